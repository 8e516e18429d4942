//! The task record as stored in Redis: its status (the state machine), the
//! retry schedule snapshotted at accept, and the parsed hash.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::held::{HeldCause, OperatorStep, ReconcileStep, parse_log, parse_operator_log};
use super::payload::{DigestItems, InvalidPayload, ParsedPayload, Payload};
use super::stored;

/// Where a task is in its life. `queued → sending → sent → delivered`, with
/// `retry_wait`, `unknown`, `failed`, `dead`, `superseded` and `cancelled` on the side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// Accepted, in its shard's ready stream, waiting for a worker.
    Queued,
    /// A worker holds a lease and is sending attempt n.
    Sending,
    /// An attempt failed retryably; the task waits in the delayed set for its due time.
    RetryWait,
    /// The provider accepted the message (receipt: provider message id).
    Sent,
    /// An attempt went out with no answer; held until a receipt, a query or an operator settles it.
    Unknown,
    /// A delivery receipt confirmed it reached the user.
    Delivered,
    /// Failed for good (the provider refused it permanently, or a receipt said so).
    Failed,
    /// Every allowed attempt failed retryably.
    Dead,
    /// Its permit lapsed while it waited and a newer task with the same key
    /// took it; that task sends instead, this one never will.
    Superseded,
    /// The delivery ledger names another task as the owner of its key:
    /// Redis lost that task's permit (a failover), and this task, accepted
    /// again, was stopped before sending (`duplicate_of` names the owner).
    DuplicatePrevented,
    /// Cancelled by the business before its first attempt began
    /// (`POST /v1/events/{biz_type}/{biz_id}/cancel`): never sent.
    Cancelled,
}

impl TaskStatus {
    /// The name stored in Redis.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Queued => "queued",
            TaskStatus::Sending => "sending",
            TaskStatus::RetryWait => "retry_wait",
            TaskStatus::Sent => "sent",
            TaskStatus::Unknown => "unknown",
            TaskStatus::Delivered => "delivered",
            TaskStatus::Failed => "failed",
            TaskStatus::Dead => "dead",
            TaskStatus::Superseded => "superseded",
            TaskStatus::DuplicatePrevented => "duplicate_prevented",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    /// Parses a stored name.
    pub fn parse(s: &str) -> Option<TaskStatus> {
        Some(match s {
            "queued" => TaskStatus::Queued,
            "sending" => TaskStatus::Sending,
            "retry_wait" => TaskStatus::RetryWait,
            "sent" => TaskStatus::Sent,
            "unknown" => TaskStatus::Unknown,
            "delivered" => TaskStatus::Delivered,
            "failed" => TaskStatus::Failed,
            "dead" => TaskStatus::Dead,
            "superseded" => TaskStatus::Superseded,
            "duplicate_prevented" => TaskStatus::DuplicatePrevented,
            "cancelled" => TaskStatus::Cancelled,
            _ => return None,
        })
    }
}

impl std::fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a task retries: exponential backoff with optional jitter. Filled from a
/// policy's `[retry]` table and snapshotted into the task at accept, so a
/// worker needs no policy lookup and a policy change does not alter tasks in flight.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Attempts allowed in all, the first included; a retryable failure of the last one makes the task `dead`.
    pub max_attempts: u32,
    /// Delay after the first failed attempt.
    pub initial: Duration,
    /// Each further delay is the previous one times this factor.
    pub factor: f64,
    /// No delay is longer than this.
    pub max_delay: Duration,
    /// When true a delay is drawn uniformly from [d/2, d] ("equal jitter"), so
    /// tasks that failed together do not retry together.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial: Duration::from_secs(2),
            factor: 2.0,
            max_delay: Duration::from_secs(300),
            jitter: true,
        }
    }
}

