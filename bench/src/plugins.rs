//! `pushonce-bench plugins`: what a plugin costs. Prints per-call cost of
//! `derive-key` on a warm pooled instance and on a fresh instance, the fuel a
//! call uses, and the load time of a plugin compiled cold vs from the disk cache.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use pushonce::cli::inputs::{default_plugin_dir, sample_event};
use pushonce::cli::output::print_table;
use pushonce::plugin::cache::{self, CacheOutcome};
use pushonce::plugin::{Limits, Plugin, PluginRegistry};

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

fn measure_plugins(s: &Settings, cache_dir: &std::path::Path) -> anyhow::Result<()> {
    let limits = Limits::default();
    let (registry, refused) = PluginRegistry::load_dir(&s.dir, &limits, Some(cache_dir))
        .with_context(|| format!("loading plugins from {}", s.dir.display()))?;
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
            s.dir.display()
        );
    }
    let event = sample_event();
    println!(
        "derive-key per call, µs ({} warm calls, {} fresh-instance calls per policy; pooling allocator: {})",
        s.calls, s.fresh_calls, limits.pooling
    );
    let mut rows = Vec::new();
    for p in &policies {
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
        rows.push([
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
        ]);
    }
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
    let runtime = registry.runtime();
    let mut rows = Vec::new();
    for p in &policies {
        let bytes = std::fs::read(&p.meta().file)?;
        let sha = cache::sha256_hex(&bytes);
        let mut cold = Vec::new();
        for _ in 0..s.compiles {
            let t = Instant::now();
            let (_, outcome) =
                cache::load_component(runtime.engine(), runtime.fingerprint(), &bytes, &sha, None)
                    .map_err(|e| anyhow::anyhow!("compiling {}: {e:#}", p.id()))?;
            cold.push(t.elapsed());
            debug_assert_eq!(outcome, CacheOutcome::Compiled);
        }
        let mut cached = Vec::new();
        for _ in 0..s.compiles * 20 {
            let t = Instant::now();
            let (_, outcome) = cache::load_component(
                runtime.engine(),
                runtime.fingerprint(),
                &bytes,
                &sha,
                Some(cache_dir),
            )
            .map_err(|e| anyhow::anyhow!("loading {} from the cache: {e:#}", p.id()))?;
            cached.push(t.elapsed());
            if outcome != CacheOutcome::FromCache {
                bail!("{} did not load from the cache", p.id());
            }
        }
        let mut whole = Vec::new();
        for _ in 0..s.compiles * 20 {
            let mut r = PluginRegistry::with_runtime(runtime.clone(), Some(cache_dir));
            let t = Instant::now();
            r.load_file(&p.meta().file)?;
            whole.push(t.elapsed());
        }
        let ms = |mut v: Vec<Duration>| {
            v.sort_unstable();
            let mean = v.iter().sum::<Duration>() / v.len() as u32;
            (
                format!("{:.3}", mean.as_secs_f64() * 1e3),
                format!("{:.3}", v[0].as_secs_f64() * 1e3),
            )
        };
        let (cm, cmin) = ms(cold);
        let (km, kmin) = ms(cached);
        let (lm, _) = ms(whole);
        rows.push([
            p.id().to_string(),
            format!("{:.1} KiB", bytes.len() as f64 / 1024.0),
            cm,
            cmin,
            km,
            kmin,
            lm,
        ]);
    }
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
