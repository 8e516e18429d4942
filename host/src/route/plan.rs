//! Planning one event: its `biz_type` routed to a policy, its channels
//! picked, each channel's key derived by the policy's key plugin, and what
//! the permit script takes built for each (`AcceptRequest`, fallback chain
//! included) — everything an accept does but Redis. The HTTP layer
//! (`api::events`) parses a request into a [`PlanRequest`] and answers a
//! [`PlanError`] as a problem naming the field or the plugin.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::{Policy, Snapshot};
use crate::config::ChannelConfig;
use crate::derive::{DeriveError, DerivedKey, derive};
use crate::event::{Event, event_json};
use crate::permit::{AcceptRequest, RetryPolicy};
use crate::plugin::ChannelPlugin;
use crate::plugin::{CallError, KeyPolicyPlugin};
use crate::route::policy::RetrySpec;
use crate::send::{Fallback, Payload, UnsubscribeLink};
use crate::unsubscribe::{Target, UnsubscribeLinks};

mod gate;

/// Deepest fallback chain followed (policies refuse cycles; this is a guard).
const MAX_FALLBACK_DEPTH: usize = 8;

/// What planning needs of a request: the event (already parsed and checked)
/// and the parts that concern its channels.
pub(crate) struct PlanRequest<'a> {
    /// The event the key policy sees.
    pub event: Event,
    /// The channels asked for (a subset of the policy's), or all of them.
    pub channels: Option<&'a [String]>,
    /// Template code for the providers; the `biz_type` when absent.
    pub template: Option<&'a str>,
    /// Template parameters.
    pub params: &'a BTreeMap<String, String>,
    /// The address per channel.
    pub recipients: &'a BTreeMap<String, String>,
    /// When to send (ms since the epoch), already checked against the
    /// host's bounds; `None`: now.
    pub send_at_ms: Option<u64>,
    /// The host's clock when the request came (ms since the epoch).
    pub now_ms: u64,
    /// The recipient's preferences (`None`: none apply).
    pub preferences: Option<crate::prefs::Verdict<'a>>,
    /// Who writes the unsubscribe links of channels whose plugin takes
    /// extras, and which categories get none (`None`: no links).
    pub unsubscribe: Option<LinkWriter<'a>>,
}

/// What writing a message's one-click unsubscribe link needs.
#[derive(Clone, Copy)]
pub(crate) struct LinkWriter<'a> {
    /// The host's signed links (`[unsubscribe]`).
    pub links: &'a UnsubscribeLinks,
    /// The categories no preference blocks: their messages get no link (it
    /// would promise what it cannot do).
    pub mandatory: &'a BTreeSet<String>,
}

/// Why an event cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A field of the request is not acceptable here.
    #[error("{field}: {detail}")]
    Invalid {
        /// The field (dotted path).
        field: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The key policy plugin cannot be resolved, refused the event or failed.
    #[error("key policy {plugin}: {detail}")]
    Plugin {
        /// `name@version` (or the policy's requirement when unresolved).
        plugin: String,
        /// The plugin's error.
        detail: String,
    },
    /// The key policy found no free instance slot: the event was not
    /// looked at; retrying later is safe.
    #[error("key policy {plugin}: {detail}")]
    Busy {
        /// `name@version`.
        plugin: String,
        /// The plugin runtime's error.
        detail: String,
    },
    /// A payload could not be written as JSON.
    #[error("payload is not JSON")]
    PayloadJson(#[source] serde_json::Error),
}

impl PlanError {
    fn invalid(field: impl Into<String>, detail: impl Into<String>) -> PlanError {
        PlanError::Invalid {
            field: field.into(),
            detail: detail.into(),
        }
    }
}

/// One channel of one event, ready to accept.
pub(crate) struct Planned {
    /// The channel.
    pub channel: String,
    /// What the permit script gets.
    pub request: AcceptRequest,
}

/// A channel of an event the recipient switched off (its channel or the
/// policy's category): nothing is accepted for it.
pub(crate) struct OptedOut {
    /// The channel.
    pub channel: String,
    /// The key the channel's message would have had.
    pub key: String,
    /// Its place among the event's results.
    pub at: usize,
}

/// One event, checked and planned.
pub(crate) struct PlannedEvent {
    /// The event's business type.
    pub biz_type: String,
    /// Business id.
    pub biz_id: String,
    /// User.
    pub user_id: String,
    /// Its channels.
    pub channels: Vec<Planned>,
    /// The channels the recipient switched off, answered `opted_out`.
    pub opted_out: Vec<OptedOut>,
    /// The event as JSON text (task field and corpus sample).
    pub event_json: std::sync::Arc<str>,
}

/// Routes, picks the channels and derives one event: everything but Redis.
pub(crate) fn plan(
    snapshot: &Snapshot,
    host_channels: &BTreeMap<String, ChannelConfig>,
    req: PlanRequest<'_>,
) -> Result<PlannedEvent, PlanError> {
    let policy = policy_of(snapshot, &req.event.biz_type)?;
    let channels = pick_channels(policy, req.channels)?;
    check_recipients(host_channels, req.recipients)?;
    let plugin = key_policy(snapshot, policy)?;
    let event_text: std::sync::Arc<str> = event_json(&req.event).into();
    let ctx = ChannelPlanner {
        policy,
        plugin: &plugin,
        event: &req.event,
        params: super::stability::params_of(policy),
        req: &req,
        snapshot,
        channels: host_channels,
    };
    let mut planned = Vec::with_capacity(channels.len());
    let mut opted_out = Vec::new();
    for channel in ctx.with_preferences(&channels) {
        match channel {
            Pick::Send(channel) => planned.push(ctx.plan_channel(channel, &event_text)?),
            Pick::OptedOut(channel) => opted_out.push(OptedOut {
                key: ctx.derive(&channel)?.key,
                channel,
                at: planned.len() + opted_out.len(),
            }),
        }
    }
    Ok(PlannedEvent {
        biz_type: req.event.biz_type.clone(),
        biz_id: req.event.biz_id.clone(),
        user_id: req.event.user_id.clone(),
        channels: planned,
        opted_out,
        event_json: event_text,
    })
}

/// A picked channel once the recipient's preferences are applied.
enum Pick {
    /// Accepted as usual.
    Send(String),
    /// Switched off: answered `opted_out`.
    OptedOut(String),
}

/// The policy routing `biz_type`.
fn policy_of<'s>(snapshot: &'s Snapshot, biz_type: &str) -> Result<&'s Policy, PlanError> {
    snapshot.policies.get(biz_type).ok_or_else(|| {
        PlanError::invalid(
            "biz_type",
            format!("no policy routes biz_type `{biz_type}`"),
        )
    })
}