/// A task as read from its Redis hash.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// Task id (`<shard>-<ms>-<random>`), also the value of its permit.
    pub id: String,
    /// The idempotency key the task was accepted under.
    pub key: String,
    /// Channel name (`sms`, `inbox`, …).
    pub channel: String,
    /// Current status.
    pub status: TaskStatus,
    /// The business type of the event.
    pub biz_type: String,
    /// The business id of the event.
    pub biz_id: String,
    /// The event as JSON text.
    pub event_json: String,
    /// What the channel sends, as JSON text.
    pub payload: String,
    /// Name of the key policy that derived the key.
    pub policy_name: String,
    /// Version of that key policy.
    pub policy_version: String,
    /// The retry schedule snapshotted at accept.
    pub retry: RetryPolicy,
    /// Dedup window in ms.
    pub window_ms: u64,
    /// When the permit was taken (Redis clock, ms since the epoch).
    pub accepted_at_ms: u64,
    /// Attempts begun so far.
    pub attempts: u32,
    /// End of the current lease (while `sending`), Redis clock.
    pub lease_until_ms: Option<u64>,
    /// When a `retry_wait` task is due.
    pub next_due_ms: Option<u64>,
    /// The last error reported by the sender.
    pub last_error: Option<String>,
    /// The provider's id of the accepted message.
    pub provider_message_id: Option<String>,
    /// The client reference the plugin gave the provider, as its receipt said.
    pub reference: Option<String>,
    /// When the first attempt started (Redis clock, ms since the epoch).
    pub first_attempt_ms: Option<u64>,
    /// When the last attempt started (Redis clock, ms since the epoch).
    pub last_attempt_ms: Option<u64>,
    /// True once some attempt is known to have reached the provider.
    pub ever_sent: bool,
    /// True once an attempt was re-claimed from a dead worker (it may have sent).
    pub maybe_sent: bool,
    /// Why it is (or was last) held: the outcome of the attempt that held it.
    pub held_cause: Option<HeldCause>,
    /// The provider's last answer as the plugin saw it, when the task was held.
    pub provider_answer: Option<String>,
    /// Every field of the hash, for fields not modelled above.
    pub fields: HashMap<String, String>,
    /// `payload` parsed at its first use ([`Task::sends`]).
    parsed_payload: ParsedPayload,
}

impl Task {
    /// What the task sends: `payload` parsed, once per task read (every later
    /// call shares the first parse).
    pub fn sends(&self) -> Result<Arc<Payload>, InvalidPayload> {
        let digest = self.fields.get("items").map(|count| DigestItems {
            count,
            items: self.fields.get("digest_items").map_or("[]", String::as_str),
            opener: &self.biz_id,
        });
        self.parsed_payload.get(&self.payload, digest)
    }

    /// For a digest task (the policy's `[digest]`): how many events it
    /// gathered; `None` for a task of one event.
    pub fn digest_count(&self) -> Option<u64> {
        self.fields.get("items").and_then(|n| n.parse().ok())
    }

    /// What the reconciler tried, oldest first (`reconcile_log`).
    pub fn reconcile_log(&self) -> Vec<ReconcileStep> {
        self.fields
            .get("reconcile_log")
            .map(|log| parse_log(log))
            .unwrap_or_default()
    }

    /// The channel its message last went through, or on a channel with
    /// providers the provider instance (`provider`): where its receipts
    /// come, and the name its provider ids are indexed under.
    pub(crate) fn sent_through(&self) -> &str {
        self.fields.get("provider").unwrap_or(&self.channel)
    }

    /// What operators did to it, oldest first (`operator_log`).
    pub(crate) fn operator_log(&self) -> Vec<OperatorStep> {
        self.fields
            .get("operator_log")
            .map(|log| parse_operator_log(log))
            .unwrap_or_default()
    }
}

