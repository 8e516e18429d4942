//! The JSON shapes of the API: requests, answers, and their limits. Each type
//! derives `ToSchema`, so the OpenAPI document is generated from these very
//! definitions and cannot drift from them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::permit::{HeldCause, OperatorStep, ReconcileStep, Task};

pub(crate) use crate::event::MAX_ID;
/// Most entries in `params`, `attributes`, `recipients`.
pub(crate) const MAX_ENTRIES: usize = 64;
/// Longest name of a param or attribute, in bytes.
pub(crate) const MAX_NAME: usize = 64;
/// Longest value of a param or attribute, in bytes.
pub(crate) const MAX_VALUE: usize = 1024;
/// Longest recipient address, in bytes.
pub(crate) const MAX_RECIPIENT: usize = 256;
/// Most channels one event may name.
pub(crate) const MAX_CHANNELS: usize = 16;

/// One business event: `POST /v1/events`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventRequest {
    /// Business type, routed to the policy of the same name, e.g. `ORDER_SHIPPED`.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
        example = "ORDER_SHIPPED"
    )]
    pub biz_type: String,
    /// The business's id of the subject, e.g. an order id.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
        example = "o-1001"
    )]
    pub biz_id: String,
    /// The user the notification is for.
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$",
        example = "u-42"
    )]
    pub user_id: String,
    /// When it happened: RFC 3339 text or epoch milliseconds. Send it: when
    /// absent the host's clock at receipt is used, so a retry of the same
    /// event may fall on another day for day-based key policies.
    #[serde(default)]
    pub occurred_at: Option<OccurredAt>,
    /// When to send (RFC 3339): the tasks wait until then, and quiet hours
    /// and frequency caps are judged at that time. At most `send_at.grace`
    /// (5 min) in the past (then sent at once) and `send_at.horizon`
    /// (30 days) ahead; outside is 422 naming `send_at`. Now when absent.
    #[serde(default)]
    #[schema(format = DateTime, example = "2026-12-01T09:00:00+08:00")]
    pub send_at: Option<String>,
    /// A subset of the policy's channels; all of them when absent.
    #[serde(default)]
    #[schema(min_items = 1, max_items = 16)]
    pub channels: Option<Vec<String>>,
    /// Template code or id the providers render; the `biz_type` when absent.
    /// A channel whose policy names its own template
    /// (`[overrides.<channel>] template`) renders that one instead.
    #[serde(default)]
    #[schema(
        min_length = 1,
        max_length = 128,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    pub template: Option<String>,
    /// Template parameters (sent in name order).
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// Attributes for the key policy (e.g. `job_id`); strings, numbers or booleans.
    #[serde(default)]
    pub attributes: BTreeMap<String, AttributeValue>,
    /// The address per channel: phone number (`sms`), openid (`wechat`),
    /// device token (`app-push`), inbox user (`inbox`, default: `user_id`).
    /// Required for every channel the event is sent on, and for its fallback.
    #[serde(default)]
    pub recipients: BTreeMap<String, String>,
}

/// When an event happened.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum OccurredAt {
    /// Milliseconds since 1970-01-01T00:00:00Z.
    Millis(u64),
    /// RFC 3339, e.g. `2026-11-30T15:59:59Z`.
    Text(String),
}

/// An attribute's value.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum AttributeValue {
    /// Text.
    Text(String),
    /// A whole number.
    Int(i64),
    /// A number with a fraction.
    Float(f64),
    /// A boolean.
    Bool(bool),
}

impl AttributeValue {
    /// The value as the event's JSON form writes it (a number as
    /// `serde_json` prints it), so a posted event and the same event read
    /// from a file get the same keys.
    pub(crate) fn as_text(&self) -> String {
        match self {
            AttributeValue::Text(t) => t.clone(),
            AttributeValue::Int(i) => i.to_string(),
            AttributeValue::Float(f) => serde_json::Value::from(*f).to_string(),
            AttributeValue::Bool(b) => b.to_string(),
        }
    }
}

/// Many events in one request: `POST /v1/events:batch`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchRequest {
    /// The events (at most the configured batch limit, 100 by default). Each is
    /// checked on its own: one bad event does not refuse the others.
    #[schema(value_type = Vec<EventRequest>, min_items = 1)]
    pub events: Vec<serde_json::Value>,
}

