//! Routing: from an event's `biz_type` to its policy (key policy, channels,
//! window, retry schedule, fallback), read from `policies/*.toml`.
//!
//! A `PolicySet` is built whole from a directory and checked against the rest
//! of the system (which key policies and channels exist); a set that fails any
//! check is refused as a whole, so the running set only ever changes atomically.

pub mod candidate;
pub(crate) mod explore;
pub mod live;
pub(crate) mod plan;
pub mod policy;
pub mod stability;
pub mod watch;

pub use live::Live;
pub(crate) use live::Snapshot;
pub(crate) use policy::{PolicyError, PolicyFile};

use crate::config::FileError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What a policy set is checked against: the rest of the running system.
pub trait Catalog {
    /// Resolves a key policy requirement `name@req` to the version it picks,
    /// or says why it cannot (unknown name, no matching version, bad syntax).
    fn resolve_key_policy(&self, requirement: &str) -> Result<semver::Version, String>;
    /// Whether `channel` is a channel instance of the host configuration.
    fn has_channel(&self, channel: &str) -> bool;
    /// The host's cap group `name` (`[caps.<name>]`), if configured.
    fn cap_group(&self, _name: &str) -> Option<crate::caps::CapSpec> {
        None
    }
    /// Whether this host's Redis is a Redis Cluster: a capped message's key
    /// must then name its recipient, so the cap and the permit share a
    /// hash slot (checked per message, see [`Policy::caps_need_recipient_key`]).
    fn is_cluster(&self) -> bool {
        false
    }
    /// Runs the key policy `requirement` resolves to with a policy's
    /// `params` on a probe event of `biz_type` for `channel`, and says which
    /// parameter alone makes it refuse every event, as `(field, reason)`
    /// (see [`stability::probe_params`]). Without plugins: nothing to run.
    fn probe_params(
        &self,
        _requirement: &str,
        _biz_type: &str,
        _channel: &str,
        _params: &[(String, String)],
    ) -> Result<(), (String, String)> {
        Ok(())
    }
}

/// A frequency cap in force for a policy.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedCap {
    /// The name answered with `capped` and used in the cap's Redis key: the
    /// group's name, or `<biz_type>/<name>` for a policy's own cap.
    pub name: String,
    /// The cap.
    pub spec: crate::caps::CapSpec,
}

/// One business type's policy, checked and resolved.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The file it came from.
    pub file: PathBuf,
    /// The key policy version the requirement resolved to when the set was built.
    pub key_policy_version: semver::Version,
    /// The file as written.
    pub spec: PolicyFile,
    /// Its caps: its own and the host groups it names, resolved.
    pub caps: Vec<NamedCap>,
    /// True when the policy has caps and the host runs on a Redis Cluster:
    /// a message whose key does not name its recipient (a key shared by
    /// several users, e.g. `per-tenant-per-hour`) cannot be capped there —
    /// its permit lives in the key's hash slot, the user's count in the
    /// user's — and is refused (422) naming the policy and its key policy.
    pub caps_need_recipient_key: bool,
}

/// Every policy in force, by business type.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    /// Policies by `biz_type`.
    pub by_biz_type: BTreeMap<String, Policy>,
}

impl PolicySet {
    /// Loads every `*.toml` of `dir` and checks it against `catalog`. Returns every
    /// refusal found (not just the first) so an operator fixes them in one pass.
    pub fn load_dir(dir: &Path, catalog: &dyn Catalog) -> Result<PolicySet, Vec<PolicyError>> {
        let files = policy_files(dir).map_err(|e| vec![e])?;
        Self::from_files(
            files.iter().map(|f| (f.clone(), PolicyFile::load(f))),
            catalog,
        )
    }

    /// Checks parsed policy files (`(file, parsed or why not)`, in order)
    /// against `catalog`, as [`PolicySet::load_dir`] does for a directory's:
    /// every refusal, or the set.
    pub fn from_files(
        files: impl IntoIterator<Item = (PathBuf, Result<PolicyFile, PolicyError>)>,
        catalog: &dyn Catalog,
    ) -> Result<PolicySet, Vec<PolicyError>> {
        let mut set = PolicySet::default();
        let mut errors = Vec::new();
        for (file, parsed) in files {
            match parsed.and_then(|spec| Self::resolve(&file, spec, catalog)) {
                Ok(policy) => {
                    if let Some(other) = set.by_biz_type.get(&policy.spec.biz_type) {
                        errors.push(PolicyError::Invalid {
                            file: file.clone(),
                            field: "biz_type".into(),
                            reason: format!(
                                "`{}` is already routed by {}",
                                policy.spec.biz_type,
                                other.file.display()
                            ),
                        });
                    } else {
                        set.by_biz_type.insert(policy.spec.biz_type.clone(), policy);
                    }
                }
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(set)
        } else {
            Err(errors)
        }
    }

    /// The policy of a business type.
    pub fn get(&self, biz_type: &str) -> Option<&Policy> {
        self.by_biz_type.get(biz_type)
    }

    fn resolve(
        file: &Path,
        spec: PolicyFile,
        catalog: &dyn Catalog,
    ) -> Result<Policy, PolicyError> {
        let invalid = |field: String, reason: String| PolicyError::Invalid {
            file: file.to_path_buf(),
            field,
            reason,
        };
        let key_policy_version = catalog
            .resolve_key_policy(&spec.key_policy)
            .map_err(|reason| invalid("key_policy".into(), reason))?;
        let used = spec.channels.iter().chain(spec.fallback.values());
        for channel in used {
            if !catalog.has_channel(channel) {
                let field = if spec.channels.contains(channel) {
                    "channels".to_string()
                } else {
                    "fallback".to_string()
                };
                return Err(invalid(
                    field,
                    format!("channel `{channel}` is not configured on this host"),
                ));
            }
        }
        if let Some(channel) = spec.channels.first() {
            let params: Vec<(String, String)> = spec
                .params
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            catalog
                .probe_params(&spec.key_policy, &spec.biz_type, channel, &params)
                .map_err(|(f, r)| invalid(f, r))?;
        }
        let caps = resolve_caps(&spec, catalog).map_err(|(f, r)| invalid(f, r))?;
        let caps_need_recipient_key = !caps.is_empty() && catalog.is_cluster();
        Ok(Policy {
            file: file.to_path_buf(),
            key_policy_version,
            spec,
            caps,
            caps_need_recipient_key,
        })
    }
}

/// The policy files of `dir`: every `*.toml`, sorted by name.
pub fn policy_files(dir: &Path) -> Result<Vec<PathBuf>, PolicyError> {
    let entries = std::fs::read_dir(dir).map_err(|source| {
        PolicyError::File(FileError::Read {
            file: dir.to_path_buf(),
            source,
        })
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

/// The caps of a policy: its own (named `<biz_type>/<name>`) and the host
/// groups it names; refused when a group is missing.
fn resolve_caps(
    spec: &PolicyFile,
    catalog: &dyn Catalog,
) -> Result<Vec<NamedCap>, (String, String)> {
    let mut caps: Vec<NamedCap> = spec
        .caps
        .iter()
        .map(|(name, cap)| NamedCap {
            name: format!("{}/{name}", spec.biz_type),
            spec: cap.clone(),
        })
        .collect();
    for group in &spec.cap_groups {
        let cap = catalog.cap_group(group).ok_or_else(|| {
            (
                "cap_groups".to_string(),
                format!("cap group `{group}` is not configured on this host (`[caps.{group}]`)"),
            )
        })?;
        caps.push(NamedCap {
            name: group.clone(),
            spec: cap,
        });
    }
    Ok(caps)
}
