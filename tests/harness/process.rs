//! Real `pushonce` processes for tests: find the binary next to the test
//! executable, run `pushonce worker --dev-sender` with arguments, kill it with SIGKILL or
//! stop it with SIGTERM, and read the ledger its development sender writes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::wait_until;

/// `<target>/<profile>/pushonce`, found from the running executable: a test
/// (`<target>/<profile>/deps/<test>`) or a program such as `chaos`
/// (`<target>/<profile>/chaos`).
pub fn pushonce_bin() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("the executable has no directory")?;
    let profile_dir = if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().context("deps/ has no profile directory")?
    } else {
        dir
    };
    let bin = profile_dir.join("pushonce");
    if !bin.exists() {
        bail!(
            "{} is missing: build it first: cargo build --bin pushonce (with --release for a release program)",
            bin.display()
        );
    }
    Ok(bin)
}

/// A running `pushonce` process (`worker` or `serve`); killed (SIGKILL) when dropped.
pub struct PushonceProcess {
    /// The child process.
    child: Option<Child>,
    /// Its stderr log file.
    log: PathBuf,
}

impl PushonceProcess {
    /// Starts `pushonce worker --dev-sender --redis <url> --ledger <ledger> <extra…>`;
    /// its stderr goes to `<ledger>.<n>.log`.
    pub fn spawn(url: &str, ledger: &Path, extra: &[&str]) -> anyhow::Result<PushonceProcess> {
        Self::worker(["--redis", url], ledger, extra)
    }

    /// Starts `pushonce worker --dev-sender --redis-cluster <urls> --ledger <ledger> <extra…>`
    /// (`urls` separated by commas, e.g. `RedisCluster::urls_env`).
    pub fn spawn_cluster(
        urls: &str,
        ledger: &Path,
        extra: &[&str],
    ) -> anyhow::Result<PushonceProcess> {
        Self::worker(["--redis-cluster", urls], ledger, extra)
    }

    fn worker(redis: [&str; 2], ledger: &Path, extra: &[&str]) -> anyhow::Result<PushonceProcess> {
        let log = ledger.with_extension(format!("{}.log", rand_suffix()));
        let mut cmd = Command::new(pushonce_bin()?);
        cmd.args(["worker", "--dev-sender"])
            .args(redis)
            .arg("--ledger")
            .arg(ledger)
            .args(extra);
        Self::start(cmd, log)
    }

    /// Starts `pushonce serve --config <config>` in the config's directory
    /// (its relative paths resolve there) with extra environment variables;
    /// its stderr goes to `<config>.<n>.log`.
    pub fn serve(config: &Path, env: &[(&str, &str)]) -> anyhow::Result<PushonceProcess> {
        Self::serve_binary(&pushonce_bin()?, config, env)
    }

