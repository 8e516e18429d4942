//! The reconciler: finds out what became of tasks awaiting confirmation —
//! `sent` without a receipt for `sent_age`, or `unknown` for `unknown_age` —
//! by asking the channel's provider ([`Sender::check`], the plugin's
//! `query`), and settles them through owner-checked permit scripts.
//!
//! Every host instance runs one [`Reconciler`]. A pass goes shard by shard:
//! `claim.lua` takes up to `batch` due entries of that shard's awaiting index
//! and re-scores them to now + `check_timeout`, so no other instance takes
//! them while this one checks; each task is then checked (claimed
//! [`CONCURRENT_CHECKS`] at a time and checked at once, each under
//! `check_timeout`, so no check outlives its claim) and the
//! decision ([`decide`]) applied: `delivered` / `failed` through the receipt
//! path ([`Permits::settle_from_provider`]: fallback first), otherwise
//! `reconcile.lua`, fenced by the status the check started from and by the
//! claim's token. Nothing is ever resent unless the provider said it never
//! got the message (`unknown` → re-queued under the same key and task).
//!
//! Metrics (names in [`crate::metric_names`]): checks and give-ups per
//! channel, and, each pass, the reconciliation lag and the awaiting tasks.

pub mod decide;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

pub(crate) use decide::{Decision, decide};

use crate::config::ReconcileConfig;
use crate::metric_names::{AWAITING_TASKS, CHECKS_TOTAL, GAVE_UP_TOTAL, LAG_SECONDS};
use crate::permit::{CheckAction, CheckNote, Claimed, PermitError, Permits, Task, TaskStatus};
use crate::send::{Check, NO_STATUS_QUERY, OutgoingMessage, Sender};

/// Checks in flight at once in one reconciler (also how many entries one claim takes).
pub(crate) const CONCURRENT_CHECKS: usize = 8;

/// What one pass did (for logs and tests).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Tasks claimed and checked.
    pub checked: usize,
    /// Checks whose outcome changed the task's status.
    pub settled: usize,
    /// Entries in every awaiting index, after the claims.
    pub awaiting: u64,
    /// How late the oldest due entry was, across shards.
    pub lag: Duration,
}

/// The reconciler of one host process.
pub struct Reconciler {
    /// Everything its checks share.
    shared: Arc<ReconcileContext>,
}

/// What every check of one reconciler shares.
struct ReconcileContext {
    /// The permit layer (claim and settle scripts).
    permits: Permits,
    /// Asks the providers.
    sender: Arc<dyn Sender>,
    /// Settings.
    config: ReconcileConfig,
    /// Where answers that settle a task are written as history.
    ledger: Option<crate::ledger::Ledger>,
}

impl Reconciler {
    /// A reconciler over `permits`, asking providers through `sender`.
    pub fn new(permits: Permits, sender: Arc<dyn Sender>, config: ReconcileConfig) -> Reconciler {
        Reconciler {
            shared: Arc::new(ReconcileContext {
                permits,
                sender,
                config,
                ledger: None,
            }),
        }
    }

