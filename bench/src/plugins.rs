//! `pushonce-bench plugins`: what a plugin costs. Prints per-call cost of
//! `derive-key` on a warm pooled instance and on a fresh instance, the fuel a
//! call uses, and the load time of a plugin compiled cold vs from the disk cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use pushonce::cli::inputs::{default_plugin_dir, sample_event};
use pushonce::cli::output::print_table;
use pushonce::plugin::cache::{self, CacheOutcome};
use pushonce::plugin::{KeyPolicyPlugin, Limits, Plugin, PluginRegistry, PluginRuntime};

/// Arguments of `pushonce-bench plugins`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Plugin directory [default: $PUSHONCE_PLUGIN_DIR or target/plugins].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Warm calls per policy.
    #[arg(long, default_value_t = 100_000)]
    calls: usize,
    /// Fresh-instance calls per policy.
    #[arg(long, default_value_t = 2_000)]
    fresh_calls: usize,
    /// Cold compiles (and cache loads ×20) per plugin.
    #[arg(long, default_value_t = 5)]
    compiles: usize,
}

/// Parameters each real policy gets in the benchmark.
fn params_for(name: &str) -> Vec<(String, String)> {
    match name {
        "per-user-per-day" => vec![("tz".into(), "+08:00".into())],
        _ => Vec::new(),
    }
}

/// How long each of `n` calls of `call` took (the first error stops it).
fn timed<E>(n: usize, mut call: impl FnMut() -> Result<(), E>) -> Result<Vec<Duration>, E> {
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = call();
        times.push(t.elapsed());
        r?;
    }
    Ok(times)
}

/// Mean, p50, p99 in µs of `samples`.
fn summary(samples: &mut [Duration]) -> [String; 3] {
    samples.sort_unstable();
    let us = |d: Duration| format!("{:.2}", d.as_secs_f64() * 1e6);
    let mean = samples.iter().sum::<Duration>() / samples.len().max(1) as u32;
    let pick = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    [us(mean), us(pick(0.50)), us(pick(0.99))]
}

/// Run `pushonce-bench plugins`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = args.dir.unwrap_or_else(default_plugin_dir);
    let cache_dir = std::env::temp_dir().join(format!("pushonce-bench-{}", std::process::id()));
    let settings = Settings {
        dir,
        calls: args.calls.max(1),
        fresh_calls: args.fresh_calls.max(1),
        compiles: args.compiles.max(1),
    };
    let result = measure_plugins(&settings, &cache_dir);
    let _ = std::fs::remove_dir_all(&cache_dir);
    result
}

/// The benchmark's settings, resolved.
struct Settings {
    /// Plugin directory.
    dir: PathBuf,
    /// Warm calls per policy.
    calls: usize,
    /// Fresh calls per policy.
    fresh_calls: usize,
    /// Cold compiles per plugin.
    compiles: usize,
}