    /// [`PushonceProcess::serve`] with the `pushonce` binary at `bin` (e.g.
    /// one unpacked from a release).
    pub fn serve_binary(
        bin: &Path,
        config: &Path,
        env: &[(&str, &str)],
    ) -> anyhow::Result<PushonceProcess> {
        let log = config.with_extension(format!("{}.log", rand_suffix()));
        let mut cmd = Command::new(bin);
        cmd.arg("serve").arg("--config").arg(config);
        if let Some(dir) = config.parent() {
            cmd.current_dir(dir);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self::start(cmd, log)
    }

    /// Starts `pushonce serve` on `listen` with a copy of the repository's
    /// `pushonce.toml` in `dir` (then `extra_toml` appended), the real
    /// plugins and policies, its data in `dir`, test values for what the
    /// configuration takes from outside (`host::repository_inputs`: a CA at
    /// its `ca_file`, secrets and callback tokens), and `env` (which may
    /// override those).
    pub fn serve_repository_config(
        dir: &Path,
        listen: &str,
        extra_toml: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<PushonceProcess> {
        let root = crate::host::repo_root();
        let mut text = std::fs::read_to_string(root.join("pushonce.toml"))?;
        text.push_str(extra_toml);
        let config = dir.join("pushonce.toml");
        std::fs::write(&config, &text)?;
        let inputs = crate::host::repository_inputs(
            &pushonce::config::HostConfig::parse(&config, &text)?,
            dir,
        )?;
        let (data, plugins) = (dir.join("data"), crate::plugins::real_dir());
        let policies = root.join("policies");
        let mut all = vec![
            ("PUSHONCE_LISTEN", listen),
            ("PUSHONCE_DATA_DIR", data.to_str().context("data dir")?),
            (
                "PUSHONCE_PLUGIN_DIR",
                plugins.to_str().context("plugin dir")?,
            ),
            (
                "PUSHONCE_POLICY_DIR",
                policies.to_str().context("policy dir")?,
            ),
        ];
        all.extend(inputs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        all.extend_from_slice(env);
        Self::serve(&config, &all)
    }

    fn start(mut cmd: Command, log: PathBuf) -> anyhow::Result<PushonceProcess> {
        if !cmd.get_envs().any(|(k, _)| k == "RUST_LOG") {
            cmd.env("RUST_LOG", "pushonce=debug,info");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        Ok(PushonceProcess {
            child: Some(child),
            log,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The file its stderr goes to.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// What the process wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `GET <base>/readyz` answers 2xx (a `serve` process);
    /// fails after `within` with the process's log.
    pub async fn wait_ready(&self, base: &str, within: Duration) -> anyhow::Result<()> {
        let client = reqwest::Client::new();
        let url = format!("{base}/readyz");
        wait_until(within, || {
            let (client, url) = (client.clone(), url.clone());
            async move {
                client
                    .get(url)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .await
        .with_context(|| format!("{base} never became ready; log:\n{}", self.log()))
    }

    /// `kill -9`: SIGKILL, then reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill(); // SIGKILL on Unix
            let _ = child.wait();
        }
    }

    /// SIGTERM, then wait up to `timeout` for a clean exit.
    pub async fn terminate(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let pid = self.child.as_ref().context("already stopped")?.id();
        Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        self.wait_exit(timeout).await
    }

    /// Waits up to `timeout` for the process to exit by itself (e.g. a
    /// `serve` refusing its configuration); killed, with its log in the
    /// error, when it does not.
    pub async fn wait_exit(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let mut child = self.child.take().context("already stopped")?;
        let mut status = None;
        let waited = wait_until(timeout, || {
            if status.is_none() {
                status = child.try_wait().ok().flatten();
            }
            let done = status.is_some();
            async move { done }
        })
        .await;
        if waited.is_err() {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "pushonce did not stop within {timeout:?}; log:\n{}",
                self.log()
            );
        }
        Ok(status.expect("waited for it"))
    }
}

impl Drop for PushonceProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn rand_suffix() -> String {
    format!(
        "{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
    )
}

/// One line of a development sender's ledger.
#[derive(Debug, Clone)]
pub struct LedgerLine {
    /// The task id.
    pub task_id: String,
    /// The idempotency key.
    pub key: String,
    /// Attempt number.
    pub attempt: u32,
    /// `sent`, `retryable`, `permanent` or `unknown`.
    pub outcome: String,
    /// The process that sent it.
    pub pid: u32,
    /// When "the provider" took it (ms since the epoch).
    pub at_ms: u64,
}

/// Reads a ledger (missing file: empty).
pub fn read_ledger(path: &Path) -> Vec<LedgerLine> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| LedgerLine {
            task_id: v["task_id"].as_str().unwrap_or_default().to_string(),
            key: v["key"].as_str().unwrap_or_default().to_string(),
            attempt: v["attempt"].as_u64().unwrap_or(0) as u32,
            outcome: v["outcome"].as_str().unwrap_or_default().to_string(),
            pid: v["pid"].as_u64().unwrap_or(0) as u32,
            at_ms: v["at_ms"].as_u64().unwrap_or(0),
        })
        .collect()
}

/// Ledger lines with outcome `sent`, grouped by idempotency key.
pub fn sent_by_key(lines: &[LedgerLine]) -> HashMap<String, Vec<LedgerLine>> {
    let mut map: HashMap<String, Vec<LedgerLine>> = HashMap::new();
    for l in lines.iter().filter(|l| l.outcome == "sent") {
        map.entry(l.key.clone()).or_default().push(l.clone());
    }
    map
}
