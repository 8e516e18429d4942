//! Test harness shared by the integration tests in `tests/`: starts real
//! services (redis-server, host processes) on loopback and waits on conditions
//! with deadlines instead of sleeping.

pub mod browser;
pub mod channels;
pub mod chaos;
pub mod cluster;
pub mod dispatcher;
pub mod fixtures;
pub mod host;
pub mod plugins;
pub mod postgres;
pub mod process;
pub mod providers;
pub mod redis;
pub mod relay;
pub mod stack;
pub mod tls;

use std::future::Future;
use std::time::{Duration, Instant};

/// The runtime of a test that runs in a process of its own (rusty-fork
/// takes plain `#[test]` functions): multi-threaded with two workers, as the
/// `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]` tests have.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Polls `check` every 20 ms until it returns true; fails after `deadline`.
pub async fn wait_until<F, Fut>(deadline: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return Ok(());
        }
        if start.elapsed() >= deadline {
            anyhow::bail!("condition not met within {deadline:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
