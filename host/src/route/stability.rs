//! Key stability across a reload: a minor or patch upgrade of a key policy
//! must not change keys (only a new major version or another policy name
//! starts a new key space, on purpose). Before a new snapshot is swapped in,
//! every policy whose key policy keeps its name and major version but changes
//! its code is run, old and new, over a corpus of recent real events; any
//! difference refuses the swap, naming an example event.

use super::{Policy, Snapshot};
use crate::derive;
use crate::event::Event;
use crate::plugin::KeyPolicyPlugin;
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

/// Checks every business type present in both snapshots. Returns one line per
/// policy whose keys would change, naming the file, both versions and an
/// example event and channel.
pub fn check(old: &Snapshot, new: &Snapshot, corpus: &[Event]) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
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
        if !same_key_space(&was, &now) || was.meta().sha256 == now.meta().sha256 {
            continue;
        }
        // Same parameters on both sides: only the plugin's code is compared.
        let params = params_of(old_policy);
        let events = corpus.iter().filter(|e| &e.biz_type == biz_type);
        if let Some(line) = first_difference(&was, &now, events, &new_policy.spec.channels, &params)
        {
            errors.push(format!("{}: {line}", new_policy.file.display()));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

/// Same name and major version: keys are promised to stay the same.
fn same_key_space(a: &KeyPolicyPlugin, b: &KeyPolicyPlugin) -> bool {
    a.meta().name == b.meta().name && a.meta().version.major == b.meta().version.major
}

fn first_difference<'a>(
    was: &Arc<KeyPolicyPlugin>,
    now: &Arc<KeyPolicyPlugin>,
    events: impl Iterator<Item = &'a Event>,
    channels: &[String],
    params: &[(String, String)],
) -> Option<String> {
    let (a, b) = (&was.meta().id, &now.meta().id);
    for event in events {
        for channel in channels {
            let old_key = derive::derive(was, event, channel, params);
            let new_key = derive::derive(now, event, channel, params);
            let example = || {
                format!(
                    "event biz_type={} biz_id={} user_id={} occurred_at_ms={} on channel {channel}",
                    event.biz_type, event.biz_id, event.user_id, event.occurred_at_ms
                )
            };
            match (old_key, new_key) {
                (Ok(o), Ok(n)) if o.key != n.key => {
                    return Some(format!(
                        "key policy {a} -> {b} changes keys within major version {}: {}: `{}` would become `{}`; \
                         publish it as a new major version to start a new key space on purpose",
                        now.meta().version.major,
                        example(),
                        o.key,
                        n.key
                    ));
                }
                (Ok(_), Err(e)) => {
                    return Some(format!(
                        "key policy {b} fails where {a} succeeded: {}: {e}",
                        example()
                    ));
                }
                _ => {}
            }
        }
    }
    None
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
