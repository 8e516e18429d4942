//! The reconciler's transition table: from a task's status, what its
//! provider said and how many checks it had, what happens next. Pure, so the
//! whole table is tested here; `mod.rs` applies the decision.

use crate::config::ReconcileConfig;
use crate::permit::{CheckAction, Claimed, TaskStatus};
use crate::send::Check;

/// What to do with a checked task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The provider settled it: `delivered` (true) or failed after accepting
    /// it (false; the fallback is accepted first) — the receipt path.
    Settle {
        /// Delivered, or failed.
        delivered: bool,
    },
    /// An owner-checked transition of `reconcile.lua`.
    Act(CheckAction),
}

/// The decision for the `claimed` task (`sent` or `unknown`, after check
/// number `claimed.checks`), whose provider answered `check`. Never resends
/// what the provider may have: only `unknown` + [`Check::Absent`] re-queues,
/// at most `max_requeues` times per task (a resend interrupted again — a
/// killed worker, a cut-off answer — is re-queued again; a provider that
/// keeps losing the message is not retried for ever: the task is checked
/// on, then `dead`).
pub(crate) fn decide(claimed: &Claimed, check: &Check, config: &ReconcileConfig) -> Decision {
    let (status, checks) = (claimed.status, claimed.checks);
    match (status, check) {
        (_, Check::Delivered) => Decision::Settle { delivered: true },
        (_, Check::Failed) => Decision::Settle { delivered: false },
        (TaskStatus::Unknown, Check::Accepted) => Decision::Act(CheckAction::Sent {
            provider_message_id: None,
        }),
        (TaskStatus::Unknown, Check::Absent) if claimed.requeues < config.max_requeues => {
            Decision::Act(CheckAction::Requeue {
                most: config.max_requeues,
            })
        }
        // Pending, nothing to tell from, a sent message the provider no
        // longer knows (records expired), or lost again after its re-queue:
        // ask again later, a bounded number of times.
        _ if checks >= config.max_checks => Decision::Act(if status == TaskStatus::Unknown {
            CheckAction::Dead
        } else {
            CheckAction::Untrack
        }),
        _ => Decision::Act(CheckAction::Later(config.backoff.delay_after(checks))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn claimed(status: TaskStatus, checks: u32) -> Claimed {
        Claimed {
            task_id: "3-1-x".into(),
            status,
            checks,
            requeues: 0,
        }
    }

    fn config() -> ReconcileConfig {
        ReconcileConfig {
            max_checks: 3,
            ..ReconcileConfig::default()
        }
    }

    #[test]
    fn provider_answers_settle_or_move_the_task() {
        let c = config();
        for status in [TaskStatus::Sent, TaskStatus::Unknown] {
            assert_eq!(
                decide(&claimed(status, 1), &Check::Delivered, &c),
                Decision::Settle { delivered: true }
            );
            assert_eq!(
                decide(&claimed(status, 1), &Check::Failed, &c),
                Decision::Settle { delivered: false }
            );
        }
        assert_eq!(
            decide(&claimed(TaskStatus::Unknown, 1), &Check::Accepted, &c),
            Decision::Act(CheckAction::Sent {
                provider_message_id: None
            })
        );
        let requeue = Decision::Act(CheckAction::Requeue {
            most: c.max_requeues,
        });
        assert_eq!(
            decide(&claimed(TaskStatus::Unknown, 1), &Check::Absent, &c),
            requeue
        );
        let again = |requeues| Claimed {
            requeues,
            ..claimed(TaskStatus::Unknown, 1)
        };
        assert_eq!(
            decide(&again(c.max_requeues - 1), &Check::Absent, &c),
            requeue,
            "lost again after a re-queue (its resend interrupted): re-queued again"
        );
        assert_eq!(
            decide(&again(c.max_requeues), &Check::Absent, &c),
            Decision::Act(CheckAction::Later(Duration::from_secs(30))),
            "re-queued at most max_requeues times"
        );
    }

    #[test]
    fn undecided_checks_back_off_then_give_up() {
        let c = config();
        let cannot = Check::CannotTell("no query".into());
        assert_eq!(
            decide(&claimed(TaskStatus::Sent, 1), &Check::Accepted, &c),
            Decision::Act(CheckAction::Later(Duration::from_secs(30)))
        );
        assert_eq!(
            decide(&claimed(TaskStatus::Unknown, 2), &cannot, &c),
            Decision::Act(CheckAction::Later(Duration::from_secs(60)))
        );
        assert_eq!(
            decide(&claimed(TaskStatus::Sent, 2), &Check::Absent, &c),
            Decision::Act(CheckAction::Later(Duration::from_secs(60))),
            "a sent task is never re-queued"
        );
        assert_eq!(
            decide(&claimed(TaskStatus::Sent, 3), &cannot, &c),
            Decision::Act(CheckAction::Untrack)
        );
        assert_eq!(
            decide(&claimed(TaskStatus::Unknown, 3), &cannot, &c),
            Decision::Act(CheckAction::Dead)
        );
    }
}
