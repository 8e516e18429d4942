//! Before a batch claims its keys: each attempt whose recipient switched its
//! channel (or the message's category) off since the accept is not sent
//! ([`crate::permit::Permits::opted_out_since_accept`]); its task ends
//! `cancelled` with why, its fallback taken when the policy says
//! `fallback_when_opted_out`. One whose recipient's preferences cannot be read
//! is given back, to be tried again: nothing goes to a user whose opt-out
//! could not be read.

use super::DispatchContext;
use super::record::Pending;
use crate::permit::{Attempt, Entry, Outcome, RecordContext};

/// The begun attempts that may go on to their claims, and the outcomes of
/// those that may not.
pub(super) async fn stop_opted_out<'a>(
    shared: &DispatchContext,
    begun: &'a [(Attempt, &'a Entry)],
) -> (Vec<&'a (Attempt, &'a Entry)>, Vec<Pending<'a>>) {
    let checks = begun
        .iter()
        .map(|b| async move { (b, stops(shared, &b.0).await) });
    let mut go = Vec::with_capacity(begun.len());
    let mut stopped = Vec::new();
    for (b, answer) in futures_util::future::join_all(checks).await {
        let (attempt, entry) = (&b.0, b.1);
        let outcome = match answer {
            Ok(None) => {
                go.push(b);
                continue;
            }
            Ok(Some(outcome)) => {
                tracing::info!(task = %attempt.task_id, channel = %attempt.task.channel, ?outcome,
                    "not sent: the recipient switched it off after the accept");
                outcome
            }
            Err(e) => {
                tracing::warn!(task = %attempt.task_id, error = %e,
                    "the recipient's preferences cannot be read, or an opted-out message's fallback cannot be accepted; not sent, the attempt is given back");
                Outcome::Release
            }
        };
        stopped.push(Pending {
            attempt,
            outcome,
            entry,
            context: RecordContext::default(),
        });
    }
    (go, stopped)
}

/// What stops `attempt` now, as the outcome to record; `None` when nothing does.
async fn stops(
    shared: &DispatchContext,
    attempt: &Attempt,
) -> Result<Option<Outcome>, crate::permit::PermitError> {
    let Some(what) = shared.permits.opted_out_since_accept(&attempt.task).await? else {
        return Ok(None);
    };
    let outcome = shared
        .permits
        .opted_out_outcome(&attempt.task, &what)
        .await?;
    Ok(Some(outcome))
}
