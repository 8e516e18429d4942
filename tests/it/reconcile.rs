//! The reconciler end to end, in process: real redis-server, the real
//! provider simulator on 127.0.0.1, the real channel plugins, a dispatcher and
//! a reconciler sending and checking through one `PluginSender`
//! (`pushonce_tests::channels`). Counts are made at the receiving end — the
//! simulator's ledger.

use provider_sim::Faults;
use pushonce::permit::{HeldCause, Requeue, TaskStatus, shard_of_task};
use pushonce::reconcile::Reconciler;
use pushonce_tests::channels::{
    DEADLINE, Env, one_attempt_then_reconcile, payload, quick_reconcile, sender,
};
use pushonce_tests::wait_until;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_task_the_provider_has_is_settled_without_a_resend() {
    let env = Env::start_with(|_| {}, one_attempt_then_reconcile(20)).await;
    // Accepted, answer cut off; the dispatcher's own query fails too.
    env.sim.set_faults(
        "inbox",
        Faults {
            drop_after_accept: 1.0,
            fail_queries: true,
            ..Faults::default()
        },
    );
    let t = env.accept("inbox", "u-1", &payload("user-u1", "T")).await;
    env.wait_status(&t, TaskStatus::Unknown).await;
    env.sim.set_faults("inbox", Faults::default());

    env.wait_status(&t, TaskStatus::Delivered).await;
    let ledger = env.ledger("inbox");
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].replays, 0, "never resent: {ledger:?}");
    let task = env.permits.task(&t).await.unwrap().unwrap();
    assert_eq!(task.attempts, 1, "{task:?}");
    assert_eq!(
        env.permits.permit_owner(&task.key).await.unwrap(),
        Some(t.clone()),
        "the permit is kept for the window"
    );
    let shard = shard_of_task(&t).unwrap();
    assert_eq!(env.permits.awaiting_count(shard).await.unwrap(), 0);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_task_the_provider_never_got_is_resent_exactly_once() {
    let env = Env::start_with(|_| {}, one_attempt_then_reconcile(20)).await;
    // Cut off before the provider took it: the host sees unknown, the
    // provider has nothing (its query says so, but the one attempt is spent).
    env.sim.set_faults(
        "sms",
        Faults {
            drop_before_accept: 1.0,
            ..Faults::default()
        },
    );
    let t = env
        .accept("sms", "n-1", &payload("+8613800000021", "SMS_1001"))
        .await;
    env.wait_status(&t, TaskStatus::Unknown).await;
    assert!(env.ledger("sms").is_empty());
    env.sim.set_faults("sms", Faults::default());

    let settled = wait_until(DEADLINE, || async {
        matches!(
            env.status(&t).await,
            Some(TaskStatus::Sent | TaskStatus::Delivered)
        )
    })
    .await;
    let task = env.permits.task(&t).await.unwrap().unwrap();
    assert!(settled.is_ok(), "never sent again: {task:?}");
    let ledger = env.ledger("sms");
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].replays, 0, "{ledger:?}");
    assert_eq!(task.attempts, 2, "one resend: {task:?}");
    // Aliyun's query may lag (1 s here): "not found" is believed only past it.
    let (first, last) = (
        task.first_attempt_ms.unwrap(),
        task.last_attempt_ms.unwrap(),
    );
    assert!(last >= first + 1000, "resent past the query lag: {task:?}");
    assert_eq!(
        task.fields.get("reconcile_requeues").map(String::as_str),
        Some("1"),
        "{task:?}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sent_task_without_receipt_is_delivered_by_a_query() {
    let env = Env::start_with(|_| {}, one_attempt_then_reconcile(20)).await;
    let t = env
        .accept("sms", "s-1", &payload("+8613800000031", "SMS_1001"))
        .await;
    env.wait_status(&t, TaskStatus::Delivered).await;
    let task = env.permits.task(&t).await.unwrap().unwrap();
    assert_eq!(task.attempts, 1);
    assert!(task.fields.contains_key("receipt_at"), "{task:?}");
    assert_eq!(env.ledger("sms").len(), 1);
    let shard = shard_of_task(&t).unwrap();
    assert_eq!(env.permits.awaiting_count(shard).await.unwrap(), 0);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_task_nothing_can_tell_goes_dead_after_max_checks_and_requeue_keeps_its_key() {
    let metrics = pushonce::api::metrics::prometheus_handle();
    let env = Env::start_with(|_| {}, one_attempt_then_reconcile(3)).await;
    // FCM (`app-push`): no reference, no query, on_unknown = hold (the
    // default). (WeChat now dedupes a resend by client_msg_id for 10 minutes.)
    env.sim.set_faults(
        "app-push",
        Faults {
            drop_after_accept: 1.0,
            ..Faults::default()
        },
    );
    let t = env
        .accept("app-push", "h-1", &payload("device-h1", "TPL"))
        .await;
    env.wait_status(&t, TaskStatus::Dead).await;
    let task = env.permits.task(&t).await.unwrap().unwrap();
    assert_eq!(task.attempts, 1, "never resent: {task:?}");
    assert_eq!(
        task.fields.get("reconcile_checks").map(String::as_str),
        Some("3")
    );
    assert!(
        task.last_error
            .as_deref()
            .is_some_and(|e| e.contains("no status query")),
        "{task:?}"
    );
    assert_eq!(env.ledger("app-push").len(), 1);
    // Listed for operators, permit kept (it may have been sent).
    let dead = env.permits.dead_tasks(10).await.unwrap();
    assert!(dead.iter().any(|(id, _)| *id == t), "{dead:?}");
    assert_eq!(
        env.permits.permit_owner(&task.key).await.unwrap(),
        Some(t.clone())
    );
    let text = metrics.render();
    assert!(
        text.contains(
            r#"pushonce_reconcile_checks_total{channel="app-push",result="cannot_tell"}"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"pushonce_reconcile_gave_up_total{channel="app-push",status="unknown"}"#),
        "{text}"
    );

    // Compensation does not double-send by accident: the message may be at
    // the provider, so a plain requeue is refused.
    assert_eq!(
        env.permits.requeue(&t, false).await.unwrap(),
        Requeue::MaybeSent
    );
    assert_eq!(env.ledger("app-push").len(), 1);
    // The operator checked and sends it again on purpose: same task, same
    // key, same permit.
    env.sim.set_faults("app-push", Faults::default());
    assert!(matches!(
        env.permits.requeue(&t, true).await.unwrap(),
        Requeue::Requeued { .. }
    ));
    env.wait_status(&t, TaskStatus::Sent).await;
    let again = env.permits.task(&t).await.unwrap().unwrap();
    assert_eq!(again.key, task.key);
    assert_eq!(
        env.permits.permit_owner(&task.key).await.unwrap(),
        Some(t.clone())
    );
    assert!(
        !env.permits
            .dead_tasks(10)
            .await
            .unwrap()
            .iter()
            .any(|(id, _)| *id == t)
    );
    assert_eq!(
        env.ledger("app-push").len(),
        2,
        "the operator's forced resend"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_reconcilers_requeue_each_absent_task_once() {
    let env = Env::start_with(|_| {}, one_attempt_then_reconcile(20)).await;
    // A second host instance's reconciler on the same Redis.
    let (stop, rx) = tokio::sync::watch::channel(false);
    let other = Reconciler::new(
        env.permits.clone(),
        std::sync::Arc::new(sender(&env.sim, &env.sim.channels())),
        quick_reconcile(20),
    );
    let other = tokio::spawn(other.run(rx));
    env.sim.set_faults(
        "sms",
        Faults {
            drop_before_accept: 1.0,
            ..Faults::default()
        },
    );
    let mut tasks = Vec::new();
    for i in 0..12 {
        tasks.push(
            env.accept(
                "sms",
                &format!("m-{i}"),
                &payload(&format!("+86138000001{i:02}"), "SMS_1001"),
            )
            .await,
        );
    }
    for t in &tasks {
        env.wait_status(t, TaskStatus::Unknown).await;
    }
    env.sim.set_faults("sms", Faults::default());
    for t in &tasks {
        env.wait_status(t, TaskStatus::Delivered).await;
    }
    let ledger = env.ledger("sms");
    assert_eq!(ledger.len(), tasks.len(), "{ledger:?}");
    assert!(ledger.iter().all(|m| m.replays == 0), "{ledger:?}");
    for t in &tasks {
        let task = env.permits.task(t).await.unwrap().unwrap();
        assert_eq!(
            task.fields.get("reconcile_requeues").map(String::as_str),
            Some("1"),
            "{task:?}"
        );
        assert_eq!(task.attempts, 2, "{task:?}");
    }
    let _ = stop.send(true);
    other.await.unwrap();
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_send_nothing_can_query_keeps_its_cause_and_logs_every_check() {
    let env = Env::start_with(|_| {}, one_attempt_then_reconcile(3)).await;
    // FCM (`app-push`): no query, no receipts; the answer is cut off after
    // the provider took the message.
    env.sim.set_faults(
        "app-push",
        Faults {
            drop_after_accept: 1.0,
            ..Faults::default()
        },
    );
    let t = env
        .accept("app-push", "cause-1", &payload("device-c1", "TPL"))
        .await;
    env.wait_status(&t, TaskStatus::Dead).await;
    let task = env.permits.task(&t).await.unwrap().unwrap();
    assert_eq!(
        task.held_cause,
        Some(HeldCause::CutOffAfterWrite),
        "the attempt's cause survives the reconciler: {task:?}"
    );
    assert!(task.provider_answer.is_some(), "{task:?}");
    let log = task.reconcile_log();
    let steps: Vec<(u32, &str, &str, &str)> = log
        .iter()
        .map(|s| {
            (
                s.check,
                s.asked.as_str(),
                s.answer.as_str(),
                s.action.as_str(),
            )
        })
        .collect();
    let no_query = "nothing: no status query";
    assert_eq!(
        steps,
        [
            (1, no_query, "cannot_tell", "later"),
            (2, no_query, "cannot_tell", "later"),
            (3, no_query, "cannot_tell", "dead"),
        ],
        "{task:?}"
    );
    assert!(log.iter().all(|s| s.detail.contains("no status query")));
    let held = env.permits.held_tasks(10).await.unwrap();
    assert!(held.iter().any(|(id, _)| *id == t), "{held:?}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sent_task_on_a_channel_without_query_is_not_awaited() {
    let env = Env::start_with(|_| {}, one_attempt_then_reconcile(3)).await;
    // FCM (`app-push`): neither a status query nor receipts.
    let t = env
        .accept("app-push", "final-1", &payload("device-f1", "TPL"))
        .await;
    env.wait_status(&t, TaskStatus::Sent).await;
    let shard = shard_of_task(&t).unwrap();
    assert_eq!(env.permits.awaiting_count(shard).await.unwrap(), 0);
    let task = env.permits.task(&t).await.unwrap().unwrap();
    assert!(!task.fields.contains_key("awaiting_since"), "{task:?}");
    assert!(task.reconcile_log().is_empty(), "{task:?}");
    assert_eq!(env.ledger("app-push").len(), 1);
    env.stop().await;
}
