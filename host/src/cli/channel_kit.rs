//! `pushonce plugins test <channel.wasm> --script FILE`: the author's test
//! kit for a channel plugin. A scripted provider listens on 127.0.0.1 (plain
//! HTTP/1.1); each case binds the plugin to a fresh channel instance whose
//! settings point at it (`{provider}`), with the host's own outbound path —
//! `PluginSender`, its outbound policy (only the provider's address, plain
//! HTTP allowed), its pooled client, its budgets — and calls `send` (the
//! answer classified as the host classifies it) or `query`. The provider
//! plays the case's steps in order: it compares each request with the
//! step's expected one, then answers the canned reply, or reads the request
//! and closes the connection (a cut-off). A case passes when the answer is
//! the expected one and every step was requested as scripted.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::channel_script::{Call, CaseMessage, ChannelCase, Expect, Script, Status, Step};
use crate::config::ChannelConfig;
use crate::plugin::bindings::{DeliveryStatus, SendError, SentMessage};
use crate::plugin::{ChannelPlugin, PluginRegistry};
use crate::send::plugin::PluginSender;
use crate::send::{OutgoingMessage, Payload, SendOutcome, Sender};

/// The channel instance name cases run on.
const CHANNEL: &str = "test";

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CaseOutcome {
    /// The case's name.
    pub name: String,
    /// `send` or `query`.
    pub call: &'static str,
    /// Whether the answer and the requests were as scripted.
    pub passed: bool,
    /// What the script expects, for the table.
    pub expected: String,
    /// What the plugin answered, for the table.
    pub got: String,
    /// `matched/steps`, for the table.
    pub requests: String,
    /// What was wrong with the requests, one line each.
    pub problems: Vec<String>,
}

/// Runs every case of `script` against `plugin` (loaded in `registry`).
pub(crate) fn run_script(
    registry: PluginRegistry,
    plugin: &ChannelPlugin,
    script: Script,
) -> anyhow::Result<Vec<CaseOutcome>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let requirement = format!("{}@={}", plugin.meta().name, plugin.meta().version);
    let registry = Arc::new(registry);
    runtime.block_on(async move {
        let provider = Provider::start().await?;
        let mut outcomes = Vec::with_capacity(script.cases.len());
        for case in script.cases {
            let config = channel_config(&requirement, &script.channel, provider.addr);
            let registry = registry.clone();
            let sender = PluginSender::new(
                &BTreeMap::from([(CHANNEL.to_string(), config)]),
                Arc::new(move || registry.clone()),
                |_| None,
            )?;
            outcomes.push(run_case(&sender, &provider, case).await);
        }
        Ok(outcomes)
    })
}

/// The channel instance of a case: the script's settings (`{provider}`
/// replaced), reaching only the provider's address, plain HTTP allowed.
fn channel_config(
    requirement: &str,
    channel: &super::channel_script::ScriptChannel,
    addr: SocketAddr,
) -> ChannelConfig {
    let base = format!("http://{addr}");
    let mut cfg = ChannelConfig::new(requirement);
    cfg.settings = channel
        .settings
        .iter()
        .map(|(k, v)| (k.clone(), v.replace("{provider}", &base)))
        .collect();
    cfg.allowed_hosts = vec![addr.to_string()];
    cfg.allow_plaintext = true;
    cfg.call_timeout = channel.call_timeout;
    cfg
}

/// What a plugin answered.
enum Got {
    /// A receipt.
    Sent { id: String },
    /// An error of a class, with its reason and retry-after hint.
    Error {
        class: Expect,
        reason: String,
        after_ms: Option<u64>,
    },
    /// A query's status.
    Status(Status),
    /// No answer of the plugin's: a trap, a timeout, no query.
    Failed(String),
}

async fn run_case(sender: &PluginSender, provider: &Provider, case: ChannelCase) -> CaseOutcome {
    provider.load(case.steps.clone());
    let got = match case.call {
        Call::Send => send(sender, &case.message).await,
        Call::Query => query(sender, &case.message).await,
    };
    let seen = provider.take();
    let problems = request_problems(&case.steps, &seen);
    let matched = seen
        .iter()
        .filter(|s| s.step.is_some() && s.mismatches.is_empty())
        .count();
    CaseOutcome {
        name: case.name.clone().unwrap_or_default(),
        call: match case.call {
            Call::Send => "send",
            Call::Query => "query",
        },
        passed: answer_holds(&case, &got) && problems.is_empty(),
        expected: expected_text(&case),
        got: got_text(&got),
        requests: format!("{matched}/{}", case.steps.len()),
        problems,
    }
}

