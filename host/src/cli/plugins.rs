//! `pushonce plugins list|check`: inspect plugin files. Also the default
//! plugin and cache directories, shared by `keys` and `bench plugins`.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

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

/// `$PUSHONCE_PLUGIN_DIR`, else `target/plugins` (where `cargo xtask plugins` puts them).
pub fn default_plugin_dir() -> PathBuf {
    std::env::var_os("PUSHONCE_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/plugins"))
}

/// `<data dir>/cache`, the data dir being `$PUSHONCE_DATA_DIR` or `./data`.
pub fn default_cache_dir() -> PathBuf {
    std::env::var_os("PUSHONCE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("data"))
        .join("cache")
}

/// Parses `name=value`.
pub fn parse_param(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not name=value"))
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
    let event = crate::cli::keys::sample_event();
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

/// `1234s` or `(policy file)`.
pub fn window(secs: Option<u32>) -> String {
    secs.map_or_else(|| "(policy file)".into(), |s| format!("{s}s"))
}

/// `12.3 KiB`.
pub fn human_size(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

/// Prints rows under a header, columns padded to their widest cell.
pub fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// Reads a file, naming it in the error.
pub fn read_to_string(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading stdin")?;
        return Ok(s);
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}