/// What became of one channel of an event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChannelResult {
    /// The channel.
    pub channel: String,
    /// `accepted`: a new task; `duplicate`: the permit is held by an earlier task.
    pub result: ResultKind,
    /// The new task, or the task that holds the permit (empty for a
    /// duplicate in Bloom mode: the filter names no task).
    pub task_id: String,
    /// The idempotency key.
    pub key: String,
    /// For a duplicate: the holding task's status (absent if its record expired).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// For `capped`: the frequency cap that had no room.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cap: Option<String>,
    /// For `capped`: when the next message would be allowed (ms since the epoch, Redis clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_allowed_at: Option<u64>,
    /// For `accepted` with a future `send_at` or inside quiet hours: when
    /// its first attempt is due (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduled_for: Option<u64>,
}

/// Accepted, digested, duplicate, capped or opted out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ResultKind {
    /// A new task was created and queued.
    Accepted,
    /// An earlier task holds the permit; nothing new was created.
    Duplicate,
    /// Added to the open digest under its key (the policy's `[digest]`):
    /// `task_id` is the digest's task, `scheduled_for` when it is sent.
    Digested,
    /// A frequency cap had no room: nothing was created (`cap`, `next_allowed_at`).
    Capped,
    /// The recipient switched this channel, or the policy's category, off
    /// (`docs/preferences.md`): nothing was created, nothing is sent, and
    /// `task_id` is empty.
    #[serde(rename = "opted_out")]
    OptedOut,
}

/// The answer to `POST /v1/events` (202).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct EventAccepted {
    /// The event's business type.
    pub biz_type: String,
    /// The event's business id.
    pub biz_id: String,
    /// The event's user.
    pub user_id: String,
    /// One result per channel, in the policy's order.
    pub results: Vec<ChannelResult>,
}

/// The result of one event of a batch.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct BatchItem {
    /// Position of the event in the request.
    pub index: usize,
    /// The status `POST /v1/events` would have answered: 202 or 4xx.
    pub status: u16,
    /// The channels' results (status 202).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted: Option<EventAccepted>,
    /// Why the event was refused (status 4xx).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<Problem>,
}

/// The answer to `POST /v1/events:batch` (200).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct BatchResponse {
    /// One item per event, in request order.
    pub results: Vec<BatchItem>,
}

/// A task as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct TaskView {
    /// Task id.
    pub id: String,
    /// Idempotency key.
    pub key: String,
    /// Channel.
    pub channel: String,
    /// `queued`, `sending`, `retry_wait`, `sent`, `unknown`, `delivered`, `failed`, `dead`,
    /// `superseded`, `duplicate_prevented`; read from the ledger (`from_ledger`) also `claimed`.
    pub status: String,
    /// Business type of its event.
    pub biz_type: String,
    /// Business id of its event.
    pub biz_id: String,
    /// Attempts begun so far.
    pub attempts: u32,
    /// Attempts allowed.
    pub max_attempts: u32,
    /// Key policy `name@version` that derived the key.
    pub key_policy: String,
    /// Dedup window in ms.
    pub window_ms: u64,
    /// When accepted (ms since the epoch, Redis clock).
    pub accepted_at: u64,
    /// Last change (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<u64>,
    /// When the provider accepted it (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<u64>,
    /// When it ended (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// When a `retry_wait` task is due (ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_due: Option<u64>,
    /// When its first attempt is due, set by the event's `send_at` or by
    /// quiet hours (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduled_for: Option<u64>,
    /// The last error the sender reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The provider's id of the message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_message_id: Option<String>,
    /// The client reference the channel plugin gave the provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// When the first attempt started (ms, Redis clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_attempt_at: Option<u64>,
    /// When the last attempt started (ms, Redis clock).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_attempt_at: Option<u64>,
    /// Times an operator requeued it.
    pub requeues: u32,
    /// For `duplicate_prevented`: the task the delivery ledger names as the
    /// owner of the key (accepted, and possibly sent, before Redis lost its permit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<String>,
    /// True once some attempt is known to have reached the provider.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ever_sent: bool,
    /// True once an attempt may have reached the provider without anyone
    /// knowing (its answer was cut off, its worker vanished mid-send, or it
    /// was re-sent after either): a requeue may send it twice.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub maybe_sent: bool,
    /// True once it was resent after an ambiguous answer on a channel that
    /// cannot dedupe the resend: the user may have it twice
    /// (`pushonce_possible_duplicates_total` counts these resends).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub possible_duplicate: bool,
    /// Why the task is (or was last) held, from the attempt that held it
    /// (`unknown`, or `dead` after its attempts ran out); never overwritten
    /// by the reconciler.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_cause: Option<HeldCauseView>,
    /// The provider's last answer as the channel plugin saw it, when the task was held.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider_answer: Option<String>,
    /// On a channel with providers: the provider instance its last request
    /// went to (where an unknown outcome is settled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// On a channel with providers: every request's `<attempt>:<provider>`,
    /// oldest first (a failover shows as two entries of one attempt).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub provider_log: Vec<String>,
    /// What the reconciler tried, oldest first (the newest 32 checks).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reconcile_log: Vec<ReconcileStepView>,
    /// What operators did to it (requeue, delivered, given up): who, when, why; oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) operator_log: Vec<OperatorStepView>,
    /// For a digest task (the policy's `[digest]`): the events it gathered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<DigestView>,
    /// True when Redis no longer has the task (retention) and this is the
    /// delivery ledger's row: no event, payload or schedule, the recipient only as a digest.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub from_ledger: bool,
    /// The event, as accepted.
    #[schema(value_type = Object)]
    pub event: serde_json::Value,
    /// What the channel sends (recipient, template, params, fallback); the
    /// one-click unsubscribe link only to an operator (`/admin`, the console).
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
}