impl Task {
    /// Builds a task from its hash fields; `None` if the hash is empty or malformed.
    pub(crate) fn from_fields(id: &str, fields: HashMap<String, String>) -> Option<Task> {
        // Fields no script reads: what the channels of the event share comes
        // from its event record (`meta`: layout 7 as text, `stored::meta_text`;
        // layout 5 and 6 as JSON); tasks written before event records pack
        // them in `spec` (JSON), older ones carry them one by one.
        let mut spec: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
        if let Some((policy, version, biz_type)) =
            fields.get("meta").and_then(|m| stored::parse_meta(m))
        {
            let biz_type = biz_type.or_else(|| stored::biz_type_of_ev(fields.get("ev")?));
            for (name, value) in [
                ("policy", Some(policy)),
                ("policy_version", Some(version)),
                ("biz_type", biz_type),
            ] {
                if let Some(value) = value {
                    spec.insert(name.into(), serde_json::Value::String(value.into()));
                }
            }
        }
        for packed in ["spec", "meta"] {
            if let Some(serde_json::Value::Object(m)) = fields
                .get(packed)
                .and_then(|s| serde_json::from_str(s).ok())
            {
                spec.extend(m);
            }
        }
        // The retry schedule packed in `retry` (`accept::retry_arg`).
        if let Some(packed) = fields.get("retry") {
            let parts: Vec<&str> = packed.split(',').collect();
            if let [initial, factor, max_delay, jitter] = parts[..] {
                for (name, value) in [
                    ("retry_initial_ms", initial),
                    ("retry_factor", factor),
                    ("retry_max_delay_ms", max_delay),
                    ("retry_jitter", jitter),
                ] {
                    spec.insert(name.into(), serde_json::Value::String(value.into()));
                }
            }
        }
        let field = |k: &str| -> Option<String> {
            match spec.get(k) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(serde_json::Value::Bool(b)) => Some(if *b { "1" } else { "0" }.into()),
                Some(v) if !v.is_null() => Some(v.to_string()),
                _ => fields.get(k).cloned(),
            }
        };
        let get = |k: &str| field(k).unwrap_or_default();
        let num = |k: &str| field(k).and_then(|v| v.parse::<u64>().ok());
        let opt = |k: &str| fields.get(k).filter(|v| !v.is_empty()).cloned();
        let status = TaskStatus::parse(fields.get("status")?)?;
        let retry = RetryPolicy {
            max_attempts: num("max").unwrap_or(5) as u32,
            initial: Duration::from_millis(num("retry_initial_ms").unwrap_or(2000)),
            factor: field("retry_factor")
                .and_then(|v| v.parse().ok())
                .unwrap_or(2.0),
            max_delay: Duration::from_millis(num("retry_max_delay_ms").unwrap_or(300_000)),
            jitter: get("retry_jitter") != "0",
        };
        let biz_type = get("biz_type");
        let biz_id = field("biz_id")
            .or_else(|| biz_id_of_ev(fields.get("ev")?, &biz_type))
            .unwrap_or_default();
        Some(Task {
            id: id.to_string(),
            key: get("key"),
            // `channel` in tasks written before layout 6.
            channel: field("ch").or_else(|| field("channel")).unwrap_or_default(),
            status,
            event_json: stored::full_event(get("event"), &biz_type, &biz_id),
            biz_type,
            biz_id,
            payload: get("payload"),
            policy_name: get("policy"),
            policy_version: get("policy_version"),
            retry,
            window_ms: num("window").unwrap_or(0),
            accepted_at_ms: num("at").unwrap_or(0),
            attempts: num("tries").unwrap_or(0) as u32,
            lease_until_ms: num("lease_until"),
            next_due_ms: num("next_due"),
            last_error: opt("last_error"),
            provider_message_id: opt("provider_message_id"),
            reference: opt("reference"),
            first_attempt_ms: num("first_attempt_at"),
            last_attempt_ms: num("attempt_started_at"),
            ever_sent: get("ever_sent") == "1",
            maybe_sent: get("maybe_sent") == "1",
            held_cause: fields.get("held_cause").and_then(|c| HeldCause::parse(c)),
            provider_answer: opt("provider_answer"),
            fields,
            parsed_payload: ParsedPayload::default(),
        })
    }
}

