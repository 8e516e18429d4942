//! The chaos proof, small enough for every CI run: events posted several
//! times to three `pushonce serve` processes that are killed with `kill -9`
//! and restarted, while Redis restarts once and the providers fail, time out
//! and refuse. At the receiving end: no duplicate, no miss, and every task
//! held for an operator explained by an injected fault, and nothing
//! accepted on WeChat for a user once their opt-out took effect. The full run
//! (20,000 events) is `cargo xtask chaos`; this test prints the same table.
//! The same on a Redis Cluster of three masters, one of them restarted.
//! And with an outage of the SMS channel's first provider (issue 37): the
//! `sms` channel fails over from Aliyun to Tencent while Aliyun's gateway
//! fails every send and query for a stretch of the run.

use std::time::Duration;

use pushonce_tests::chaos::{ChaosConfig, ProviderOutage, run};

/// Runs a small chaos scenario and checks what a user would: nothing
/// doubled, nothing silently lost, every hold explained.
async fn small_run(cluster: bool, events: usize) {
    let config = ChaosConfig {
        cluster,
        events,
        posts: 3,
        instances: 3,
        concurrency: 32,
        kills: 3,
        kill_every: Duration::from_secs(3),
        redis_restarts: 1,
        progress_every: Duration::from_secs(10),
        quiescence_timeout: Duration::from_secs(180),
        ..ChaosConfig::default()
    };
    let report = run(&config, &|line| eprintln!("{line}"))
        .await
        .expect("the chaos run completes");
    let table = report.table(if cluster {
        "chaos (Redis Cluster, CI size)"
    } else {
        "chaos (one Redis, CI size)"
    });
    println!("{table}");
    assert!(report.kills >= 3, "hosts were killed:\n{table}");
    assert_eq!(report.redis_restarts, 1, "{table}");
    assert!(
        report.opt_outs.0 > 0,
        "users switched WeChat off during the load:\n{table}"
    );
    assert!(
        report.retries > 0,
        "faults were injected and retried:\n{table}"
    );
    assert!(
        report.is_clean(),
        "duplicates, misses or unexplained holds:\n{table}\n{:#?}",
        report.examples
    );
    assert_eq!(
        report.delivered + report.held_missing,
        report.expected,
        "every expected message is at its provider or visibly held:\n{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_duplicate_and_no_miss_while_hosts_die_and_redis_restarts() {
    small_run(false, 600).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_too_while_hosts_die_and_a_master_restarts() {
    small_run(true, 300).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sms_provider_outage_sends_nothing_twice_and_its_held_tasks_settle_after_it() {
    let config = ChaosConfig {
        events: 600,
        concurrency: 32,
        kills: 3,
        kill_every: Duration::from_secs(3),
        redis_restarts: 1,
        progress_every: Duration::from_secs(10),
        quiescence_timeout: Duration::from_secs(240),
        provider_outage: Some(ProviderOutage {
            start: Duration::from_secs(2),
            length: Duration::from_secs(10),
            settle_timeout: Duration::from_secs(180),
        }),
        ..ChaosConfig::default()
    };
    let report = run(&config, &|line| eprintln!("{line}"))
        .await
        .expect("the chaos run completes");
    let table = report.table("chaos with an Aliyun outage (CI size)");
    println!("{table}");
    let outage = report.outage.clone().expect("the outage is reported");
    assert!(
        outage.held_at_a() > 0,
        "SMS went to Aliyun while it was dark and were held there:\n{table}"
    );
    assert_eq!(outage.held_otherwise, 0, "{table}\n{:#?}", report.examples);
    assert_eq!(
        outage.settled,
        outage.held_at_a(),
        "every SMS held at Aliyun settles once it is back:\n{table}\n{:#?}",
        report.examples
    );
    assert!(
        outage.sent_by_b > 0,
        "Tencent took new SMS meanwhile:\n{table}"
    );
    assert_eq!(
        (report.duplicates, report.misses),
        (0, 0),
        "{table}\n{:#?}",
        report.examples
    );
    assert!(report.is_clean(), "{table}\n{:#?}", report.examples);
}