/// `send` through the host's `Sender`, classified as the dispatcher sees it.
async fn send(sender: &PluginSender, m: &CaseMessage) -> Got {
    let payload = Payload {
        recipient: m.recipient.clone(),
        template: m.template.clone(),
        params: m.params.clone().into_iter().collect(),
        plugin: None,
        fallback: None,
        unsubscribe: None,
    };
    let msg = OutgoingMessage {
        task_id: "kit-task".into(),
        idempotency_key: m.idempotency_key.clone().unwrap_or_default(),
        channel: CHANNEL.into(),
        attempt: m.attempt,
        payload: Ok(std::sync::Arc::new(payload)),
        reference: m.reference.clone(),
        provider_message_id: m.provider_message_id.clone(),
        first_attempt_ms: 0,
        last_attempt_ms: 0,
        last_attempt_ended_ms: 0,
        provider: None,
    };
    match sender.send(&msg).await {
        SendOutcome::Sent {
            provider_message_id,
            ..
        } => Got::Sent {
            id: provider_message_id,
        },
        SendOutcome::Retryable { reason, after } => Got::Error {
            class: Expect::Retryable,
            reason,
            after_ms: after.map(|d| d.as_millis() as u64),
        },
        SendOutcome::Permanent(reason) => error(Expect::Permanent, reason),
        SendOutcome::Unknown(reason) => error(Expect::Unknown, reason),
    }
}

fn error(class: Expect, reason: String) -> Got {
    Got::Error {
        class,
        reason,
        after_ms: None,
    }
}

/// `query` on the channel's plugin instance, when the plugin says it can.
async fn query(sender: &PluginSender, m: &CaseMessage) -> Got {
    let inst = match sender.instance(CHANNEL, None) {
        Ok(i) => i,
        Err(e) => return Got::Failed(e.to_string()),
    };
    match inst.capabilities().await {
        Ok(caps) if caps.value.can_query => {}
        Ok(_) => {
            return Got::Failed(
                "capabilities say can-query = false: the host never calls query".into(),
            );
        }
        Err(e) => return Got::Failed(format!("capabilities failed: {e}")),
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let sent = SentMessage {
        task_id: "kit-task".into(),
        idempotency_key: m.idempotency_key.clone().unwrap_or_default(),
        recipient: m.recipient.clone(),
        template: m.template.clone(),
        reference: m.reference.clone(),
        provider_message_id: m.provider_message_id.clone(),
        first_attempt_ms: now,
        last_attempt_ms: now,
    };
    match inst.query(sent).await {
        Ok(answer) => match answer.value {
            Ok(status) => Got::Status(match status {
                DeliveryStatus::Pending => Status::Pending,
                DeliveryStatus::Delivered => Status::Delivered,
                DeliveryStatus::Failed => Status::Failed,
                DeliveryStatus::Unknown => Status::Unknown,
            }),
            Err(SendError::Retryable(r)) => Got::Error {
                class: Expect::Retryable,
                reason: r.reason,
                after_ms: r.after_ms,
            },
            Err(SendError::Permanent(r)) => error(Expect::Permanent, r),
            Err(SendError::Unknown(r)) => error(Expect::Unknown, r),
        },
        Err(e) => Got::Failed(format!("call failed: {e}")),
    }
}

fn answer_holds(case: &ChannelCase, got: &Got) -> bool {
    match got {
        Got::Sent { id } => {
            case.expect == Some(Expect::Sent)
                && case.provider_message_id.as_ref().is_none_or(|p| p == id)
        }
        Got::Error {
            class,
            reason,
            after_ms,
        } => {
            case.expect == Some(*class)
                && case.reason.as_ref().is_none_or(|r| reason.contains(r))
                && case.after_ms.is_none_or(|a| Some(a) == *after_ms)
        }
        Got::Status(s) => case.status == Some(*s),
        Got::Failed(_) => false,
    }
}

fn class_name(class: Expect) -> &'static str {
    match class {
        Expect::Sent => "sent",
        Expect::Retryable => "retryable",
        Expect::Permanent => "permanent",
        Expect::Unknown => "unknown",
    }
}

fn status_name(status: Status) -> &'static str {
    match status {
        Status::Pending => "pending",
        Status::Delivered => "delivered",
        Status::Failed => "failed",
        Status::Unknown => "unknown",
    }
}

fn expected_text(case: &ChannelCase) -> String {
    if let Some(s) = case.status {
        return format!("status {}", status_name(s));
    }
    let mut out = case.expect.map(class_name).unwrap_or_default().to_string();
    if let Some(id) = &case.provider_message_id {
        out += &format!(", id {id}");
    }
    if let Some(ms) = case.after_ms {
        out += &format!(", after {ms} ms");
    }
    if let Some(r) = &case.reason {
        out += &format!(", reason contains `{r}`");
    }
    out
}

/// The most characters of a reason shown in the table.
const REASON_CHARS: usize = 100;

fn got_text(got: &Got) -> String {
    match got {
        Got::Sent { id } => format!("sent, id {id}"),
        Got::Error {
            class,
            reason,
            after_ms,
        } => {
            let after = after_ms
                .map(|ms| format!(", after {ms} ms"))
                .unwrap_or_default();
            format!("{}{after}: {}", class_name(*class), shorten(reason))
        }
        Got::Status(s) => format!("status {}", status_name(*s)),
        Got::Failed(why) => format!("no answer: {}", shorten(why)),
    }
}

