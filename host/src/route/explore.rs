//! The key explorer: the key every channel of every policy in force would
//! give one event, and its window — the same derivation as `pushonce keys`
//! ([`derive::dry_run`]) with each policy's key policy, parameters and
//! channels.

use std::time::Duration;

use super::Snapshot;
use super::stability::params_of;
use crate::derive;
use crate::event::Event;

/// One policy's keys for the event.
#[derive(Debug)]
pub(crate) struct PolicyKeys {
    /// The policy's business type.
    pub biz_type: String,
    /// Whether the event's own `biz_type` is routed by this policy.
    pub routes_event: bool,
    /// The key policy's `name@version`, or why it did not resolve.
    pub plugin: Result<String, String>,
    /// Each channel's key and window, or why not, in the policy's order.
    pub keys: Vec<ChannelKey>,
}

/// One channel and its key and window, or why it gets none.
pub(crate) type ChannelKey = (String, Result<(String, Duration), String>);

/// The keys `event` would get under each policy of `snapshot`, the policy
/// routing its `biz_type` first.
pub(crate) fn keys_under_each(snapshot: &Snapshot, event: &Event) -> Vec<PolicyKeys> {
    let mut all: Vec<PolicyKeys> = snapshot
        .policies
        .by_biz_type
        .values()
        .map(|policy| {
            let spec = &policy.spec;
            let run = derive::dry_run(
                &snapshot.registry,
                &spec.key_policy,
                event,
                &spec.channels,
                &params_of(policy),
            );
            let (plugin, keys) = match run {
                Ok((id, results)) => {
                    let keys = results
                        .into_iter()
                        .map(|(channel, key)| {
                            let key = key
                                .map(|k| (k.key, spec.window_for(&channel, k.window_secs)))
                                .map_err(|e| e.to_string());
                            (channel, key)
                        })
                        .collect();
                    (Ok(id), keys)
                }
                Err(e) => (Err(e.to_string()), Vec::new()),
            };
            PolicyKeys {
                biz_type: spec.biz_type.clone(),
                routes_event: spec.biz_type == event.biz_type,
                plugin,
                keys,
            }
        })
        .collect();
    all.sort_by_key(|p| !p.routes_event);
    all
}
