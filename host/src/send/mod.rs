//! The `Sender` seam: what the dispatcher calls to hand one attempt of a task
//! to a provider, and the classes of outcome it gets back.
//!
//! Channel plugins plug in behind [`Sender`] as [`plugin::PluginSender`];
//! [`receipts::apply_receipts`] settles tasks from providers' delivery
//! callbacks. For development and tests [`LedgerFileSender`] plays the
//! provider: it appends one JSON line per call to a ledger file before it
//! answers, so a test can count what reached "the provider" even when the
//! sending process is killed with `kill -9`.

pub mod circuit;
pub mod path_token;
pub mod plugin;
pub mod providers;
pub mod receipts;
pub mod redact;

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A boxed future that can cross threads, as [`Sender::send`] returns.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One attempt of one task, as the sender sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingMessage {
    /// The task id.
    pub task_id: String,
    /// The idempotency key; a provider that honours a client reference gets this.
    pub idempotency_key: String,
    /// The channel name.
    pub channel: String,
    /// Attempt number, 1 for the first.
    pub attempt: u32,
    /// What to send: the task's payload, parsed once for the whole attempt
    /// (an invalid one is refused for good by the sender).
    pub payload: Result<Arc<Payload>, InvalidPayload>,
    /// The client reference a previous attempt's receipt named, if any.
    pub reference: Option<String>,
    /// The provider's id of the message, if a receipt named it.
    pub provider_message_id: Option<String>,
    /// When the task's first attempt started (ms since the epoch; 0 if unknown).
    pub first_attempt_ms: u64,
    /// When its last attempt started (ms since the epoch; 0 if unknown).
    pub last_attempt_ms: u64,
    /// When its last attempt's send call returned, if this host saw it (ms
    /// since the epoch; 0 if unknown): the provider cannot have got the
    /// request later.
    pub last_attempt_ended_ms: u64,
    /// On a channel with providers: the provider instance this attempt goes
    /// to (the task's `provider`, where its last request went; `None`: the
    /// channel's first). Ignored by a single-plugin channel.
    pub provider: Option<String>,
}

impl OutgoingMessage {
    /// The message of `task`'s current attempt, with what the task recorded
    /// of earlier ones (reference, provider id, attempt times).
    pub(crate) fn of_task(task: &crate::permit::Task) -> OutgoingMessage {
        OutgoingMessage {
            task_id: task.id.clone(),
            idempotency_key: task.key.clone(),
            channel: task.channel.clone(),
            attempt: task.attempts,
            payload: task.sends(),
            reference: task.reference.clone(),
            provider_message_id: task.provider_message_id.clone(),
            first_attempt_ms: task.first_attempt_ms.unwrap_or(0),
            last_attempt_ms: task.last_attempt_ms.unwrap_or(0),
            last_attempt_ended_ms: held_after_last_attempt(task),
            provider: task.fields.get("provider").cloned(),
        }
    }
}

/// When `task`'s last attempt was recorded held (its `held_at`), which is
/// after its send call returned; 0 when it was not held after that attempt.
fn held_after_last_attempt(task: &crate::permit::Task) -> u64 {
    let held_at = task
        .fields
        .get("held_at")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    match task.last_attempt_ms {
        Some(started) if held_at >= started => held_at,
        _ => 0,
    }
}

/// What became of an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// The provider accepted the message.
    Sent {
        /// The provider's id for it.
        provider_message_id: String,
        /// The client reference the plugin gave the provider, if any.
        reference: Option<String>,
    },
    /// A failure worth retrying (429, a refused connection: not taken).
    Retryable {
        /// Why, for operators.
        reason: String,
        /// The provider asked to wait this long first (`Retry-After`).
        after: Option<Duration>,
    },
    /// A failure that will not change (invalid number, arrears).
    Permanent(String),
    /// The request went out and no answer that says whether the provider took
    /// it came back (cut off, or an ambiguous 5xx): the provider may have it.
    Unknown(String),
}

impl SendOutcome {
    /// A retryable failure without a retry-after hint.
    pub fn retryable(reason: impl Into<String>) -> SendOutcome {
        SendOutcome::Retryable {
            reason: reason.into(),
            after: None,
        }
    }
}

/// What to do about a send whose outcome is unknown, as the channel can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnknownVerdict {
    /// The provider has the message (a status query said so): record it sent.
    Sent {
        /// The provider's id, when the answer carried one.
        provider_message_id: Option<String>,
    },
    /// Resending with the same key is safe (the provider honours the
    /// reference, or a query said it does not have the message), or the
    /// channel is configured `on_unknown = "resend"`.
    Resend,
    /// Resend, though the provider cannot dedupe it: the channel honours no
    /// reference (or its window is over) and either `on_unknown = "resend"`
    /// or a status query found nothing (queries may lag). A possible
    /// duplicate: counted and marked on the task when the resend is made.
    ResendMayDuplicate,
    /// Nothing can tell: hold the task as `unknown` for a receipt or an operator.
    Hold,
}

