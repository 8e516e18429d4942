//! `pushonce plugins list|check|test|new`: inspect plugin files, run an
//! author's test cases against one, scaffold a new plugin project.

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
    /// Run a key policy against event → expected-key cases (TOML `[[case]]`
    /// or JSON lines); prints a pass/fail table, fails if any case fails.
    Test {
        /// The `.wasm` file.
        file: PathBuf,
        /// The cases file (`.toml`, else JSON lines).
        #[arg(long)]
        cases: PathBuf,
    },
    /// Write a new plugin project (sources, WIT, build command, test cases).
    New {
        /// `key-policy` or `channel`.
        kind: super::scaffold::Kind,
        /// The plugin's name, `[a-z][a-z0-9-]*`.
        name: String,
        /// The language.
        #[arg(long, value_enum, default_value = "rust")]
        lang: super::scaffold::Lang,
        /// Where to write it [default: ./NAME].
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// Run `pushonce plugins`.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.what {
        What::List { dir } => list(&dir.unwrap_or_else(default_plugin_dir)),
        What::Check { file, params } => check(&file, &params),
        What::Test { file, cases } => test(&file, &cases),
        What::New {
            kind,
            name,
            lang,
            dir,
        } => new(
            kind,
            &name,
            lang,
            &dir.unwrap_or_else(|| PathBuf::from(&name)),
        ),
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

fn test(file: &Path, cases: &Path) -> anyhow::Result<()> {
    let cases = super::plugin_test::read_cases(cases)?;
    let mut registry = PluginRegistry::new(&Limits::default(), Some(&default_cache_dir()))?;
    let plugin = match registry.load_file(file) {
        Ok(Plugin::KeyPolicy(p)) => p,
        Ok(other) => bail!(
            "{} is a {} plugin: `plugins test` runs key policies",
            other.meta().id,
            other.meta().world
        ),
        Err(e) => bail!("refused: {e}"),
    };
    let outcomes = super::plugin_test::run_cases(&plugin, cases);
    let rows: Vec<[String; 4]> = outcomes
        .iter()
        .map(|o| {
            let result = if o.passed { "pass" } else { "FAIL" };
            [
                o.name.clone(),
                result.into(),
                o.expected.clone(),
                o.got.clone(),
            ]
        })
        .collect();
    print_table(&["CASE", "RESULT", "EXPECTED", "GOT"], &rows);
    let failed = outcomes.iter().filter(|o| !o.passed).count();
    println!(
        "{}: {} passed, {failed} failed",
        plugin.id(),
        outcomes.len() - failed
    );
    if failed > 0 {
        bail!("{failed} of {} case(s) failed", outcomes.len());
    }
    Ok(())
}

fn new(
    kind: super::scaffold::Kind,
    name: &str,
    lang: super::scaffold::Lang,
    dir: &Path,
) -> anyhow::Result<()> {
    let files = super::scaffold::scaffold(kind, name, lang, dir)?;
    println!("wrote {} files into {}", files.len(), dir.display());
    println!(
        "build: cd {} && {}",
        dir.display(),
        super::scaffold::build_command(lang)
    );
    if kind == super::scaffold::Kind::KeyPolicy {
        println!("test:  pushonce plugins test <the .wasm> --cases cases.toml");
    }
    Ok(())
}