fn measure_plugins(s: &Settings, cache_dir: &Path) -> anyhow::Result<()> {
    let limits = Limits::default();
    let (registry, policies) = load_key_policies(&s.dir, &limits, cache_dir)?;
    println!(
        "derive-key per call, µs ({} warm calls, {} fresh-instance calls per policy; pooling allocator: {})",
        s.calls, s.fresh_calls, limits.pooling
    );
    let rows = policies
        .iter()
        .map(|p| call_costs(s, p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    print_table(
        &[
            "POLICY",
            "WARM MEAN",
            "WARM P50",
            "WARM P99",
            "+KEY MEAN",
            "+KEY P99",
            "FRESH MEAN",
            "FRESH P50",
            "FRESH P99",
            "FUEL/CALL",
        ],
        &rows,
    );
    println!("(+KEY: warm call plus host-side validation and composition of the full key)");
    println!(
        "\nload one plugin, ms (cold compile ×{}, cache load ×{})",
        s.compiles,
        s.compiles * 20
    );
    let rows = policies
        .iter()
        .map(|p| load_costs(s, registry.runtime(), p, cache_dir))
        .collect::<anyhow::Result<Vec<_>>>()?;
    print_table(
        &[
            "PLUGIN",
            "WASM",
            "COMPILE MEAN",
            "COMPILE MIN",
            "CACHE MEAN",
            "CACHE MIN",
            "LOAD_FILE (CACHED)",
        ],
        &rows,
    );
    println!("(LOAD_FILE: read + hash + cache load + link + instantiate + describe)");
    Ok(())
}

/// Loads the plugins of `dir` (printing the refused ones) and returns the
/// registry with its key policies; an error when there are none.
pub(super) fn load_key_policies(
    dir: &Path,
    limits: &Limits,
    cache_dir: &Path,
) -> anyhow::Result<(PluginRegistry, Vec<Arc<KeyPolicyPlugin>>)> {
    let (registry, refused) = PluginRegistry::load_dir(dir, limits, Some(cache_dir))
        .with_context(|| format!("loading plugins from {}", dir.display()))?;
    for r in &refused {
        eprintln!("refused: {r}");
    }
    let policies: Vec<_> = registry
        .plugins()
        .into_iter()
        .filter_map(|p| match p {
            Plugin::KeyPolicy(p) => Some(p),
            Plugin::Channel(_) => None,
        })
        .collect();
    if policies.is_empty() {
        bail!(
            "no key-policy plugins in {} (build them: cargo xtask plugins)",
            dir.display()
        );
    }
    Ok((registry, policies))
}

/// One policy's call costs: warm, warm plus the host's key composition,
/// fresh instance (mean, p50, p99 in µs), and the fuel of one call.
fn call_costs(s: &Settings, p: &KeyPolicyPlugin) -> anyhow::Result<[String; 10]> {
    let event = sample_event();
    let params = params_for(&p.meta().name);
    // Warm up the pool, then time each call.
    for _ in 0..1000 {
        p.derive_key(&event, "sms", &params)?;
    }
    let mut warm = timed(s.calls, || p.derive_key(&event, "sms", &params).map(drop))?;
    let mut full = timed(s.calls, || {
        pushonce::derive::derive(p, &event, "sms", &params).map(drop)
    })?;
    let mut fresh = timed(s.fresh_calls, || {
        p.derive_key_fresh(&event, "sms", &params).map(drop)
    })?;
    let fuel = p.fuel_used_by_one_call(&event, "sms", &params)?;
    let [wm, w50, w99] = summary(&mut warm);
    let [dm, _, d99] = summary(&mut full);
    let [fm, f50, f99] = summary(&mut fresh);
    Ok([
        p.id().to_string(),
        wm,
        w50,
        w99,
        dm,
        d99,
        fm,
        f50,
        f99,
        fuel.to_string(),
    ])
}

/// One plugin's load costs: cold compile, load from the disk cache, and a
/// whole `load_file` from the cache (mean and min in ms).
fn load_costs(
    s: &Settings,
    runtime: &Arc<PluginRuntime>,
    p: &KeyPolicyPlugin,
    cache_dir: &Path,
) -> anyhow::Result<[String; 7]> {
    let bytes = std::fs::read(&p.meta().file)?;
    let sha = cache::sha256_hex(&bytes);
    let load = |cache: Option<&Path>| {
        let t = Instant::now();
        let (_, outcome) =
            cache::load_component(runtime.engine(), runtime.fingerprint(), &bytes, &sha, cache)
                .map_err(|e| anyhow::anyhow!("loading {}: {e:#}", p.id()))?;
        Ok::<_, anyhow::Error>((t.elapsed(), outcome))
    };
    let mut cold = Vec::new();
    for _ in 0..s.compiles {
        let (took, outcome) = load(None)?;
        debug_assert_eq!(outcome, CacheOutcome::Compiled);
        cold.push(took);
    }
    let mut cached = Vec::new();
    for _ in 0..s.compiles * 20 {
        let (took, outcome) = load(Some(cache_dir))?;
        if outcome != CacheOutcome::FromCache {
            bail!("{} did not load from the cache", p.id());
        }
        cached.push(took);
    }
    let mut whole = Vec::new();
    for _ in 0..s.compiles * 20 {
        let mut r = PluginRegistry::with_runtime(runtime.clone(), Some(cache_dir));
        let t = Instant::now();
        r.load_file(&p.meta().file)?;
        whole.push(t.elapsed());
    }
    let [cm, cmin] = mean_min_ms(cold);
    let [km, kmin] = mean_min_ms(cached);
    let [lm, _] = mean_min_ms(whole);
    Ok([
        p.id().to_string(),
        format!("{:.1} KiB", bytes.len() as f64 / 1024.0),
        cm,
        cmin,
        km,
        kmin,
        lm,
    ])
}

/// Mean and min in ms of `samples`.
fn mean_min_ms(samples: Vec<Duration>) -> [String; 2] {
    let ms = |d: Duration| format!("{:.3}", d.as_secs_f64() * 1e3);
    let mean = samples.iter().sum::<Duration>() / samples.len().max(1) as u32;
    let min = samples.iter().min().copied().unwrap_or_default();
    [ms(mean), ms(min)]
}
