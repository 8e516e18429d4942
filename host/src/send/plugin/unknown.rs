//! After an unknown outcome: what the provider's status query says, and
//! whether a resend is safe, held or may duplicate.

use std::time::Duration;

use super::PluginSender;
use super::runtime::ChannelRuntime;
use crate::config::OnUnknown;
use crate::plugin::bindings::{Capabilities, DeliveryStatus, SendError, SentMessage};
use crate::plugin::channel::ChannelInstance;
use crate::send::{Check, NO_STATUS_QUERY, OutgoingMessage, UnknownVerdict};

impl PluginSender {
    /// Asks the provider through the plugin's `query`, if it has one. An
    /// `unknown` answer earlier than the provider's query lag after the last
    /// attempt is not believed: it cannot tell (asked again later).
    pub(super) async fn query(
        &self,
        rt: &ChannelRuntime,
        inst: &ChannelInstance,
        msg: &OutgoingMessage,
    ) -> Check {
        let caps = rt.capabilities_of(inst).await;
        if !caps.can_query {
            return Check::CannotTell(format!("channel {} {NO_STATUS_QUERY}", rt.name));
        }
        let payload = match &msg.payload {
            Ok(p) => p,
            Err(e) => return Check::CannotTell(e.to_string()),
        };
        let sent = SentMessage {
            task_id: msg.task_id.clone(),
            idempotency_key: msg.idempotency_key.clone(),
            recipient: payload.recipient.clone(),
            template: payload.template.clone(),
            reference: msg.reference.clone(),
            provider_message_id: msg.provider_message_id.clone(),
            first_attempt_ms: msg.first_attempt_ms,
            last_attempt_ms: msg.last_attempt_ms,
        };
        let _slot = rt.slots.acquire().await;
        match inst.query(sent).await {
            Ok(a) => match a.value {
                Ok(DeliveryStatus::Delivered) => Check::Delivered,
                Ok(DeliveryStatus::Pending) => Check::Accepted,
                Ok(DeliveryStatus::Failed) => Check::Failed,
                Ok(DeliveryStatus::Unknown) => {
                    absent_unless_lagging(msg, &caps, rt.settings.call_timeout, now_ms())
                }
                Err(e) => {
                    let why = rt.redact(&format!("status query failed: {}", error_text(&e)));
                    tracing::info!(task = %msg.task_id, error = %why, "status query failed");
                    Check::CannotTell(why)
                }
            },
            Err(e) => {
                let why = rt.redact(&format!("status query failed: {e}"));
                tracing::warn!(task = %msg.task_id, error = %why, "status query failed");
                Check::CannotTell(why)
            }
        }
    }

    pub(super) async fn check_one(
        &self,
        msg: &OutgoingMessage,
        provider_message_id: Option<&str>,
    ) -> Check {
        let msg = OutgoingMessage {
            provider_message_id: provider_message_id
                .map(str::to_string)
                .or_else(|| msg.provider_message_id.clone()),
            ..msg.clone()
        };
        match self.runtime_of(&msg) {
            Ok((rt, inst)) => self.query(rt, &inst, &msg).await,
            Err(e) => Check::CannotTell(e.to_string()),
        }
    }

    /// Whether `msg`'s channel has a status query (when its plugin cannot be
    /// had, assumed so: a useless check costs less than a missed one).
    /// Receipts need no check: they settle a `sent` task by themselves.
    pub(super) async fn queryable(&self, msg: &OutgoingMessage) -> bool {
        match self.runtime_of(msg) {
            Ok((rt, inst)) => rt.capabilities_of(&inst).await.can_query,
            Err(_) => true,
        }
    }

    /// After an unknown outcome: a query that finds the message records it
    /// sent; a believed `unknown` (past the not-found horizon) resends; a
    /// reference the provider still honours (inside its window) resends; a
    /// channel with a status query that cannot tell yet (inside the horizon,
    /// or the query failed) holds, for receipts and the reconciler's later
    /// checks to settle; else the channel's `on_unknown`. A resend the
    /// provider cannot dedupe is [`UnknownVerdict::ResendMayDuplicate`].
    pub(super) async fn settle(&self, msg: &OutgoingMessage) -> UnknownVerdict {
        let Ok((rt, inst)) = self.runtime_of(msg) else {
            return UnknownVerdict::Hold;
        };
        let caps = rt.capabilities_of(&inst).await;
        let deduped = reference_honoured(msg, &caps, now_ms());
        match self.query(rt, &inst, msg).await {
            Check::Delivered | Check::Accepted | Check::Failed => {
                return UnknownVerdict::Sent {
                    provider_message_id: None,
                };
            }
            Check::Absent if deduped => return UnknownVerdict::Resend,
            Check::Absent => return UnknownVerdict::ResendMayDuplicate,
            Check::CannotTell(_) => {}
        }
        if deduped {
            return UnknownVerdict::Resend;
        }
        match rt.on_unknown {
            // Neither a receipt nor the query can tell yet: they may still.
            _ if caps.can_query => UnknownVerdict::Hold,
            OnUnknown::Hold => UnknownVerdict::Hold,
            OnUnknown::Resend => UnknownVerdict::ResendMayDuplicate,
        }
    }
}

