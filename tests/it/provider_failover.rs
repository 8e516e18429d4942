//! Providers within a channel (issue 37, items 2 and 4): a channel `sms-any`
//! that names Aliyun SMS (`sms`) then Tencent Cloud SMS (`tencent`). The
//! task moves to Tencent only when Aliyun refused the message before taking
//! it for a reason of Aliyun's own (credentials, arrears); an ambiguous
//! answer after Aliyun took it is settled at Aliyun, and a per-number limit
//! stays at Aliyun. Real redis-server, the real plugins, the simulator
//! speaking both providers' protocols; counts are made where the user would
//! see them — the simulator's ledger of what each provider took.

use std::collections::BTreeMap;
use std::time::Duration;

use provider_sim::Faults;
use pushonce::config::ChannelConfig;
use pushonce::permit::{
    AcceptRequest, Acceptance, CapCheck, CapPeriod, Gate, RetryPolicy, Task, TaskStatus,
};
use pushonce::send::circuit::CircuitState;
use pushonce_tests::channels::{
    DEADLINE, Env, EnvOptions, fast_retry, one_attempt_then_reconcile, payload,
};
use pushonce_tests::providers::{Sim, TENCENT};
use pushonce_tests::wait_until;

/// The channel that fails over: Aliyun first, then Tencent.
const CHAIN: &str = "sms-any";

/// Redis, the simulator and a dispatcher with [`CHAIN`] configured.
async fn env(
    tweak: impl FnOnce(&Sim, &mut BTreeMap<String, ChannelConfig>),
    options: EnvOptions,
) -> Env {
    Env::start_with_sim(
        |sim, c| {
            c.insert(TENCENT.0.into(), sim.tencent_channel());
            let mut chain = ChannelConfig::new("");
            chain.providers = vec!["sms".into(), TENCENT.0.into()];
            c.insert(CHAIN.into(), chain);
            tweak(sim, c);
        },
        options,
    )
    .await
}

async fn accept(env: &Env, key: &str, phone: &str) -> String {
    env.accept(CHAIN, key, &payload(phone, "SMS_1001")).await
}

/// Aliyun refuses each number of `refusals` for good with its code.
fn aliyun_refuses(env: &Env, refusals: &[(&str, &str)]) {
    let mut faults = Faults::default();
    for (phone, code) in refusals {
        faults.permanent.insert(phone.to_string(), code.to_string());
    }
    env.sim.set_faults("sms", faults);
}

async fn task(env: &Env, id: &str) -> Task {
    env.permits
        .task(id)
        .await
        .unwrap()
        .expect("the task exists")
}

/// Waits until the task is `sent` or `delivered`.
async fn wait_sent(env: &Env, t: &str) {
    let done = wait_until(DEADLINE, || async {
        matches!(
            env.status(t).await,
            Some(TaskStatus::Sent | TaskStatus::Delivered)
        )
    })
    .await;
    if done.is_err() {
        panic!("never sent: {:?}", task(env, t).await);
    }
}

fn field<'a>(task: &'a Task, name: &str) -> &'a str {
    task.fields.get(name).map(String::as_str).unwrap_or("")
}

