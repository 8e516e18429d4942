//! `pushonce keys`: the operator's dry run of key derivation. Loads the
//! plugins, resolves `--policy NAME@REQ`, and prints the key every channel
//! would get for the event in `--event`, one line per channel.

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::derive::event_from_json;
pub use crate::derive::{ChannelKey, dry_run};
use crate::plugin::{Limits, PluginRegistry};

use super::inputs::{default_cache_dir, default_plugin_dir, parse_param, read_to_string};
use super::output::{print_table, window};

/// Arguments of `pushonce keys`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Key policy and version requirement, e.g. `per-user-per-day@^1.2`.
    #[arg(long)]
    policy: String,
    /// Event JSON file (`-` for stdin): {"biz_type","biz_id","user_id","occurred_at","attributes"}.
    #[arg(long)]
    event: PathBuf,
    /// Channel to derive a key for (repeatable) [default: inbox, sms, wechat, app-push].
    #[arg(long = "channel")]
    channels: Vec<String>,
    /// Policy parameter `name=value` (repeatable), e.g. `--param tz=+08:00`.
    #[arg(long = "param", value_parser = parse_param)]
    params: Vec<(String, String)>,
    /// Plugin directory [default: $PUSHONCE_PLUGIN_DIR or target/plugins].
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The channels of the product brief.
const DEFAULT_CHANNELS: [&str; 4] = ["inbox", "sms", "wechat", "app-push"];

/// Run `pushonce keys`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let event = event_from_json(&read_to_string(&args.event)?)
        .with_context(|| format!("in {}", args.event.display()))?;
    let dir = args.dir.unwrap_or_else(default_plugin_dir);
    let (registry, refused) =
        PluginRegistry::load_dir(&dir, &Limits::default(), Some(&default_cache_dir()))?;
    for r in &refused {
        tracing::warn!("{r}");
    }
    let channels: Vec<String> = if args.channels.is_empty() {
        DEFAULT_CHANNELS.map(String::from).to_vec()
    } else {
        args.channels
    };
    let (policy, results) = dry_run(&registry, &args.policy, &event, &channels, &args.params)?;
    eprintln!("policy {policy}");
    let mut rows = Vec::new();
    let mut errors = 0;
    for (channel, result) in results {
        match result {
            Ok(k) => rows.push([k.channel, k.key, window(k.window_secs)]),
            Err(e) => {
                errors += 1;
                rows.push([channel, format!("error: {e}"), String::new()]);
            }
        }
    }
    print_table(&["CHANNEL", "KEY", "WINDOW"], &rows);
    if errors > 0 {
        bail!("{errors} of {} channel(s) got no key", channels.len());
    }
    Ok(())
}