/// The channels asked for, in the policy's order, or all of the policy's.
fn pick_channels(policy: &Policy, asked: Option<&[String]>) -> Result<Vec<String>, PlanError> {
    let spec = &policy.spec;
    let Some(asked) = asked else {
        return Ok(spec.channels.clone());
    };
    for (i, c) in asked.iter().enumerate() {
        if !spec.channels.contains(c) {
            return Err(PlanError::invalid(
                format!("channels[{i}]"),
                format!(
                    "channel `{}` is not allowed by the policy of {} (allowed: {})",
                    c.chars().take(64).collect::<String>(),
                    spec.biz_type,
                    spec.channels.join(", ")
                ),
            ));
        }
        if asked[..i].contains(c) {
            return Err(PlanError::invalid(
                format!("channels[{i}]"),
                format!("`{c}` is listed twice"),
            ));
        }
    }
    Ok(spec
        .channels
        .iter()
        .filter(|c| asked.contains(c))
        .cloned()
        .collect())
}

/// Every recipient names a channel instance of this host.
fn check_recipients(
    host_channels: &BTreeMap<String, ChannelConfig>,
    recipients: &BTreeMap<String, String>,
) -> Result<(), PlanError> {
    match recipients
        .keys()
        .find(|name| !host_channels.contains_key(*name))
    {
        Some(name) => Err(PlanError::invalid(
            format!("recipients.{}", name.chars().take(64).collect::<String>()),
            "not a channel of this host",
        )),
        None => Ok(()),
    }
}

/// The key policy plugin the policy's requirement resolves to now.
fn key_policy(snapshot: &Snapshot, policy: &Policy) -> Result<Arc<KeyPolicyPlugin>, PlanError> {
    let requirement = &policy.spec.key_policy;
    snapshot
        .registry
        .resolve_key_policy(requirement)
        .map_err(|e| PlanError::Plugin {
            plugin: requirement.clone(),
            detail: e.to_string(),
        })
}

/// What every channel of one event shares while it is planned.
struct ChannelPlanner<'a> {
    /// The policy of the event's biz_type.
    policy: &'a Policy,
    /// Its key policy plugin.
    plugin: &'a KeyPolicyPlugin,
    /// The event.
    event: &'a Event,
    /// The policy's params for the plugin.
    params: Vec<(String, String)>,
    /// The request's channel-facing parts.
    req: &'a PlanRequest<'a>,
    /// The snapshot of the request (its registry resolves channel plugins).
    snapshot: &'a Snapshot,
    /// The host's channel instances.
    channels: &'a BTreeMap<String, crate::config::ChannelConfig>,
}