impl TaskView {
    /// This view as the API token sees it (`/v1`): without its payload's
    /// one-click unsubscribe link, nor that of any fallback down its chain.
    /// A link opts its user out to whoever holds it, which the API token
    /// may not do (`[preferences] api_token_writes`).
    pub(crate) fn without_unsubscribe_links(mut self) -> TaskView {
        let mut payload = Some(&mut self.payload);
        while let Some(p) = payload.and_then(serde_json::Value::as_object_mut) {
            p.remove("unsubscribe");
            payload = p.get_mut("fallback").and_then(|f| f.get_mut("payload"));
        }
        self
    }
}

impl From<&Task> for TaskView {
    /// A task as the API shows it.
    fn from(task: &Task) -> TaskView {
        let num = |k: &str| task.fields.get(k).and_then(|v| v.parse::<u64>().ok());
        let json = |text: &str| serde_json::from_str(text).unwrap_or(serde_json::Value::Null);
        TaskView {
            id: task.id.clone(),
            key: task.key.clone(),
            channel: task.channel.clone(),
            status: task.status.to_string(),
            biz_type: task.biz_type.clone(),
            biz_id: task.biz_id.clone(),
            attempts: task.attempts,
            max_attempts: task.retry.max_attempts,
            key_policy: format!("{}@{}", task.policy_name, task.policy_version),
            window_ms: task.window_ms,
            accepted_at: task.accepted_at_ms,
            // An accept writes no `updated_at` (layout 4): until the task
            // first changes, it was last updated when it was accepted.
            updated_at: num("updated_at").or(Some(task.accepted_at_ms)),
            sent_at: num("sent_at"),
            finished_at: num("finished_at"),
            next_due: task.next_due_ms,
            scheduled_for: num("scheduled_for"),
            last_error: task.last_error.clone(),
            provider_message_id: task.provider_message_id.clone(),
            reference: task.reference.clone(),
            first_attempt_at: task.first_attempt_ms,
            last_attempt_at: task.last_attempt_ms,
            requeues: num("requeues").unwrap_or(0) as u32,
            duplicate_of: task.fields.get("duplicate_of").cloned(),
            ever_sent: task.ever_sent,
            maybe_sent: task.maybe_sent,
            possible_duplicate: task
                .fields
                .get(crate::dispatch::duplicates::FIELD)
                .is_some_and(|v| v == "1"),
            held_cause: task.held_cause.map(HeldCauseView::from),
            provider_answer: task.provider_answer.clone(),
            provider: task.fields.get("provider").cloned(),
            provider_log: task
                .fields
                .get("provider_log")
                .map(|log| log.split_whitespace().map(str::to_string).collect())
                .unwrap_or_default(),
            reconcile_log: task
                .reconcile_log()
                .into_iter()
                .map(ReconcileStepView::from)
                .collect(),
            operator_log: task
                .operator_log()
                .into_iter()
                .map(OperatorStepView::from)
                .collect(),
            digest: task.digest_count().map(|count| DigestView {
                count,
                items: task
                    .fields
                    .get("digest_items")
                    .and_then(|t| serde_json::from_str(t).ok())
                    .unwrap_or_default(),
            }),
            from_ledger: false,
            event: json(&task.event_json),
            payload: json(&task.payload),
        }
    }
}