/// What a provider says, when asked later, about a message that was sent
/// (or may have been): the reconciler's question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Delivered to the user.
    Delivered,
    /// The provider has it, not delivered yet.
    Accepted,
    /// The provider had it, and delivery failed.
    Failed,
    /// The provider never got it: sending it (again) is not a duplicate.
    Absent,
    /// Nothing to tell from: no status query, or the query failed (the reason).
    CannotTell(String),
}

impl Check {
    /// Every [`Check::label`], for registering the series up front.
    pub(crate) const LABELS: [&'static str; 5] =
        ["delivered", "pending", "failed", "absent", "cannot_tell"];

    /// A short name, for metrics labels: `delivered`, `pending`, `failed`, `absent`, `cannot_tell`.
    pub fn label(&self) -> &'static str {
        match self {
            Check::Delivered => "delivered",
            Check::Accepted => "pending",
            Check::Failed => "failed",
            Check::Absent => "absent",
            Check::CannotTell(_) => "cannot_tell",
        }
    }
}

/// How a [`Check::CannotTell`] says that nothing could be asked at all.
pub(crate) const NO_STATUS_QUERY: &str = "has no status query";

/// Sends one attempt. Object safe: the dispatcher holds an `Arc<dyn Sender>`.
pub trait Sender: Send + Sync {
    /// Sends `msg` and classifies the result. Must not panic; every failure is an outcome.
    fn send<'a>(&'a self, msg: &'a OutgoingMessage) -> BoxFuture<'a, SendOutcome>;

    /// After `send` answered [`SendOutcome::Unknown`]: can the channel find out
    /// (status query) or make a resend harmless (client reference)? The
    /// default knows nothing and holds.
    fn settle_unknown<'a>(&'a self, msg: &'a OutgoingMessage) -> BoxFuture<'a, UnknownVerdict> {
        let _ = msg;
        Box::pin(async { UnknownVerdict::Hold })
    }

    /// Whether the reconciler can ask the provider later what became of a
    /// sent message of `msg`'s channel (a status query). When it cannot, a
    /// `sent` task is final: nothing to check, no awaiting entry (a delivery
    /// receipt still settles it). The default can ([`Sender::check`] may answer).
    fn can_check<'a>(&'a self, msg: &'a OutgoingMessage) -> BoxFuture<'a, bool> {
        let _ = msg;
        Box::pin(async { true })
    }

    /// Whether the provider of `msg`'s channel posts delivery receipts
    /// (callbacks): a message it answered `sent` may still be reported
    /// failed later (a bounce), and its ids are indexed for the receipts to
    /// find it by. The default may (nothing is left unfound).
    fn takes_receipts<'a>(&'a self, msg: &'a OutgoingMessage) -> BoxFuture<'a, bool> {
        let _ = msg;
        Box::pin(async { true })
    }

    /// Whether the provider dedupes a resend of `msg` now (it honours the
    /// reference, inside its window). When it does not, a resend after an
    /// ambiguous answer is a possible duplicate. The default dedupes (the
    /// development sender plays such a provider).
    fn dedupes<'a>(&'a self, msg: &'a OutgoingMessage) -> BoxFuture<'a, bool> {
        let _ = msg;
        Box::pin(async { true })
    }

    /// The provider instances of `channel`, in order, when it fails over
    /// between providers (`providers = [...]`); empty for a single-plugin
    /// channel (the default).
    fn providers(&self, channel: &str) -> Vec<String> {
        let _ = channel;
        Vec::new()
    }

    /// Where a new task of `channel` starts: the first of its providers whose
    /// circuit lets it through (a half-open one takes its one try), else the
    /// first; `None` for a single-plugin channel (the default).
    fn start_provider(&self, channel: &str) -> Option<String> {
        let _ = channel;
        None
    }

    /// Sends `msg` like [`Sender::send`], and says whether the outcome is a
    /// refusal the next provider of the channel may take over: the provider
    /// did not take the message, and its reason is its own, not the
    /// recipient's (`send::providers::Handover`). The default never hands over.
    fn send_for_handover<'a>(
        &'a self,
        msg: &'a OutgoingMessage,
    ) -> BoxFuture<'a, (SendOutcome, providers::Handover)> {
        Box::pin(async move { (self.send(msg).await, providers::Handover::Stays) })
    }

    /// Asks the provider what became of `msg` (by its idempotency key and,
    /// when known, the provider's id). Must not resend. The default cannot tell.
    fn check<'a>(
        &'a self,
        msg: &'a OutgoingMessage,
        provider_message_id: Option<&'a str>,
    ) -> BoxFuture<'a, Check> {
        let _ = (msg, provider_message_id);
        Box::pin(async { Check::CannotTell(format!("this sender {NO_STATUS_QUERY}")) })
    }
}