fn shorten(text: &str) -> String {
    let one_line = text.replace(['\n', '\r'], " ");
    if one_line.chars().count() <= REASON_CHARS {
        return one_line;
    }
    let cut: String = one_line.chars().take(REASON_CHARS).collect();
    format!("{cut}…")
}

/// What was wrong with the requests of a case: mismatches, requests
/// beyond the script, steps never requested.
fn request_problems(steps: &[Step], seen: &[Seen]) -> Vec<String> {
    let label = |i: usize| {
        let r = &steps[i].request;
        format!("step {} ({} {})", i + 1, r.method, r.path)
    };
    let mut problems = Vec::new();
    for s in seen {
        match s.step {
            Some(i) if !s.mismatches.is_empty() => {
                problems.push(format!("{}: {}", label(i), s.mismatches.join("; ")));
            }
            Some(_) => {}
            None => problems.push(format!(
                "unexpected request {} (the case scripts {} step(s); answered 500)",
                s.what,
                steps.len()
            )),
        }
    }
    for i in seen.len()..steps.len() {
        problems.push(format!("{} was never requested", label(i)));
    }
    problems
}

/// One request the provider received.
#[derive(Debug, Clone)]
struct Seen {
    /// `METHOD path?query`.
    what: String,
    /// The step it was compared with (`None`: beyond the script).
    step: Option<usize>,
    /// How it differs from the step's request.
    mismatches: Vec<String>,
}

/// The steps of the current case and the requests received.
#[derive(Default)]
struct Playback {
    steps: Vec<Step>,
    seen: Vec<Seen>,
}

/// The scripted provider: HTTP/1.1 on 127.0.0.1, one case at a time.
struct Provider {
    addr: SocketAddr,
    play: Arc<Mutex<Playback>>,
}

/// The service's error that makes hyper close the connection unanswered.
#[derive(Debug, thiserror::Error)]
#[error("cut off by the script")]
struct CutOff;

impl Provider {
    async fn start() -> std::io::Result<Provider> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let play: Arc<Mutex<Playback>> = Arc::default();
        let shared = play.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let play = shared.clone();
                let svc = service_fn(move |req| answer(play.clone(), req));
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc),
                );
            }
        });
        Ok(Provider { addr, play })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Playback> {
        self.play.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn load(&self, steps: Vec<Step>) {
        *self.lock() = Playback {
            steps,
            seen: Vec::new(),
        };
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut self.lock().seen)
    }
}

/// Reads the whole request, compares it with the next step, then answers
/// the step's reply or cuts the connection off.
async fn answer(
    play: Arc<Mutex<Playback>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, CutOff> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let step = {
        let mut play = play.lock().unwrap_or_else(|e| e.into_inner());
        let index = play.seen.len();
        let step = play.steps.get(index).cloned();
        play.seen.push(Seen {
            what: format!("{} {}", parts.method, path_and_query(&parts.uri)),
            step: step.as_ref().map(|_| index),
            mismatches: step
                .as_ref()
                .map(|s| mismatches(s, &parts, &body))
                .unwrap_or_default(),
        });
        step
    };
    let Some(step) = step else {
        return Ok(reply(500, &BTreeMap::new(), "not in the script"));
    };
    match step.reply {
        Some(r) => Ok(reply(r.status, &r.headers, &r.body)),
        None => Err(CutOff),
    }
}

fn path_and_query(uri: &http::Uri) -> &str {
    uri.path_and_query().map_or("/", |p| p.as_str())
}

/// An expected header value that only asks for the header to be present
/// (a signature, a timestamp).
const ANY_VALUE: &str = "*";

/// How a request differs from `step`'s expected one.
fn mismatches(step: &Step, parts: &http::request::Parts, body: &[u8]) -> Vec<String> {
    let want = &step.request;
    let mut out = Vec::new();
    if !parts.method.as_str().eq_ignore_ascii_case(&want.method) {
        out.push(format!(
            "method {} (expected {})",
            parts.method, want.method
        ));
    }
    let path = if want.path.contains('?') {
        path_and_query(&parts.uri)
    } else {
        parts.uri.path()
    };
    if path != want.path {
        out.push(format!("path {path} (expected {})", want.path));
    }
    for (name, value) in &want.headers {
        match parts.headers.get(name.as_str()).map(|v| v.to_str()) {
            Some(Ok(v)) if v == value || value == ANY_VALUE => {}
            Some(Err(_)) if value == ANY_VALUE => {}
            Some(Ok(v)) => out.push(format!("header {name}: `{v}` (expected `{value}`)")),
            Some(Err(_)) => out.push(format!("header {name}: not text (expected `{value}`)")),
            None => out.push(format!("header {name} missing (expected `{value}`)")),
        }
    }
    let text = String::from_utf8_lossy(body);
    for fragment in &want.body_contains {
        if !text.contains(fragment.as_str()) {
            out.push(format!("body lacks `{fragment}`"));
        }
    }
    out
}

fn reply(status: u16, headers: &BTreeMap<String, String>, body: &str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in headers {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            resp.headers_mut().insert(n, v);
        }
    }
    resp
}
