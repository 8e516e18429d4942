//! Channels end to end, in process: real redis-server, the real provider
//! simulator on 127.0.0.1 (`provider_sim::run`), the real channel plugins built
//! by `build.rs`, the dispatcher sending through `PluginSender`. Counts are
//! made at the receiving end — the simulator's ledger. The setup is shared
//! with `reconcile.rs` (`pushonce_tests::channels`). Per provider — receipts
//! in each provider's format, callback signatures, token refresh, error
//! classes, cut-off answers — in `providers.rs`; through a real host in
//! `contract.rs`, `e2e.rs` and the chaos proof.

use provider_sim::Faults;
use pushonce::config::{ChannelConfig, OnUnknown};
use pushonce::permit::TaskStatus;
use pushonce::plugin::bindings::{Message, SendError};
use pushonce::plugin::{Limits, PluginRegistry, PluginRuntime};
use pushonce::send::Fallback;
use pushonce_tests::channels::{DEADLINE, Env, Sim, payload, sender, sender_over, sim};
use pushonce_tests::plugins::{another_build, limits, real};
use pushonce_tests::wait_until;
use std::path::Path;
use std::sync::{Arc, Mutex};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_per_channel_reaches_the_provider_once() {
    let env = Env::start(|_| {}).await;
    let mut tasks = Vec::new();
    for (channel, provider, recipient, template) in [
        ("inbox", "inbox", "user-1", "order-shipped"),
        ("sms", "sms", "+8613800000001", "SMS_1001"),
        (
            "app-push",
            "app-push",
            "device-token-1",
            "Your order shipped",
        ),
        ("wechat", "wechat", "openid-1", "TPL-SHIPPED"),
    ] {
        let t = env
            .accept(channel, "o-1:u-1", &payload(recipient, template))
            .await;
        tasks.push((t, provider, recipient, template));
    }
    for (t, ..) in &tasks {
        env.wait_status(t, TaskStatus::Sent).await;
    }
    for (_, provider, recipient, template) in &tasks {
        let ledger = env.ledger(provider);
        assert_eq!(ledger.len(), 1, "{provider}: {ledger:?}");
        assert_eq!(ledger[0].recipient, *recipient);
        // FCM has no template: the plugin puts it in the message's data.
        if *provider != "app-push" {
            assert_eq!(ledger[0].template, *template);
        }
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retryable_faults_still_deliver_each_message_once() {
    let env = Env::start(|_| {}).await;
    // A 5xx is ambiguous (issue 31): only the inbox, which answers by key
    // and dedupes, gets them here; SMS's query lags and FCM holds.
    for provider in ["inbox", "sms", "app-push"] {
        env.sim.set_faults(
            provider,
            Faults {
                fail_5xx: if provider == "inbox" { 0.1 } else { 0.0 },
                fail_429: 0.2,
                ..Faults::default()
            },
        );
    }
    let mut tasks = Vec::new();
    for i in 0..10 {
        for channel in ["inbox", "sms", "app-push"] {
            // Aliyun refuses what is not a phone number (isv.MOBILE_NUMBER_ILLEGAL).
            let recipient = match channel {
                "sms" => format!("+86138000001{i:02}"),
                _ => format!("r-{i}"),
            };
            let t = env
                .accept(channel, &format!("o-{i}"), &payload(&recipient, "T"))
                .await;
            tasks.push(t);
        }
    }
    for t in &tasks {
        env.wait_status(t, TaskStatus::Sent).await;
    }
    let mut attempts = 0;
    for t in &tasks {
        attempts += env.permits.task(t).await.unwrap().unwrap().attempts;
    }
    assert!(
        attempts > tasks.len() as u32,
        "some attempts failed and were retried: {attempts}"
    );
    for provider in ["inbox", "sms", "app-push"] {
        let ledger = env.ledger(provider);
        assert_eq!(ledger.len(), 10, "{provider}: exactly one per message");
        let mut r: Vec<_> = ledger.iter().map(|m| m.recipient.clone()).collect();
        r.sort();
        r.dedup();
        assert_eq!(r.len(), 10, "{provider}: no duplicates");
    }
    let stats = env.sim.state.stats();
    assert!(
        stats
            .keys()
            .any(|k| k.ends_with(".5xx") || k.ends_with(".429")),
        "{stats:?}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sms_arrears_falls_back_to_one_app_push() {
    let env = Env::start(|_| {}).await;
    let phone = "+8613800000099";
    env.sim.set_faults(
        "sms",
        Faults {
            permanent: [(phone.to_string(), "isv.AMOUNT_NOT_ENOUGH".to_string())].into(),
            ..Faults::default()
        },
    );
    let mut p = payload(phone, "SMS_1001");
    p.fallback = Some(Box::new(Fallback {
        channel: "app-push".into(),
        key: "push:per-event@1:app-push:o-9:u-9".into(),
        window_ms: 3_600_000,
        payload: payload("device-9", "Your order shipped"),
        category: None,
    }));
    let sms_key = "push:per-event@1:sms:o-9:u-9";
    let t = env.accept("sms", "o-9:u-9", &p).await;
    env.wait_status(&t, TaskStatus::Failed).await;
    let task = env.permits.task(&t).await.unwrap().unwrap();
    assert!(task.last_error.unwrap().contains("AMOUNT_NOT_ENOUGH"));
    assert_eq!(
        env.permits.permit_owner(sms_key).await.unwrap(),
        None,
        "permit released"
    );
    let fb = env
        .permits
        .permit_owner("push:per-event@1:app-push:o-9:u-9")
        .await
        .unwrap()
        .expect("fallback accepted");
    env.wait_status(&fb, TaskStatus::Sent).await;
    assert!(env.ledger("sms").is_empty());
    let push = env.ledger("app-push");
    assert_eq!(push.len(), 1);
    assert_eq!(push[0].recipient, "device-9");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fcm_on_unknown_resend_sends_again() {
    // FCM has neither a reference nor a query: `on_unknown = "resend"` is the
    // operator accepting a possible second push. (WeChat, the channel this
    // test used, now dedupes a resend by client_msg_id inside 10 minutes.)
    let env = Env::start(|c| {
        c.get_mut("app-push").unwrap().on_unknown = OnUnknown::Resend;
    })
    .await;
    env.sim.set_faults(
        "app-push",
        Faults {
            drop_after_accept: 1.0,
            ..Faults::default()
        },
    );
    let t = env
        .accept("app-push", "r-0", &payload("device-r", "TPL"))
        .await;
    wait_until(DEADLINE, || async { env.ledger("app-push").len() >= 2 })
        .await
        .expect("resent after unknown, as configured");
    env.sim.set_faults("app-push", Faults::default());
    env.wait_status(&t, TaskStatus::Sent).await;
    env.stop().await;
}

fn message(key: &str) -> Message {
    Message {
        task_id: "t-1".into(),
        idempotency_key: key.into(),
        recipient: "user-x".into(),
        template: "T".into(),
        params: vec![],
        attempt: 1,
    }
}

/// Sends one inbox message through a channel instance configured by `tweak`.
async fn inbox_send(
    sim: &Sim,
    tweak: impl FnOnce(&mut ChannelConfig),
) -> (
    Result<pushonce::plugin::bindings::Receipt, SendError>,
    Vec<String>,
) {
    let mut chans = sim.channels();
    tweak(chans.get_mut("inbox").unwrap());
    let sender = sender(sim, &chans);
    let inst = sender.instance("inbox", None).unwrap();
    let answer = inst
        .send(message("k-1"))
        .await
        .expect("the call itself works");
    (answer.value, answer.log.denied)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbound_policy_refuses_hosts_off_the_allowlist() {
    let sim = sim().await;
    let port = sim.addr.port();

    // Allowed by IP literal: reaches the simulator.
    let (ok, denied) = inbox_send(&sim, |_| {}).await;
    assert!(ok.is_ok(), "{ok:?}");
    assert!(denied.is_empty());

    // Another loopback address, not on the list: refused, and the plugin says so.
    let (res, denied) = inbox_send(&sim, |c| {
        c.settings
            .insert("endpoint".into(), format!("https://127.0.0.2:{port}"));
    })
    .await;
    match res {
        // Contract 2's SDK: a refusal by the outbound policy is permanent
        // (an operator must change `allowed_hosts`; retrying cannot help).
        Err(SendError::Permanent(m)) => assert!(m.contains("denied"), "{m}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert!(
        denied[0].contains("not in the channel's allowed_hosts"),
        "{denied:?}"
    );

    // Only names listed: `localhost` resolves to loopback and is refused...
    let (res, denied) = inbox_send(&sim, |c| {
        c.settings
            .insert("endpoint".into(), format!("https://localhost:{port}"));
        c.allowed_hosts = vec![format!("localhost:{port}")];
    })
    .await;
    assert!(
        matches!(&res, Err(SendError::Permanent(m)) if m.contains("denied")),
        "{res:?}"
    );
    assert!(denied[0].contains("loopback"), "{denied:?}");

    // ...unless the operator allows private addresses.
    let (res, _) = inbox_send(&sim, |c| {
        c.settings
            .insert("endpoint".into(), format!("https://localhost:{port}"));
        c.allowed_hosts = vec![format!("localhost:{port}")];
        c.allow_private = true;
    })
    .await;
    assert!(res.is_ok(), "{res:?}");
    assert_eq!(
        sim.state.ledger()["inbox"].len(),
        1,
        "the refused calls sent nothing"
    );
}

/// A registry on `runtime` holding build `build` of the inbox plugin
/// (its file written into `dir`), as a reload on that runtime loads it.
fn inbox_build(runtime: &Arc<PluginRuntime>, dir: &Path, build: u32) -> Arc<PluginRegistry> {
    let original = std::fs::read(real("inbox")).unwrap();
    let file = dir.join(format!("inbox-{build}.wasm"));
    std::fs::write(&file, another_build(&original, build)).unwrap();
    let mut registry = PluginRegistry::with_runtime(runtime.clone(), None);
    if let Err(e) = registry.load_file(&file) {
        panic!("build {build} is refused: {e}");
    }
    Arc::new(registry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_plugin_replaced_more_times_than_the_pool_has_slots_still_sends() {
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    // One engine for every build, as a host keeps it across its reloads,
    // with 4 instance slots: an instance kept for a replaced build would
    // hold one of them for good.
    let small_pool = Limits {
        pool_slots: 4,
        ..limits()
    };
    let runtime = PluginRuntime::new(&small_pool).unwrap();
    let current = Arc::new(Mutex::new(inbox_build(&runtime, dir.path(), 0)));
    let in_force = current.clone();
    let sender = sender_over(&sim, &sim.channels(), move || {
        in_force.lock().unwrap().clone()
    });
    let builds = 8;
    for build in 1..=builds {
        *current.lock().unwrap() = inbox_build(&runtime, dir.path(), build);
        let inst = sender.instance("inbox", None).unwrap();
        let answer = inst.send(message(&format!("k-{build}"))).await;
        assert!(
            matches!(&answer, Ok(a) if a.value.is_ok()),
            "build {build}: {answer:?}"
        );
    }
    assert_eq!(sim.state.ledger()["inbox"].len(), builds as usize);
}
