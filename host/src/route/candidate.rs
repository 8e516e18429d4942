//! A candidate policy file, pasted by an operator, checked and diffed
//! before it is applied (the console's policies page).
//!
//! [`plan`] checks the candidate as the policy loader will: the policy
//! directory as it is, with the candidate in place of the file that routes
//! its business type (or as a new file), against the plugins in force and
//! the host's channels. It then compares the keys of sampled real events
//! under the set in force and the candidate set with the same
//! [`stability::diff`] as `pushonce policies diff`. [`apply`] checks again,
//! writes the file (atomically) and runs the same checked reload as
//! `POST /admin/reload`; a refused reload puts the directory back as it was.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::live::{RegistryCatalog, Snapshot};
use super::stability::{self, KeyDiff};
use super::watch::Reloader;
use super::{Live, PolicyFile, PolicySet, policy_files};
use crate::config::HostConfig;
use crate::event::Event;

/// The name a pasted policy's own errors give it (before its file is known).
pub(crate) const PASTED: &str = "pasted.toml";

/// A candidate that checked: where it goes and how keys change.
#[derive(Debug)]
pub struct Planned {
    /// The business type it routes.
    pub biz_type: String,
    /// The file it would be written to.
    pub target: PathBuf,
    /// Whether that file exists now (the candidate replaces it).
    pub replaces: bool,
    /// The key policy it resolves to, `name@version`.
    pub key_policy: String,
    /// How the keys of the sampled events change.
    pub diff: KeyDiff,
}

/// Why a candidate was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The candidate does not check; nothing was written.
    #[error("the policy does not check:\n  {}", .0.join("\n  "))]
    Invalid(Vec<String>),
    /// Writing the file failed; nothing changed.
    #[error("cannot write {}: {source}", .file.display())]
    Write {
        /// The file.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The reload was refused; the policies in force stay.
    #[error("the reload was refused ({}):\n  {}", put_back(.restored), .errors.join("\n  "))]
    Refused {
        /// Every reason, in words.
        errors: Vec<String>,
        /// Whether the directory was put back as it was.
        restored: bool,
    },
}

fn put_back(restored: &bool) -> &'static str {
    if *restored {
        "the policy directory was put back as it was"
    } else {
        "the policy directory could not be put back"
    }
}

/// An applied candidate.
#[derive(Debug)]
pub struct Applied {
    /// The file written.
    pub target: PathBuf,
    /// The generation now in force.
    pub generation: u64,
    /// What the reload's checks could not verify.
    pub notes: Vec<String>,
}

/// Checks `text` as a policy file of the directory of `config` against
/// `current`'s plugins, and diffs the keys of `events` (at most `examples`
/// changed keys kept). Every refusal, in words, naming the file.
pub fn plan(
    current: &Snapshot,
    config: &HostConfig,
    text: &str,
    events: &[Event],
    examples: usize,
) -> Result<Planned, Vec<String>> {
    let spec = PolicyFile::parse(Path::new(PASTED), text).map_err(|e| vec![e.to_string()])?;
    let (target, replaces) = target_file(current, &config.policy_dir, &spec.biz_type)?;
    let candidate = Snapshot {
        generation: current.generation + 1,
        registry: current.registry.clone(),
        policies: candidate_set(current, config, &target, text)?,
        plugin_refusals: current.plugin_refusals.clone(),
        loaded_at: SystemTime::now(),
        notes: Vec::new(),
    };
    let key_policy = candidate
        .policies
        .get(&spec.biz_type)
        .map(|p| {
            format!(
                "{}@{}",
                key_policy_name(&p.spec.key_policy),
                p.key_policy_version
            )
        })
        .unwrap_or_default();
    Ok(Planned {
        biz_type: spec.biz_type,
        target,
        replaces,
        key_policy,
        diff: stability::diff(current, &candidate, events, examples),
    })
}

/// `name` of a requirement `name@req`.
fn key_policy_name(requirement: &str) -> &str {
    requirement.split('@').next().unwrap_or(requirement)
}

