//! `pushonce plugins list|check|test|build|new`: inspect plugin files, run
//! an author's test cases against one, build and scaffold plugin projects.

use std::path::{Path, PathBuf};

use anyhow::bail;

use super::inputs::{default_cache_dir, default_plugin_dir, parse_param, sample_event};
use super::output::{human_size, print_table, window};
use crate::config::HostConfig;
use crate::plugin::{Limits, Plugin, PluginRegistry};
use crate::route::live::limits_of;

/// Arguments of `pushonce plugins`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
    /// Host configuration file whose `[plugin_limits]` plugins are loaded
    /// and run under, as the host does [default: ./pushonce.toml when
    /// present, else the default limits].
    #[arg(long, global = true)]
    config: Option<PathBuf>,
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
    /// Run a plugin against its cases: a key policy against event →
    /// expected-key cases (TOML `[[case]]` or JSON lines), a channel plugin
    /// against a scripted provider on 127.0.0.1 (a TOML script of expected
    /// requests and canned or cut-off answers); prints a pass/fail table,
    /// fails if any case fails.
    Test {
        /// The `.wasm` file.
        file: PathBuf,
        /// The cases file (key policy: `.toml`, else JSON lines) or the
        /// channel script (TOML).
        #[arg(long, visible_alias = "script")]
        cases: PathBuf,
    },
    /// Build a plugin project written by `plugins new` (Rust, JavaScript or
    /// Python, told by its files) and copy the `.wasm` into a plugin directory.
    Build {
        /// The project directory.
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Where to copy the component [default: $PUSHONCE_PLUGIN_DIR, else the project directory].
        #[arg(long)]
        out: Option<PathBuf>,
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
    let limits = || -> anyhow::Result<Limits> {
        let config = HostConfig::load(args.config.as_deref())?;
        Ok(limits_of(&config))
    };
    match args.what {
        What::List { dir } => list(&dir.unwrap_or_else(default_plugin_dir), &limits()?),
        What::Check { file, params } => check(&file, &params, &limits()?),
        What::Test { file, cases } => test(&file, &cases, &limits()?),
        What::Build { dir, out } => build(&dir, out, &limits()?),
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

fn list(dir: &Path, limits: &Limits) -> anyhow::Result<()> {
    let cache = default_cache_dir();
    let (registry, refused) = PluginRegistry::load_dir(dir, limits, Some(&cache))?;
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

fn check(file: &Path, params: &[(String, String)], limits: &Limits) -> anyhow::Result<()> {
    let cache = default_cache_dir();
    let mut registry = PluginRegistry::new(limits, Some(&cache))?;
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

fn test(file: &Path, cases: &Path, limits: &Limits) -> anyhow::Result<()> {
    let mut registry = PluginRegistry::new(limits, Some(&default_cache_dir()))?;
    match registry.load_file(file) {
        Ok(Plugin::KeyPolicy(p)) => test_key_policy(&p, cases),
        Ok(Plugin::Channel(p)) => test_channel(registry, &p, cases),
        Err(e) => bail!("refused: {e}"),
    }
}

fn test_key_policy(plugin: &crate::plugin::KeyPolicyPlugin, cases: &Path) -> anyhow::Result<()> {
    let cases = super::plugin_test::read_cases(cases)?;
    let outcomes = super::plugin_test::run_cases(plugin, cases);
    let rows: Vec<[String; 4]> = outcomes
        .iter()
        .map(|o| {
            [
                o.name.clone(),
                pass_fail(o.passed),
                o.expected.clone(),
                o.got.clone(),
            ]
        })
        .collect();
    print_table(&["CASE", "RESULT", "EXPECTED", "GOT"], &rows);
    let failed = outcomes.iter().filter(|o| !o.passed).count();
    summary(plugin.id(), outcomes.len(), failed)
}

fn test_channel(
    registry: PluginRegistry,
    plugin: &crate::plugin::ChannelPlugin,
    script: &Path,
) -> anyhow::Result<()> {
    let script = super::channel_script::read_script(script)?;
    let outcomes = super::channel_kit::run_script(registry, plugin, script)?;
    let rows: Vec<[String; 6]> = outcomes
        .iter()
        .map(|o| {
            [
                o.name.clone(),
                pass_fail(o.passed),
                o.call.into(),
                o.expected.clone(),
                o.got.clone(),
                o.requests.clone(),
            ]
        })
        .collect();
    print_table(
        &["CASE", "RESULT", "CALL", "EXPECTED", "GOT", "REQUESTS"],
        &rows,
    );
    for o in outcomes.iter().filter(|o| !o.problems.is_empty()) {
        for p in &o.problems {
            println!("{}: {p}", o.name);
        }
    }
    let failed = outcomes.iter().filter(|o| !o.passed).count();
    summary(plugin.id(), outcomes.len(), failed)
}

fn pass_fail(passed: bool) -> String {
    if passed { "pass" } else { "FAIL" }.into()
}

/// Prints `id: N passed, M failed`; an error when any failed.
fn summary(id: &str, total: usize, failed: usize) -> anyhow::Result<()> {
    println!("{id}: {} passed, {failed} failed", total - failed);
    if failed > 0 {
        bail!("{failed} of {total} case(s) failed");
    }
    Ok(())
}

fn build(dir: &Path, out: Option<PathBuf>, limits: &Limits) -> anyhow::Result<()> {
    let out = out
        .or_else(|| std::env::var_os("PUSHONCE_PLUGIN_DIR").map(PathBuf::from))
        .unwrap_or_else(|| dir.to_path_buf());
    let file = super::plugin_build::build(dir, &out)?;
    println!("built {}", file.display());
    check(&file, &[], limits)
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
    println!("or:    pushonce plugins build {}", dir.display());
    println!("test:  pushonce plugins test <the .wasm> --cases cases.toml");
    Ok(())
}
