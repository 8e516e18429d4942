//! Bloom mode (`dedup = "bloom"`) against one real redis-server for the
//! whole binary: over the HTTP API a re-posted event is `duplicate`, is sent
//! once, and no per-key permit is left once it is sent; distinct events are
//! accepted; the answers are counted by mode; a re-post is caught for at
//! least one window and accepted again once both filters expired; a bloom
//! policy with a fallback is refused with its reason; and the measured
//! false-positive rate over 1,000,000 keys is within the configured bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pushonce::permit::{
    AcceptRequest, Acceptance, Begin, BloomCheck, BloomSizing, Gate, Outcome, PermitFate, Recorded,
    Requeue, Settle, Settled, TaskStatus,
};
use pushonce::route::policy::PolicyFile;
use pushonce_tests::fixtures::{accept_request, permit_config};
use pushonce_tests::host::{Setup, TestHost};
use pushonce_tests::process::read_ledger;
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;
use rusty_fork::rusty_fork_test;
use serde_json::{Value, json};

const BROADCAST: &str = r#"
biz_type = "BROADCAST"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
dedup = "bloom"
bloom = { items = 100_000, false_positive = 0.001 }
"#;

fn event(biz_id: &str) -> Value {
    json!({
        "biz_type": "BROADCAST",
        "biz_id": biz_id,
        "user_id": "u-7",
        "occurred_at": "2026-12-01T10:00:00Z",
        "attributes": {},
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Keys of this server matching `pattern` (SCAN, all of them).
async fn keys_like(server: &RedisServer, pattern: &str) -> Vec<String> {
    server.keys_matching(pattern).await.unwrap()
}

rusty_fork_test! {
    /// One server for the parts, run one after the other; in a process of
    /// its own (rusty-fork), since the answers it counts in `/metrics` are
    /// in the process-wide recorder the other tests of this binary share.
    #[test]
    fn bloom_mode() {
        pushonce_tests::runtime().block_on(async {
            let server = RedisServer::start().await.unwrap();
            a_repost_is_duplicate_and_sent_once_over_the_api(&server).await;
            a_repost_is_caught_for_a_window_then_accepted_again(&server).await;
            an_open_task_holds_a_permit_only_until_it_ends(&server).await;
            the_false_positive_rate_on_a_million_keys_is_within_the_bound(&server).await;
        })
    }
}

/// An event of a bloom policy is accepted and sent once; its re-post is
/// `duplicate` (no task named: the filter does not know it) and not sent
/// again; once it is sent no permit key is left in Redis (the memory win);
/// 50 distinct events are all accepted; the answers are counted by mode.
async fn a_repost_is_duplicate_and_sent_once_over_the_api(server: &RedisServer) {
    let setup = Setup {
        policies: Some(vec![("broadcast.toml".into(), BROADCAST.into())]),
        ..Setup::default()
    };
    let host = TestHost::start_with(server, setup).await.unwrap();
    let first = host.post("/v1/events", &event("b-1"), None).await.unwrap();
    assert_eq!(first.status, 202, "{}", first.body);
    assert_eq!(
        first.body["results"][0]["result"], "accepted",
        "{}",
        first.body
    );
    let task = first.body["results"][0]["task_id"]
        .as_str()
        .unwrap()
        .to_string();
    let again = host.post("/v1/events", &event("b-1"), None).await.unwrap();
    let r = &again.body["results"][0];
    assert_eq!(r["result"], "duplicate", "{}", again.body);

    let ledger = host.ledger();
    wait_until(Duration::from_secs(30), || {
        let ledger = ledger.clone();
        let task = task.clone();
        async move {
            read_ledger(&ledger)
                .iter()
                .any(|l| l.task_id == task && l.outcome == "sent")
        }
    })
    .await
    .expect("the accepted event is sent");
    let view = wait_until(Duration::from_secs(30), || async {
        let view = host.get(&format!("/v1/tasks/{task}"), None).await.unwrap();
        view.body["status"] == "sent" || view.body["status"] == "delivered"
    })
    .await;
    view.expect("the task is recorded sent");
    assert_eq!(
        keys_like(server, "*:permit:*").await,
        Vec::<String>::new(),
        "a sent bloom task keeps no permit"
    );
    let after = host.post("/v1/events", &event("b-1"), None).await.unwrap();
    assert_eq!(
        after.body["results"][0]["result"], "duplicate",
        "{}",
        after.body
    );

    for i in 0..50 {
        let a = host
            .post("/v1/events", &event(&format!("d-{i}")), None)
            .await
            .unwrap();
        assert_eq!(
            a.body["results"][0]["result"], "accepted",
            "d-{i}: {}",
            a.body
        );
    }
    let sends = read_ledger(&ledger)
        .into_iter()
        .filter(|l| l.task_id == task)
        .count();
    assert_eq!(sends, 1, "the re-posted event is sent once");
    let metrics = host.metrics().await.unwrap();
    let count = |answer: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("pushonce_dedup_answers_total{")
                    && l.contains("mode=\"bloom\"")
                    && l.contains(&format!("answer=\"{answer}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(|v| v.parse::<f64>().unwrap())
    };
    assert_eq!(count("accepted"), Some(51.0), "{metrics}");
    assert_eq!(count("duplicate"), Some(2.0), "{metrics}");
    host.shutdown().await.unwrap();
}

fn bloom_request(key: &str, window: Duration) -> AcceptRequest {
    AcceptRequest {
        window,
        gate: Gate {
            bloom: Some(BloomCheck {
                filter: "BROADCAST:sms".into(),
                items: 10_000,
                false_positive: 0.001,
            }),
            ..Gate::default()
        },
        ..accept_request(key)
    }
}

/// Filters live two window periods and both are checked: with a 1 s window
/// a re-post is `duplicate` until at least one window after the first
/// accept, and accepted again once both filters that knew it expired (within
/// two windows and a bit). No permit is written at accept.
async fn a_repost_is_caught_for_a_window_then_accepted_again(server: &RedisServer) {
    let permits = server.permits(permit_config()).await.unwrap();
    let window = Duration::from_secs(1);
    let req = bloom_request("w-1", window);
    let first = permits.accept(&req).await.unwrap();
    let Acceptance::Accepted { task_id } = first else {
        panic!("expected accepted, got {first:?}");
    };
    let task = permits.task(&task_id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Queued);
    assert_eq!(task.fields["dedup"], "bloom");
    assert_eq!(permits.permit_owner("w-1").await.unwrap(), None);
    let accepted_at = task.accepted_at_ms;
    let again = permits.accept(&req).await.unwrap();
    assert_eq!(
        again,
        Acceptance::Duplicate {
            task_id: String::new(),
            status: None
        }
    );
    // When the accept that found the key gone returned: its script ran
    // before then, so the filters let the key go no later than this.
    let accepted_again = Arc::new(AtomicU64::new(0));
    wait_until(Duration::from_secs(5), || {
        let permits = permits.clone();
        let req = req.clone();
        let accepted_again = accepted_again.clone();
        async move {
            let answer = permits.accept(&req).await.unwrap();
            accepted_again.store(now_ms(), Ordering::SeqCst);
            matches!(answer, Acceptance::Accepted { .. })
        }
    })
    .await
    .expect("accepted again once both filters expired");
    // Measured after the call returned, so a slow poll on a loaded machine
    // can only make it later, never earlier than the script's own time.
    let accepted_again = accepted_again.load(Ordering::SeqCst);
    assert!(
        accepted_again >= accepted_at + 1000,
        "duplicate until at least one window after the first accept \
         (accepted again {} ms after it)",
        accepted_again - accepted_at
    );
}

/// A bloom task takes a permit when its attempt begins (the lease's
/// fencing works as in the permit mode) and drops it when it ends: after a
/// `resend` (it may have been sent) and a `dead` outcome, where the permit
/// mode keeps the permit for the window, no permit is left; a re-post is
/// still `duplicate` (the filter's bits stay). An operator's requeue and
/// give-up follow the same rule.
async fn an_open_task_holds_a_permit_only_until_it_ends(server: &RedisServer) {
    let permits = server.permits(permit_config()).await.unwrap();
    let req = bloom_request("life-1", Duration::from_secs(600));
    let Acceptance::Accepted { task_id } = permits.accept(&req).await.unwrap() else {
        panic!("expected accepted");
    };
    let lease = Duration::from_secs(30);
    let begin = |permits: pushonce::permit::Permits, id: String| async move {
        match permits.begin_attempt(&id, lease).await.unwrap() {
            Begin::Begun(a) => a,
            other => panic!("expected to begin, got {other:?}"),
        }
    };
    let first = begin(permits.clone(), task_id.clone()).await;
    assert_eq!(
        permits.permit_owner("life-1").await.unwrap(),
        Some(task_id.clone()),
        "an open task holds the permit"
    );
    let ttl = permits
        .permit_ttl("life-1")
        .await
        .unwrap()
        .flatten()
        .unwrap();
    assert!(
        ttl <= (lease + permit_config().grace).as_millis() as u64,
        "held for the lease and the grace, not the window: {ttl} ms"
    );
    let resend = Outcome::Resend {
        delay: Duration::from_millis(1),
        reason: "timeout after write".into(),
        by_reference: false,
    };
    permits.record(&first, &resend, None).await.unwrap();
    // retry_wait: the next attempt may begin at once (no promotion needed).
    let second = begin(permits.clone(), task_id.clone()).await;
    assert_eq!(second.number, 2);
    let dead = Outcome::Dead {
        reason: "gave up".into(),
    };
    let done = permits.record(&second, &dead, None).await.unwrap();
    assert_eq!(done, Recorded::Done(PermitFate::Released));
    assert_eq!(permits.permit_owner("life-1").await.unwrap(), None);
    let again = permits.accept(&req).await.unwrap();
    assert!(matches!(again, Acceptance::Duplicate { .. }), "{again:?}");

    // An operator's forced requeue takes no permit for the window; the
    // next attempt takes it for the lease. Held (`unknown`), the task keeps
    // it; given up, it keeps none.
    let requeued = permits.requeue(&task_id, true).await.unwrap();
    assert!(matches!(requeued, Requeue::Requeued { .. }), "{requeued:?}");
    assert_eq!(
        permits.permit_owner("life-1").await.unwrap(),
        None,
        "a requeue takes no permit"
    );
    let third = begin(permits.clone(), task_id.clone()).await;
    let unknown = Outcome::Unknown {
        reason: "cut off after write".into(),
    };
    permits.record(&third, &unknown, None).await.unwrap();
    assert_eq!(
        permits.permit_owner("life-1").await.unwrap(),
        Some(task_id.clone()),
        "a held task keeps its permit"
    );
    let settled = permits
        .settle(&task_id, Settle::GivenUp, &Default::default())
        .await
        .unwrap();
    assert!(matches!(settled, Settled::Settled(_)), "{settled:?}");
    assert_eq!(
        permits.permit_owner("life-1").await.unwrap(),
        None,
        "a task given up keeps no permit"
    );
    let still = permits.accept(&req).await.unwrap();
    assert!(matches!(still, Acceptance::Duplicate { .. }), "{still:?}");
}

/// A filter sized for n = 1,000,000 keys at p = 0.001 holds 1,000,000 keys;
/// 1,000,000 other keys are checked with the accept script's own bit
/// functions (`bloom.lua`). The bound: the filter's expected rate q =
/// (1 - e^(-kn/m))^k (≤ p by the sizing) and the number of false positives
/// X ~ Binomial(N, q): X must lie within 6 standard deviations of N·q (a
/// correct filter falls outside with probability ~1e-9; one whose positions
/// are correlated or mis-sized lands far outside), and X/N ≤ 1.2 p (the
/// configured rate with room for that noise: N·q + 6σ ≈ 1,190 < 1,200).
async fn the_false_positive_rate_on_a_million_keys_is_within_the_bound(server: &RedisServer) {
    let permits = server.permits(permit_config()).await.unwrap();
    let (n, probes, p) = (1_000_000u64, 1_000_000u64, 0.001);
    let sizing = BloomSizing::for_filter(n, p).unwrap();
    let filter = "{measure}:bloom:fp";
    // Small calls: a 50,000-key script call outlived the connection's
    // response timeout on a loaded machine.
    let chunk = 10_000u64;
    let mut collisions = 0;
    for start in (0..n).step_by(chunk as usize) {
        let keys: Vec<String> = (start..start + chunk).map(|i| format!("in-{i}")).collect();
        collisions += permits
            .bloom_keys(filter, &sizing, &keys, true)
            .await
            .unwrap();
    }
    let mut found = 0;
    for start in (0..probes).step_by(chunk as usize) {
        let keys: Vec<String> = (start..start + chunk).map(|i| format!("out-{i}")).collect();
        found += permits
            .bloom_keys(filter, &sizing, &keys, false)
            .await
            .unwrap();
    }
    let q = sizing.expected_rate(n);
    let mean = probes as f64 * q;
    let sd = (probes as f64 * q * (1.0 - q)).sqrt();
    let rate = found as f64 / probes as f64;
    eprintln!(
        "bloom: m = {} bits, k = {}, {n} keys in ({collisions} already all set while \
         inserting), {found} of {probes} other keys found: rate {rate:.6} \
         (expected {q:.6}, configured {p})",
        sizing.bits, sizing.hashes
    );
    assert!(q <= p, "the sizing gives {q} > {p}");
    assert!(
        (found as f64 - mean).abs() <= 6.0 * sd,
        "{found} false positives, expected {mean:.0} ± {:.0} (6σ)",
        6.0 * sd
    );
    assert!(rate <= 1.2 * p, "rate {rate} above 1.2 × {p}");
    let mut conn = server.manager().await.unwrap();
    let len: u64 = redis::cmd("STRLEN")
        .arg(filter)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(len, sizing.bytes(), "the filter is m/8 bytes");
    // Allocated up front, not grown greedily by SETBIT (up to twice its
    // length): at most the allocator's size class above it (≤ 25 %).
    let used: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(filter)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        used <= sizing.bytes() * 5 / 4 + 1024,
        "{used} bytes for a {len}-byte filter"
    );
}

/// A bloom policy naming a fallback is refused, saying why in words.
#[test]
fn bloom_with_a_fallback_is_refused() {
    let text = format!(
        "{}\n[fallback]\ninbox = \"sms\"\n",
        BROADCAST.replace("[\"inbox\"]", "[\"inbox\", \"sms\"]")
    );
    let err = PolicyFile::parse(std::path::Path::new("policies/broadcast.toml"), &text)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("policies/broadcast.toml: dedup: policy `BROADCAST`"),
        "{err}"
    );
    assert!(err.contains("cannot be used with a fallback"), "{err}");
    assert!(err.contains("false positive skips the message"), "{err}");
    assert!(err.contains("inbox -> sms"), "{err}");
    let no_sizing = BROADCAST.replace("bloom = { items = 100_000, false_positive = 0.001 }", "");
    let err = PolicyFile::parse(std::path::Path::new("policies/b.toml"), &no_sizing)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bloom: `dedup = \"bloom\"` needs `[bloom]`"),
        "{err}"
    );
}
