//! The policies and plugins in force, swapped atomically.
//!
//! A `Snapshot` is one consistent pair of plugin registry and policy set. A
//! reload builds a new snapshot off to the side from the plugin and policy
//! directories, validates it (every configured channel's plugin resolves,
//! every policy resolves, every channel exists, minor/patch upgrades of key
//! policies keep their keys) and only then swaps it
//! in. A refused reload leaves the running snapshot in force and is kept as
//! `last_refused` for the admin API and the metrics.

use super::{Catalog, PolicyError, PolicySet};
use crate::config::HostConfig;
use crate::plugin::{Limits, PluginRegistry, PluginRuntime};
use arc_swap::ArcSwap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// One consistent set of plugins and policies.
pub struct Snapshot {
    /// Increases by one with every successful swap; 1 for the first.
    pub generation: u64,
    /// Every plugin loaded from the plugin directory.
    pub registry: Arc<PluginRegistry>,
    /// Every policy, by business type.
    pub policies: PolicySet,
    /// Plugin files that were refused (they do not block the snapshot; a
    /// policy that needs one is refused in turn).
    pub plugin_refusals: Vec<String>,
    /// When this snapshot was built.
    pub loaded_at: SystemTime,
    /// What the checks of the reload that swapped it in could not verify
    /// or that reload does not apply, one line each (e.g. a key policy
    /// change the event corpus had no event to check on, `pushonce.toml`
    /// edits waiting for a restart); empty for the first snapshot.
    pub notes: Vec<String>,
}

/// A reload that was swapped in.
#[derive(Debug, Clone)]
pub struct Reloaded {
    /// The generation now in force.
    pub generation: u64,
    /// What its checks could not verify (see [`Snapshot::notes`]).
    pub notes: Vec<String>,
}

/// A reload that was refused, and why.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// When it was refused.
    pub at: SystemTime,
    /// Every reason, one line each, naming the file.
    pub errors: Vec<String>,
}

/// Why a snapshot could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The plugin directory or the engine failed.
    #[error("plugins: {0}")]
    Plugins(String),
    /// Configured channels whose plugin requirement does not resolve: one
    /// line per channel, then the plugin files refused (often the reason).
    #[error("{} channel{} without a plugin:\n  {}", .unresolved.len(), if .unresolved.len() == 1 { "" } else { "s" }, channel_lines(.unresolved, .refused_files).join("\n  "))]
    Channels {
        /// `channels.<name>.plugin: ...`, one per channel.
        unresolved: Vec<String>,
        /// The plugin files refused at this load, each naming its file.
        refused_files: Vec<String>,
    },
    /// Policy files were refused.
    #[error("{} polic{} refused:\n  {}", .0.len(), if .0.len() == 1 { "y" } else { "ies" }, .0.join("\n  "))]
    Policies(Vec<String>),
}

impl LiveError {
    /// Every reason, one line each.
    pub fn lines(&self) -> Vec<String> {
        match self {
            LiveError::Plugins(e) => vec![format!("plugins: {e}")],
            LiveError::Channels {
                unresolved,
                refused_files,
            } => channel_lines(unresolved, refused_files),
            LiveError::Policies(v) => v.clone(),
        }
    }
}

/// The lines of [`LiveError::Channels`]: each unresolved channel, then each
/// refused plugin file.
fn channel_lines(unresolved: &[String], refused_files: &[String]) -> Vec<String> {
    unresolved
        .iter()
        .cloned()
        .chain(
            refused_files
                .iter()
                .map(|r| format!("plugin file refused: {r}")),
        )
        .collect()
}

/// The plugins and policies in force, and the means to replace them.
pub struct Live {
    /// The host configuration (directories, limits, channels).
    config: Arc<HostConfig>,
    /// The one engine and instance pool every snapshot's plugins run on:
    /// its limits are the configuration's, fixed for the process, and an
    /// engine per reload would reserve a pool's address space each time.
    runtime: Arc<PluginRuntime>,
    /// The snapshot in force.
    current: ArcSwap<Snapshot>,
    /// The last refused reload, if any since start.
    last_refused: Mutex<Option<Refusal>>,
    /// Serialises reloads (a watcher, SIGHUP and the admin API may race).
    reloading: Mutex<()>,
}