    /// Writes the tasks its checks settle to the delivery ledger too.
    pub fn with_ledger(mut self, ledger: Option<crate::ledger::Ledger>) -> Reconciler {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.ledger = ledger;
        }
        self
    }

    /// Runs a pass every `every` until `shutdown` turns true; a pass in
    /// progress finishes (its checks are recorded). A failed pass is logged
    /// and the next one runs as usual: the reconciler never stops on its own.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        tracing::info!(every = ?self.shared.config.every, "reconciler started");
        while !*shutdown.borrow() {
            match self.pass().await {
                Ok(r) if r.checked > 0 => tracing::debug!(?r, "reconcile pass"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "reconcile pass failed; next pass as usual"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.shared.config.every) => {}
                _ = shutdown.changed() => {}
            }
        }
        tracing::info!("reconciler stopped");
    }

    /// One pass over every shard: claim the due entries of each, check them,
    /// apply the decisions; then update the lag and awaiting gauges.
    ///
    /// A shard is claimed [`CONCURRENT_CHECKS`] entries at a time and those
    /// are checked at once, so every check starts right after its claim and
    /// ends within its hold (`check_timeout`); up to `batch` per shard.
    pub async fn pass(&self) -> Result<PassReport, PermitError> {
        let s = &self.shared;
        let token = format!("{:016x}", rand::random::<u64>());
        let mut report = PassReport::default();
        let mut failure = None;
        for shard in 0..s.permits.layout().shards() {
            // A failing shard does not stop the others' pass.
            if let Err(e) = self.pass_shard(shard, &token, &mut report).await {
                failure = Some(e);
            }
        }
        if let Some(e) = failure {
            return Err(e);
        }
        metrics::gauge!(LAG_SECONDS).set(report.lag.as_secs_f64());
        metrics::gauge!(AWAITING_TASKS).set(report.awaiting as f64);
        Ok(report)
    }

    async fn pass_shard(
        &self,
        shard: u16,
        token: &str,
        report: &mut PassReport,
    ) -> Result<(), PermitError> {
        let s = &self.shared;
        let mut taken = 0;
        let mut first = true;
        while taken < s.config.batch {
            let want = CONCURRENT_CHECKS.min(s.config.batch - taken);
            let pass = s
                .permits
                .claim_checks(shard, want, s.config.check_timeout, token)
                .await?;
            if first {
                report.awaiting += pass.awaiting;
                report.lag = report.lag.max(pass.lag());
                first = false;
            }
            let n = pass.claimed.len();
            let mut running = JoinSet::new();
            for claimed in pass.claimed {
                let (shared, token) = (s.clone(), token.to_string());
                running.spawn(async move { shared.check(&claimed, &token).await });
            }
            let mut failure = None;
            while let Some(done) = running.join_next().await {
                report.checked += 1;
                match done {
                    Ok(Ok(true)) => report.settled += 1,
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => failure = Some(e),
                    Err(e) => tracing::error!(error = %e, "a reconcile check panicked"),
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
            taken += n;
            if n < want {
                break;
            }
        }
        Ok(())
    }
}

impl ReconcileContext {
    /// Writes a task the reconciler settled `status` (with `error`, when
    /// one was recorded) to the ledger, when there is one; once it holds a
    /// task that ended for good (`ends`), the task leaves Redis.
    async fn note(&self, task: &Task, status: &str, error: Option<String>, ends: bool) {
        if let Some(ledger) = &self.ledger {
            let settled = crate::permit::Settlement {
                status,
                error,
                note: None,
            };
            self.permits
                .settle_and_forget(ledger, task, settled, ends)
                .await;
        }
    }

    /// Checks one claimed task and applies the decision; true if the task's
    /// status changed. An entry left unsettled (an error, a crash) comes due
    /// again when its claim's hold runs out.
    async fn check(&self, claimed: &Claimed, token: &str) -> Result<bool, PermitError> {
        let Some(task) = self.permits.task(&claimed.task_id).await? else {
            return Ok(false);
        };
        if task.status != claimed.status {
            // Settled meanwhile (a receipt); the next claim drops the entry.
            return Ok(false);
        }
        let msg = OutgoingMessage::of_task(&task);
        let check = tokio::time::timeout(
            self.config.check_timeout,
            self.sender.check(&msg, task.provider_message_id.as_deref()),
        )
        .await
        .unwrap_or_else(|_| Check::CannotTell("the check timed out".into()));
        metrics::counter!(CHECKS_TOTAL, "channel" => task.channel.clone(), "result" => check.label())
            .increment(1);
        let decision = decide(claimed, &check, &self.config);
        tracing::info!(task = %task.id, status = %claimed.status, checks = claimed.checks, ?check, ?decision, "reconcile check");
        let action = match decision {
            Decision::Settle { delivered } => {
                let settled = self
                    .permits
                    .settle_from_provider(&task, delivered, None)
                    .await?;
                if settled.updated {
                    let status = if delivered { "delivered" } else { "failed" };
                    let ends = delivered || settled.fallback;
                    self.note(&task, status, settled.error, ends).await;
                }
                return Ok(settled.updated);
            }
            Decision::Act(action) => action,
        };
        let why = match &check {
            Check::CannotTell(why) => why.clone(),
            other => other.label().to_string(),
        };
        // An `unknown` task keeps what held it (a `sent` one was not held).
        let held = (claimed.status == TaskStatus::Unknown)
            .then_some(task.last_error.as_deref())
            .flatten();
        let reason = check_reason(claimed.checks, &why, held);
        let done = self
            .permits
            .settle_check_noting(
                &task,
                claimed.status,
                token,
                &action,
                &reason,
                &note_of(&check),
            )
            .await?;
        if done && matches!(action, CheckAction::Requeue { .. }) && !self.sender.dedupes(&msg).await
        {
            // The query found nothing, but it may lag, and the resend is not deduped.
            crate::dispatch::duplicates::note(&self.permits, &task.id, &task.channel).await;
        }
        if done && matches!(action, CheckAction::Untrack | CheckAction::Dead) {
            metrics::counter!(GAVE_UP_TOTAL, "channel" => task.channel.clone(), "status" => claimed.status.as_str())
                .increment(1);
            gave_up(&task, claimed, &reason);
            match action {
                CheckAction::Dead => self.note(&task, "dead", None, false).await,
                // Sent, and no check will settle it any more: it ended, and
                // leaves Redis once the ledger holds it (a late receipt
                // still reaches its ledger row) — unless a receipt may still
                // report it failed and its payload has a fallback, which
                // must then still be there to take.
                _ => {
                    let has_fallback = task.sends().is_ok_and(|p| p.fallback.is_some());
                    let leaves = !(has_fallback && self.sender.takes_receipts(&msg).await);
                    self.note(&task, "sent", None, leaves).await
                }
            }
        }
        Ok(done && !matches!(action, CheckAction::Later(_) | CheckAction::Untrack))
    }
}

/// Logs that the reconciler stopped checking a task: a warning for a held
/// one made `dead` (an operator must look), info for a `sent` one (it was
/// sent; only its delivery stays unconfirmed).
fn gave_up(task: &Task, claimed: &Claimed, reason: &str) {
    if claimed.status == TaskStatus::Unknown {
        tracing::warn!(task = %task.id, status = %claimed.status, checks = claimed.checks, "reconciler gave up: {reason}");
    } else {
        tracing::info!(task = %task.id, status = %claimed.status, checks = claimed.checks, "no longer checked: {reason}");
    }
}

/// What a check asked and was answered, for the task's `reconcile_log`.
fn note_of(check: &Check) -> CheckNote {
    let (asked, detail) = match check {
        Check::CannotTell(why) if why.contains(NO_STATUS_QUERY) => {
            ("nothing: no status query", why.clone())
        }
        Check::CannotTell(why) => ("status query", why.clone()),
        _ => ("status query", String::new()),
    };
    CheckNote {
        asked: asked.to_string(),
        answer: check.label().to_string(),
        detail,
    }
}

/// How a check's result reads in the task's `last_error`: the check, and
/// what first held the task (the send's error, kept through every check), so
/// an operator still sees why it is `unknown` or `dead`.
fn check_reason(checks: u32, why: &str, previous: Option<&str>) -> String {
    const HELD: &str = "; held after: ";
    let origin = previous.map(|p| match p.split_once(HELD) {
        Some((_, origin)) => origin,
        None if p.starts_with("reconcile check ") => "",
        None => p,
    });
    match origin.filter(|o| !o.is_empty()) {
        Some(origin) => format!("reconcile check {checks}: {why}{HELD}{origin}"),
        None => format!("reconcile check {checks}: {why}"),
    }
}

#[cfg(test)]
mod check_reason_tests {
    use super::check_reason;

    #[test]
    fn the_first_cause_of_a_hold_stays_through_every_check() {
        let first = check_reason(1, "no query", Some("no complete answer: cut off"));
        assert_eq!(
            first,
            "reconcile check 1: no query; held after: no complete answer: cut off"
        );
        assert_eq!(
            check_reason(2, "no query", Some(&first)),
            "reconcile check 2: no query; held after: no complete answer: cut off"
        );
        assert_eq!(check_reason(1, "absent", None), "reconcile check 1: absent");
        assert_eq!(
            check_reason(2, "absent", Some("reconcile check 1: absent")),
            "reconcile check 2: absent"
        );
    }
}
