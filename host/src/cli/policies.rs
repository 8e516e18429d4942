//! `pushonce policies check|diff`: validate policy files against the plugins
//! and the host configuration, and show how keys change between two sets.

use crate::config::HostConfig;
use crate::event::event_from_json;
use crate::route::live::{self, Snapshot};
use crate::route::stability;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

use super::inputs::read_to_string;
use super::output::print_table;

/// Arguments of `pushonce policies`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
    /// Host configuration file [default: ./pushonce.toml when present].
    #[arg(long, global = true)]
    config: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// Validate every policy file of DIR and print what is in force.
    Check {
        /// Policy directory [default: the configuration's `policy_dir`].
        dir: Option<PathBuf>,
    },
    /// Count the keys that change between two policy directories for some events.
    Diff {
        /// The policy directory in force.
        old: PathBuf,
        /// The candidate policy directory.
        new: PathBuf,
        /// Events, one JSON object per line.
        #[arg(long)]
        events: PathBuf,
        /// Changed keys to show.
        #[arg(long, default_value_t = 10)]
        examples: usize,
    },
}

/// Run `pushonce policies`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let config = HostConfig::load(args.config.as_deref())?;
    match args.what {
        What::Check { dir } => {
            let dir = dir.unwrap_or_else(|| config.policy_dir.clone());
            let snapshot = snapshot_of(&config, &dir)?;
            print_policies(&snapshot);
            Ok(())
        }
        What::Diff {
            old,
            new,
            events,
            examples,
        } => {
            let (old, new) = (snapshot_of(&config, &old)?, snapshot_of(&config, &new)?);
            let events = read_events(&events)?;
            let d = stability::diff(&old, &new, &events, examples);
            println!("{}", d.summary());
            if !d.examples.is_empty() {
                println!();
                print_table(&["EVENT", "CHANNEL", "OLD KEY", "NEW KEY"], &d.examples);
            }
            for e in &d.errors {
                println!("not derivable: {e}");
            }
            Ok(())
        }
    }
}

/// Builds a snapshot with `dir` as the policy directory, or fails with every reason.
pub(crate) fn snapshot_of(config: &HostConfig, dir: &Path) -> anyhow::Result<Snapshot> {
    let config = HostConfig {
        policy_dir: dir.to_path_buf(),
        ..config.clone()
    };
    match live::build(&config, &live::limits_of(&config), 1) {
        Ok(s) => Ok(s),
        Err(e) => {
            for line in e.lines() {
                eprintln!("refused: {line}");
            }
            bail!("the policies in {} do not validate", dir.display())
        }
    }
}

fn print_policies(snapshot: &Snapshot) {
    let rows: Vec<[String; 6]> = snapshot
        .policies
        .by_biz_type
        .values()
        .map(|p| {
            let name = p.spec.key_policy.split('@').next().unwrap_or_default();
            let retry = &p.spec.retry;
            [
                p.spec.biz_type.clone(),
                format!("{}@{} ({})", name, p.key_policy_version, p.spec.key_policy),
                p.spec.channels.join(","),
                humantime::format_duration(p.spec.window).to_string(),
                format!(
                    "{}x {}..{} x{}{}",
                    retry.max_attempts,
                    humantime::format_duration(retry.backoff.initial),
                    humantime::format_duration(retry.backoff.max),
                    retry.backoff.factor,
                    if retry.backoff.jitter { " jitter" } else { "" }
                ),
                p.spec
                    .fallback
                    .iter()
                    .map(|(a, b)| format!("{a}->{b}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ]
        })
        .collect();
    print_table(
        &[
            "BIZ_TYPE",
            "KEY POLICY",
            "CHANNELS",
            "WINDOW",
            "RETRIES",
            "FALLBACK",
        ],
        &rows,
    );
    println!("{} policies valid", rows.len());
}

fn read_events(path: &Path) -> anyhow::Result<Vec<crate::event::Event>> {
    let text = read_to_string(path)?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| event_from_json(l).with_context(|| format!("{}:{}", path.display(), i + 1)))
        .collect()
}