/// The catalog a policy set is checked against: a registry and the host's channels.
pub struct RegistryCatalog<'a> {
    /// Loaded plugins.
    pub registry: &'a PluginRegistry,
    /// Host configuration (channel instances).
    pub config: &'a HostConfig,
}

impl Catalog for RegistryCatalog<'_> {
    fn resolve_key_policy(&self, requirement: &str) -> Result<semver::Version, String> {
        self.registry
            .resolve_key_policy(requirement)
            .map(|p| p.meta().version.clone())
            .map_err(|e| e.to_string())
    }

    fn has_channel(&self, channel: &str) -> bool {
        self.config.channels.contains_key(channel)
    }

    fn cap_group(&self, name: &str) -> Option<crate::caps::CapSpec> {
        self.config.caps.get(name).cloned()
    }

    fn is_cluster(&self) -> bool {
        !self.config.redis_cluster.is_empty()
    }

    fn probe_params(
        &self,
        requirement: &str,
        biz_type: &str,
        channel: &str,
        params: &[(String, String)],
    ) -> Result<(), (String, String)> {
        match self.registry.resolve_key_policy(requirement) {
            Ok(plugin) => super::stability::probe_params(&plugin, biz_type, channel, params),
            Err(_) => Ok(()),
        }
    }
}

/// The plugin limits a host configuration asks for.
pub fn limits_of(config: &HostConfig) -> Limits {
    Limits {
        fuel_per_call: config.plugin_limits.fuel,
        channel_fuel_per_call: config.plugin_limits.channel_fuel,
        memory_bytes: config.plugin_limits.memory.as_u64() as usize,
        pool_slots: config.plugin_limits.instances,
        max_file_bytes: config.plugin_limits.max_file_size.as_u64(),
        ..Limits::default()
    }
}

/// Every configured channel instance whose `plugin` requirement does not
/// resolve in `registry`, as `channels.<name>.plugin: why` (a channel that
/// names `providers` has no plugin of its own: its providers are channels
/// and checked as such). A snapshot with such a channel would accept events
/// for it that no send can deliver.
fn unresolved_channels(config: &HostConfig, registry: &PluginRegistry) -> Vec<String> {
    config
        .channels
        .iter()
        .filter(|(_, c)| c.providers.is_empty())
        .filter_map(|(name, c)| {
            let e = registry.resolve_channel(&c.plugin).err()?;
            Some(format!(
                "channels.{name}.plugin: `{}` does not resolve: {e}",
                c.plugin
            ))
        })
        .collect()
}

/// Builds a snapshot from the configured directories (no swap, no checks
/// against a previous snapshot) on a new runtime for `limits`; refused when
/// a configured channel's plugin does not resolve or a policy file is refused.
pub fn build(config: &HostConfig, limits: &Limits, generation: u64) -> Result<Snapshot, LiveError> {
    build_on(&new_runtime(limits)?, config, generation)
}

/// A runtime (engine, linkers, instance pool) for `limits`.
fn new_runtime(limits: &Limits) -> Result<Arc<PluginRuntime>, LiveError> {
    PluginRuntime::new(limits).map_err(|e| LiveError::Plugins(e.to_string()))
}

