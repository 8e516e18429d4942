//! `pushonce-bench languages`: what a key policy costs per language, in one
//! run. Every key policy in the plugin directory (Rust, and the JavaScript and
//! Python ones `cargo xtask plugins` built) is measured the same way —
//! component size, cold compile, load from the disk cache, warm `derive-key`
//! call, fuel per call, linear memory of one instance — and each figure is
//! also given as a ratio to the Rust `per-user-per-day` plugin (the baseline).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;

use pushonce::cli::inputs::default_plugin_dir;
use pushonce::cli::output::print_table;
use pushonce::event::Event;
use pushonce::plugin::cache::{self, CacheOutcome};
use pushonce::plugin::{KeyPolicyPlugin, Limits, PluginRuntime};

/// Arguments of `pushonce-bench languages`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Plugin directory [default: $PUSHONCE_PLUGIN_DIR or target/plugins].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Warm calls per plugin.
    #[arg(long, default_value_t = 20_000)]
    calls: usize,
    /// Cold compiles per plugin (cache loads: 10 times as many).
    #[arg(long, default_value_t = 3)]
    compiles: usize,
}

/// The baseline every ratio is against.
const BASELINE: &str = "per-user-per-day";

/// One plugin's figures.
struct Figures {
    id: String,
    lang: &'static str,
    size: f64,
    compile: f64,
    cached: f64,
    warm_mean: f64,
    warm_p99: f64,
    fuel: u64,
    memory: f64,
}

/// Run `pushonce-bench languages`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = args.dir.unwrap_or_else(default_plugin_dir);
    let cache_dir =
        std::env::temp_dir().join(format!("pushonce-bench-lang-{}", std::process::id()));
    let result = measure(&dir, args.calls.max(1), args.compiles.max(1), &cache_dir);
    let _ = std::fs::remove_dir_all(&cache_dir);
    result
}

fn measure(dir: &Path, calls: usize, compiles: usize, cache_dir: &Path) -> anyhow::Result<()> {
    let (registry, mut policies) =
        super::plugins::load_key_policies(dir, &Limits::default(), cache_dir)?;
    policies.sort_by_key(|p| (lang_of(&p.meta().name) != "Rust", p.id().to_string()));
    if !policies.iter().any(|p| p.meta().name == BASELINE) {
        bail!(
            "the baseline {BASELINE} is not in {} (build: cargo xtask plugins)",
            dir.display()
        );
    }
    let runtime = registry.runtime();
    let mut all = Vec::new();
    for p in &policies {
        eprintln!("measuring {}", p.id());
        all.push(figures(p, runtime, calls, compiles, cache_dir)?);
    }
    print_figures(&all, calls, compiles);
    Ok(())
}

/// The language of a shipped key policy, by name.
fn lang_of(name: &str) -> &'static str {
    match name {
        "per-user-per-week" => "JavaScript",
        "per-tenant-per-hour" => "Python",
        _ => "Rust",
    }
}

/// The event and params each plugin is measured with (it answers a key).
fn input_for(name: &str) -> (Event, Vec<(String, String)>) {
    let event = Event {
        biz_type: "ORDER_SHIPPED".into(),
        biz_id: "o-1001".into(),
        user_id: "u-42".into(),
        occurred_at_ms: 1_796_054_399_000,
        attributes: vec![
            ("job_id".into(), "job-7".into()),
            ("tenant_id".into(), "acme".into()),
        ],
    };
    let params = match name {
        "per-user-per-day" | "per-user-per-week" => vec![("tz".into(), "+08:00".into())],
        _ => Vec::new(),
    };
    (event, params)
}

fn mean_ms(v: &[Duration]) -> f64 {
    v.iter().sum::<Duration>().as_secs_f64() * 1e3 / v.len() as f64
}

fn figures(
    p: &KeyPolicyPlugin,
    runtime: &Arc<PluginRuntime>,
    calls: usize,
    compiles: usize,
    cache_dir: &Path,
) -> anyhow::Result<Figures> {
    let (event, params) = input_for(&p.meta().name);
    let bytes = std::fs::read(&p.meta().file)?;
    let sha = cache::sha256_hex(&bytes);
    let load = |cache: Option<&Path>| -> anyhow::Result<Duration> {
        let t = Instant::now();
        let (_, outcome) =
            cache::load_component(runtime.engine(), runtime.fingerprint(), &bytes, &sha, cache)
                .map_err(|e| anyhow::anyhow!("loading {}: {e:#}", p.id()))?;
        let took = t.elapsed();
        if cache.is_some() && outcome != CacheOutcome::FromCache {
            bail!("{} did not load from the cache", p.id());
        }
        Ok(took)
    };
    let cold: Vec<Duration> = (0..compiles)
        .map(|_| load(None))
        .collect::<Result<_, _>>()?;
    let cached: Vec<Duration> = (0..compiles * 10)
        .map(|_| load(Some(cache_dir)))
        .collect::<Result<_, _>>()?;
    for _ in 0..100.min(calls) {
        p.derive_key(&event, "sms", &params)?;
    }
    let mut warm = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        p.derive_key(&event, "sms", &params)?;
        warm.push(t.elapsed());
    }
    warm.sort_unstable();
    let p99 = warm[((warm.len() as f64 - 1.0) * 0.99).round() as usize];
    Ok(Figures {
        id: p.id().to_string(),
        lang: lang_of(&p.meta().name),
        size: bytes.len() as f64 / 1024.0,
        compile: mean_ms(&cold),
        cached: mean_ms(&cached),
        warm_mean: mean_ms(&warm) * 1e3,
        warm_p99: p99.as_secs_f64() * 1e6,
        fuel: p.fuel_used_by_one_call(&event, "sms", &params)?,
        memory: p.memory_after_one_call(&event, "sms", &params)? as f64 / (1024.0 * 1024.0),
    })
}

fn print_figures(all: &[Figures], calls: usize, compiles: usize) {
    let base = all
        .iter()
        .find(|f| f.id.starts_with(BASELINE))
        .expect("baseline measured");
    let ratio = |x: f64, b: f64| format!("{:.1}×", x / b);
    let rows: Vec<[String; 13]> = all
        .iter()
        .map(|f| {
            [
                f.id.clone(),
                f.lang.into(),
                format!("{:.1} KiB", f.size),
                ratio(f.size, base.size),
                format!("{:.1}", f.compile),
                ratio(f.compile, base.compile),
                format!("{:.2}", f.cached),
                ratio(f.cached, base.cached),
                format!("{:.2}", f.warm_mean),
                ratio(f.warm_mean, base.warm_mean),
                format!("{:.2}", f.warm_p99),
                format!("{:.1}", f.memory),
                ratio(f.memory, base.memory),
            ]
        })
        .collect();
    println!(
        "key policies per language ({calls} warm calls, {compiles} cold compiles and {} cache loads each; ratios to Rust {BASELINE})",
        compiles * 10
    );
    print_table(
        &[
            "PLUGIN",
            "LANG",
            "WASM",
            "×",
            "COMPILE MS",
            "×",
            "CACHE MS",
            "×",
            "WARM µs",
            "×",
            "P99 µs",
            "MEMORY MiB",
            "×",
        ],
        &rows,
    );
    for f in all {
        println!("fuel per call {}: {}", f.id, f.fuel);
    }
    println!(
        "(MEMORY: linear memory of one instance after a call — each warm instance costs this)"
    );
}
