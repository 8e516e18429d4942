//! Why a task is held, and what the reconciler tried since: the evidence an
//! operator needs to tell a message that may be at the provider from one
//! that is not.
//!
//! A task that becomes `unknown` (or `dead` after its attempts ran out)
//! keeps its [`HeldCause`] and the provider's last answer in fields of its
//! own (`held_cause`, `provider_answer`), written by `record.lua` from the
//! attempt that held it. The reconciler never writes them (it only fills a
//! missing cause, for tasks held before these fields existed); every check
//! it completes appends one [`ReconcileStep`] to `reconcile_log`.

use serde::{Deserialize, Serialize};

/// The attempt's outcome that held the task, as the worker saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HeldCause {
    /// The channel plugin wrote its request and the answer was cut off (or
    /// the call trapped or timed out after a request went out): the provider
    /// may have the message.
    CutOffAfterWrite,
    /// The worker holding the lease vanished mid-attempt and the task was
    /// re-claimed. `request_started`: that worker had handed the message to
    /// the channel (its request may have been written); false means it
    /// vanished before, as far as Redis recorded it.
    WorkerVanished {
        /// The vanished worker had started the send.
        request_started: bool,
    },
    /// Every allowed attempt failed retryably (`dead`); the provider's last
    /// answer says why.
    RetriesExhausted,
    /// Only the reconciler's checks are known (a task held before causes
    /// were recorded): no check could tell.
    QueryCouldNotTell,
}

impl HeldCause {
    /// The cause as stored in the task hash (JSON).
    pub(crate) fn to_json(self) -> String {
        serde_json::to_string(&self).unwrap_or_default()
    }

    /// Parses a stored cause; `None` when absent or unreadable.
    pub fn parse(text: &str) -> Option<HeldCause> {
        serde_json::from_str(text).ok()
    }

    /// Its name, as stored in `kind`.
    pub fn kind(self) -> &'static str {
        match self {
            HeldCause::CutOffAfterWrite => "cut_off_after_write",
            HeldCause::WorkerVanished { .. } => "worker_vanished",
            HeldCause::RetriesExhausted => "retries_exhausted",
            HeldCause::QueryCouldNotTell => "query_could_not_tell",
        }
    }

    /// What the cause means for an operator, in plain words.
    pub(crate) fn explain(self) -> &'static str {
        match self {
            HeldCause::CutOffAfterWrite => {
                "the request was written and the answer cut off: the provider may have the message"
            }
            HeldCause::WorkerVanished {
                request_started: true,
            } => {
                "the worker vanished after handing the message to the channel: the provider may have it"
            }
            HeldCause::WorkerVanished {
                request_started: false,
            } => {
                "the worker vanished before handing the message to the channel: it did not send it"
            }
            HeldCause::RetriesExhausted => {
                "every allowed attempt failed retryably; the provider's last answer says why"
            }
            HeldCause::QueryCouldNotTell => "no check of the provider could tell",
        }
    }
}

/// One check the reconciler completed, as `reconcile.lua` appends it to
/// the task's `reconcile_log` (one JSON object a line, the newest last).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileStep {
    /// When the check was recorded (Redis clock, ms since the epoch).
    pub at: u64,
    /// The check's number since the task entered the awaiting index.
    pub check: u32,
    /// What was asked: `status query`, or why nothing could be asked.
    pub asked: String,
    /// The answer: `pending`, `absent`, `cannot_tell`, …
    pub answer: String,
    /// The answer's detail (a failed query's error, the lag), if any.
    #[serde(default)]
    pub detail: String,
    /// What the reconciler did: `later`, `untrack`, `sent`, `requeue`, `dead`.
    pub action: String,
}

/// The steps of a stored `reconcile_log`, oldest first; unreadable lines are skipped.
pub(crate) fn parse_log(text: &str) -> Vec<ReconcileStep> {
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// Who acts on a task and why, as an operator action records it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperatorNote {
    /// Who: the console's signed-in name, or the admin API's `by`.
    pub by: String,
    /// Why, in the operator's words.
    pub why: String,
}

/// One operator action on a task, as `operator_log` keeps it (one JSON
/// object a line, the newest last): requeue, delivered, given up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OperatorStep {
    /// When (Redis clock, ms since the epoch).
    pub at: u64,
    /// Who.
    pub by: String,
    /// `requeue`, `requeue (forced)`, `delivered` or `given_up`.
    pub action: String,
    /// Why.
    pub why: String,
}

/// The steps of a stored `operator_log`, oldest first; unreadable lines are skipped.
pub(crate) fn parse_operator_log(text: &str) -> Vec<OperatorStep> {
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// What a worker knows about an outcome beyond the outcome itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordContext {
    /// A `sent` outcome enters the awaiting index only when the reconciler
    /// can check it (its channel has a status query); otherwise `sent` is
    /// final (a delivery receipt still settles it).
    pub checkable: bool,
    /// Why an `unknown` or `dead` outcome holds the task; `None`: derived from the outcome.
    pub held: Option<HeldCause>,
    /// The delivery ledger already holds this outcome (written and
    /// confirmed before the record): a task that ends for good with it —
    /// `sent` with nothing to await, or `failed` with its fallback taken —
    /// leaves Redis in the same script (its permit stays). False (the
    /// default): it keeps the retention.
    pub ledger_holds_outcome: bool,
    /// The delivery ledger may still hold the task's row of its key (its
    /// removal was not confirmed): a `failed` or `dead` outcome keeps the
    /// permit for the window even when nothing was sent, since a re-post
    /// would be accepted by Redis and refused by the ledger's claim. False
    /// (the default): such an outcome releases the permit.
    pub ledger_keeps_key: bool,
}

impl Default for RecordContext {
    fn default() -> Self {
        RecordContext {
            checkable: true,
            held: None,
            ledger_holds_outcome: false,
            ledger_keeps_key: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_read_back_as_written() {
        for cause in [
            HeldCause::CutOffAfterWrite,
            HeldCause::WorkerVanished {
                request_started: true,
            },
            HeldCause::WorkerVanished {
                request_started: false,
            },
            HeldCause::RetriesExhausted,
            HeldCause::QueryCouldNotTell,
        ] {
            assert_eq!(HeldCause::parse(&cause.to_json()), Some(cause));
            assert!(cause.to_json().contains(cause.kind()));
        }
        assert_eq!(
            HeldCause::WorkerVanished {
                request_started: true
            }
            .to_json(),
            r#"{"kind":"worker_vanished","request_started":true}"#
        );
        assert_eq!(HeldCause::parse("nonsense"), None);
    }

    #[test]
    fn log_lines_parse_and_bad_ones_are_skipped() {
        let log = "{\"at\":1,\"check\":1,\"asked\":\"nothing\",\"answer\":\"cannot_tell\",\"action\":\"later\"}\nbroken\n";
        let steps = parse_log(log);
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].action, "later");
        assert_eq!(steps[0].detail, "");
    }
}