/// [`build`] with the plugins on `runtime`.
fn build_on(
    runtime: &Arc<PluginRuntime>,
    config: &HostConfig,
    generation: u64,
) -> Result<Snapshot, LiveError> {
    let cache = config.cache_dir();
    let (registry, refused) =
        PluginRegistry::load_dir_with(runtime.clone(), &config.plugin_dir, Some(&cache))
            .map_err(|e| LiveError::Plugins(e.to_string()))?;
    let plugin_refusals: Vec<String> = refused.iter().map(|e| e.to_string()).collect();
    for r in &plugin_refusals {
        tracing::warn!(refusal = %r, "plugin file refused");
    }
    let unresolved = unresolved_channels(config, &registry);
    if !unresolved.is_empty() {
        return Err(LiveError::Channels {
            unresolved,
            refused_files: plugin_refusals,
        });
    }
    let catalog = RegistryCatalog {
        registry: &registry,
        config,
    };
    let policies = PolicySet::load_dir(&config.policy_dir, &catalog).map_err(|errors| {
        LiveError::Policies(errors.iter().map(PolicyError::to_string).collect())
    })?;
    Ok(Snapshot {
        generation,
        registry: Arc::new(registry),
        policies,
        plugin_refusals,
        loaded_at: SystemTime::now(),
        notes: Vec::new(),
    })
}

impl Live {
    /// Builds the first snapshot; an error here stops the host from starting.
    pub fn load(config: Arc<HostConfig>) -> Result<Live, LiveError> {
        let runtime = new_runtime(&limits_of(&config))?;
        let first = build_on(&runtime, &config, 1)?;
        Ok(Live {
            config,
            runtime,
            current: ArcSwap::from_pointee(first),
            last_refused: Mutex::new(None),
            reloading: Mutex::new(()),
        })
    }

    /// The snapshot in force. Cheap; hold it for the length of one request so
    /// the request sees one consistent set.
    pub fn current(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// What the policy in force for `biz_type` says of opt-outs (`None`: no
    /// policy for it now).
    pub fn opt_out_policy(&self, biz_type: &str) -> Option<crate::permit::OptOutPolicy> {
        let snapshot = self.current.load();
        let spec = &snapshot.policies.get(biz_type)?.spec;
        Some(crate::permit::OptOutPolicy {
            category: spec.category.clone(),
            fallback_when_opted_out: spec.fallback_when_opted_out,
        })
    }

    /// The host configuration.
    pub fn config(&self) -> &Arc<HostConfig> {
        &self.config
    }

    /// The last refused reload since start, if any.
    pub fn last_refused(&self) -> Option<Refusal> {
        self.last_refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Rebuilds from the directories, checks the result against the running
    /// snapshot with `check` (e.g. key stability over a corpus of events:
    /// refusal lines, or notes of what it could not verify), and swaps it
    /// in. On refusal the running snapshot stays and the refusal is
    /// recorded. Returns the generation in force afterwards and the notes.
    pub(crate) fn reload_with(
        &self,
        check: impl FnOnce(&Snapshot, &Snapshot) -> Result<Vec<String>, Vec<String>>,
    ) -> Result<Reloaded, Refusal> {
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.current();
        let result = build_on(&self.runtime, &self.config, old.generation + 1)
            .map_err(|e| e.lines())
            .and_then(|mut new| {
                new.notes = check(&old, &new)?;
                Ok(new)
            });
        match result {
            Ok(new) => {
                let reloaded = Reloaded {
                    generation: new.generation,
                    notes: new.notes.clone(),
                };
                self.current.store(Arc::new(new));
                tracing::info!(
                    generation = reloaded.generation,
                    "policies and plugins reloaded"
                );
                for note in &reloaded.notes {
                    tracing::warn!(note = %note, "reloaded without a check");
                }
                Ok(reloaded)
            }
            Err(errors) => {
                metrics::counter!(crate::metric_names::RELOAD_REFUSED).increment(1);
                for e in &errors {
                    tracing::warn!(error = %e, "reload refused; the running policies stay in force");
                }
                let refusal = Refusal {
                    at: SystemTime::now(),
                    errors,
                };
                *self.last_refused.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(refusal.clone());
                Err(refusal)
            }
        }
    }

    /// `reload_with` without extra checks.
    pub fn reload(&self) -> Result<Reloaded, Refusal> {
        self.reload_with(|_, _| Ok(Vec::new()))
    }
}
