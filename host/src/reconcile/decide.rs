//! The reconciler's transition table: from a task's status, what its
//! provider said and how many checks it had, what happens next. Pure, so the
//! whole table is tested here; `mod.rs` applies the decision.

use crate::config::ReconcileConfig;
use crate::permit::{CheckAction, TaskStatus};
use crate::send::Check;

/// What to do with a checked task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The provider settled it: `delivered` (true) or failed after accepting
    /// it (false; the fallback is accepted first) — the receipt path.
    Settle {
        /// Delivered, or failed.
        delivered: bool,
    },
    /// An owner-checked transition of `reconcile.lua`.
    Act(CheckAction),
}

/// The decision for a task in `status` (`sent` or `unknown`) after check
/// number `checks`, whose provider answered `check`. Never resends what the
/// provider may have: only `unknown` + [`Check::Absent`] re-queues.
pub fn decide(
    status: TaskStatus,
    check: &Check,
    checks: u32,
    config: &ReconcileConfig,
) -> Decision {
    match (status, check) {
        (_, Check::Delivered) => Decision::Settle { delivered: true },
        (_, Check::Failed) => Decision::Settle { delivered: false },
        (TaskStatus::Unknown, Check::Accepted) => Decision::Act(CheckAction::Sent {
            provider_message_id: None,
        }),
        (TaskStatus::Unknown, Check::Absent) => Decision::Act(CheckAction::Requeue),
        // Pending, nothing to tell from, or a sent message the provider no
        // longer knows (records expired): ask again later, a bounded number of times.
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
                decide(status, &Check::Delivered, 1, &c),
                Decision::Settle { delivered: true }
            );
            assert_eq!(
                decide(status, &Check::Failed, 1, &c),
                Decision::Settle { delivered: false }
            );
        }
        assert_eq!(
            decide(TaskStatus::Unknown, &Check::Accepted, 1, &c),
            Decision::Act(CheckAction::Sent {
                provider_message_id: None
            })
        );
        assert_eq!(
            decide(TaskStatus::Unknown, &Check::Absent, 1, &c),
            Decision::Act(CheckAction::Requeue)
        );
    }

    #[test]
    fn undecided_checks_back_off_then_give_up() {
        let c = config();
        let cannot = Check::CannotTell("no query".into());
        assert_eq!(
            decide(TaskStatus::Sent, &Check::Accepted, 1, &c),
            Decision::Act(CheckAction::Later(Duration::from_secs(30)))
        );
        assert_eq!(
            decide(TaskStatus::Unknown, &cannot, 2, &c),
            Decision::Act(CheckAction::Later(Duration::from_secs(60)))
        );
        assert_eq!(
            decide(TaskStatus::Sent, &Check::Absent, 2, &c),
            Decision::Act(CheckAction::Later(Duration::from_secs(60))),
            "a sent task is never re-queued"
        );
        assert_eq!(
            decide(TaskStatus::Sent, &cannot, 3, &c),
            Decision::Act(CheckAction::Untrack)
        );
        assert_eq!(
            decide(TaskStatus::Unknown, &cannot, 3, &c),
            Decision::Act(CheckAction::Dead)
        );
    }
}
