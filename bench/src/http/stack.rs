//! What every phase of `pushonce-bench http` runs against: an embedded Redis
//! (AOF on, as in production), the provider simulator of the test harness in
//! this process (real TLS, the six providers' documented protocols), the
//! bench policies, and `pushonce serve` processes configured by the test
//! harness's [`ServeConfig`] to send through the real plugins.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pushonce::store::{RedisConn, RedisTarget, Store};
use pushonce_tests::providers::{self, Sim};
use pushonce_tests::stack::{ServeConfig, ServeProcess};

/// The bench's policies: one channel and four channels, per-event keys.
pub(super) const ONE: (&str, &str) = ("BENCH_ONE", "sms");
/// Shards of the bench host's key layout (the harness's own default).
pub(super) const SHARDS: u16 = 4;
pub(super) const FOUR: (&str, &str) = ("BENCH_FOUR", "inbox,sms,wechat,app-push");

/// Redis, the simulator and the policy directory, for the whole run.
pub(super) struct BenchStack {
    /// The embedded Redis.
    pub store: Store,
    /// A connection to it (floors, memory, `FLUSHALL` between phases).
    pub conn: RedisConn,
    /// The provider simulator.
    pub sim: Sim,
    /// Where the run keeps its files.
    tmp: PathBuf,
}

impl BenchStack {
    /// Starts Redis and the simulator, and writes the bench policies.
    pub async fn start(tmp: &Path) -> anyhow::Result<BenchStack> {
        let store = Store::open(&RedisTarget::Embedded {
            data_dir: tmp.join("redis"),
        })
        .await?;
        let conn = store.manager().await?;
        let sim = providers::sim().await;
        write_policies(&tmp.join("policies"))?;
        Ok(BenchStack {
            store,
            conn,
            sim,
            tmp: tmp.to_path_buf(),
        })
    }

    /// Starts the host of phase `name`: `workers` dispatcher workers,
    /// dispatching or not, as shipped or lean (see `--lean`).
    pub async fn serve(
        &self,
        name: &str,
        workers: usize,
        dispatch: bool,
        lean: bool,
    ) -> anyhow::Result<ServeProcess> {
        let mut config = ServeConfig::new(self.store.url(), &self.sim);
        config.workers = workers;
        config.shards = SHARDS;
        // One ledger for every instance of the stack, as the host requires of
        // instances sharing a Redis.
        let ledger = self.tmp.join("ledger.sqlite3");
        config.ledger_url = Some(format!("sqlite:{}", ledger.display()));
        config.extra = format!("dispatch = {dispatch}\n");
        if lean {
            config.extra.push_str("event_index = false\n");
        }
        ServeProcess::start(&config, &self.tmp.join(name), &self.tmp.join("policies")).await
    }

    /// Makes the providers that send delivery receipts post them to `host`
    /// (at once), or stop (`None`).
    pub fn receipts_to(&self, host: Option<&ServeProcess>) {
        match host {
            Some(host) => self.sim.send_receipts_to(host.base(), 0, &[]),
            None => {
                for channel in pushonce_tests::providers::WITH_CALLBACKS {
                    let provider = pushonce_tests::providers::provider_of(channel);
                    self.sim.state.set_receipts(provider, None);
                }
            }
        }
    }

    /// Messages the simulator accepted so far, all providers.
    pub fn delivered(&self) -> u64 {
        self.sim
            .state
            .stats()
            .iter()
            .filter(|(k, _)| k.ends_with(".accepted"))
            .map(|(_, v)| v)
            .sum()
    }

    /// Waits until the simulator has `expected` messages, printing progress
    /// every few seconds; false when `timeout` passed first.
    pub async fn drain(&self, expected: u64, timeout: Duration) -> bool {
        let start = Instant::now();
        let mut said = start;
        loop {
            let have = self.delivered();
            if have >= expected {
                return true;
            }
            if start.elapsed() > timeout {
                eprintln!(
                    "  gave up waiting for the backlog after {timeout:?}: {have} of {expected} messages at the simulator"
                );
                return false;
            }
            if said.elapsed() > Duration::from_secs(5) {
                eprintln!(
                    "  waiting for the backlog: {have} of {expected} messages at the simulator"
                );
                said = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Writes the bench policies into `dir`.
fn write_policies(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (file, (biz_type, channels)) in [("bench-one.toml", ONE), ("bench-four.toml", FOUR)] {
        let mut policy: toml::Table = toml::from_str(
            r#"
key_policy = "per-event@^1"
window = "24h"
[retry]
max_attempts = 5
backoff = { initial = "1s", factor = 2.0, max = "1m", jitter = true }
"#,
        )?;
        policy.insert("biz_type".into(), biz_type.into());
        policy.insert(
            "channels".into(),
            channels.split(',').collect::<Vec<_>>().into(),
        );
        std::fs::write(dir.join(file), toml::to_string(&policy)?)?;
    }
    Ok(())
}