/// Scripted faults of the [`LedgerFileSender`], for tests and demos.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Attempts 1..=K of every task fail retryably (the attempt number comes from
    /// Redis, so this holds across processes).
    pub fail_first: u32,
    /// Keys containing this text fail permanently.
    pub permanent_match: Option<String>,
    /// Keys containing this text answer unknown (as if the connection dropped after sending).
    pub unknown_match: Option<String>,
    /// Wait this long before "the provider" takes the message.
    pub send_delay: Duration,
    /// Wait this long after the provider took the message, before answering
    /// (the window where a crash leaves a sent message unrecorded).
    pub hold_after_send: Duration,
}

/// A development sender that plays the provider: every call appends one JSON
/// line `{task_id, key, channel, attempt, outcome, pid, at_ms}` to a ledger
/// file (`O_APPEND`, one `write` per line, before answering).
#[derive(Debug)]
pub struct LedgerFileSender {
    /// The ledger, opened for appending; the lock keeps lines whole.
    file: Mutex<File>,
    /// Where the ledger is, read back by [`Sender::check`].
    path: std::path::PathBuf,
    /// Faults to inject.
    faults: Faults,
}

impl LedgerFileSender {
    /// Opens (creating if needed) the ledger at `path`.
    pub fn open(path: &Path, faults: Faults) -> std::io::Result<LedgerFileSender> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(LedgerFileSender {
            file: Mutex::new(file),
            path: path.to_path_buf(),
            faults,
        })
    }

    fn classify(&self, msg: &OutgoingMessage) -> SendOutcome {
        let matches = |pat: &Option<String>| {
            pat.as_deref()
                .is_some_and(|p| !p.is_empty() && msg.idempotency_key.contains(p))
        };
        if matches(&self.faults.permanent_match) {
            SendOutcome::Permanent("scripted: permanent failure".into())
        } else if msg.attempt <= self.faults.fail_first {
            SendOutcome::retryable(format!("scripted: attempt {} fails", msg.attempt))
        } else if matches(&self.faults.unknown_match) {
            SendOutcome::Unknown("scripted: no answer".into())
        } else {
            SendOutcome::Sent {
                provider_message_id: format!("ledger-{}-{}", msg.task_id, msg.attempt),
                reference: None,
            }
        }
    }

    fn append(&self, msg: &OutgoingMessage, outcome: &SendOutcome) -> std::io::Result<()> {
        let (name, detail) = match outcome {
            SendOutcome::Sent {
                provider_message_id,
                ..
            } => ("sent", provider_message_id.as_str()),
            SendOutcome::Retryable { reason, .. } => ("retryable", reason.as_str()),
            SendOutcome::Permanent(r) => ("permanent", r.as_str()),
            SendOutcome::Unknown(r) => ("unknown", r.as_str()),
        };
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let mut line = serde_json::json!({
            "task_id": msg.task_id,
            "key": msg.idempotency_key,
            "channel": msg.channel,
            "attempt": msg.attempt,
            "outcome": name,
            "detail": detail,
            "pid": std::process::id(),
            "at_ms": at_ms,
        })
        .to_string();
        line.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(line.as_bytes())?;
        file.flush()
    }
}

impl LedgerFileSender {
    /// What "the provider" has of `key`: a ledger line that took it (`sent`,
    /// or `unknown` — taken, answer lost) means delivered; none, absent.
    fn look_up(&self, key: &str) -> Check {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) => return Check::CannotTell(format!("cannot read the ledger: {e}")),
        };
        let took = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|l| l["key"] == key && (l["outcome"] == "sent" || l["outcome"] == "unknown"));
        if took {
            Check::Delivered
        } else {
            Check::Absent
        }
    }
}

impl Sender for LedgerFileSender {
    fn send<'a>(&'a self, msg: &'a OutgoingMessage) -> BoxFuture<'a, SendOutcome> {
        Box::pin(async move {
            if !self.faults.send_delay.is_zero() {
                tokio::time::sleep(self.faults.send_delay).await;
            }
            let outcome = self.classify(msg);
            if let Err(e) = self.append(msg, &outcome) {
                // The provider did not take it: nothing went out.
                return SendOutcome::retryable(format!("ledger write failed: {e}"));
            }
            if !self.faults.hold_after_send.is_zero() {
                tokio::time::sleep(self.faults.hold_after_send).await;
            }
            outcome
        })
    }

    /// The ledger plays a provider that honours the idempotency key as a
    /// client reference (its lines carry the key), so a resend is harmless.
    fn settle_unknown<'a>(&'a self, _msg: &'a OutgoingMessage) -> BoxFuture<'a, UnknownVerdict> {
        Box::pin(async { UnknownVerdict::Resend })
    }

    fn check<'a>(&'a self, msg: &'a OutgoingMessage, _: Option<&'a str>) -> BoxFuture<'a, Check> {
        Box::pin(async move { self.look_up(&msg.idempotency_key) })
    }
}

pub use crate::permit::{Fallback, InvalidPayload, Payload, UnsubscribeLink};
