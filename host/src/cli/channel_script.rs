//! The script of `pushonce plugins test <channel.wasm> --script FILE`: the
//! channel's settings and a list of cases, each a call of the plugin (`send`
//! or `query`), what it must answer, and the provider's part — the requests
//! the plugin must make, in order, each with a canned reply or a cut-off
//! (the connection closes once the request was read, no answer).
//!
//! ```toml
//! [channel]
//! settings = { endpoint = "{provider}" }   # {provider}: the scripted provider's base URL
//!
//! [[case]]
//! name = "accepted"
//! message = { recipient = "u-1", template = "T", idempotency_key = "k-1" }
//! expect = "sent"
//! provider_message_id = "m-1"
//! [[case.step]]
//! request = { method = "POST", path = "/inbox/v1/messages", headers = { idempotency-key = "k-1" } }
//! reply = { status = 201, body = '{"id":"m-1"}' }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// A channel plugin's script.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Script {
    /// The channel instance the plugin is bound to.
    #[serde(default)]
    pub channel: ScriptChannel,
    /// The cases, run in order, each on a fresh channel instance.
    #[serde(default, rename = "case")]
    pub cases: Vec<ChannelCase>,
}

/// The channel instance of a script.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScriptChannel {
    /// Settings handed to the plugin (secrets too: use test values);
    /// `{provider}` in a value becomes the scripted provider's base URL,
    /// `http://127.0.0.1:<port>`.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Most time one plugin call may take.
    #[serde(default = "default_call_timeout", with = "humantime_serde")]
    pub call_timeout: Duration,
}

impl Default for ScriptChannel {
    fn default() -> Self {
        ScriptChannel {
            settings: BTreeMap::new(),
            call_timeout: default_call_timeout(),
        }
    }
}

fn default_call_timeout() -> Duration {
    Duration::from_secs(10)
}

/// Which export a case calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Call {
    /// `send`, through the host's own classification of the answer.
    #[default]
    Send,
    /// `query` (the plugin must say it can query).
    Query,
}

/// The class of answer a case expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Expect {
    /// `send` returned a receipt.
    Sent,
    /// `send-error.retryable`.
    Retryable,
    /// `send-error.permanent`.
    Permanent,
    /// `send-error.unknown`: the provider may have the message.
    Unknown,
}

/// A `delivery-status` a query must answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    /// Accepted, not yet delivered.
    Pending,
    /// Delivered.
    Delivered,
    /// Accepted, then failed.
    Failed,
    /// The provider does not know the message.
    Unknown,
}

/// One case of a script.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChannelCase {
    /// A name for the table (default: `#<n>`, its position in the file).
    pub name: Option<String>,
    /// `send` (default) or `query`.
    #[serde(default)]
    pub call: Call,
    /// The message sent, or asked about.
    #[serde(default)]
    pub message: CaseMessage,
    /// The class of answer: `sent`, `retryable`, `permanent`, `unknown`
    /// (a query: a failed query's class; else give `status`).
    pub expect: Option<Expect>,
    /// A query's answer: `pending`, `delivered`, `failed` or `unknown`.
    pub status: Option<Status>,
    /// Text an error's reason must contain.
    pub reason: Option<String>,
    /// The provider message id a receipt must name.
    pub provider_message_id: Option<String>,
    /// The retry-after hint a retryable error must carry, in ms.
    pub after_ms: Option<u64>,
    /// The provider's part, in order.
    #[serde(default, rename = "step")]
    pub steps: Vec<Step>,
}

/// The message of a case (what `send` gets; `query` gets the same fields
/// as a sent message).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CaseMessage {
    /// The address on the channel.
    #[serde(default = "default_recipient")]
    pub recipient: String,
    /// The template.
    #[serde(default = "default_template")]
    pub template: String,
    /// Template parameters (in name order).
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// The idempotency key (default `push:kit@1:test:case-<n>`).
    pub idempotency_key: Option<String>,
    /// The attempt number.
    #[serde(default = "one")]
    pub attempt: u32,
    /// A query: the reference a receipt named.
    pub reference: Option<String>,
    /// A query: the provider's id a receipt named.
    pub provider_message_id: Option<String>,
}

impl Default for CaseMessage {
    fn default() -> Self {
        CaseMessage {
            recipient: default_recipient(),
            template: default_template(),
            params: BTreeMap::new(),
            idempotency_key: None,
            attempt: 1,
            reference: None,
            provider_message_id: None,
        }
    }
}

fn default_recipient() -> String {
    "u-1".into()
}

fn default_template() -> String {
    "T".into()
}

fn one() -> u32 {
    1
}

/// One request the plugin must make, and the provider's answer to it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Step {
    /// What the request must be.
    pub request: ExpectedRequest,
    /// The answer (give this or `cut_off = true`).
    pub reply: Option<Reply>,
    /// Read the request, then close the connection without an answer.
    #[serde(default)]
    pub cut_off: bool,
}

/// What a request must be.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExpectedRequest {
    /// `GET`, `POST`, ...
    pub method: String,
    /// The path; with a `?`, the path and query string.
    pub path: String,
    /// Headers the request must carry, with these values (names in any
    /// case; the value `*`: present, any value).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Texts the body must contain.
    #[serde(default)]
    pub body_contains: Vec<String>,
}