/// The file a candidate for `biz_type` goes to: the one routing it now,
/// else `<biz_type in lower case>.toml` — refused if that file routes
/// another business type.
fn target_file(
    current: &Snapshot,
    dir: &Path,
    biz_type: &str,
) -> Result<(PathBuf, bool), Vec<String>> {
    if let Some(policy) = current.policies.get(biz_type) {
        return Ok((policy.file.clone(), true));
    }
    let target = dir.join(format!("{}.toml", file_stem(biz_type)));
    let taken = current
        .policies
        .by_biz_type
        .values()
        .find(|p| p.file == target);
    if let Some(other) = taken {
        return Err(vec![format!(
            "{}: routes biz_type `{}`; a new policy for `{biz_type}` would replace it: \
             give it another biz_type or edit that file",
            target.display(),
            other.spec.biz_type
        )]);
    }
    let exists = target.exists();
    Ok((target, exists))
}

/// A file name for a business type: lower case, `[a-z0-9-]`, others as `-`.
fn file_stem(biz_type: &str) -> String {
    biz_type
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-') => c,
            _ => '-',
        })
        .collect()
}

/// The policy set the directory would load with `text` as `target`.
fn candidate_set(
    current: &Snapshot,
    config: &HostConfig,
    target: &Path,
    text: &str,
) -> Result<PolicySet, Vec<String>> {
    let mut files = policy_files(&config.policy_dir).map_err(|e| vec![e.to_string()])?;
    if !files.iter().any(|f| f == target) {
        files.push(target.to_path_buf());
        files.sort();
    }
    let parsed = files.into_iter().map(|file| {
        let spec = if file == target {
            PolicyFile::parse(&file, text)
        } else {
            PolicyFile::load(&file)
        };
        (file, spec)
    });
    let catalog = RegistryCatalog {
        registry: &current.registry,
        config,
    };
    PolicySet::from_files(parsed, &catalog)
        .map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

/// Checks `text` again, writes it into the policy directory and runs
/// `reload` (the checked reload every trigger runs). A refused reload puts
/// the file back as it was (or removes it, if it is new).
pub async fn apply(live: &Live, reload: &Reloader, text: &str) -> Result<Applied, ApplyError> {
    let planned =
        plan(&live.current(), live.config(), text, &[], 0).map_err(ApplyError::Invalid)?;
    let target = planned.target;
    let previous = write(&target, text)?;
    match reload().await {
        Ok(reloaded) => {
            let generation = reloaded.generation;
            tracing::info!(file = %target.display(), generation, "policy applied from the console");
            Ok(Applied {
                target,
                generation,
                notes: reloaded.notes,
            })
        }
        Err(refusal) => {
            let restored = restore(&target, previous.as_deref());
            Err(ApplyError::Refused {
                errors: refusal.errors,
                restored,
            })
        }
    }
}

/// Writes `text` to `target` through a temporary file renamed over it (a
/// reload never reads half a file); the previous content, if any.
fn write(target: &Path, text: &str) -> Result<Option<String>, ApplyError> {
    let failed = |source| ApplyError::Write {
        file: target.to_path_buf(),
        source,
    };
    let previous = std::fs::read_to_string(target).ok();
    let name = target.file_name().unwrap_or_default().to_string_lossy();
    // Not `*.toml`: the loader never reads the temporary file.
    let temporary = target.with_file_name(format!(".{name}.pasting"));
    std::fs::write(&temporary, text).map_err(failed)?;
    std::fs::rename(&temporary, target).map_err(failed)?;
    Ok(previous)
}

/// Puts `target` back as `previous` (absent: removes it); whether it worked.
fn restore(target: &Path, previous: Option<&str>) -> bool {
    let result = match previous {
        Some(text) => write(target, text).map(|_| ()),
        None => std::fs::remove_file(target).map_err(|source| ApplyError::Write {
            file: target.to_path_buf(),
            source,
        }),
    };
    if let Err(e) = &result {
        tracing::error!(error = %e, "could not put the policy directory back after a refused reload");
    }
    result.is_ok()
}

#[cfg(test)]
mod tests {
    use super::file_stem;

    #[test]
    fn a_business_type_names_its_file() {
        assert_eq!(file_stem("ORDER_SHIPPED"), "order-shipped");
        assert_eq!(file_stem("a/../b"), "a----b");
    }
}