impl ChannelPlanner<'_> {
    /// Whether the recipient switched `channel` (or this policy's category) off.
    fn blocked(&self, channel: &str) -> bool {
        self.req
            .preferences
            .is_some_and(|v| v.blocks(channel, self.policy.spec.category.as_deref()))
    }

    /// The picked channels in order, each sent or opted out; with the
    /// policy's `fallback_when_opted_out`, an opted-out channel's first
    /// fallback the recipient did not switch off (and the event does not
    /// send on already) is sent in its place, right after it.
    fn with_preferences(&self, picked: &[String]) -> Vec<Pick> {
        let spec = &self.policy.spec;
        let mut out: Vec<Pick> = Vec::with_capacity(picked.len());
        let sends =
            |out: &[Pick], c: &str| out.iter().any(|p| matches!(p, Pick::Send(s) if s == c));
        for channel in picked {
            if !self.blocked(channel) {
                out.push(Pick::Send(channel.clone()));
                continue;
            }
            out.push(Pick::OptedOut(channel.clone()));
            if !spec.fallback_when_opted_out {
                continue;
            }
            let taken = |to: &str| picked.iter().any(|p| p == to) || sends(&out, to);
            if let Some((to, _)) = self.next_fallback(channel, MAX_FALLBACK_DEPTH, taken) {
                out.push(Pick::Send(to.clone()));
            }
        }
        out
    }

    /// The first channel down `from`'s fallback chain that the recipient
    /// did not switch off and `taken` does not rule out, looking at no more
    /// than `limit` of them; with how many were passed over before it.
    fn next_fallback(
        &self,
        from: &str,
        limit: usize,
        taken: impl Fn(&str) -> bool,
    ) -> Option<(&String, usize)> {
        let chain = &self.policy.spec.fallback;
        let mut at = from;
        for passed in 0..limit {
            let to = chain.get(at)?;
            if !self.blocked(to) && !taken(to) {
                return Some((to, passed));
            }
            at = to;
        }
        None
    }

    /// One channel's accept request: its key, window, payload and retries.
    fn plan_channel(
        &self,
        channel: String,
        event_text: &std::sync::Arc<str>,
    ) -> Result<Planned, PlanError> {
        let derived = self.derive(&channel)?;
        let payload = self.payload(&channel, None, 0)?;
        let payload = serde_json::to_string(&payload).map_err(PlanError::PayloadJson)?;
        let meta = self.plugin.meta();
        let window = self.window(&channel, &derived);
        let gate = self.gate(&channel, &derived.key)?;
        self.check_send_at(&channel, &gate, window)?;
        Ok(Planned {
            request: AcceptRequest {
                key: derived.key.clone(),
                channel: channel.clone(),
                window,
                biz_type: self.event.biz_type.clone(),
                biz_id: self.event.biz_id.clone(),
                event_json: event_text.clone(),
                payload,
                policy_name: meta.name.clone(),
                policy_version: meta.version.to_string(),
                retry: self.retry(&channel),
                gate,
                recipient: Some(self.event.user_id.clone()),
                send_at_ms: self.req.send_at_ms,
            },
            channel,
        })
    }

    /// The channel plugin (`name@version`) the channel instance resolves to
    /// now: pinned into the task so a send in flight keeps its version.
    /// Resolved for the channels of this event only.
    fn channel_plugin(&self, channel: &str) -> Option<String> {
        Some(self.resolve_plugin(channel)?.meta().id.clone())
    }

    /// The channel plugin the channel instance resolves to now.
    fn resolve_plugin(&self, channel: &str) -> Option<Arc<ChannelPlugin>> {
        let config = self.channels.get(channel)?;
        self.snapshot.registry.resolve_channel(&config.plugin).ok()
    }

    /// Whether a plugin `channel`'s messages are sent through takes extras
    /// (writes the unsubscribe headers): its own, or on a channel with
    /// providers any of its provider instances'.
    fn takes_extras(&self, channel: &str) -> bool {
        let Some(config) = self.channels.get(channel) else {
            return false;
        };
        config
            .sent_through(channel)
            .into_iter()
            .any(|name| self.resolve_plugin(name).is_some_and(|p| p.takes_extras()))
    }

    /// The one-click unsubscribe link of `channel`'s message: written when
    /// the host writes links, a plugin the channel sends through takes
    /// extras and the policy's category is not mandatory. It switches the
    /// category off, or the channel when the policy names none.
    fn unsubscribe(&self, channel: &str) -> Option<UnsubscribeLink> {
        let writer = self.req.unsubscribe?;
        let category = self.policy.spec.category.clone();
        if category
            .as_ref()
            .is_some_and(|c| writer.mandatory.contains(c))
        {
            return None;
        }
        if !self.takes_extras(channel) {
            return None;
        }
        let target = match &category {
            Some(c) => Target::Category(c.clone()),
            None => Target::Channel(channel.to_string()),
        };
        // Good for `link_ttl` from the send, not the accept: a message
        // scheduled weeks ahead must not arrive with a link near its end.
        let sent_ms = self
            .req
            .send_at_ms
            .map_or(self.req.now_ms, |at| at.max(self.req.now_ms));
        let sent = UNIX_EPOCH + Duration::from_millis(sent_ms);
        Some(UnsubscribeLink {
            url: writer.links.link(&self.event.user_id, &target, sent),
            category,
        })
    }

    fn derive(&self, channel: &str) -> Result<DerivedKey, PlanError> {
        derive(self.plugin, self.event, channel, &self.params).map_err(|e| match e {
            DeriveError::Call(call @ CallError::Busy { .. }) => PlanError::Busy {
                plugin: call.plugin().to_string(),
                detail: call.to_string(),
            },
            DeriveError::Call(call) => PlanError::Plugin {
                plugin: call.plugin().to_string(),
                detail: call.to_string(),
            },
            DeriveError::BadKey { ref plugin, .. } => PlanError::Plugin {
                plugin: plugin.clone(),
                detail: e.to_string(),
            },
            DeriveError::BadChannel { .. } => PlanError::invalid("channels", e.to_string()),
        })
    }

    fn window(&self, channel: &str, derived: &DerivedKey) -> Duration {
        self.policy.spec.window_for(channel, derived.window_secs)
    }

    fn retry(&self, channel: &str) -> RetryPolicy {
        let spec = &self.policy.spec;
        let r: &RetrySpec = spec
            .overrides
            .get(channel)
            .and_then(|o| o.retry.as_ref())
            .unwrap_or(&spec.retry);
        RetryPolicy {
            max_attempts: r.max_attempts,
            initial: r.backoff.initial,
            factor: r.backoff.factor,
            max_delay: r.backoff.max,
            jitter: r.backoff.jitter,
        }
    }

    fn recipient(&self, channel: &str, fallback_of: Option<&str>) -> Result<String, PlanError> {
        if let Some(r) = self.req.recipients.get(channel) {
            // Sent, digested in the ledger and matched by a bounce or a
            // reply in the one form, trimmed as providers trim it.
            return Ok(r.trim().to_string());
        }
        if channel == "inbox" {
            return Ok(self.event.user_id.clone());
        }
        let why = match fallback_of {
            Some(from) => format!(
                "required: the address on channel `{channel}` (the policy's fallback for `{from}`)"
            ),
            None => format!("required: the address on channel `{channel}`"),
        };
        Err(PlanError::invalid(format!("recipients.{channel}"), why))
    }

    fn payload(
        &self,
        channel: &str,
        fallback_of: Option<&str>,
        depth: usize,
    ) -> Result<Payload, PlanError> {
        Ok(Payload {
            recipient: self.recipient(channel, fallback_of)?,
            template: self
                .policy
                .spec
                .digest
                .as_ref()
                .and_then(|d| d.template.as_deref())
                .or(self.policy.spec.template_for(channel))
                .or(self.req.template)
                .unwrap_or(&self.event.biz_type)
                .to_string(),
            params: self
                .req
                .params
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            plugin: self.channel_plugin(channel),
            fallback: self.fallback(channel, depth)?,
            unsubscribe: self.unsubscribe(channel),
        })
    }

    /// The fallback of `channel`: the next channel of its chain the
    /// recipient did not switch off.
    fn fallback(&self, channel: &str, depth: usize) -> Result<Option<Box<Fallback>>, PlanError> {
        let limit = MAX_FALLBACK_DEPTH.saturating_sub(depth);
        let Some((to, passed)) = self.next_fallback(channel, limit, |_| false) else {
            return Ok(None);
        };
        let depth = depth + passed;
        let derived = self.derive(to)?;
        Ok(Some(Box::new(Fallback {
            channel: to.clone(),
            key: derived.key.clone(),
            window_ms: crate::permit::millis(self.window(to, &derived)),
            payload: self.payload(to, Some(channel), depth + 1)?,
            category: self.policy.spec.category.clone(),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_json_is_the_value_form_sorted_with_the_last_repeated_attribute() {
        let event = Event {
            biz_type: "ORDER_SHIPPED".into(),
            biz_id: "o-\"1\"".into(),
            user_id: "u-42".into(),
            occurred_at_ms: 1_796_054_399_000,
            attributes: vec![
                ("z".into(), "last".into()),
                ("a".into(), "first".into()),
                ("z".into(), "again".into()),
            ],
        };
        let reference = serde_json::json!({
            "biz_type": event.biz_type,
            "biz_id": event.biz_id,
            "user_id": event.user_id,
            "occurred_at": event.occurred_at_ms,
            "attributes": {"z": "again", "a": "first"},
        })
        .to_string();
        assert_eq!(event_json(&event), reference);
        let back = crate::event::event_from_json(&event_json(&event)).unwrap();
        assert_eq!(back.biz_id, event.biz_id);
        assert_eq!(back.occurred_at_ms, event.occurred_at_ms);
    }
}