/// `unknown` from the provider: absent, unless asked inside the not-found
/// horizon (then it cannot tell yet). The horizon runs from the moment the
/// last attempt's request could last have reached the provider — when its
/// send call returned, if known, else the attempt's start plus the
/// channel's `call_timeout`, past which the host drops the request — and
/// lasts the plugin's declared `query_lag_secs`.
fn absent_unless_lagging(
    msg: &OutgoingMessage,
    caps: &Capabilities,
    call_timeout: Duration,
    now: u64,
) -> Check {
    // When the call's return is known it is the bound: the request went
    // out after the attempt began, maybe much later (a ledger claim that
    // waited), so the start plus `call_timeout` is no bound then.
    let written_by = match msg.last_attempt_ended_ms {
        0 => msg
            .last_attempt_ms
            .saturating_add(u64::try_from(call_timeout.as_millis()).unwrap_or(u64::MAX)),
        ended => ended,
    };
    let horizon_ends = written_by.saturating_add(u64::from(caps.query_lag_secs) * 1000);
    if now < horizon_ends {
        Check::CannotTell(format!(
            "the provider's query may not show a message yet: `unknown` is believed {} s after the request could last have reached it (query_lag), {} ms to go",
            caps.query_lag_secs,
            horizon_ends - now
        ))
    } else {
        Check::Absent
    }
}

/// Whether a resend carrying the same reference is still deduplicated by the
/// provider: it honours references, and `now` is inside its window from the
/// first attempt (or it has none).
pub(super) fn reference_honoured(msg: &OutgoingMessage, caps: &Capabilities, now: u64) -> bool {
    caps.honours_reference
        && caps
            .reference_window_secs
            .is_none_or(|w| now < msg.first_attempt_ms.saturating_add(u64::from(w) * 1000))
}

/// Milliseconds since the Unix epoch, by this host's clock.
pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A plugin's error, as text for operators.
fn error_text(e: &SendError) -> String {
    match e {
        SendError::Retryable(r) => format!("retryable: {}", r.reason),
        SendError::Permanent(r) => format!("permanent: {r}"),
        SendError::Unknown(r) => format!("unknown: {r}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider whose query may not show a message for `lag` seconds.
    fn lagging(lag: u32) -> Capabilities {
        Capabilities {
            honours_reference: false,
            reference_window_secs: None,
            can_query: true,
            query_lag_secs: lag,
            callbacks: false,
        }
    }

    fn attempt(started: u64, ended: u64) -> OutgoingMessage {
        OutgoingMessage {
            task_id: "t".into(),
            idempotency_key: "k".into(),
            channel: "sms".into(),
            attempt: 1,
            payload: Err(crate::permit::InvalidPayload("unused".into())),
            reference: None,
            provider_message_id: None,
            first_attempt_ms: started,
            last_attempt_ms: started,
            last_attempt_ended_ms: ended,
            provider: None,
        }
    }

    #[test]
    fn the_query_lag_runs_from_when_the_request_could_last_have_arrived() {
        let now = 1_000_000;
        let timeout = Duration::from_secs(10);
        // Begun a minute ago, its request held back (a ledger claim that
        // waited) and timed out just now: a 5 s lag has not passed.
        let late_request = attempt(now - 60_000, now - 1_000);
        assert!(matches!(
            absent_unless_lagging(&late_request, &lagging(5), timeout, now),
            Check::CannotTell(_)
        ));
        // Past the lag from the call's return: absent.
        let old = attempt(now - 60_000, now - 6_000);
        assert_eq!(
            absent_unless_lagging(&old, &lagging(5), timeout, now),
            Check::Absent
        );
        // The return not known: the start plus the call timeout bounds it.
        let vanished = attempt(now - 12_000, 0);
        assert!(matches!(
            absent_unless_lagging(&vanished, &lagging(5), timeout, now),
            Check::CannotTell(_)
        ));
        let long_gone = attempt(now - 16_000, 0);
        assert_eq!(
            absent_unless_lagging(&long_gone, &lagging(5), timeout, now),
            Check::Absent
        );
    }
}