fn recipients(env: &Env, channel: &str) -> Vec<String> {
    env.ledger(channel)
        .into_iter()
        .map(|m| m.recipient)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliyun_refusing_the_credentials_hands_the_sms_to_tencent_which_sends_it_once() {
    // Aliyun's signature is made with the wrong secret: it refuses every
    // request (a credential error, before anything is taken).
    let env = env(
        |_, c| {
            let aliyun = c.get_mut("sms").unwrap();
            aliyun
                .secrets_from_env
                .insert("access_key_secret".into(), "TEST_TENCENT_SECRET".into());
        },
        EnvOptions::default(),
    )
    .await;
    let t = accept(&env, "fo-auth", "+8613800000001").await;
    wait_sent(&env, &t).await;
    let task = task(&env, &t).await;
    assert_eq!(recipients(&env, TENCENT.0), ["+8613800000001"], "one SMS");
    assert!(recipients(&env, "sms").is_empty(), "Aliyun took nothing");
    assert_eq!(task.attempts, 1, "{task:?}");
    assert_eq!(field(&task, "provider"), TENCENT.0, "{task:?}");
    assert_eq!(field(&task, "provider_log"), "1:sms 1:tencent", "{task:?}");
    assert_eq!(
        task.provider_message_id.as_deref(),
        Some(env.ledger(TENCENT.0)[0].id.as_str()),
        "Tencent's SerialNo"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliyun_arrears_hand_the_sms_to_tencent_and_a_refused_number_fails_at_aliyun() {
    let env = env(|_, _| {}, EnvOptions::default()).await;
    aliyun_refuses(
        &env,
        &[
            ("+8613800000011", "isv.AMOUNT_NOT_ENOUGH"),
            ("+8613800000012", "isv.MOBILE_NUMBER_ILLEGAL"),
        ],
    );
    let bad = accept(&env, "fo-number", "+8613800000012").await;
    env.wait_status(&bad, TaskStatus::Failed).await;
    let task = task(&env, &bad).await;
    assert_eq!(field(&task, "provider_log"), "1:sms", "{task:?}");
    // Arrears (which also open Aliyun's circuit) hand the next one over.
    let arrears = accept(&env, "fo-arrears", "+8613800000011").await;
    wait_sent(&env, &arrears).await;
    assert_eq!(
        recipients(&env, TENCENT.0),
        ["+8613800000011"],
        "the refused number is not tried at Tencent"
    );
    assert!(recipients(&env, "sms").is_empty());
    env.stop().await;
}

/// Two providers name one message by their own template ids: each
/// instance maps the message's template (`template.<name>` settings), so
/// the SMS Aliyun sends carries Aliyun's code and the one handed over to
/// Tencent carries Tencent's id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_provider_renders_its_own_template_id_for_the_message() {
    let env = env(
        |_, c| {
            for (channel, id) in [("sms", "SMS_465910001"), (TENCENT.0, "2084672")] {
                let settings = &mut c.get_mut(channel).unwrap().settings;
                settings.insert("template.order_shipped".into(), id.into());
            }
        },
        EnvOptions::default(),
    )
    .await;
    aliyun_refuses(&env, &[("+8613800000041", "isv.AMOUNT_NOT_ENOUGH")]);
    for (key, phone) in [
        ("fo-tpl-1", "+8613800000042"),
        ("fo-tpl-2", "+8613800000041"),
    ] {
        let t = env
            .accept(CHAIN, key, &payload(phone, "order_shipped"))
            .await;
        wait_sent(&env, &t).await;
    }
    let sent = |channel: &str| -> Vec<(String, String)> {
        env.ledger(channel)
            .into_iter()
            .map(|m| (m.recipient, m.template))
            .collect()
    };
    assert_eq!(
        sent("sms"),
        [("+8613800000042".to_string(), "SMS_465910001".to_string())]
    );
    assert_eq!(
        sent(TENCENT.0),
        [("+8613800000041".to_string(), "2084672".to_string())]
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_answer_after_aliyun_took_the_sms_is_settled_at_aliyun_and_tencent_never_sends_it()
 {
    let env = env(|_, _| {}, one_attempt_then_reconcile(20)).await;
    // A 503 after Aliyun took the first SMS; the answer to the second cut
    // off after Aliyun took it (a timeout).
    env.sim.set_faults(
        "sms",
        Faults {
            fail_next: 1,
            error_after_accept: 1.0,
            ..Faults::default()
        },
    );
    let five = accept(&env, "fo-5xx", "+8613800000021").await;
    wait_sent(&env, &five).await;
    env.sim.set_faults(
        "sms",
        Faults {
            drop_next: 1,
            ..Faults::default()
        },
    );
    let cut = accept(&env, "fo-cut", "+8613800000022").await;
    wait_sent(&env, &cut).await;
    for t in [&five, &cut] {
        let task = task(&env, t).await;
        assert_eq!(task.attempts, 1, "never resent: {task:?}");
        assert_eq!(field(&task, "provider"), "sms", "{task:?}");
        assert_eq!(field(&task, "provider_log"), "1:sms", "{task:?}");
    }
    assert_eq!(
        recipients(&env, "sms"),
        ["+8613800000021", "+8613800000022"],
        "one SMS each, from Aliyun"
    );
    assert!(recipients(&env, TENCENT.0).is_empty(), "Tencent sent none");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_number_limit_at_aliyun_keeps_the_task_at_aliyun() {
    let env = env(
        |_, _| {},
        EnvOptions {
            retry: RetryPolicy {
                max_attempts: 2,
                ..fast_retry()
            },
            reconcile: None,
        },
    )
    .await;
    aliyun_refuses(&env, &[("+8613800000031", "isv.BUSINESS_LIMIT_CONTROL")]);
    let t = accept(&env, "fo-limit", "+8613800000031").await;
    env.wait_status(&t, TaskStatus::Dead).await;
    let task = task(&env, &t).await;
    assert_eq!(field(&task, "provider_log"), "1:sms 2:sms", "{task:?}");
    let why = task.last_error.clone().unwrap_or_default();
    assert!(why.contains("at sms:"), "{why}");
    assert!(why.contains("isv.BUSINESS_LIMIT_CONTROL"), "{why}");
    assert!(
        recipients(&env, TENCENT.0).is_empty(),
        "never moved to Tencent"
    );
    assert!(recipients(&env, "sms").is_empty());
    env.stop().await;
}

/// Accepts a message to `phone` on [`CHAIN`] under a cap of one message an
/// hour per user and channel.
async fn accept_capped(env: &Env, key: &str, phone: &str) -> Acceptance {
    let req = AcceptRequest {
        key: format!("push:per-event@1:{CHAIN}:{key}"),
        channel: CHAIN.into(),
        window: Duration::from_secs(3600),
        biz_type: "ORDER_SHIPPED".into(),
        biz_id: key.into(),
        event_json: "{}".into(),
        payload: serde_json::to_string(&payload(phone, "SMS_1001")).unwrap(),
        policy_name: "per-event".into(),
        policy_version: "1.0.0".into(),
        retry: RetryPolicy {
            max_attempts: 1,
            ..fast_retry()
        },
        gate: Gate {
            caps: vec![CapCheck {
                name: "sms-hourly".into(),
                subject: format!("{phone}:{CHAIN}"),
                max: 1,
                period: CapPeriod::Rolling(Duration::from_secs(3600)),
            }],
            ..Gate::default()
        },
        recipient: Some(phone.into()),
        send_at_ms: None,
    };
    env.permits.accept(&req).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_budget_per_user_whichever_provider_sent_or_holds_the_message() {
    // Item 4: the cap is the channel's. A message that failed over to
    // Tencent, and one held unknown at Aliyun, each used the user's budget.
    let env = env(
        |_, _| {},
        EnvOptions {
            retry: RetryPolicy {
                max_attempts: 1,
                ..fast_retry()
            },
            reconcile: None,
        },
    )
    .await;
    aliyun_refuses(&env, &[("+8613800000041", "isv.SMS_TEMPLATE_ILLEGAL")]);
    let moved = accept_capped(&env, "fo-cap-1", "+8613800000041").await;
    let Acceptance::Accepted { task_id: moved } = moved else {
        panic!("the first message is accepted: {moved:?}");
    };
    wait_sent(&env, &moved).await;
    assert_eq!(recipients(&env, TENCENT.0), ["+8613800000041"]);
    let again = accept_capped(&env, "fo-cap-2", "+8613800000041").await;
    assert!(
        matches!(&again, Acceptance::Capped { cap, .. } if cap == "sms-hourly"),
        "the failover gave no fresh budget: {again:?}"
    );
    env.sim.set_faults(
        "sms",
        Faults {
            fail_next: 1,
            error_after_accept: 1.0,
            ..Faults::default()
        },
    );
    let held = accept_capped(&env, "fo-cap-3", "+8613800000042").await;
    let Acceptance::Accepted { task_id: held } = held else {
        panic!("accepted: {held:?}");
    };
    env.wait_status(&held, TaskStatus::Unknown).await;
    let again = accept_capped(&env, "fo-cap-4", "+8613800000042").await;
    assert!(
        matches!(&again, Acceptance::Capped { .. }),
        "an unknown outcome counts: {again:?}"
    );
    assert_eq!(
        recipients(&env, TENCENT.0),
        ["+8613800000041"],
        "{:?}",
        task(&env, &held).await
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliyuns_circuit_opens_under_5xx_new_tasks_start_at_tencent_and_a_good_try_closes_it() {
    let env = env(
        |_, c| {
            let chain = c.get_mut(CHAIN).unwrap();
            chain.circuit_failures = 2;
            chain.circuit_open = Duration::from_millis(500);
        },
        EnvOptions {
            retry: RetryPolicy {
                max_attempts: 1,
                ..fast_retry()
            },
            reconcile: None,
        },
    )
    .await;
    let circuit = || env.sender.circuit_state(CHAIN, "sms");
    env.sim.set_faults(
        "sms",
        Faults {
            fail_5xx: 1.0,
            ..Faults::default()
        },
    );
    // Two 503s in a row: unknown, each held at Aliyun (never handed on).
    let mut held = Vec::new();
    for (key, phone) in [("fo-cb-1", "+8613800000051"), ("fo-cb-2", "+8613800000052")] {
        let t = accept(&env, key, phone).await;
        env.wait_status(&t, TaskStatus::Unknown).await;
        held.push(t);
    }
    assert_eq!(circuit(), CircuitState::Open);
    // While it is open, a new task starts at Tencent.
    let during = accept(&env, "fo-cb-3", "+8613800000053").await;
    wait_sent(&env, &during).await;
    assert_eq!(
        field(&task(&env, &during).await, "provider_log"),
        "1:tencent"
    );
    // Aliyun recovers; once half-open, one real message tries it and closes it.
    env.sim.set_faults("sms", Faults::default());
    wait_until(DEADLINE, || async { circuit() == CircuitState::HalfOpen })
        .await
        .expect("the circuit turns half-open");
    let probe = accept(&env, "fo-cb-4", "+8613800000054").await;
    wait_sent(&env, &probe).await;
    assert_eq!(field(&task(&env, &probe).await, "provider_log"), "1:sms");
    assert_eq!(circuit(), CircuitState::Closed);
    for t in &held {
        let task = task(&env, t).await;
        assert_eq!(field(&task, "provider_log"), "1:sms", "{task:?}");
        assert_eq!(task.status, TaskStatus::Unknown, "{task:?}");
    }
    assert_eq!(
        recipients(&env, TENCENT.0),
        ["+8613800000053"],
        "Tencent sent only the new task"
    );
    assert_eq!(recipients(&env, "sms"), ["+8613800000054"]);
    env.stop().await;
}
