//! An attempt of a message whose recipient switched its channel (or its
//! category) off since the accept is not sent: it is recorded `opted_out`
//! ([`Outcome::OptedOut`](super::Outcome::OptedOut): the task ends
//! `cancelled`) before its key is claimed in the ledger.
//! An attempt that begins within the preferences' bound of its accept is not
//! checked again: the accept's own reading was that fresh.
//! With the policy's `fallback_when_opted_out`, its fallback takes its place,
//! as at an accept.

use super::fallback::recipient_of;
use super::{Outcome, PermitError, Permits, Task};

impl Permits {
    /// What the recipient of `task` switched off since its accept that stops
    /// it now (`sms`, `category marketing`); `None` when nothing does, when
    /// it was accepted within the bound, or without preferences (no
    /// [`OptOuts`](super::OptOuts) given). `Err` when the preferences
    /// cannot be read: the attempt must not send yet.
    pub(crate) async fn opted_out_since_accept(
        &self,
        task: &Task,
    ) -> Result<Option<String>, PermitError> {
        let Some(opt_outs) = &self.opt_outs else {
            return Ok(None);
        };
        let since_accept = crate::ledger::now_ms()
            .max(0)
            .unsigned_abs()
            .saturating_sub(task.accepted_at_ms);
        if u128::from(since_accept) < opt_outs.bound().as_millis() {
            return Ok(None);
        }
        let Some(user) = recipient_of(&task.event_json) else {
            return Ok(None);
        };
        let category = opt_outs.policy_of(&task.biz_type).and_then(|p| p.category);
        opt_outs
            .switched_off(&user, &task.channel, category.as_deref())
            .await
            .map_err(PermitError::Preferences)
    }

    /// What an attempt of `task` stopped because its recipient switched
    /// `what` off records: [`Outcome::OptedOut`], after the task's fallback
    /// is accepted when the policy in force says `fallback_when_opted_out`
    /// (as an event's accept hands an opted-out channel's place to it; one
    /// the recipient switched off too is passed over). `Err` when that
    /// fallback could not be accepted: the attempt must be tried again.
    pub(crate) async fn opted_out_outcome(
        &self,
        task: &Task,
        what: &str,
    ) -> Result<Outcome, PermitError> {
        let reason = format!("not sent: the recipient switched {what} off after the accept");
        let hands_over = self
            .opt_outs
            .as_ref()
            .and_then(|o| o.policy_of(&task.biz_type))
            .is_some_and(|p| p.fallback_when_opted_out);
        let fallback = task.sends().ok().and_then(|p| p.fallback.clone());
        let Some(fb) = fallback.filter(|_| hands_over) else {
            return Ok(Outcome::OptedOut { reason });
        };
        let taken = self.accept_fallback(task, &fb).await?;
        if taken.accepted.is_some() {
            metrics::counter!(crate::metric_names::FALLBACK, "channel" => task.channel.clone())
                .increment(1);
        }
        Ok(Outcome::OptedOut {
            reason: format!("{reason}; {}", taken.note()),
        })
    }

    /// Gives back the room `task`, stopped by an opt-out with nothing sent,
    /// took in its caps at the accept, as a cancel does: its id leaves each
    /// set its `caps` field names (the recipient's shard: on a cluster the
    /// task's own slot), so the caps count what is sent.
    pub(crate) async fn give_back_caps(&self, task: &Task) -> Result<(), PermitError> {
        let Some(caps) = task.fields.get("caps").filter(|c| !c.is_empty()) else {
            return Ok(());
        };
        let mut batch = crate::store::Batch::new();
        for key in caps.split('\n') {
            let mut cmd = redis::cmd("ZREM");
            cmd.arg(key).arg(&task.id);
            batch.add_keyed(cmd);
        }
        batch.query(&mut self.conn.clone(), None).await?;
        Ok(())
    }
}
