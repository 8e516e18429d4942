//! Each real channel plugin against the provider simulator over TLS
//! (issue 13, "Tests"): success, every error class, token refresh, callback
//! signatures, Aliyun's query (visible, lagging, absent), and that a cut-off
//! answer on a provider without a reference never becomes a second message.
//! Real redis-server, the real plugins built by `build.rs`, the dispatcher
//! and the reconciler in process (`pushonce_tests::channels::Env`); counts are
//! made where a user would see them — the simulator's ledger.
//!
//! Provider callbacks reach a minimal stand-in for the host's
//! `/v1/receipts/{channel}/{token}` (the path token checked, the request
//! handed whole to `handle_callback`, the plugin's reply returned), posted by
//! the simulator in each provider's own format.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use provider_sim::Faults;
use pushonce::config::ChannelConfig;
use pushonce::permit::{Permits, RetryPolicy, Task, TaskStatus};
use pushonce::plugin::bindings::{CallbackRequest, Message, Receipt, SendError};
use pushonce::send::plugin::{CallbackAccess, PluginSender};
use pushonce::send::receipts::{ReceiptError, handle_callback};
use pushonce::send::{Fallback, Payload};
use pushonce_tests::channels::{
    DEADLINE, Env, EnvOptions, cached_sender, fast_retry, one_attempt_then_reconcile, payload, sim,
};
use pushonce_tests::providers::{CHANNELS, Sim, TENCENT, WEBHOOK_ENDPOINT, start as start_sim};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;

// ---------------------------------------------------------------- helpers

/// A recipient `n` each provider accepts: a phone number for Aliyun, a
/// 64-hex-digit device token for APNs, the webhook endpoint's name.
fn recipient(channel: &str, n: u32) -> String {
    match channel {
        "sms" => format!("+86138{n:08}"),
        "apns" => format!("{n:064x}"),
        "webhook" => WEBHOOK_ENDPOINT.into(),
        "wechat" => format!("openid-{n}"),
        "app-push" => format!("fcm-token-{n}"),
        _ => format!("user-{n}"),
    }
}

/// A template of each provider's kind.
fn template(channel: &str) -> &'static str {
    match channel {
        "sms" => "SMS_1001",
        "wechat" => "TPL-SHIPPED",
        _ => "order-shipped",
    }
}

/// The six channels, by name.
fn channels() -> impl Iterator<Item = &'static str> {
    CHANNELS.iter().map(|(c, _, _)| *c)
}

/// Accepts one task on `channel` to recipient `n`.
async fn accept(env: &Env, channel: &str, key: &str, n: u32) -> String {
    let p = payload(&recipient(channel, n), template(channel));
    env.accept(channel, key, &p).await
}

/// The task, which must exist.
async fn task(permits: &Permits, id: &str) -> Task {
    permits.task(id).await.unwrap().expect("the task exists")
}

/// Waits until the task is `sent` or `delivered` (receipts may be quick).
async fn wait_settled(env: &Env, t: &str) {
    let done = wait_until(DEADLINE, || async {
        matches!(
            env.status(t).await,
            Some(TaskStatus::Sent | TaskStatus::Delivered)
        )
    })
    .await;
    if done.is_err() {
        panic!("never sent: {:?}", task(&env.permits, t).await);
    }
}

/// Every send to the provider is accepted, then its answer cut off.
fn cut_after_accept() -> Faults {
    Faults {
        drop_after_accept: 1.0,
        ..Faults::default()
    }
}

/// Every send is cut off before the provider took it.
fn cut_before_accept() -> Faults {
    Faults {
        drop_before_accept: 1.0,
        ..Faults::default()
    }
}

/// Sends one message straight through `channel`'s plugin (the host's call,
/// no dispatcher).
async fn send_now(sender: &PluginSender, channel: &str, key: &str) -> Result<Receipt, SendError> {
    let msg = Message {
        task_id: format!("t-{key}"),
        idempotency_key: format!("push:per-event@1:{channel}:{key}"),
        recipient: recipient(channel, 1),
        template: template(channel).into(),
        params: vec![("order".into(), key.into())],
        attempt: 1,
    };
    let inst = sender.instance(channel, None).unwrap();
    inst.send(msg).await.expect("the plugin call works").value
}

/// A simulator stat (`provider.outcome`), 0 when never counted.
fn stat(sim: &Sim, name: &str) -> u64 {
    sim.state.stats().get(name).copied().unwrap_or(0)
}

// ------------------------------------------------ the test's receipts route

/// What the receipts route shares with its handler.
#[derive(Clone)]
struct Route {
    permits: Permits,
    sender: Arc<PluginSender>,
}

