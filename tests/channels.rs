//! Channels end to end, in process: real redis-server, the real provider
//! simulator on 127.0.0.1 (`provider_sim::run`), the real channel plugins built
//! by `build.rs`, the dispatcher sending through `PluginSender`. Counts are
//! made at the receiving end — the simulator's ledger. Receipts come from the
//! simulator itself, posted to a minimal route that calls `handle_callback`.
//! The setup is shared with `reconcile.rs` (`pushonce_tests::channels`).

use std::sync::{Arc, Mutex};

use provider_sim::{Delivery, Faults, ReceiptConfig};
use pushonce::config::{ChannelConfig, OnUnknown};
use pushonce::permit::{Permits, TaskStatus};
use pushonce::plugin::bindings::{Message, SendError};
use pushonce::send::Fallback;
use pushonce::send::plugin::PluginSender;
use pushonce::send::receipts::{ReceiptError, ReceiptReport, handle_callback};
use pushonce_tests::channels::{DEADLINE, Env, Sim, payload, sender, sim};
use pushonce_tests::wait_until;

/// A provider's `POST` of `body` to `channel`'s callback URL, handled by
/// its plugin; ids matching no task are unmatched at once (no grace).
async fn apply_receipts(
    permits: &Permits,
    sender: &PluginSender,
    channel: &str,
    body: &[u8],
) -> Result<ReceiptReport, ReceiptError> {
    let req = pushonce::plugin::bindings::CallbackRequest {
        method: "POST".into(),
        path: String::new(),
        query: String::new(),
        headers: vec![("content-type".into(), "application/json".into())],
        body: body.to_vec(),
    };
    let zero = std::time::Duration::ZERO;
    Ok(handle_callback(permits, sender, channel, req, zero)
        .await?
        .report)
}

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
    for provider in ["inbox", "sms", "app-push"] {
        env.sim.set_faults(
            provider,
            Faults {
                fail_5xx: 0.1,
                fail_429: 0.1,
                ..Faults::default()
            },
        );
    }
    let mut tasks = Vec::new();
    for i in 0..10 {
        for channel in ["inbox", "sms", "app-push"] {
            let t = env
                .accept(channel, &format!("o-{i}"), &payload(&format!("r-{i}"), "T"))
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
async fn accept_then_drop_never_doubles_and_wechat_is_held() {
    let env = Env::start(|_| {}).await;
    for provider in ["inbox", "sms", "wechat"] {
        env.sim.set_faults(
            provider,
            Faults {
                drop_after_accept: 1.0,
                ..Faults::default()
            },
        );
    }
    env.sim.set_faults(
        "app-push",
        Faults {
            drop_after_accept: 0.5,
            ..Faults::default()
        },
    );
    let mut sent = Vec::new();
    for i in 0..4 {
        for channel in ["inbox", "sms", "app-push"] {
            sent.push(
                env.accept(channel, &format!("d-{i}"), &payload(&format!("r-{i}"), "T"))
                    .await,
            );
        }
    }
    let wechat = env
        .accept("wechat", "d-0", &payload("openid-d", "TPL"))
        .await;
    for t in &sent {
        env.wait_status(t, TaskStatus::Sent).await;
    }
    env.wait_status(&wechat, TaskStatus::Unknown).await;
    for provider in ["inbox", "sms", "app-push"] {
        assert_eq!(
            env.ledger(provider).len(),
            4,
            "{provider}: one message each"
        );
    }
    assert_eq!(env.ledger("wechat").len(), 1);
    // Held, not resent: the attempt count stays at one.
    let task = env.permits.task(&wechat).await.unwrap().unwrap();
    assert_eq!(task.attempts, 1, "{task:?}");
    assert!(env.permits.permit_owner(&task.key).await.unwrap().is_some());
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechat_on_unknown_resend_sends_again() {
    let env = Env::start(|c| {
        c.get_mut("wechat").unwrap().on_unknown = OnUnknown::Resend;
    })
    .await;
    env.sim.set_faults(
        "wechat",
        Faults {
            drop_after_accept: 1.0,
            ..Faults::default()
        },
    );
    let t = env
        .accept("wechat", "r-0", &payload("openid-r", "TPL"))
        .await;
    wait_until(DEADLINE, || async { env.ledger("wechat").len() >= 2 })
        .await
        .expect("resent after unknown, as configured");
    env.sim.set_faults("wechat", Faults::default());
    env.wait_status(&t, TaskStatus::Sent).await;
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechat_token_expiry_mid_run_loses_and_doubles_nothing() {
    let env = Env::start(|_| {}).await;
    let mut tasks = Vec::new();
    for i in 0..6 {
        tasks.push(
            env.accept(
                "wechat",
                &format!("w-{i}"),
                &payload(&format!("openid-{i}"), "TPL"),
            )
            .await,
        );
    }
    for t in &tasks {
        env.wait_status(t, TaskStatus::Sent).await;
    }
    assert!(env.sim.state.expire_tokens() >= 1);
    for i in 6..12 {
        tasks.push(
            env.accept(
                "wechat",
                &format!("w-{i}"),
                &payload(&format!("openid-{i}"), "TPL"),
            )
            .await,
        );
    }
    for t in &tasks {
        env.wait_status(t, TaskStatus::Sent).await;
    }
    let ledger = env.ledger("wechat");
    assert_eq!(ledger.len(), 12);
    let stats = env.sim.state.stats();
    assert!(
        stats.get("wechat.expired_token").copied().unwrap_or(0) >= 1,
        "{stats:?}"
    );
    assert!(
        stats.get("wechat.token").copied().unwrap_or(0) >= 2,
        "{stats:?}"
    );
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
            .insert("endpoint".into(), format!("http://localhost:{port}"));
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
            .insert("endpoint".into(), format!("http://localhost:{port}"));
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_settle_tasks_and_failed_after_accept_falls_back() {
    let env = Env::start(|_| {}).await;
    let receipts_sender = sender(&env.sim, &env.sim.channels());
    let inbox = env.accept("inbox", "rc-1", &payload("user-rc", "T")).await;
    let mut p = payload("+8613800000077", "SMS_1001");
    p.fallback = Some(Box::new(Fallback {
        channel: "app-push".into(),
        key: "push:per-event@1:app-push:rc-2".into(),
        window_ms: 3_600_000,
        payload: payload("device-rc", "Shipped"),
    }));
    let sms = env.accept("sms", "rc-2", &p).await;
    env.wait_status(&inbox, TaskStatus::Sent).await;
    env.wait_status(&sms, TaskStatus::Sent).await;

    // Inbox receipts name the reference (the idempotency key).
    let key = env.permits.task(&inbox).await.unwrap().unwrap().key;
    let body = format!(r#"{{"receipts":[{{"reference":"{key}","status":"delivered"}}]}}"#);
    let report = apply_receipts(&env.permits, &receipts_sender, "inbox", body.as_bytes())
        .await
        .unwrap();
    assert_eq!(report.updated, 1, "{report:?}");
    assert_eq!(env.status(&inbox).await, Some(TaskStatus::Delivered));

    // SMS receipts name the provider's BizId; failed after accept → fallback.
    let biz_id = env.ledger("sms")[0].id.clone();
    let body = format!(r#"{{"receipts":[{{"message_id":"{biz_id}","status":"failed"}}]}}"#);
    for _ in 0..2 {
        // Applying the same callback twice changes nothing more.
        apply_receipts(&env.permits, &receipts_sender, "sms", body.as_bytes())
            .await
            .unwrap();
    }
    assert_eq!(env.status(&sms).await, Some(TaskStatus::Failed));
    let fb = env
        .permits
        .permit_owner("push:per-event@1:app-push:rc-2")
        .await
        .unwrap()
        .expect("fallback accepted");
    env.wait_status(&fb, TaskStatus::Sent).await;
    assert_eq!(env.ledger("app-push").len(), 1);

    // A malformed callback is refused with the plugin's reason.
    let err = apply_receipts(&env.permits, &receipts_sender, "sms", b"not json")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not JSON"), "{err}");
    env.stop().await;
}

/// What the test's receipts route did with each callback.
#[derive(Debug, Clone)]
struct Callback {
    channel: String,
    status: u16,
    report: Option<ReceiptReport>,
}

/// A minimal stand-in for the API's `POST /v1/receipts/{channel}` on
/// 127.0.0.1: checks the bearer secret, forwards to `handle_callback`. It
/// answers 503 when an entry names no task yet or a task not yet `sent`, so
/// the simulator retries: a receipt can outrun the dispatcher's recording
/// of the send it reports.
async fn receipts_route(
    permits: Permits,
    sender: PluginSender,
    secret: &'static str,
) -> (String, Arc<Mutex<Vec<Callback>>>) {
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    type Ctx = (Permits, Arc<PluginSender>, Arc<Mutex<Vec<Callback>>>);
    let log: Arc<Mutex<Vec<Callback>>> = Arc::default();
    let app = axum::Router::new()
        .route(
            "/v1/receipts/{channel}",
            axum::routing::post(
                move |State((permits, sender, log)): State<Ctx>,
                      Path(channel): Path<String>,
                      headers: HeaderMap,
                      body: axum::body::Bytes| async move {
                    let auth = headers.get("authorization").and_then(|v| v.to_str().ok());
                    let (status, report) = if auth != Some(&format!("Bearer {secret}")) {
                        (StatusCode::UNAUTHORIZED, None)
                    } else {
                        match apply_receipts(&permits, &sender, &channel, &body).await {
                            Ok(r)
                                if r.unmatched.is_empty()
                                    && r.not_yet.is_empty()
                                    && r.ignored == 0 =>
                            {
                                (StatusCode::OK, Some(r))
                            }
                            Ok(r) => (StatusCode::SERVICE_UNAVAILABLE, Some(r)),
                            Err(ReceiptError::Permit(_)) => (StatusCode::SERVICE_UNAVAILABLE, None),
                            Err(_) => (StatusCode::UNPROCESSABLE_ENTITY, None),
                        }
                    };
                    log.lock().unwrap().push(Callback {
                        channel,
                        status: status.as_u16(),
                        report,
                    });
                    status
                },
            ),
        )
        .with_state((permits, Arc::new(sender), log.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (base, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_receipts_deliver_tasks_and_failed_after_accept_falls_back() {
    const SECRET: &str = "receipt-secret";
    let env = Env::start(|_| {}).await;
    let (base, callbacks) =
        receipts_route(env.permits.clone(), sender(&env.sim, &env.sim.channels()), SECRET).await;
    let failing_phone = "+8613800000088";
    for provider in ["inbox", "sms", "app-push", "wechat"] {
        env.sim.state.set_receipts(
            provider,
            Some(ReceiptConfig {
                url: format!("{base}/v1/receipts/{provider}"),
                delay_ms: 200,
                secret: Some(SECRET.into()),
                fail_after_accept: [failing_phone.to_string()].into(),
            }),
        );
    }

    let mut delivered = Vec::new();
    for (channel, recipient, template) in [
        ("inbox", "user-rx", "order-shipped"),
        ("sms", "+8613800000001", "SMS_1001"),
        ("app-push", "device-rx", "Shipped"),
        ("wechat", "openid-rx", "TPL-SHIPPED"),
    ] {
        delivered.push(
            env.accept(channel, "rx-1", &payload(recipient, template))
                .await,
        );
    }
    let mut p = payload(failing_phone, "SMS_1001");
    p.fallback = Some(Box::new(Fallback {
        channel: "app-push".into(),
        key: "push:per-event@1:app-push:rx-2".into(),
        window_ms: 3_600_000,
        payload: payload("device-fb", "Shipped"),
    }));
    let failing = env.accept("sms", "rx-2", &p).await;

    // Accepted by the providers, then settled by their receipts alone.
    for t in &delivered {
        env.wait_status(t, TaskStatus::Delivered).await;
    }
    env.wait_status(&failing, TaskStatus::Failed).await;
    let fb = env
        .permits
        .permit_owner("push:per-event@1:app-push:rx-2")
        .await
        .unwrap()
        .expect("the failed-after-accept SMS accepted its fallback");
    // The fallback push is itself accepted, then delivered by its receipt.
    env.wait_status(&fb, TaskStatus::Delivered).await;

    let sms = env.ledger("sms");
    assert_eq!(sms.len(), 2, "{sms:?}");
    assert_eq!(
        sms.iter()
            .find(|m| m.recipient == failing_phone)
            .map(|m| m.delivery),
        Some(Delivery::Failed)
    );
    let push = env.ledger("app-push");
    assert_eq!(push.len(), 2, "one direct push, one fallback: {push:?}");
    assert_eq!(
        push.iter().filter(|m| m.recipient == "device-fb").count(),
        1,
        "exactly one fallback push: {push:?}"
    );
    assert_eq!(env.ledger("inbox").len(), 1);
    assert_eq!(env.ledger("wechat").len(), 1);

    let task = env.permits.task(&failing).await.unwrap().unwrap();
    assert_eq!(
        task.attempts, 1,
        "failed after accept is not resent: {task:?}"
    );
    // Counted once the simulator has read the route's answer.
    let posted = || {
        let stats = env.sim.state.stats();
        ["inbox", "sms", "app-push", "wechat"]
            .iter()
            .map(|p| {
                stats
                    .get(&format!("{p}.receipt_posted"))
                    .copied()
                    .unwrap_or(0)
            })
            .sum::<u64>()
    };
    wait_until(DEADLINE, || async { posted() == 6 })
        .await
        .unwrap_or_else(|_| panic!("six receipts posted: {:?}", env.sim.state.stats()));
    let callbacks = callbacks.lock().unwrap().clone();
    assert!(
        callbacks.iter().all(|c| c.status != 401 && c.status != 422),
        "{callbacks:#?}"
    );
    let fallbacks: usize = callbacks
        .iter()
        .filter_map(|c| c.report.as_ref())
        .map(|r| r.fallbacks)
        .sum();
    assert_eq!(fallbacks, 1, "{callbacks:#?}");
    assert!(
        callbacks
            .iter()
            .any(|c| c.channel == "wechat" && c.status == 200)
    );
    env.stop().await;
}
