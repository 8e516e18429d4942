//! Key stability across a reload: a minor or patch upgrade of a key policy,
//! or an edit of a policy's `params`, must not change keys (only a new major
//! version or another policy name starts a new key space, on purpose).
//! Before a new snapshot is swapped in, every policy whose key policy keeps
//! its name and major version but changes its code or its parameters is
//! run, old plugin with old params and new plugin with new params, over a
//! corpus of recent real events; any difference refuses the swap, naming an
//! example event. A policy the corpus has no event of cannot be checked: the
//! reload goes on and says so in its notes. Apart from any corpus, every
//! policy's params are probed when its set is loaded ([`probe_params`]).

use super::{Policy, Snapshot};
use crate::derive::{self, DeriveError};
use crate::event::Event;
use crate::plugin::{CallError, KeyPolicyPlugin};
use std::sync::Arc;

/// The parameters a policy hands its key policy.
pub(crate) fn params_of(policy: &Policy) -> Vec<(String, String)> {
    policy
        .spec
        .params
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// `{tz = "+08:00", ...}`, as an operator wrote them.
fn show_params(params: &[(String, String)]) -> String {
    let inner: Vec<String> = params.iter().map(|(k, v)| format!("{k} = {v:?}")).collect();
    format!("{{{}}}", inner.join(", "))
}

/// One side of a comparison: a key policy and the params it is given.
struct Side<'a> {
    plugin: &'a Arc<KeyPolicyPlugin>,
    params: &'a [(String, String)],
}

/// Checks every business type present in both snapshots. Returns one line
/// per policy whose keys would change, naming the file, what changed and an
/// example event and channel; or, when it passes, one note per changed
/// policy it had no event to check on.
pub fn check(old: &Snapshot, new: &Snapshot, corpus: &[Event]) -> Result<Vec<String>, Vec<String>> {
    let (mut errors, mut notes) = (Vec::new(), Vec::new());
    for (biz_type, new_policy) in &new.policies.by_biz_type {
        let Some(old_policy) = old.policies.get(biz_type) else {
            continue;
        };
        let (Ok(was), Ok(now)) = (
            old.registry.resolve_key_policy(&old_policy.spec.key_policy),
            new.registry.resolve_key_policy(&new_policy.spec.key_policy),
        ) else {
            continue;
        };
        let (old_params, new_params) = (params_of(old_policy), params_of(new_policy));
        let same_code = was.meta().sha256 == now.meta().sha256;
        if !same_key_space(&was, &now) || (same_code && old_params == new_params) {
            continue;
        }
        let file = new_policy.file.display();
        let change = describe_change(&was, &now, &old_params, &new_params);
        let events: Vec<&Event> = corpus.iter().filter(|e| &e.biz_type == biz_type).collect();
        if events.is_empty() {
            notes.push(format!(
                "{file}: {change}: keys not checked: the corpus holds no recent `{biz_type}` event"
            ));
            continue;
        }
        // Only channels both sets send on: a new channel has sent nothing yet.
        let channels: Vec<&String> = new_policy
            .spec
            .channels
            .iter()
            .filter(|c| old_policy.spec.channels.contains(c))
            .collect();
        let (a, b) = (
            Side {
                plugin: &was,
                params: &old_params,
            },
            Side {
                plugin: &now,
                params: &new_params,
            },
        );
        if let Some(line) = first_difference(&a, &b, &events, &channels) {
            errors.push(format!("{file}: {change} {line}"));
        }
    }
    if errors.is_empty() {
        Ok(notes)
    } else {
        Err(errors)
    }
}

/// What changed of a policy's keys: `key policy a -> b` and/or
/// `params {..} -> {..}` (the field an operator edits).
fn describe_change(
    was: &KeyPolicyPlugin,
    now: &KeyPolicyPlugin,
    old_params: &[(String, String)],
    new_params: &[(String, String)],
) -> String {
    let code = format!("key policy {} -> {}", was.meta().id, now.meta().id);
    if old_params == new_params {
        return code;
    }
    let params = format!(
        "params: {} -> {}",
        show_params(old_params),
        show_params(new_params)
    );
    if was.meta().sha256 == now.meta().sha256 {
        format!("{params} (key policy {})", now.meta().id)
    } else {
        format!("{params}, {code}")
    }
}

/// Same name and major version: keys are promised to stay the same.
fn same_key_space(a: &KeyPolicyPlugin, b: &KeyPolicyPlugin) -> bool {
    a.meta().name == b.meta().name && a.meta().version.major == b.meta().version.major
}

fn first_difference(
    was: &Side<'_>,
    now: &Side<'_>,
    events: &[&Event],
    channels: &[&String],
) -> Option<String> {
    let major = now.plugin.meta().version.major;
    for event in events {
        for channel in channels {
            let old_key = derive::derive(was.plugin, event, channel, was.params);
            let new_key = derive::derive(now.plugin, event, channel, now.params);
            let example = || {
                format!(
                    "event biz_type={} biz_id={} user_id={} occurred_at_ms={} on channel {channel}",
                    event.biz_type, event.biz_id, event.user_id, event.occurred_at_ms
                )
            };
            match (old_key, new_key) {
                (Ok(o), Ok(n)) if o.key != n.key => {
                    return Some(format!(
                        "changes keys within major version {major}: {}: `{}` would become `{}`; \
                         a business re-post within its window would be sent again: \
                         publish it as a new major version (or use another key policy) to start a new key space on purpose",
                        example(),
                        o.key,
                        n.key
                    ));
                }
                (Ok(_), Err(e)) => {
                    return Some(format!(
                        "fails where the running one succeeded: {}: {e}",
                        example()
                    ));
                }
                _ => {}
            }
        }
    }
    None
}