/// The business id in a task's `ev` (`<n>:<biz_type>:<biz_id>`, the name
/// of its event record after the text's number), given the business type
/// (which may hold `:` itself).
fn biz_id_of_ev(ev: &str, biz_type: &str) -> Option<String> {
    let (_, name) = ev.split_once(':')?;
    let id = name.strip_prefix(biz_type)?.strip_prefix(':')?;
    Some(id.to_string())
}

#[cfg(test)]
mod spec_tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn packed_spec_and_separate_fields_read_the_same() {
        let packed = fields(&[
            ("status", "queued"),
            ("key", "k"),
            ("max", "7"),
            (
                "spec",
                r#"{"channel":"sms","biz_type":"T","biz_id":"b","policy":"per-event","policy_version":"1.0.0","retry_initial_ms":1500,"retry_factor":1.5,"retry_max_delay_ms":60000,"retry_jitter":false}"#,
            ),
        ]);
        let separate = fields(&[
            ("status", "queued"),
            ("key", "k"),
            ("max", "7"),
            ("ch", "sms"),
            ("biz_type", "T"),
            ("biz_id", "b"),
            ("policy", "per-event"),
            ("policy_version", "1.0.0"),
            ("retry_initial_ms", "1500"),
            ("retry_factor", "1.5"),
            ("retry_max_delay_ms", "60000"),
            ("retry_jitter", "0"),
        ]);
        let a = Task::from_fields("3-1-x", packed).unwrap();
        let b = Task::from_fields("3-1-x", separate).unwrap();
        for t in [&a, &b] {
            assert_eq!(t.channel, "sms");
            assert_eq!((t.biz_type.as_str(), t.biz_id.as_str()), ("T", "b"));
            assert_eq!(t.policy_name, "per-event");
            assert_eq!(t.policy_version, "1.0.0");
            assert_eq!(
                t.retry,
                RetryPolicy {
                    max_attempts: 7,
                    initial: Duration::from_millis(1500),
                    factor: 1.5,
                    max_delay: Duration::from_secs(60),
                    jitter: false,
                }
            );
        }
    }

    #[test]
    fn a_business_type_without_a_colon_comes_from_the_record_name() {
        let t = Task::from_fields(
            "3-1-x",
            fields(&[
                ("status", "queued"),
                ("ev", "2:ORDER_SHIPPED:o:1"),
                ("meta", "per-event 1.0.0"),
            ]),
        )
        .unwrap();
        assert_eq!(
            (t.biz_type.as_str(), t.biz_id.as_str()),
            ("ORDER_SHIPPED", "o:1")
        );
        assert_eq!(t.policy_version, "1.0.0");
    }

    #[test]
    fn the_business_id_comes_from_the_record_name_after_the_business_type() {
        // Layout 7's `meta` text, and the JSON of layouts 5 and 6 (a held
        // task outlives a drain).
        for meta in [
            "per-event 1.0.0 A:B",
            r#"{"biz_type":"A:B","policy":"per-event","policy_version":"1.0.0"}"#,
        ] {
            let t = Task::from_fields(
                "3-1-x",
                fields(&[
                    ("status", "queued"),
                    ("ev", "2:A:B:x:y"),
                    ("meta", meta),
                    (
                        "event",
                        r#"{"attributes":{},"occurred_at":1,"user_id":"u"}"#,
                    ),
                ]),
            )
            .unwrap();
            assert_eq!((t.biz_type.as_str(), t.biz_id.as_str()), ("A:B", "x:y"));
            assert_eq!(
                (t.policy_name.as_str(), t.policy_version.as_str()),
                ("per-event", "1.0.0")
            );
            assert_eq!(
                t.event_json,
                r#"{"attributes":{},"biz_id":"x:y","biz_type":"A:B","occurred_at":1,"user_id":"u"}"#
            );
        }
    }
}
