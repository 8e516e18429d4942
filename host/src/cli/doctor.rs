//! `pushonce doctor [--config FILE] [--json]`: checks a deployment before it
//! goes live — Redis, the ledger, plugins, channels, tokens — reading the
//! configuration file `serve` reads, and prints one line per check (`ok`,
//! `warn`, `FAIL`, what was found, what to do). Exits non-zero when a check
//! failed. A running host answers the same at `GET /admin/doctor`.
//!
//! With the embedded Redis (no `redis_url`), doctor talks to the one the
//! running host started (its socket in `<data_dir>/redis`): whatever
//! accepts a connection there is that server, even when it answers only
//! errors (`-LOADING` while it reads a large AOF, `-BUSY`), which the checks
//! then report. When nothing listens there, it starts the server as `serve`
//! would, and stops it afterwards; that start takes the data directory's
//! lock (`store::embedded`), so it is refused while a host owns the
//! directory (e.g. one still starting, before its socket exists).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::bail;

use crate::config::HostConfig;
use crate::doctor::{self, Check, Deployment, Report};
use crate::ledger::LedgerPool;
use crate::permit::Permits;
use crate::route::Live;
use crate::store::{RedisTarget, Store};

/// Arguments of `pushonce doctor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Configuration file [default: ./pushonce.toml when it exists].
    #[arg(long, env = "PUSHONCE_CONFIG")]
    config: Option<PathBuf>,
    /// Print the report as JSON (the `/admin/doctor` document).
    #[arg(long)]
    json: bool,
}

/// Run `pushonce doctor`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let config = HostConfig::load(args.config.as_deref())?;
    let report = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(examine(config));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for check in &report.checks {
            println!("{}", check.line());
        }
    }
    if !report.ok {
        bail!(
            "{} of {} checks failed",
            report.failures(),
            report.checks.len()
        );
    }
    Ok(())
}

/// Opens what `config` names, as far as it opens, and checks it.
async fn examine(config: HostConfig) -> Report {
    let env = |var: &str| std::env::var(var).ok();
    let (store, note) = open_redis(&config).await;
    let permits = match &store {
        Ok(store) => store
            .manager()
            .await
            .map(|conn| Permits::new(conn, crate::service::permit_config(&config)))
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.clone()),
    };
    let ledger = match config.ledger() {
        None => None,
        Some(url) => Some(open_ledger(&config, &url).await),
    };
    let shared = Arc::new(config.clone());
    let live = match tokio::task::spawn_blocking(move || Live::load(shared)).await {
        Ok(Ok(live)) => Ok(Arc::new(live)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let deployment = Deployment {
        config: &config,
        env: &env,
        redis: permits.as_ref().map_err(Clone::clone),
        ledger: ledger.as_ref().map(|l| l.as_ref().map_err(Clone::clone)),
        live: live.as_ref().map_err(Clone::clone),
    };
    let mut checks: Vec<Check> = note.into_iter().collect();
    checks.extend(doctor::examine(&deployment).await.checks);
    if let Ok(store) = store {
        store.shutdown().await;
    }
    Report::new(checks)
}

/// The Redis the configuration names. The embedded one: the running host's
/// (a note says so), or started here when none runs.
async fn open_redis(config: &HostConfig) -> (Result<Store, String>, Option<Check>) {
    let target = config.redis_target();
    let RedisTarget::Embedded { data_dir } = &target else {
        return (Store::open(&target).await.map_err(|e| e.to_string()), None);
    };
    let dir = data_dir.canonicalize().unwrap_or_else(|_| data_dir.clone());
    let socket = dir.join("redis.sock");
    if socket.as_os_str().len() > 107 {
        return (
            Err(format!(
                "the embedded Redis of {} listens on a loopback port doctor cannot find (the path is too long for a unix socket); ask the running host instead: GET /admin/doctor",
                dir.display()
            )),
            None,
        );
    }
    if let Some(store) = running(&socket).await {
        let note = Check::ok(
            "redis.embedded",
            format!("the running host's embedded Redis at {}", socket.display()),
        );
        return (Ok(store), Some(note));
    }
    let note = Check::ok(
        "redis.embedded",
        format!(
            "no host runs on {}: started the embedded Redis as `pushonce serve` does (AOF on, noeviction) for these checks",
            dir.display()
        ),
    );
    match Store::open(&target).await {
        Ok(store) => (Ok(store), Some(note)),
        Err(e) => (Err(e.to_string()), None),
    }
}

/// The embedded Redis listening on `socket`, if one does: a server that
/// accepts the connection runs there, whatever it then answers (a stale
/// socket file of a stopped server refuses it).
async fn running(socket: &Path) -> Option<Store> {
    let listening = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        tokio::net::UnixStream::connect(socket),
    )
    .await;
    if !matches!(listening, Ok(Ok(_))) {
        return None;
    }
    let url = format!("redis+unix://{}", socket.display());
    Store::open(&RedisTarget::Url(url)).await.ok()
}

/// The ledger's pool, connected without migrating (a SQLite file is
/// created empty when missing, as `serve` would create it).
async fn open_ledger(config: &HostConfig, url: &str) -> Result<LedgerPool, String> {
    if url.starts_with("sqlite:") {
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| format!("cannot create {}: {e}", config.data_dir.display()))?;
    }
    LedgerPool::connect(url).await.map_err(|e| e.to_string())
}