/// Serves `/v1/receipts/{channel}/{token}[/rest]` for `env` on 127.0.0.1, as
/// the host does: a wrong or missing path token is 404; a request that names
/// a send not recorded yet is 503 (the provider posts it again); a refused
/// one 403/400; else the plugin's reply. Returns `http://127.0.0.1:PORT`.
async fn serve_receipts(env: &Env) -> String {
    let route = Route {
        permits: env.permits.clone(),
        sender: env.sender.clone(),
    };
    let app = axum::Router::new()
        .route(
            "/v1/receipts/{channel}/{*rest}",
            axum::routing::any(receipt),
        )
        .with_state(route);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

async fn receipt(
    State(route): State<Route>,
    Path((channel, rest)): Path<(String, String)>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (token, path) = rest.split_once('/').unwrap_or((&rest, ""));
    if route.sender.callback_access(&channel) != Some(CallbackAccess::Token(token)) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let req = CallbackRequest {
        method: method.to_string(),
        path: path.into(),
        query: query.unwrap_or_default(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
            .collect(),
        body: body.to_vec(),
    };
    let grace = Duration::from_secs(30);
    match handle_callback(&route.permits, &route.sender, &channel, req, grace).await {
        Ok(done) if !done.report.not_yet.is_empty() => {
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
        Ok(done) => {
            let status = StatusCode::from_u16(done.reply.status).unwrap();
            (status, done.reply.body).into_response()
        }
        Err(ReceiptError::Forbidden { .. }) => StatusCode::FORBIDDEN.into_response(),
        Err(ReceiptError::Malformed { .. }) => StatusCode::BAD_REQUEST.into_response(),
        Err(ReceiptError::Permit(_)) => StatusCode::SERVICE_UNAVAILABLE.into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

// ------------------------------------------------------------ capabilities

/// What each provider's documentation supports; every row cites it. The
/// host resends after an unknown outcome only on what this table says.
struct Documented {
    channel: &'static str,
    honours_reference: bool,
    /// `Some(bound)`: the reference window must be `Some(w)` with `w <= bound`.
    window_at_most: Option<u32>,
    can_query: bool,
    query_lag_secs: u32,
    callbacks: bool,
    source: &'static str,
}

const DOCUMENTED: [Documented; 6] = [
    // SendSms is not idempotent (OutId is only echoed back); QuerySendDetails
    // finds a message after an undocumented lag (the setting, 1 s in the
    // harness); SmsReport pushes receipts.
    Documented {
        channel: "sms",
        honours_reference: false,
        window_at_most: None,
        can_query: true,
        query_lag_secs: 1,
        callbacks: true,
        source: "https://help.aliyun.com/zh/sms/developer-reference/api-dysmsapi-2017-05-25-querysenddetails",
    },
    // client_msg_id: "对于同一个openid + client_msg_id, 只发送一条消息,10分钟有效";
    // no status query; TEMPLATESENDJOBFINISH events.
    Documented {
        channel: "wechat",
        honours_reference: true,
        window_at_most: Some(600),
        can_query: false,
        query_lag_secs: 0,
        callbacks: true,
        source: "https://developers.weixin.qq.com/doc/offiaccount/Message_Management/Template_Message_Interface.html",
    },
    // The Message resource has no idempotency field; no status query, no callbacks.
    Documented {
        channel: "app-push",
        honours_reference: false,
        window_at_most: None,
        can_query: false,
        query_lag_secs: 0,
        callbacks: false,
        source: "https://firebase.google.com/docs/reference/fcm/rest/v1/projects.messages/send",
    },
    // apns-id is only echoed back; no status query, no callbacks.
    Documented {
        channel: "apns",
        honours_reference: false,
        window_at_most: None,
        can_query: false,
        query_lag_secs: 0,
        callbacks: false,
        source: "https://developer.apple.com/documentation/usernotifications/sending-notification-requests-to-apns",
    },
    // The spec advises receivers to dedupe on webhook-id ("save the IDs in
    // redis for 5 minutes"); declared only when the operator sets
    // `dedupe_window`, as the harness does for the simulated receiver
    // (without it: `a_webhook_receiver_not_declared_to_dedupe_…`).
    Documented {
        channel: "webhook",
        honours_reference: true,
        window_at_most: Some(300),
        can_query: false,
        query_lag_secs: 0,
        callbacks: false,
        source: "https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md",
    },
    // Our own service: Idempotency-Key for good, status by key, receipts
    // (its contract is the inbox plugin's module doc).
    Documented {
        channel: "inbox",
        honours_reference: true,
        window_at_most: None,
        can_query: true,
        query_lag_secs: 0,
        callbacks: true,
        source: "plugins/channels/inbox/src/lib.rs",
    },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_capabilities_are_what_the_provider_documentation_says() {
    let sim = sim().await;
    let redis = RedisServer::start().await.unwrap();
    let sender = cached_sender(&sim, &sim.channels(), &redis).await;
    assert_eq!(DOCUMENTED.len(), CHANNELS.len(), "one row per channel");
    for doc in &DOCUMENTED {
        let caps = sender.capabilities(doc.channel, None).await.unwrap();
        let row = format!("{} ({}): {caps:?}", doc.channel, doc.source);
        assert_eq!(caps.honours_reference, doc.honours_reference, "{row}");
        assert_eq!(caps.can_query, doc.can_query, "{row}");
        assert_eq!(caps.query_lag_secs, doc.query_lag_secs, "{row}");
        assert_eq!(caps.callbacks, doc.callbacks, "{row}");
        match doc.window_at_most {
            Some(bound) => assert!(
                caps.reference_window_secs.is_some_and(|w| w <= bound),
                "a bounded window: {row}"
            ),
            None if doc.honours_reference => {
                assert_eq!(caps.reference_window_secs, None, "for good: {row}")
            }
            None => {}
        }
    }
}

// ----------------------------------------------------------------- success

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_provider_takes_one_message_and_the_task_records_its_id() {
    let env = Env::start(|_| {}).await;
    let mut tasks = Vec::new();
    for channel in channels() {
        tasks.push((channel, accept(&env, channel, "ok-1", 1).await));
    }
    for (channel, t) in &tasks {
        env.wait_status(t, TaskStatus::Sent).await;
        let ledger = env.ledger(channel);
        assert_eq!(ledger.len(), 1, "{channel}: {ledger:?}");
        assert_eq!(ledger[0].recipient, recipient(channel, 1), "{channel}");
        // FCM's id is the message's resource name, `projects/p/messages/<id>`.
        let id = task(&env.permits, t).await.provider_message_id;
        assert!(
            id.as_deref().is_some_and(|id| id.ends_with(&ledger[0].id)),
            "{channel}: the provider's id is kept for receipts: {id:?} {ledger:?}"
        );
    }
    env.stop().await;
}

// ------------------------------------------------------------ error classes

/// Each provider's code for "never, for this recipient".
fn permanent_code(channel: &str) -> &'static str {
    match channel {
        "sms" => "isv.AMOUNT_NOT_ENOUGH",
        "wechat" => "43004",
        "app-push" => "UNREGISTERED",
        "apns" => "Unregistered",
        "webhook" => "410",
        _ => "user deleted",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_refusal_fails_the_task_and_sends_its_fallback_once() {
    let env = Env::start(|_| {}).await;
    let mut tasks = Vec::new();
    for channel in channels() {
        let (refused, code) = (recipient(channel, 9), permanent_code(channel));
        let faults = Faults {
            permanent: [(refused.clone(), code.to_string())].into(),
            ..Faults::default()
        };
        env.sim.set_faults(channel, faults);
        // The inbox falls back to SMS, every other channel to the inbox.
        let fb_channel = if channel == "inbox" { "sms" } else { "inbox" };
        let fb_key = format!("push:per-event@1:{fb_channel}:fb-{channel}");
        let mut p = payload(&refused, template(channel));
        p.fallback = Some(Box::new(Fallback {
            channel: fb_channel.into(),
            key: fb_key.clone(),
            window_ms: 3_600_000,
            payload: payload(&recipient(fb_channel, 8), template(fb_channel)),
            category: None,
        }));
        let t = env.accept(channel, "perm-1", &p).await;
        tasks.push((channel, code, t, fb_key));
    }
    for (channel, code, t, fb_key) in &tasks {
        env.wait_status(t, TaskStatus::Failed).await;
        let task = task(&env.permits, t).await;
        let why = task.last_error.clone().unwrap_or_default();
        assert!(why.contains(code), "{channel}: {why}");
        assert_eq!(task.attempts, 1, "{channel}: not retried: {task:?}");
        let fb = env.permits.permit_owner(fb_key).await.unwrap();
        let fb = fb.unwrap_or_else(|| panic!("{channel}: no fallback accepted"));
        env.wait_status(&fb, TaskStatus::Sent).await;
    }
    for channel in channels() {
        let refused = recipient(channel, 9);
        let ledger = env.ledger(channel);
        assert!(ledger.iter().all(|m| m.recipient != refused), "{channel}");
    }
    assert_eq!(env.ledger("inbox").len(), 5, "one fallback per channel");
    assert_eq!(env.ledger("sms").len(), 1, "the inbox's fallback");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_answer_puts_the_next_attempt_after_it_then_one_message_is_sent() {
    // A schedule that would retry within 300 ms, capped at 10 s so that the
    // providers' `Retry-After: 2` is honoured.
    let options = EnvOptions {
        retry: RetryPolicy {
            max_delay: Duration::from_secs(10),
            ..fast_retry()
        },
        reconcile: None,
    };
    let env = Env::start_with(|_| {}, options).await;
    // 429 with Retry-After (a 5xx is ambiguous, not a retry: Aliyun's 503
    // is now settled by its query; its rate limit carries no Retry-After).
    let with_retry_after = ["app-push", "apns", "webhook", "inbox"];
    let mut tasks = Vec::new();
    for channel in with_retry_after {
        let faults = Faults {
            fail_429: 1.0,
            retry_after_secs: Some(2),
            ..Faults::default()
        };
        env.sim.set_faults(channel, faults);
        tasks.push((channel, accept(&env, channel, "ra-1", 1).await));
    }
    for (channel, t) in &tasks {
        env.wait_status(t, TaskStatus::RetryWait).await;
        let task = task(&env.permits, t).await;
        let (due, tried) = (task.next_due_ms.unwrap(), task.last_attempt_ms.unwrap());
        assert!(
            due >= tried + 2000,
            "{channel}: next attempt {}ms after the last: {task:?}",
            due - tried
        );
        env.sim.set_faults(channel, Faults::default());
    }
    for (channel, t) in &tasks {
        env.wait_status(t, TaskStatus::Sent).await;
        assert_eq!(env.ledger(channel).len(), 1, "{channel}");
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechat_busy_is_retried_and_sent_once() {
    let env = Env::start(|_| {}).await;
    // errcode -1 "system error" twice (WeChat sends no Retry-After).
    env.sim.set_faults(
        "wechat",
        Faults {
            fail_next: 2,
            ..Faults::default()
        },
    );
    let t = accept(&env, "wechat", "busy-1", 1).await;
    env.wait_status(&t, TaskStatus::Sent).await;
    assert_eq!(task(&env.permits, &t).await.attempts, 3);
    assert_eq!(env.ledger("wechat").len(), 1);
    env.stop().await;
}

// --------------------------------------------------- unknown after a cut-off

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_push_without_reference_is_held_and_never_sent_twice() {
    // FCM and APNs: no reference, no query, `on_unknown = "hold"`. The
    // reconciler cannot tell either, and gives up to an operator.
    let env = Env::start_with(|_| {}, one_attempt_then_reconcile(2)).await;
    let mut tasks = Vec::new();
    for channel in ["app-push", "apns"] {
        env.sim.set_faults(channel, cut_after_accept());
        tasks.push((channel, accept(&env, channel, "cut-1", 1).await));
    }
    for (channel, t) in &tasks {
        env.wait_status(t, TaskStatus::Dead).await;
        let task = task(&env.permits, t).await;
        assert_eq!(task.attempts, 1, "{channel}: never resent: {task:?}");
        let ledger = env.ledger(channel);
        assert_eq!(ledger.len(), 1, "{channel}: one message: {ledger:?}");
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_answer_is_resent_under_the_same_reference_and_the_provider_keeps_one() {
    // WeChat (client_msg_id, inside its 10 minutes) and webhooks
    // (webhook-id) dedupe a resend: the host resends at once.
    let env = Env::start(|_| {}).await;
    let mut tasks = Vec::new();
    for channel in ["wechat", "webhook"] {
        env.sim.set_faults(channel, cut_after_accept());
        tasks.push((channel, accept(&env, channel, "cut-2", 1).await));
    }
    for (channel, _) in &tasks {
        let resent = wait_until(DEADLINE, || async {
            env.ledger(channel).first().is_some_and(|m| m.replays > 0)
        })
        .await;
        assert!(
            resent.is_ok(),
            "{channel}: resent: {:?}",
            env.ledger(channel)
        );
        env.sim.set_faults(channel, Faults::default());
    }
    for (channel, t) in &tasks {
        wait_settled(&env, t).await;
        let ledger = env.ledger(channel);
        assert_eq!(ledger.len(), 1, "{channel}: one message: {ledger:?}");
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_inbox_message_is_found_by_its_key_and_not_resent() {
    let env = Env::start(|_| {}).await;
    env.sim.set_faults("inbox", cut_after_accept());
    let t = accept(&env, "inbox", "cut-3", 1).await;
    wait_settled(&env, &t).await;
    assert_eq!(task(&env.permits, &t).await.attempts, 1);
    let ledger = env.ledger("inbox");
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].replays, 0, "asked, not resent: {ledger:?}");
    env.stop().await;
}

// ---------------------------------- an ambiguous 5xx after the provider took it

/// The next send is taken by the provider, then answered with its usual
/// server error (WeChat `-1`, Aliyun 503 `ServiceUnavailable`, 5xx elsewhere).
fn error_after_accept() -> Faults {
    Faults {
        fail_next: 1,
        error_after_accept: 1.0,
        ..Faults::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_after_accept_is_resent_under_the_reference_or_found_by_key_and_the_user_gets_one() {
    // Issue 31, item 1: the 5xx is unknown, not "not sent". WeChat
    // (client_msg_id, inside its window) and webhooks (webhook-id) resend
    // under the reference, which the provider dedupes; the inbox is asked
    // by key and answers that it has the message.
    let env = Env::start(|_| {}).await;
    let mut tasks = Vec::new();
    for channel in ["wechat", "webhook", "inbox"] {
        env.sim.set_faults(channel, error_after_accept());
        tasks.push((channel, accept(&env, channel, "amb-1", 1).await));
    }
    for (channel, t) in &tasks {
        wait_settled(&env, t).await;
        let ledger = env.ledger(channel);
        assert_eq!(ledger.len(), 1, "{channel}: one message: {ledger:?}");
        let task = task(&env.permits, t).await;
        assert!(
            !task.fields.contains_key("possible_duplicate"),
            "{channel}: a deduped resend is no possible duplicate: {task:?}"
        );
        if *channel == "inbox" {
            assert_eq!(task.attempts, 1, "found by its key: {task:?}");
            assert_eq!(ledger[0].replays, 0, "not resent: {ledger:?}");
        } else {
            assert_eq!(task.attempts, 2, "{channel}: resent once: {task:?}");
            assert_eq!(ledger[0].replays, 1, "{channel}: deduped: {ledger:?}");
        }
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliyun_sms_5xx_after_accept_is_settled_by_the_query_without_a_second_sms() {
    let env = Env::start_with(|_| {}, one_attempt_then_reconcile(20)).await;
    env.sim.set_faults("sms", error_after_accept());
    let t = accept(&env, "sms", "amb-2", 1).await;
    wait_settled(&env, &t).await;
    let task = task(&env.permits, &t).await;
    assert_eq!(task.attempts, 1, "{task:?}");
    assert_eq!(stat(&env.sim, "aliyun-sms.5xx_after_accept"), 1);
    let ledger = env.ledger("sms");
    assert_eq!(ledger.len(), 1, "one SMS: {ledger:?}");
    assert!(stat(&env.sim, "aliyun-sms.query") >= 1);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_after_accept_on_a_push_without_reference_is_held_not_retried() {
    // FCM and APNs, `on_unknown = "hold"`: before issue 31 the 5xx was
    // retried, and the user got the push twice.
    let env = Env::start(|_| {}).await;
    let mut tasks = Vec::new();
    for channel in ["app-push", "apns"] {
        env.sim.set_faults(channel, error_after_accept());
        tasks.push((channel, accept(&env, channel, "amb-3", 1).await));
    }
    for (channel, t) in &tasks {
        env.wait_status(t, TaskStatus::Unknown).await;
        let task = task(&env.permits, t).await;
        assert_eq!(task.attempts, 1, "{channel}: not resent: {task:?}");
        let why = task.last_error.clone().unwrap_or_default();
        assert!(
            why.contains("503") || why.contains("Unavailable") || why.contains("UNAVAILABLE"),
            "{channel}: {why}"
        );
        let ledger = env.ledger(channel);
        assert_eq!(ledger.len(), 1, "{channel}: one message: {ledger:?}");
    }
    env.stop().await;
}

// ------------------------------------ WeChat answers that say nothing for sure

/// A WeChat task whose fallback goes to the inbox, under `fb_key`.
fn wechat_with_inbox_fallback(fb_key: &str) -> Payload {
    let mut p = payload(&recipient("wechat", 1), template("wechat"));
    p.fallback = Some(Box::new(Fallback {
        channel: "inbox".into(),
        key: fb_key.into(),
        window_ms: 3_600_000,
        payload: payload(&recipient("inbox", 8), template("inbox")),
        category: None,
    }));
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wechat_200_without_errcode_is_resent_under_its_client_msg_id_not_taken_as_sent() {
    // A proxy answering 200 `{}`: only errcode 0 says WeChat took the
    // message. Unknown, the task is resent under the same client_msg_id,
    // which WeChat dedupes: one message, and the id WeChat gave it.
    let env = Env::start(|_| {}).await;
    env.sim.set_faults(
        "wechat",
        Faults {
            empty_200_next: 1,
            ..Faults::default()
        },
    );
    let t = accept(&env, "wechat", "empty-200", 1).await;
    wait_settled(&env, &t).await;
    let ledger = env.ledger("wechat");
    assert_eq!(ledger.len(), 1, "one message: {ledger:?}");
    let task = task(&env.permits, &t).await;
    assert_eq!(
        ledger[0].replays, 1,
        "resent under the same client_msg_id, deduplicated: {ledger:?} {task:?}"
    );
    assert_eq!(task.attempts, 2, "{task:?}");
    assert_eq!(
        task.provider_message_id.as_deref(),
        Some(ledger[0].id.as_str()),
        "the msgid WeChat answered the resend with: {task:?}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlisted_wechat_errcode_to_a_replay_sends_no_fallback_and_the_user_gets_one() {
    // The first send is taken and its answer cut off; WeChat answers the
    // resend under the same client_msg_id with a code the plugin does not
    // know (what it answers there is undocumented). That is no refusal:
    // the first message arrived, so a fallback would be a second one.
    let env = Env::start(|_| {}).await;
    env.sim.set_faults(
        "wechat",
        Faults {
            drop_next: 1,
            replay_errcode: Some(99999),
            ..Faults::default()
        },
    );
    let fb_key = "push:per-event@1:inbox:fb-replay-code";
    let t = env
        .accept("wechat", "replay-code", &wechat_with_inbox_fallback(fb_key))
        .await;
    let replayed = wait_until(DEADLINE, || async {
        env.ledger("wechat").first().is_some_and(|m| m.replays >= 1)
    })
    .await;
    assert!(replayed.is_ok(), "{:?}", env.ledger("wechat"));
    // Answered 99999 to that replay; the next answers carry the msgid.
    env.sim.set_faults("wechat", Faults::default());
    wait_settled(&env, &t).await;
    let task = task(&env.permits, &t).await;
    assert!(task.attempts >= 3, "resent past the unknown code: {task:?}");
    let ledger = env.ledger("wechat");
    assert_eq!(ledger.len(), 1, "one message: {ledger:?}");
    assert_eq!(
        env.permits.permit_owner(fb_key).await.unwrap(),
        None,
        "no fallback: {task:?}"
    );
    assert!(env.ledger("inbox").is_empty(), "{:?}", env.ledger("inbox"));
    env.stop().await;
}

// ------------------------------------ a timeout after the provider took it

/// The channel gives up on an answer after 300 ms.
fn short_response_timeout(
    channel: &'static str,
) -> impl FnOnce(&mut BTreeMap<String, ChannelConfig>) {
    move |chans| {
        let c = chans.get_mut(channel).expect("the channel is configured");
        c.response_timeout = Duration::from_millis(300);
    }
}

/// The provider takes the message, then answers after 1.5 s.
fn answer_late() -> Faults {
    Faults {
        slow_after_accept_ms: 1500,
        ..Faults::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fcm_push_that_timed_out_after_fcm_took_it_is_held_not_resent() {
    // FCM has no reference and no query: a timeout may mean "sent", so the
    // task is held (`on_unknown = "hold"`), never resent blindly.
    let env = Env::start(short_response_timeout("app-push")).await;
    env.sim.set_faults("app-push", answer_late());
    let t = accept(&env, "app-push", "late-1", 1).await;
    env.wait_status(&t, TaskStatus::Unknown).await;
    let task = task(&env.permits, &t).await;
    assert_eq!(task.attempts, 1, "not resent: {task:?}");
    let ledger = env.ledger("app-push");
    assert_eq!(ledger.len(), 1, "FCM took it, once: {ledger:?}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wechat_send_that_timed_out_after_wechat_took_it_is_resent_and_deduplicated() {
    // The first answer comes after the channel gave up; the resend under
    // the same client_msg_id is answered at once, and WeChat dedupes it.
    let env = Env::start(short_response_timeout("wechat")).await;
    env.sim.set_faults("wechat", answer_late());
    let t = accept(&env, "wechat", "late-2", 1).await;
    let taken = wait_until(DEADLINE, || async { !env.ledger("wechat").is_empty() }).await;
    assert!(taken.is_ok(), "WeChat took the first send");
    // That answer is already delayed; the resend's is not.
    env.sim.set_faults("wechat", Faults::default());
    wait_settled(&env, &t).await;
    let task = task(&env.permits, &t).await;
    assert!(task.attempts >= 2, "resent after the timeout: {task:?}");
    let ledger = env.ledger("wechat");
    assert_eq!(ledger.len(), 1, "one message: {ledger:?}");
    assert!(
        ledger[0].replays >= 1,
        "the resend was deduplicated: {ledger:?}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_replay_while_the_first_request_is_in_flight_is_retried_and_no_fallback_is_sent() {
    // Issue 31, item 5: the inbox answers 409 to a replay of a key whose
    // first request is still being processed. That is no refusal: the
    // first may succeed (here it does), so the task retries, and its
    // fallback is never sent.
    let options = EnvOptions {
        retry: RetryPolicy {
            max_attempts: 60,
            ..fast_retry()
        },
        reconcile: None,
    };
    let env = Env::start_with(|_| {}, options).await;
    env.sim.set_faults(
        "inbox",
        Faults {
            slow_ms: 800,
            ..Faults::default()
        },
    );
    let ca = std::fs::read(env.sim.ca_file()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    // Another request with the task's key, in flight first.
    let first = tokio::spawn(
        client
            .post(format!("{}/inbox/v1/messages", env.sim.base()))
            .header("idempotency-key", "push:per-event@1:inbox:inflight-1")
            .json(&serde_json::json!({"user_id": recipient("inbox", 1), "template": template("inbox")}))
            .send(),
    );
    wait_until(DEADLINE, || async {
        stat(&env.sim, "inbox.in_flight") >= 1
    })
    .await
    .expect("the first request is in flight");
    let fb_key = "push:per-event@1:sms:fb-inflight-1";
    let mut p = payload(&recipient("inbox", 1), template("inbox"));
    p.fallback = Some(Box::new(Fallback {
        channel: "sms".into(),
        key: fb_key.into(),
        window_ms: 3_600_000,
        payload: payload(&recipient("sms", 8), template("sms")),
        category: None,
    }));
    let t = env.accept("inbox", "inflight-1", &p).await;
    assert_eq!(first.await.unwrap().unwrap().status(), 201);
    wait_settled(&env, &t).await;
    let task = task(&env.permits, &t).await;
    assert!(
        stat(&env.sim, "inbox.conflict") >= 1,
        "{:?}",
        env.sim.state.stats()
    );
    assert!(task.attempts >= 2, "retried after the 409: {task:?}");
    let ledger = env.ledger("inbox");
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(
        env.permits.permit_owner(fb_key).await.unwrap(),
        None,
        "no fallback"
    );
    assert!(env.ledger("sms").is_empty());
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_receiver_not_declared_to_dedupe_is_not_resent_after_a_cut_off() {
    // The receiver is the customer's server; the spec only advises it to
    // dedupe on webhook-id. Without the operator's `dedupe_window`, the
    // plugin declares no reference: a cut-off answer is held
    // (`on_unknown = "hold"`), not resent under the id.
    let env = Env::start(|chans| {
        let webhook = chans.get_mut("webhook").unwrap();
        webhook.settings.remove("dedupe_window");
    })
    .await;
    let caps = env.sender.capabilities("webhook", None).await.unwrap();
    assert!(!caps.honours_reference, "{caps:?}");
    env.sim.set_faults("webhook", cut_after_accept());
    let t = accept(&env, "webhook", "undeclared-1", 1).await;
    env.wait_status(&t, TaskStatus::Unknown).await;
    let task = task(&env.permits, &t).await;
    assert_eq!(task.attempts, 1, "not resent: {task:?}");
    let ledger = env.ledger("webhook");
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].replays, 0, "no resend reached it: {ledger:?}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_dedupe_window_that_is_not_seconds_fails_the_send_naming_it() {
    // A mistyped declaration is not read as some window: the channel
    // declares no reference and says what is wrong at the first send.
    let env = Env::start(|chans| {
        let webhook = chans.get_mut("webhook").unwrap();
        webhook
            .settings
            .insert("dedupe_window".to_string(), "5m".to_string());
    })
    .await;
    let caps = env.sender.capabilities("webhook", None).await.unwrap();
    assert!(!caps.honours_reference, "{caps:?}");
    let t = accept(&env, "webhook", "bad-window-1", 1).await;
    env.wait_status(&t, TaskStatus::Failed).await;
    let task = task(&env.permits, &t).await;
    let why = task.last_error.unwrap_or_default();
    assert!(
        why.contains("dedupe_window") && why.contains("5m"),
        "names it: {why}"
    );
    assert!(env.ledger("webhook").is_empty(), "nothing was sent");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_endpoint_answering_404_is_retried_and_only_410_stops() {
    // Issue 31, item 4: Standard Webhooks stops only on 410 Gone; 401, 404
    // and other 4xx are failures retried over the schedule.
    let env = Env::start(|_| {}).await;
    env.sim.set_faults(
        "webhook",
        Faults {
            permanent: [(WEBHOOK_ENDPOINT.to_string(), "404".to_string())].into(),
            ..Faults::default()
        },
    );
    let t = accept(&env, "webhook", "wh-404", 1).await;
    let retried = wait_until(DEADLINE, || async {
        task(&env.permits, &t).await.attempts >= 2
    })
    .await;
    assert!(retried.is_ok(), "{:?}", task(&env.permits, &t).await);
    env.sim.set_faults("webhook", Faults::default());
    wait_settled(&env, &t).await;
    assert_eq!(env.ledger("webhook").len(), 1);
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliyun_ram_permission_deny_fails_at_once_though_it_is_an_isp_code() {
    let env = Env::start(|_| {}).await;
    let refused = recipient("sms", 7);
    env.sim.set_faults(
        "sms",
        Faults {
            permanent: [(refused.clone(), "isp.RAM_PERMISSION_DENY".to_string())].into(),
            ..Faults::default()
        },
    );
    let t = env
        .accept("sms", "ram-1", &payload(&refused, template("sms")))
        .await;
    env.wait_status(&t, TaskStatus::Failed).await;
    let task = task(&env.permits, &t).await;
    assert_eq!(task.attempts, 1, "{task:?}");
    let why = task.last_error.unwrap_or_default();
    assert!(why.contains("RAM"), "names the cause: {why}");
    env.stop().await;
}

// ------------------------------------------------- Aliyun: query and its lag

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliyun_sms_cut_off_at_the_provider_is_settled_by_the_query_without_a_second_sms() {
    let env = Env::start_with(|_| {}, one_attempt_then_reconcile(20)).await;
    // Every send is cut off after Aliyun took it: a resend would show.
    env.sim.set_faults("sms", cut_after_accept());
    let t = accept(&env, "sms", "q-1", 1).await;
    wait_settled(&env, &t).await;
    let task = task(&env.permits, &t).await;
    assert_eq!(task.attempts, 1, "{task:?}");
    let ledger = env.ledger("sms");
    assert_eq!(ledger.len(), 1, "one SMS: {ledger:?}");
    assert!(stat(&env.sim, "aliyun-sms.query") >= 1);
    env.stop().await;
}

// Absent (cut off before Aliyun took it): resent once, past the query lag —
// `reconcile.rs`, `unknown_task_the_provider_never_got_is_resent_exactly_once`.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliyun_sms_is_never_resent_while_the_query_may_still_lag() {
    // A lag of an hour: every "not found" the reconciler gets is inside it.
    let env = Env::start_with(
        |c| {
            let sms = c.get_mut("sms").unwrap();
            sms.settings.insert("query_lag".into(), "3600".into());
        },
        one_attempt_then_reconcile(3),
    )
    .await;
    env.sim.set_faults("sms", cut_before_accept());
    let t = accept(&env, "sms", "q-3", 1).await;
    env.wait_status(&t, TaskStatus::Unknown).await;
    env.sim.set_faults("sms", Faults::default());
    // Asked three times, never believed absent: held for an operator.
    env.wait_status(&t, TaskStatus::Dead).await;
    let task = task(&env.permits, &t).await;
    assert_eq!(task.attempts, 1, "{task:?}");
    assert!(stat(&env.sim, "aliyun-sms.query") >= 3);
    assert!(env.ledger("sms").is_empty(), "no SMS sent");
    env.stop().await;
}

/// Neither a receipt nor the query can tell (the query fails): held, never
/// resent, though the channel is told to resend on doubt — an SMS Aliyun
/// cannot dedupe is not risked on a guess.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliyun_sms_is_held_not_resent_when_its_query_cannot_tell() {
    let env = Env::start_with(
        |c| {
            c.get_mut("sms").unwrap().on_unknown = pushonce::config::OnUnknown::Resend;
        },
        EnvOptions {
            retry: RetryPolicy {
                max_attempts: 3,
                ..fast_retry()
            },
            ..one_attempt_then_reconcile(3)
        },
    )
    .await;
    env.sim.set_faults(
        "sms",
        Faults {
            fail_queries: true,
            ..cut_before_accept()
        },
    );
    let t = accept(&env, "sms", "q-4", 1).await;
    env.wait_status(&t, TaskStatus::Unknown).await;
    // Asked until the reconciler gives up, never answered: held for an operator.
    env.wait_status(&t, TaskStatus::Dead).await;
    let task = task(&env.permits, &t).await;
    assert_eq!(task.attempts, 1, "{task:?}");
    assert!(
        stat(&env.sim, "aliyun-sms.query_5xx") >= 2,
        "asked more than once"
    );
    assert!(env.ledger("sms").is_empty(), "no SMS sent");
    env.stop().await;
}

// ----------------------------------------------------------- token refresh

/// The simulator, a Redis for the shared token cache, and a sender using it.
async fn with_token_cache() -> (Sim, RedisServer, PluginSender) {
    let sim = sim().await;
    let redis = RedisServer::start().await.unwrap();
    let sender = cached_sender(&sim, &sim.channels(), &redis).await;
    (sim, redis, sender)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechat_gets_a_new_token_when_its_cached_one_expired_and_sends() {
    let (sim, _redis, sender) = with_token_cache().await;
    send_now(&sender, "wechat", "tok-1").await.unwrap();
    send_now(&sender, "wechat", "tok-2").await.unwrap();
    assert_eq!(stat(&sim, "wechat.token"), 1, "one token serves both");
    assert!(sim.state.expire_tokens() >= 1);
    send_now(&sender, "wechat", "tok-3").await.unwrap();
    assert_eq!(stat(&sim, "wechat.expired_token"), 1);
    assert_eq!(stat(&sim, "wechat.token"), 2, "refreshed once");
    assert_eq!(sim.ledger("wechat").len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechat_gets_a_new_token_when_another_client_rotated_it_and_sends() {
    let (sim, _redis, sender) = with_token_cache().await;
    send_now(&sender, "wechat", "rot-1").await.unwrap();
    // Another client of the same account forces a new stable token: the
    // cached one is invalid from now on (errcode 40001).
    let creds = sim.state.credentials();
    let ca = reqwest::Certificate::from_pem(sim.state.ca_pem().as_bytes()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .unwrap();
    let body = serde_json::json!({
        "grant_type": "client_credential",
        "appid": creds.wechat_appid,
        "secret": creds.wechat_secret,
        "force_refresh": true,
    });
    let answer: serde_json::Value = client
        .post(format!("{}/cgi-bin/stable_token", sim.base()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(answer["access_token"].is_string(), "{answer}");
    send_now(&sender, "wechat", "rot-2").await.unwrap();
    assert_eq!(stat(&sim, "wechat.invalid_token"), 1);
    assert_eq!(sim.ledger("wechat").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fcm_refreshes_an_expired_oauth_token_once_and_sends() {
    let (sim, _redis, sender) = with_token_cache().await;
    send_now(&sender, "app-push", "oauth-1").await.unwrap();
    assert_eq!(stat(&sim, "fcm.token"), 1);
    assert!(sim.state.expire_tokens() >= 1);
    send_now(&sender, "app-push", "oauth-2").await.unwrap();
    assert_eq!(stat(&sim, "fcm.expired_token"), 1, "one 401");
    assert_eq!(stat(&sim, "fcm.token"), 2, "refreshed once");
    assert_eq!(sim.ledger("app-push").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apns_mints_a_new_provider_token_when_apple_calls_it_expired_and_sends() {
    // Apple refuses a provider token older than an hour; here the limit is
    // two seconds (and no minimum between token updates), so the token the
    // plugin shares for 50 minutes expires during the test.
    let sim = start_sim(provider_sim::Config {
        apns_token_max_age: Duration::from_secs(2),
        apns_min_token_interval: Duration::ZERO,
        ..provider_sim::Config::default()
    })
    .await;
    let redis = RedisServer::start().await.unwrap();
    let sender = cached_sender(&sim, &sim.channels(), &redis).await;
    send_now(&sender, "apns", "ptok-1").await.unwrap();
    // The token's `iat` is at most this second; APNs calls it expired once
    // more than two seconds older than that.
    let minted_by = unix_secs();
    wait_until(DEADLINE, || async { unix_secs() > minted_by + 2 })
        .await
        .expect("the clock passes the token's age limit");
    send_now(&sender, "apns", "ptok-2").await.unwrap();
    assert_eq!(
        stat(&sim, "apns.expired_token"),
        1,
        "one ExpiredProviderToken"
    );
    send_now(&sender, "apns", "ptok-3").await.unwrap();
    assert_eq!(
        stat(&sim, "apns.expired_token"),
        1,
        "the new token is shared"
    );
    assert_eq!(stat(&sim, "apns.bad_token"), 0, "no malformed token");
    assert_eq!(sim.ledger("apns").len(), 3, "each push once");
}

/// Seconds since the Unix epoch, the unit of a JWT's `iat`.
fn unix_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliyun_credential_errors_fail_at_once_and_name_the_setting_to_fix() {
    let env = Env::start(|chans| {
        let sms = chans["sms"].clone();
        let mut bad_id = sms.clone();
        bad_id
            .settings
            .insert("access_key_id".into(), "LTAI5tNoSuchKey0000000000".into());
        // Another credential's value: Aliyun recomputes the signature with
        // the account's real secret and finds a different one.
        let mut bad_secret = sms;
        bad_secret
            .secrets_from_env
            .insert("access_key_secret".into(), "TEST_WECHAT_SECRET".into());
        chans.insert("sms-bad-id".into(), bad_id);
        chans.insert("sms-bad-secret".into(), bad_secret);
    })
    .await;
    let cases = [
        ("sms-bad-id", "InvalidAccessKeyId", "check `access_key_id`"),
        (
            "sms-bad-secret",
            "SignatureDoesNotMatch",
            "check `access_key_secret`",
        ),
    ];
    for (channel, code, fix) in cases {
        let p = payload(&recipient("sms", 1), template("sms"));
        let t = env.accept(channel, "cred-1", &p).await;
        env.wait_status(&t, TaskStatus::Failed).await;
        let task = task(&env.permits, &t).await;
        let why = task.last_error.clone().unwrap_or_default();
        assert!(
            why.contains(code),
            "{channel}: names the provider's code: {why}"
        );
        assert!(
            why.contains(fix),
            "{channel}: names the setting to fix: {why}"
        );
        assert_eq!(task.attempts, 1, "{channel}: not retried: {task:?}");
    }
    assert_eq!(
        stat(&env.sim, "aliyun-sms.bad_signature"),
        2,
        "one refusal each"
    );
    assert!(env.ledger("sms").is_empty(), "no SMS with bad credentials");
    env.stop().await;
}

// ------------------------------------- templates and signs not approved

/// A message to `phone` with `template`, falling back to
/// one app push under key `fb_key`.
fn with_push_fallback(phone: &str, template: &str, fb_key: &str) -> Payload {
    let mut p = payload(phone, template);
    p.fallback = Some(Box::new(Fallback {
        channel: "app-push".into(),
        key: fb_key.into(),
        window_ms: 3_600_000,
        payload: payload(&recipient("app-push", 3), "order-shipped"),
        category: None,
    }));
    p
}

/// Waits for `failed`, checks it was tried once and its `last_error`
/// names `code` and `fix`, and that its fallback push was sent.
async fn fails_naming_and_falls_back(env: &Env, t: &str, code: &str, fix: &str, fb_key: &str) {
    env.wait_status(t, TaskStatus::Failed).await;
    let task = task(&env.permits, t).await;
    let why = task.last_error.clone().unwrap_or_default();
    assert!(why.contains(code), "names the provider's code: {why}");
    assert!(why.contains(fix), "says what to fix: {why}");
    assert_eq!(task.attempts, 1, "not retried: {task:?}");
    let fb = env.permits.permit_owner(fb_key).await.unwrap();
    env.wait_status(&fb.expect("fallback accepted"), TaskStatus::Sent)
        .await;
}

/// An Aliyun SMS whose template the account has not approved is refused
/// (`isv.SMS_TEMPLATE_ILLEGAL`), never sent: the task fails at once with the
/// code in `last_error`, and its fallback channel is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aliyun_sms_with_an_unapproved_template_fails_unsent_and_falls_back() {
    let env = Env::start(|_| {}).await;
    let fb_key = "push:per-event@1:app-push:unapproved-1";
    let p = with_push_fallback(&recipient("sms", 5), "SMS_404404", fb_key);
    let t = env.accept("sms", "unapproved-1", &p).await;
    fails_naming_and_falls_back(&env, &t, "isv.SMS_TEMPLATE_ILLEGAL", "template", fb_key).await;
    assert!(env.ledger("sms").is_empty(), "no SMS sent");
    assert_eq!(stat(&env.sim, "aliyun-sms.unapproved"), 1, "asked once");
    assert_eq!(env.ledger("app-push").len(), 1, "one fallback push");
    env.stop().await;
}

/// A Tencent SMS signed with a sign name the account has not approved is
/// refused per number (`FailedOperation.SignatureIncorrectOrUnapproved`),
/// never sent: the task fails at once naming the code and `sign_name`, and
/// its fallback channel is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tencent_sms_with_an_unapproved_sign_name_fails_unsent_and_falls_back() {
    let env = Env::start_with_sim(
        |sim, c| {
            let mut tencent = sim.tencent_channel();
            tencent
                .settings
                .insert("sign_name".into(), "NotOurSign".into());
            c.insert(TENCENT.0.into(), tencent);
        },
        EnvOptions::default(),
    )
    .await;
    let fb_key = "push:per-event@1:app-push:unapproved-2";
    let p = with_push_fallback("+8613800000006", "1110", fb_key);
    let t = env.accept(TENCENT.0, "unapproved-2", &p).await;
    fails_naming_and_falls_back(
        &env,
        &t,
        "FailedOperation.SignatureIncorrectOrUnapproved",
        "sign_name",
        fb_key,
    )
    .await;
    assert!(env.ledger(TENCENT.0).is_empty(), "no SMS sent");
    assert_eq!(stat(&env.sim, "tencent-sms.unapproved"), 1, "asked once");
    assert_eq!(env.ledger("app-push").len(), 1, "one fallback push");
    env.stop().await;
}

/// A WeChat message whose template the official account does not have is
/// refused (errcode 40037), never sent: the task fails at once naming the
/// code and what to fix, and its fallback channel is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wechat_message_with_a_template_the_account_lacks_fails_unsent_and_falls_back() {
    let env = Env::start(|_| {}).await;
    let fb_key = "push:per-event@1:app-push:wx-template-1";
    let p = with_push_fallback(&recipient("wechat", 5), "TPL-404", fb_key);
    let t = env.accept("wechat", "wx-template-1", &p).await;
    fails_naming_and_falls_back(&env, &t, "40037", "template library", fb_key).await;
    assert!(env.ledger("wechat").is_empty(), "no WeChat message sent");
    assert_eq!(stat(&env.sim, "wechat.template_refused"), 1, "asked once");
    assert_eq!(env.ledger("app-push").len(), 1, "one fallback push");
    env.stop().await;
}

/// A WeChat message whose params leave a keyword of its template without a
/// value is refused (errcode 47003), never sent: the task fails at once
/// naming the code and, in WeChat's words, the keyword, and its fallback
/// channel is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wechat_message_whose_data_lacks_a_keyword_fails_unsent_naming_it_and_falls_back() {
    let env = Env::start(|_| {}).await;
    // The account's one template uses keywords `order` and `eta`.
    let set = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://{}/_sim/wechat-templates", env.sim.control))
        .json(&serde_json::json!({"templates": {"WX_SHIPPED": ["order", "eta"]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200, "the simulator takes the template list");
    let fb_key = "push:per-event@1:app-push:wx-data-1";
    // Its params give `order` only.
    let p = with_push_fallback(&recipient("wechat", 6), "WX_SHIPPED", fb_key);
    let t = env.accept("wechat", "wx-data-1", &p).await;
    fails_naming_and_falls_back(&env, &t, "47003", "data.eta.value is empty", fb_key).await;
    assert!(env.ledger("wechat").is_empty(), "no WeChat message sent");
    assert_eq!(stat(&env.sim, "wechat.template_refused"), 1, "asked once");
    assert_eq!(env.ledger("app-push").len(), 1, "one fallback push");
    env.stop().await;
}

// --------------------------------------------------------------- callbacks

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_in_each_providers_format_settle_tasks_and_a_failed_sms_falls_back() {
    let env = Env::start(|_| {}).await;
    let base = serve_receipts(&env).await;
    let failing = recipient("sms", 77);
    env.sim.send_receipts_to(&base, 100, &[&failing]);
    let mut delivered = Vec::new();
    for channel in ["inbox", "sms", "wechat"] {
        delivered.push(accept(&env, channel, "rx-1", 1).await);
    }
    let mut p = payload(&failing, "SMS_1001");
    let fb_key = "push:per-event@1:app-push:rx-2";
    p.fallback = Some(Box::new(Fallback {
        channel: "app-push".into(),
        key: fb_key.into(),
        window_ms: 3_600_000,
        payload: payload(&recipient("app-push", 2), "order-shipped"),
        category: None,
    }));
    let failed = env.accept("sms", "rx-2", &p).await;

    for t in &delivered {
        env.wait_status(t, TaskStatus::Delivered).await;
    }
    env.wait_status(&failed, TaskStatus::Failed).await;
    let fb = env.permits.permit_owner(fb_key).await.unwrap();
    env.wait_status(&fb.expect("fallback accepted"), TaskStatus::Sent)
        .await;
    assert_eq!(task(&env.permits, &failed).await.attempts, 1);
    assert_eq!(env.ledger("sms").len(), 2, "no SMS resent");
    assert_eq!(env.ledger("app-push").len(), 1, "one fallback push");
    env.stop().await;
}

/// Seconds since the Unix epoch, now (WeChat's `timestamp`).
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A `TEMPLATESENDJOBFINISH` event for message `msgid`, as WeChat posts it.
fn wechat_event(openid: &str, msgid: &str) -> String {
    format!(
        "<xml><ToUserName><![CDATA[gh_test]]></ToUserName><FromUserName><![CDATA[{openid}]]></FromUserName>\
         <CreateTime>1700000000</CreateTime><MsgType><![CDATA[event]]></MsgType>\
         <Event><![CDATA[TEMPLATESENDJOBFINISH]]></Event><MsgID>{msgid}</MsgID>\
         <Status><![CDATA[success]]></Status></xml>"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wechat_event_with_a_forged_signature_is_refused_and_settles_nothing() {
    let env = Env::start(|_| {}).await;
    let base = serve_receipts(&env).await;
    let t = accept(&env, "wechat", "forged-1", 1).await;
    env.wait_status(&t, TaskStatus::Sent).await;
    let msgid = task(&env.permits, &t).await.provider_message_id.unwrap();
    let url = env.sim.callback_url(&base, "wechat");
    let client = reqwest::Client::new();
    let post = |query: String| {
        client
            .post(format!("{url}?{query}"))
            .header("content-type", "text/xml")
            .body(wechat_event(&recipient("wechat", 1), &msgid))
            .send()
    };

    let now = now_secs().to_string();
    let forged =
        format!("signature=0123456789abcdef0123456789abcdef01234567&timestamp={now}&nonce=42");
    assert_eq!(post(forged).await.unwrap().status(), 403);
    // Signed with the right token but sent to a wrong path token: no such route.
    let token = &env.sim.state.credentials().wechat_callback_token;
    let signature = provider_sim::receipts::wechat_signature(token, &now, "42");
    let signed = format!("signature={signature}&timestamp={now}&nonce=42");
    let wrong_path = client
        .post(format!("{base}/v1/receipts/wechat/not-the-token?{signed}"))
        .body(wechat_event(&recipient("wechat", 1), &msgid))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_path.status(), 404);
    assert_eq!(
        env.status(&t).await,
        Some(TaskStatus::Sent),
        "nothing settled"
    );

    // The same event, signed: delivered, answered `success`.
    let answer = post(signed).await.unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.unwrap(), "success");
    assert_eq!(env.status(&t).await, Some(TaskStatus::Delivered));
    env.stop().await;
}

/// A job-finish event whose `MsgID` is 0 (reported when `client_msg_id` is
/// set) names no message: answered `success`, it settles nothing; the event
/// naming the task's msgid still settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wechat_event_with_msgid_0_settles_nothing() {
    let env = Env::start(|_| {}).await;
    let base = serve_receipts(&env).await;
    let t = accept(&env, "wechat", "msgid0-1", 1).await;
    env.wait_status(&t, TaskStatus::Sent).await;
    let msgid = task(&env.permits, &t).await.provider_message_id.unwrap();
    let url = env.sim.callback_url(&base, "wechat");
    let token = env.sim.state.credentials().wechat_callback_token.clone();
    let client = reqwest::Client::new();
    let post = |id: &str| {
        let timestamp = now_secs().to_string();
        let nonce = format!("n{id}");
        let signature = provider_sim::receipts::wechat_signature(&token, &timestamp, &nonce);
        client
            .post(format!(
                "{url}?signature={signature}&timestamp={timestamp}&nonce={nonce}"
            ))
            .header("content-type", "text/xml")
            .body(wechat_event(&recipient("wechat", 1), id))
            .send()
    };
    let zero = post("0").await.unwrap();
    assert_eq!(zero.status(), 200);
    assert_eq!(zero.text().await.unwrap(), "success");
    assert_eq!(
        env.status(&t).await,
        Some(TaskStatus::Sent),
        "nothing settled"
    );
    let named = post(&msgid).await.unwrap();
    assert_eq!(named.status(), 200);
    assert_eq!(env.status(&t).await, Some(TaskStatus::Delivered));
    env.stop().await;
}

/// WeChat's compatibility mode (plain fields and `Encrypt` in one body) on a
/// channel with the EncodingAESKey: the simulator's push settles its task,
/// and what settles is what `Encrypt` says, never the plain fields beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_wechat_compatibility_mode_only_the_encrypted_message_counts() {
    use provider_sim::receipts::{wechat_encrypt, wechat_msg_signature, wechat_signature};
    use provider_sim::{ReceiptConfig, WechatMode};
    let env = Env::start(|c| {
        pushonce_tests::providers::wechat_safe_mode(c.get_mut("wechat").unwrap());
    })
    .await;
    let base = serve_receipts(&env).await;
    let url = env.sim.callback_url(&base, "wechat");
    let pushes = ReceiptConfig {
        url: url.clone(),
        wechat_mode: WechatMode::Compatible,
        ..ReceiptConfig::default()
    };
    assert!(env.sim.state.set_receipts("wechat", Some(pushes)));
    let pushed = accept(&env, "wechat", "compat-1", 1).await;
    env.wait_status(&pushed, TaskStatus::Delivered).await;
    assert!(env.sim.state.set_receipts("wechat", None));

    let t = accept(&env, "wechat", "compat-2", 2).await;
    env.wait_status(&t, TaskStatus::Sent).await;
    let msgid = task(&env.permits, &t).await.provider_message_id.unwrap();
    let creds = env.sim.state.credentials();
    let event = |status: &str| {
        format!(
            "<xml><ToUserName><![CDATA[{}]]></ToUserName><FromUserName><![CDATA[openid-2]]></FromUserName>\
             <CreateTime>1700000000</CreateTime><MsgType><![CDATA[event]]></MsgType>\
             <Event><![CDATA[TEMPLATESENDJOBFINISH]]></Event><MsgID>{msgid}</MsgID>\
             <Status><![CDATA[{status}]]></Status></xml>",
            creds.wechat_account
        )
    };
    // The plain fields say delivered; the encrypted message says failed.
    let encrypt = wechat_encrypt(
        &creds.wechat_encoding_aes_key,
        b"fedcba9876543210",
        &event("failed:user block"),
        &creds.wechat_appid,
    )
    .unwrap();
    let body = event("success").replace(
        "</xml>",
        &format!("<Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>"),
    );
    let (timestamp, nonce) = (now_secs().to_string(), "5772156649");
    let token = &creds.wechat_callback_token;
    let answer = reqwest::Client::new()
        .post(format!(
            "{url}?signature={}&timestamp={timestamp}&nonce={nonce}&openid=openid-2\
             &encrypt_type=aes&msg_signature={}",
            wechat_signature(token, &timestamp, nonce),
            wechat_msg_signature(token, &timestamp, nonce, &encrypt)
        ))
        .header("content-type", "text/xml")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.text().await.unwrap(), "success");
    assert_eq!(env.status(&t).await, Some(TaskStatus::Failed));
    env.stop().await;
}

/// A malformed EncodingAESKey refuses every callback (nothing would verify),
/// naming the setting and what is wrong, never the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_wechat_encoding_aes_key_refuses_callbacks_naming_the_setting() {
    const BAD_KEY: &str = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG=";
    let env = Env::start(|c| {
        let wechat = c.get_mut("wechat").unwrap();
        wechat
            .settings
            .insert("encoding_aes_key".into(), BAD_KEY.into());
    })
    .await;
    let token = env.sim.state.credentials().wechat_callback_token.clone();
    let (timestamp, nonce) = (now_secs().to_string(), "8675309");
    let signature = provider_sim::receipts::wechat_signature(&token, &timestamp, nonce);
    let req = CallbackRequest {
        method: "POST".into(),
        path: String::new(),
        query: format!("signature={signature}&timestamp={timestamp}&nonce={nonce}"),
        headers: vec![("content-type".into(), "text/xml".into())],
        body: wechat_event("openid-1", "1000001").into_bytes(),
    };
    let refused = handle_callback(
        &env.permits,
        &env.sender,
        "wechat",
        req,
        Duration::from_secs(30),
    )
    .await;
    let Err(ReceiptError::Forbidden { reason, .. }) = refused else {
        panic!("not refused as forbidden: {refused:?}");
    };
    assert!(reason.contains("`encoding_aes_key`"), "{reason}");
    assert!(reason.contains("43 characters"), "{reason}");
    assert!(
        !reason.contains("abcdefghijklmnop"),
        "the key is not shown: {reason}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wechat_url_check_echoes_only_when_signed_with_the_channel_token() {
    let env = Env::start(|_| {}).await;
    let base = serve_receipts(&env).await;
    let url = env.sim.callback_url(&base, "wechat");
    let echoed = env.sim.state.wechat_verify_url(&url, None).await.unwrap();
    assert!(echoed, "the configured token verifies");
    let other = env
        .sim
        .state
        .wechat_verify_url(&url, Some("another-token"))
        .await
        .unwrap();
    assert!(!other, "another token does not");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aliyun_sms_report_settles_only_through_the_channels_path_token() {
    let env = Env::start(|_| {}).await;
    let base = serve_receipts(&env).await;
    let t = accept(&env, "sms", "report-1", 1).await;
    env.wait_status(&t, TaskStatus::Sent).await;
    let sms = env.ledger("sms").remove(0);
    let report = serde_json::json!([{
        "phone_number": sms.recipient,
        "send_time": "2026-12-01 08:00:00",
        "report_time": "2026-12-01 08:00:05",
        "success": true,
        "err_code": "DELIVERED",
        "err_msg": "用户接收成功",
        "sms_size": "1",
        "biz_id": sms.id,
        "out_id": sms.reference,
    }]);
    let client = reqwest::Client::new();
    // Aliyun's connectivity check (a GET) before SmsReport can be enabled.
    let started = std::time::Instant::now();
    let check = client
        .get(env.sim.callback_url(&base, "sms"))
        .send()
        .await
        .unwrap();
    assert_eq!(check.status(), 200);
    let check: serde_json::Value = check.json().await.unwrap();
    assert_eq!(check, serde_json::json!({"code": 0, "msg": "成功"}));
    assert!(
        started.elapsed() < Duration::from_millis(700),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        env.status(&t).await,
        Some(TaskStatus::Sent),
        "settles nothing"
    );
    // Aliyun signs nothing: a wrong path token is all that stops a forger.
    let wrong = client
        .post(format!("{base}/v1/receipts/sms/cb-sms-guessed"))
        .json(&report)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 404);
    assert_eq!(env.status(&t).await, Some(TaskStatus::Sent));

    let answer = client
        .post(env.sim.callback_url(&base, "sms"))
        .json(&report)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let reply: serde_json::Value = answer.json().await.unwrap();
    assert_eq!(reply["code"], 0, "the answer Aliyun expects: {reply}");
    assert_eq!(env.status(&t).await, Some(TaskStatus::Delivered));
    env.stop().await;
}

// ------------------------------------------------------ Tencent Cloud SMS

/// Redis, the simulator and a dispatcher (and a reconciler, per `options`)
/// with the Tencent Cloud SMS channel ([`TENCENT`]) beside the six.
async fn tencent_env(options: EnvOptions, on_unknown: pushonce::config::OnUnknown) -> Env {
    Env::start_with_sim(
        |sim, c| {
            let mut tencent = sim.tencent_channel();
            tencent.on_unknown = on_unknown;
            c.insert(TENCENT.0.into(), tencent);
        },
        options,
    )
    .await
}

/// Accepts one Tencent SMS task to `phone`.
async fn accept_tencent(env: &Env, key: &str, phone: &str) -> String {
    env.accept(TENCENT.0, key, &payload(phone, "1110")).await
}

/// Receives the simulator's Tencent status pushes at the channel's callback
/// URL (path token included) on a stand-in of the host's receipts route.
async fn tencent_receipts(env: &Env) {
    let base = serve_receipts(env).await;
    let config = provider_sim::ReceiptConfig {
        url: env.sim.callback_url(&base, TENCENT.0),
        delay_ms: 0,
        secret: None,
        fail_after_accept: Default::default(),
        wechat_mode: Default::default(),
    };
    assert!(env.sim.state.set_receipts(TENCENT.1, Some(config)));
}

/// The declaration the no-duplicate guarantee rests on: no reference, a
/// query that never proves absence (its not-found horizon never ends:
/// PullSmsSendStatusByPhoneNumber lists receipts only,
/// https://www.tencentcloud.com/document/api/382/40518), callbacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tencent_sms_declares_a_query_whose_not_found_never_permits_a_resend() {
    let sim = sim().await;
    let redis = RedisServer::start().await.unwrap();
    let mut channels = sim.channels();
    channels.insert(TENCENT.0.into(), sim.tencent_channel());
    let sender = cached_sender(&sim, &channels, &redis).await;
    let caps = sender.capabilities(TENCENT.0, None).await.unwrap();
    assert!(!caps.honours_reference, "{caps:?}");
    assert!(caps.can_query, "{caps:?}");
    assert_eq!(caps.query_lag_secs, u32::MAX, "{caps:?}");
    assert!(caps.callbacks, "{caps:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tencent_sms_is_sent_once_and_its_status_push_settles_it_delivered() {
    let env = tencent_env(EnvOptions::default(), Default::default()).await;
    tencent_receipts(&env).await;
    let t = accept_tencent(&env, "tx-1", "+8613800000001").await;
    env.wait_status(&t, TaskStatus::Delivered).await;
    let ledger = env.ledger(TENCENT.0);
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    let task = task(&env.permits, &t).await;
    assert_eq!(task.attempts, 1, "{task:?}");
    assert_eq!(
        task.provider_message_id.as_deref(),
        Some(ledger[0].id.as_str()),
        "the SerialNo the push names"
    );
    // The simulator counts its push once the host has answered it, which
    // may be after the host settled the task.
    let counted = wait_until(DEADLINE, || async {
        stat(&env.sim, "tencent-sms.receipt_posted") >= 1
    })
    .await;
    assert!(counted.is_ok(), "the push was answered");
    assert_eq!(stat(&env.sim, "tencent-sms.receipt_posted"), 1);
    env.stop().await;
}

/// Without a push, the reconciler's pull finds the receipt and settles the
/// sent task delivered: the query can confirm, never deny.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sent_tencent_sms_is_settled_delivered_by_the_pulled_receipt() {
    let options = EnvOptions {
        reconcile: Some(pushonce_tests::channels::quick_reconcile(20)),
        ..EnvOptions::default()
    };
    let env = tencent_env(options, Default::default()).await;
    let t = accept_tencent(&env, "tx-2", "13800000002").await;
    env.wait_status(&t, TaskStatus::Delivered).await;
    assert!(stat(&env.sim, "tencent-sms.query") >= 1);
    assert_eq!(env.ledger(TENCENT.0).len(), 1);
    env.stop().await;
}

/// `InternalError.Timeout` after Tencent took the SMS, and before it took
/// another, and a gateway's 502 after it took a third: all are unknown and
/// all are held — no receipt names them,
/// and "no receipt" is never read as "not sent", not even on a channel told
/// to resend on doubt. The user gets the first SMS once, the second never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tencent_internal_timeout_is_held_unknown_and_never_resent() {
    let env = tencent_env(
        EnvOptions {
            retry: RetryPolicy {
                max_attempts: 3,
                ..fast_retry()
            },
            ..one_attempt_then_reconcile(3)
        },
        pushonce::config::OnUnknown::Resend,
    )
    .await;
    tencent_receipts(&env).await;
    env.sim.set_faults(
        TENCENT.0,
        Faults {
            fail_next: 1,
            error_after_accept: 1.0,
            ..Faults::default()
        },
    );
    let taken = accept_tencent(&env, "tx-3", "+8613800000003").await;
    env.wait_status(&taken, TaskStatus::Unknown).await;
    env.sim.set_faults(
        TENCENT.0,
        Faults {
            fail_next: 1,
            ..Faults::default()
        },
    );
    let not_taken = accept_tencent(&env, "tx-4", "+8613800000004").await;
    env.wait_status(&not_taken, TaskStatus::Unknown).await;
    // The gateway's 502 after the SMS was taken (a cloud-API outage).
    env.sim.set_faults(
        TENCENT.0,
        Faults {
            fail_next: 1,
            error_after_accept: 1.0,
            gateway_errors: true,
            ..Faults::default()
        },
    );
    let gateway = accept_tencent(&env, "tx-6", "+8613800000006").await;
    env.wait_status(&gateway, TaskStatus::Unknown).await;
    env.sim.set_faults(TENCENT.0, Faults::default());
    for (t, answer) in [
        (&taken, "InternalError.Timeout"),
        (&not_taken, "InternalError.Timeout"),
        (&gateway, "status 502"),
    ] {
        // Asked until the reconciler gives up: held for an operator.
        env.wait_status(t, TaskStatus::Dead).await;
        let task = task(&env.permits, t).await;
        assert_eq!(task.attempts, 1, "never resent: {task:?}");
        let why = task.last_error.clone().unwrap_or_default();
        assert!(why.contains(answer), "{why}");
    }
    assert!(
        stat(&env.sim, "tencent-sms.query") >= 2,
        "the pull was asked"
    );
    let ledger = env.ledger(TENCENT.0);
    let to: Vec<&str> = ledger.iter().map(|m| m.recipient.as_str()).collect();
    assert_eq!(
        to,
        ["+8613800000003", "+8613800000006"],
        "one SMS each for the taken ones, never a second, none for the other"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tencent_sms_to_an_invalid_number_fails_at_once() {
    let env = tencent_env(EnvOptions::default(), Default::default()).await;
    let t = accept_tencent(&env, "tx-5", "+86abc").await;
    env.wait_status(&t, TaskStatus::Failed).await;
    let task = task(&env.permits, &t).await;
    assert_eq!(task.attempts, 1, "{task:?}");
    let why = task.last_error.clone().unwrap_or_default();
    assert!(
        why.contains("InvalidParameterValue.IncorrectPhoneNumber"),
        "{why}"
    );
    assert!(env.ledger(TENCENT.0).is_empty());
    env.stop().await;
}

/// A channel that fails over from Aliyun (`sms`) to Tencent: a task Aliyun
/// refused for its credentials is sent by Tencent, whose status push on
/// Tencent's own callback route settles it delivered (issue 37, item 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_over_sms_is_settled_by_the_status_push_of_the_provider_that_sent_it() {
    let env = Env::start_with_sim(
        |sim, c| {
            c.insert(TENCENT.0.into(), sim.tencent_channel());
            c.get_mut("sms")
                .unwrap()
                .secrets_from_env
                .insert("access_key_secret".into(), "TEST_TENCENT_SECRET".into());
            let mut chain = pushonce::config::ChannelConfig::new("");
            chain.providers = vec!["sms".into(), TENCENT.0.into()];
            c.insert("sms-any".into(), chain);
        },
        EnvOptions::default(),
    )
    .await;
    tencent_receipts(&env).await;
    let t = env
        .accept("sms-any", "fo-push", &payload("+8613800000061", "1110"))
        .await;
    env.wait_status(&t, TaskStatus::Delivered).await;
    let task = task(&env.permits, &t).await;
    assert_eq!(
        task.fields.get("provider").map(String::as_str),
        Some(TENCENT.0)
    );
    assert_eq!(env.ledger(TENCENT.0).len(), 1);
    assert!(env.ledger("sms").is_empty());
    assert_eq!(stat(&env.sim, "tencent-sms.receipt_posted"), 1);
    env.stop().await;
}
