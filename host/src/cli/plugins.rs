//! `pushonce plugins list|check`: inspect plugin files.

use std::path::{Path, PathBuf};

use anyhow::bail;

use super::inputs::{default_cache_dir, default_plugin_dir, parse_param, sample_event};
use super::output::{human_size, print_table, window};
use crate::plugin::{Limits, Plugin, PluginRegistry};

/// Arguments of `pushonce plugins`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, clap::Subcommand)]
enum What {
    /// List the plugins in a directory (and the files refused, with why).
    List {
        /// Plugin directory [default: $PUSHONCE_PLUGIN_DIR or target/plugins].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Load one plugin file, describe it and try it on a sample event.
    Check {
        /// The `.wasm` file.
        file: PathBuf,
        /// Parameter given to a key policy, `name=value` (repeatable).
        #[arg(long = "param", value_parser = parse_param)]
        params: Vec<(String, String)>,
    },
}

/// Run `pushonce plugins`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::List { dir } => list(&dir.unwrap_or_else(default_plugin_dir)),
        What::Check { file, params } => check(&file, &params),
    }
}

fn list(dir: &Path) -> anyhow::Result<()> {
    let cache = default_cache_dir();
    let (registry, refused) = PluginRegistry::load_dir(dir, &Limits::default(), Some(&cache))?;
    let rows: Vec<[String; 5]> = registry
        .plugins()
        .iter()
        .map(|p| {
            let m = p.meta();
            [
                m.name.clone(),
                m.version.to_string(),
                m.world.to_string(),
                human_size(m.size),
                m.file.display().to_string(),
            ]
        })
        .collect();
    print_table(&["NAME", "VERSION", "WORLD", "SIZE", "FILE"], &rows);
    if rows.is_empty() {
        println!("(no plugins in {})", dir.display());
    }
    if !refused.is_empty() {
        println!("\n{} file(s) refused:", refused.len());
        for r in &refused {
            println!("  {r}");
        }
        // A refused file is a failure scripts must see, not only a line of output.
        bail!("{} file(s) in {} refused", refused.len(), dir.display());
    }
    Ok(())
}

fn check(file: &Path, params: &[(String, String)]) -> anyhow::Result<()> {
    let cache = default_cache_dir();
    let mut registry = PluginRegistry::new(&Limits::default(), Some(&cache))?;
    let plugin = match registry.load_file(file) {
        Ok(p) => p,
        Err(e) => bail!("refused: {e}"),
    };
    let m = plugin.meta().clone();
    println!("plugin      {}", m.id);
    println!("world       {}", m.world);
    println!("description {}", m.description);
    println!("file        {} ({})", m.file.display(), human_size(m.size));
    println!("sha256      {}", m.sha256);
    println!(
        "loaded in   {:.1} ms ({:?})",
        m.load_time.as_secs_f64() * 1e3,
        m.cache
    );
    let Plugin::KeyPolicy(policy) = plugin else {
        return Ok(());
    };
    let event = sample_event();
    println!("sample event: {event:?}");
    let mut failed = false;
    for channel in ["inbox", "sms"] {
        match crate::derive::derive(&policy, &event, channel, params) {
            Ok(k) => println!("  {channel:<6} {}  {}", k.key, window(k.window_secs)),
            Err(e) => {
                // The plugin's own answer to bad input is fine; a trap is not.
                failed |= !matches!(
                    e,
                    crate::derive::DeriveError::Call(crate::plugin::CallError::Refused { .. })
                );
                println!("  {channel:<6} error: {e}");
            }
        }
    }
    if failed {
        bail!("{} failed on the sample event", m.id);
    }
    Ok(())
}