/// A canned answer.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Reply {
    /// The status code.
    pub status: u16,
    /// Headers, e.g. `content-type`, `retry-after`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The body.
    #[serde(default)]
    pub body: String,
}

/// Why a script cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScriptError {
    /// The file cannot be read.
    #[error("cannot read script {}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TOML does not parse as a script (names the field and the line).
    #[error("{}: not a channel script", file.display())]
    Toml {
        /// The file.
        file: PathBuf,
        /// Why.
        #[source]
        source: toml::de::Error,
    },
    /// The file holds no case.
    #[error("{}: no `[[case]]`", file.display())]
    Empty {
        /// The file.
        file: PathBuf,
    },
    /// A case or one of its steps does not make sense.
    #[error("{}: case {case}{}: {problem}", file.display(), step.map(|s| format!(", step {s}")).unwrap_or_default())]
    Case {
        /// The file.
        file: PathBuf,
        /// The case's name.
        case: String,
        /// The 1-based step, when the problem is in one.
        step: Option<usize>,
        /// What is wrong, naming the field.
        problem: String,
    },
}

/// Reads and checks the script in `file` (TOML).
pub(crate) fn read_script(file: &Path) -> Result<Script, ScriptError> {
    let text = std::fs::read_to_string(file).map_err(|source| ScriptError::Read {
        file: file.to_path_buf(),
        source,
    })?;
    let mut script: Script = toml::from_str(&text).map_err(|source| ScriptError::Toml {
        file: file.to_path_buf(),
        source,
    })?;
    if script.cases.is_empty() {
        return Err(ScriptError::Empty {
            file: file.to_path_buf(),
        });
    }
    for (i, case) in script.cases.iter_mut().enumerate() {
        let name = case
            .name
            .get_or_insert_with(|| format!("#{}", i + 1))
            .clone();
        case.message
            .idempotency_key
            .get_or_insert_with(|| format!("push:kit@1:test:case-{}", i + 1));
        let fail = |step: Option<usize>, problem: String| ScriptError::Case {
            file: file.to_path_buf(),
            case: name.clone(),
            step,
            problem,
        };
        check_expectation(case).map_err(|p| fail(None, p))?;
        for (s, step) in case.steps.iter().enumerate() {
            check_step(step).map_err(|p| fail(Some(s + 1), p))?;
        }
    }
    Ok(script)
}

/// The expectation fields fit the call: exactly one answer expected.
fn check_expectation(case: &ChannelCase) -> Result<(), String> {
    match (case.call, case.expect, case.status) {
        (Call::Send, None, _) => return Err("give `expect` (sent, retryable, permanent or unknown)".into()),
        (Call::Send, _, Some(_)) => return Err("`status` is for `call = \"query\"`: a send answers `expect`".into()),
        (Call::Query, None, None) | (Call::Query, Some(_), Some(_)) => {
            return Err("a query case gives exactly one of `status` (the answer) and `expect` (the class of a failed query)".into())
        }
        (Call::Query, Some(Expect::Sent), _) => {
            return Err("`expect = \"sent\"` is for a send: a query answers `status`".into())
        }
        _ => {}
    }
    if case.provider_message_id.is_some() && case.expect != Some(Expect::Sent) {
        return Err(
            "`provider_message_id` is checked on a receipt: only with `expect = \"sent\"`".into(),
        );
    }
    if case.after_ms.is_some() && case.expect != Some(Expect::Retryable) {
        return Err(
            "`after_ms` is checked on a retryable error: only with `expect = \"retryable\"`".into(),
        );
    }
    if case.reason.is_some() && matches!(case.expect, None | Some(Expect::Sent)) {
        return Err("`reason` is checked on an error: not with a receipt or a status".into());
    }
    Ok(())
}

/// A step has exactly one answer, a method, a path and valid header names.
fn check_step(step: &Step) -> Result<(), String> {
    match (&step.reply, step.cut_off) {
        (None, false) => return Err("give `reply = { status = ... }` or `cut_off = true`".into()),
        (Some(_), true) => return Err("give either `reply` or `cut_off = true`, not both".into()),
        _ => {}
    }
    let r = &step.request;
    if http::Method::from_bytes(r.method.as_bytes()).is_err() || r.method.is_empty() {
        return Err(format!(
            "request.method `{}` is not an HTTP method",
            r.method
        ));
    }
    if !r.path.starts_with('/') {
        return Err(format!("request.path `{}` must start with `/`", r.path));
    }
    let mut names: Vec<(&str, &String)> =
        r.headers.keys().map(|k| ("request.headers", k)).collect();
    if let Some(reply) = &step.reply {
        if http::StatusCode::from_u16(reply.status).is_err() || reply.status < 200 {
            return Err(format!(
                "reply.status {} is not a final HTTP status (200..=999)",
                reply.status
            ));
        }
        names.extend(reply.headers.keys().map(|k| ("reply.headers", k)));
        for (k, v) in &reply.headers {
            if http::HeaderValue::from_str(v).is_err() {
                return Err(format!("reply.headers.{k}: `{v}` is not a header value"));
            }
        }
    }
    for (field, name) in names {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("{field}: `{name}` is not a header name"));
        }
    }
    Ok(())
}