/// The event a policy's params are probed on: its business type, no attributes.
fn probe_event(biz_type: &str) -> Event {
    Event {
        biz_type: biz_type.to_string(),
        biz_id: "probe".into(),
        user_id: "probe".into(),
        occurred_at_ms: 1_764_000_000_000,
        attributes: Vec::new(),
    }
}

/// Runs `plugin` with `params` on a probe event of `biz_type` for
/// `channel`. When the plugin refuses it and leaving out one parameter
/// makes it accept, that parameter is at fault — the key policy would
/// refuse every event (422 `key-policy-failed`) — and is named as
/// `params.<name>` with the plugin's reason. A refusal no single
/// parameter explains (e.g. the probe lacks an attribute real events
/// carry) passes.
pub(crate) fn probe_params(
    plugin: &KeyPolicyPlugin,
    biz_type: &str,
    channel: &str,
    params: &[(String, String)],
) -> Result<(), (String, String)> {
    let event = probe_event(biz_type);
    let refused = match derive::derive(plugin, &event, channel, params) {
        Err(DeriveError::Call(e @ CallError::Refused { .. })) => e,
        _ => return Ok(()),
    };
    for (i, (name, value)) in params.iter().enumerate() {
        let without: Vec<(String, String)> = params
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, p)| p.clone())
            .collect();
        if derive::derive(plugin, &event, channel, &without).is_ok() {
            return Err((
                format!("params.{name}"),
                format!(
                    "{value:?} makes key policy {} refuse every event (422 key-policy-failed): {refused}",
                    plugin.meta().id
                ),
            ));
        }
    }
    Ok(())
}

/// The keys an event would get under a snapshot: channel → key, or why not.
pub fn keys_for(snapshot: &Snapshot, event: &Event) -> Result<Vec<(String, String)>, String> {
    let policy = snapshot
        .policies
        .get(&event.biz_type)
        .ok_or_else(|| format!("no policy routes biz_type `{}`", event.biz_type))?;
    let plugin = snapshot
        .registry
        .resolve_key_policy(&policy.spec.key_policy)
        .map_err(|e| e.to_string())?;
    let params = params_of(policy);
    policy
        .spec
        .channels
        .iter()
        .map(|c| {
            derive::derive(&plugin, event, c, &params)
                .map(|k| (c.clone(), k.key))
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// How keys differ between two policy sets over a set of events.
#[derive(Debug, Default)]
pub struct KeyDiff {
    /// Events compared.
    pub events: usize,
    /// (event, channel) pairs present under both sets.
    pub compared: usize,
    /// Pairs whose key changed.
    pub changed: usize,
    /// Pairs only the new set sends (a channel added).
    pub added: usize,
    /// Pairs only the old set sends (a channel removed).
    pub removed: usize,
    /// Events one of the sets cannot derive keys for, with the reason.
    pub errors: Vec<String>,
    /// Up to `max_examples` changed pairs: (event summary, channel, old key, new key).
    pub examples: Vec<[String; 4]>,
}

impl KeyDiff {
    /// What an operator reads first (the CLI's first line, the console's summary).
    pub fn summary(&self) -> String {
        format!(
            "{} events, {} keys compared: {} changed, {} channels added, {} removed, {} events not derivable",
            self.events,
            self.compared,
            self.changed,
            self.added,
            self.removed,
            self.errors.len()
        )
    }
}

/// Compares the keys of `events` under `old` and `new`.
pub fn diff(old: &Snapshot, new: &Snapshot, events: &[Event], max_examples: usize) -> KeyDiff {
    let mut d = KeyDiff {
        events: events.len(),
        ..KeyDiff::default()
    };
    for event in events {
        let summary = format!("{}/{}/{}", event.biz_type, event.biz_id, event.user_id);
        let (was, now) = match (keys_for(old, event), keys_for(new, event)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) => {
                d.errors.push(format!("{summary}: old set: {e}"));
                continue;
            }
            (_, Err(e)) => {
                d.errors.push(format!("{summary}: new set: {e}"));
                continue;
            }
        };
        for (channel, old_key) in &was {
            match now.iter().find(|(c, _)| c == channel) {
                None => d.removed += 1,
                Some((_, new_key)) => {
                    d.compared += 1;
                    if new_key != old_key {
                        d.changed += 1;
                        if d.examples.len() < max_examples {
                            d.examples.push([
                                summary.clone(),
                                channel.clone(),
                                old_key.clone(),
                                new_key.clone(),
                            ]);
                        }
                    }
                }
            }
        }
        d.added += now
            .iter()
            .filter(|(c, _)| !was.iter().any(|(o, _)| o == c))
            .count();
    }
    d
}