/// A digest task's events: how many, and the first `max_items` in the
/// order they joined.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct DigestView {
    /// How many events the digest holds.
    pub count: u64,
    /// The events it carries in its message, each `{"biz_id", "params"}`.
    #[schema(value_type = Vec<Object>)]
    pub items: Vec<serde_json::Value>,
}

impl From<HeldCause> for HeldCauseView {
    /// A held cause as the API shows it.
    fn from(cause: HeldCause) -> HeldCauseView {
        HeldCauseView {
            kind: cause.kind().to_string(),
            request_started: match cause {
                HeldCause::WorkerVanished { request_started } => Some(request_started),
                _ => None,
            },
            explanation: cause.explain().to_string(),
        }
    }
}

impl From<ReconcileStep> for ReconcileStepView {
    /// A reconciler step as the API shows it.
    fn from(step: ReconcileStep) -> ReconcileStepView {
        ReconcileStepView {
            at: step.at,
            check: step.check,
            asked: step.asked,
            answer: step.answer,
            detail: step.detail,
            action: step.action,
        }
    }
}

/// Why a task is held.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct HeldCauseView {
    /// `cut_off_after_write` (the request was written, the answer cut off),
    /// `worker_vanished` (re-claimed from a worker that vanished mid-attempt),
    /// `retries_exhausted` (every attempt failed retryably), or
    /// `query_could_not_tell` (held before causes were recorded; no check could tell).
    pub kind: String,
    /// For `worker_vanished`: whether that worker had handed the message to
    /// its channel (its request may have been written); false: it had not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_started: Option<bool>,
    /// What the cause means, in plain words.
    pub explanation: String,
}

/// One check the reconciler made of a task.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct ReconcileStepView {
    /// When (ms since the epoch, Redis clock).
    pub at: u64,
    /// Its number since the task began awaiting confirmation.
    pub check: u32,
    /// What was asked: `status query`, or `nothing: no status query`.
    pub asked: String,
    /// The answer: `pending`, `absent`, `cannot_tell`, ….
    pub answer: String,
    /// The answer's detail, if any (a failed query's error).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
    /// What the reconciler did: `later`, `untrack`, `sent`, `requeue`, `dead`.
    pub action: String,
}

/// One operator action on a task.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct OperatorStepView {
    /// When (ms since the epoch, Redis clock).
    pub at: u64,
    /// Who (the console's signed-in name, or the admin API's `by`).
    pub by: String,
    /// `requeue`, `requeue (forced)`, `delivered` or `given_up`.
    pub action: String,
    /// Why, in the operator's words.
    pub why: String,
}

impl From<OperatorStep> for OperatorStepView {
    /// An operator action as the API shows it.
    fn from(step: OperatorStep) -> OperatorStepView {
        OperatorStepView {
            at: step.at,
            by: step.by,
            action: step.action,
            why: step.why,
        }
    }
}

/// The tasks of one event: `GET /v1/events/{biz_type}/{biz_id}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct EventTasks {
    /// Business type.
    pub biz_type: String,
    /// Business id.
    pub biz_id: String,
    /// Its tasks (every channel, fallbacks included once created), oldest first.
    pub tasks: Vec<TaskView>,
    /// Its channels answered `opted_out` (the recipient had switched the
    /// channel or the policy's category off: no task), oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub opted_out: Vec<OptedOutView>,
}

/// A channel of an event answered `opted_out`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct OptedOutView {
    /// The channel.
    pub channel: String,
    /// The key its message would have had.
    pub key: String,
    /// When it was answered (ms since the epoch, the host's clock).
    pub at: i64,
}

/// `?user_id=` of the event lookup.
#[derive(Debug, Clone, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventQuery {
    /// Only the tasks of this user's event.
    pub user_id: Option<String>,
}

/// An RFC 9457 problem details body.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem, e.g. `urn:pushonce:problem:invalid-field`.
    #[serde(rename = "type")]
    pub kind: String,
    /// A short summary of the kind of problem.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong in this case, in plain words.
    pub detail: String,
    /// The request field at fault (dotted path, e.g. `recipients.sms`), when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The plugin at fault (`name@version`), when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
    /// Every reason, one line each (a refused reload).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<String>>,
    /// On a 503 of `POST /v1/events`: the channels known to be accepted
    /// before Redis failed (possibly none). Retrying the same event is safe:
    /// accepted channels answer `duplicate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted: Option<Vec<ChannelResult>>,
}
