//! `pushonce doctor` through the real binary, against real Redis servers
//! and real SQLite / PostgreSQL ledgers: it passes on the `cargo xtask run`
//! setup (the repository's `pushonce.toml`, the embedded Redis, the
//! environment `xtask run` provides) and a running host answers the same at
//! `GET /admin/doctor`; each misconfiguration fails, exits non-zero, and its
//! line names the fix.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pushonce::config::HostConfig;
use pushonce_tests::cluster::RedisCluster;
use pushonce_tests::host::{TestHost, repo_root, repository_inputs};
use pushonce_tests::process::{PushonceProcess, pushonce_bin};
use pushonce_tests::redis::{RedisServer, config_set, server_info};
use pushonce_tests::wait_until;
use serde_json::Value;

/// The repository's `pushonce.toml` in `dir` (after `edits`, each a
/// `(from, to)` text replacement) and the environment `cargo xtask run`
/// gives the host: its plugins and policies, a data dir, a value for every
/// secret and callback token, a CA at every channel's `ca_file`.
#[derive(Clone)]
struct Setup {
    config: PathBuf,
    env: Vec<(String, String)>,
}

impl Setup {
    fn new(dir: &Path, edits: &[(&str, &str)]) -> Setup {
        let mut text = std::fs::read_to_string(repo_root().join("pushonce.toml")).unwrap();
        for (from, to) in edits {
            assert!(text.contains(from), "pushonce.toml has no {from:?}");
            text = text.replace(from, to);
        }
        let config = dir.join("pushonce.toml");
        std::fs::write(&config, &text).unwrap();
        let parsed = HostConfig::parse(&config, &text).unwrap();
        let mut env = repository_inputs(&parsed, dir).unwrap();
        let path = |p: PathBuf| p.to_str().unwrap().to_string();
        env.extend([
            ("PUSHONCE_DATA_DIR".into(), path(dir.join("data"))),
            (
                "PUSHONCE_PLUGIN_DIR".into(),
                path(pushonce_tests::plugins::real_dir()),
            ),
            (
                "PUSHONCE_POLICY_DIR".into(),
                path(repo_root().join("policies")),
            ),
        ]);
        Setup { config, env }
    }

    /// This setup's environment with `var` set to `value` (`None`: unset).
    fn with(&self, var: &str, value: Option<&str>) -> Setup {
        let mut env: Vec<_> = self.env.iter().filter(|(k, _)| k != var).cloned().collect();
        env.extend(value.map(|v| (var.to_string(), v.to_string())));
        Setup {
            config: self.config.clone(),
            env,
        }
    }

    /// This setup on the Redis at `url`.
    fn on(&self, redis: &RedisServer) -> Setup {
        self.with("PUSHONCE_REDIS_URL", Some(&redis.url()))
    }

    /// Runs `pushonce doctor --config <file>` in the file's directory:
    /// whether it exited 0, and what it printed.
    async fn doctor(&self) -> (bool, String) {
        let (config, env) = (self.config.clone(), self.env.clone());
        tokio::task::spawn_blocking(move || {
            let mut cmd = Command::new(pushonce_bin().unwrap());
            cmd.arg("doctor")
                .arg("--config")
                .arg(&config)
                .current_dir(config.parent().unwrap())
                .env("RUST_LOG", "warn")
                .env("RUST_BACKTRACE", "0");
            for (var, _) in std::env::vars().filter(|(k, _)| k.starts_with("PUSHONCE_")) {
                cmd.env_remove(var);
            }
            let out = cmd.envs(env).output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.success(), text)
        })
        .await
        .unwrap()
    }

    /// `pushonce serve` with this setup.
    fn serve(&self, listen: &str) -> PushonceProcess {
        let mut env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        env.push(("PUSHONCE_LISTEN", listen));
        PushonceProcess::serve(&self.config, &env).unwrap()
    }
}

/// The line of `check` in doctor's output.
fn line<'a>(out: &'a str, check: &str) -> &'a str {
    out.lines()
        .find(|l| {
            l.get(6..)
                .is_some_and(|rest| rest.starts_with(&format!("{check}:")))
        })
        .unwrap_or_else(|| panic!("no {check} line in:\n{out}"))
}

/// Doctor exited non-zero and the line of `check` is a failure naming `fix`.
fn assert_fails_naming(run: &(bool, String), check: &str, fix: &str) {
    let (passed, out) = run;
    let line = line(out, check);
    assert!(
        !passed && line.starts_with("FAIL") && line.contains(" — fix: ") && line.contains(fix),
        "expected a failed {check} naming {fix:?} and a non-zero exit (exit 0: {passed}):\n{out}"
    );
}

/// `url` with `PORT` replaced by a free loopback port: nothing listens there.
fn closed(url: &str) -> String {
    url.replace(
        "PORT",
        &pushonce::store::free_loopback_port().unwrap().to_string(),
    )
}

fn listen() -> String {
    closed("127.0.0.1:PORT")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_on_the_xtask_run_setup_and_a_running_host_answers_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup::new(dir.path(), &[]);

    // Before the first start: doctor starts the embedded Redis itself.
    let (passed, out) = setup.doctor().await;
    assert!(
        passed && !out.contains("FAIL") && line(&out, "redis.embedded").contains("no host runs"),
        "doctor did not pass before the first start:\n{out}"
    );

    // With the host running: doctor talks to its embedded Redis.
    let addr = listen();
    let mut host = setup.serve(&addr);
    let base = format!("http://{addr}");
    host.wait_ready(&base, Duration::from_secs(60))
        .await
        .unwrap();
    let (passed, out) = setup.doctor().await;
    assert!(
        passed
            && !out.contains("FAIL")
            && !out.contains("warn")
            && line(&out, "redis.embedded").contains("the running host's"),
        "doctor did not pass on the running xtask setup:\n{out}\nhost log:\n{}",
        host.log()
    );

    let answer: Value = reqwest::get(format!("{base}/admin/doctor"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let failed: Vec<&Value> = answer["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .collect();
    assert!(
        answer["ok"] == true
            && failed.is_empty()
            && answer["checks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["check"] == "channel.sms.callbacks" && c["status"] == "ok"),
        "GET /admin/doctor: {answer:#}"
    );
    assert!(
        host.terminate(Duration::from_secs(20))
            .await
            .unwrap()
            .success()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misconfigured_redis_fails_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup::new(dir.path(), &[]);

    let nowhere = closed("redis://127.0.0.1:PORT");
    let run = setup
        .with("PUSHONCE_REDIS_URL", Some(&nowhere))
        .doctor()
        .await;
    assert_fails_naming(&run, "redis.reachable", "redis_url");

    let evicting = RedisServer::start_with_args(&["--maxmemory-policy", "volatile-lru"])
        .await
        .unwrap();
    let run = setup.on(&evicting).doctor().await;
    assert_fails_naming(
        &run,
        "redis.maxmemory-policy",
        "CONFIG SET maxmemory-policy noeviction",
    );

    let forgetful = RedisServer::start_with_args(&["--appendonly", "no"])
        .await
        .unwrap();
    let run = setup.on(&forgetful).doctor().await;
    assert_fails_naming(&run, "redis.durability", "CONFIG SET appendonly yes");

    let alone = RedisServer::start().await.unwrap();
    let waits = Setup::new(dir.path(), &[("wait_replicas = 0", "wait_replicas = 1")]);
    let run = waits.on(&alone).doctor().await;
    assert_fails_naming(
        &run,
        "redis.durability",
        "attach 1 replica(s) to it (replicaof)",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misconfigured_ledger_fails_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start().await.unwrap();
    let setup = Setup::new(dir.path(), &[]).on(&redis);

    let run = setup
        .with("PUSHONCE_LEDGER_URL", Some("off"))
        .doctor()
        .await;
    assert_fails_naming(&run, "ledger.reachable", "remove ledger_url");

    let nowhere = closed("postgres://pushonce@127.0.0.1:PORT/pushonce");
    let run = setup
        .with("PUSHONCE_LEDGER_URL", Some(&nowhere))
        .doctor()
        .await;
    assert_fails_naming(&run, "ledger.reachable", "correct ledger_url");

    // An instance on this Redis claims in its ledger; doctor's is another.
    let other = TestHost::start(&redis).await.unwrap();
    let own = format!("sqlite:{}", dir.path().join("own.sqlite3").display());
    drop(pushonce::ledger::Ledger::open(&own).await.unwrap());
    let run = setup.with("PUSHONCE_LEDGER_URL", Some(&own)).doctor().await;
    assert_fails_naming(
        &run,
        "ledger.shared",
        "give every instance the same ledger_url",
    );
    other.shutdown().await.unwrap();
}

/// Two `pushonce serve` instances on one Redis, both claiming in the
/// ledger at `url`; doctor's answer once it sees both dispatching.
async fn two_instances_then_doctor(dir: &Path, redis: &RedisServer, url: &str) -> (bool, String) {
    let setup = Setup::new(dir, &[])
        .on(redis)
        .with("PUSHONCE_LEDGER_URL", Some(url));
    let (a, b) = (listen(), listen());
    let first = setup.serve(&a);
    let second = setup.serve(&b);
    for (host, addr) in [(&first, &a), (&second, &b)] {
        host.wait_ready(&format!("http://{addr}"), Duration::from_secs(60))
            .await
            .unwrap();
    }
    let last = std::sync::Arc::new(std::sync::Mutex::new((true, String::new())));
    let seen_both = wait_until(Duration::from_secs(30), || {
        let (setup, last) = (setup.clone(), last.clone());
        async move {
            let run = setup.doctor().await;
            let both = run.1.contains("2 instance(s)");
            *last.lock().unwrap() = run;
            both
        }
    })
    .await;
    let run = last.lock().unwrap().clone();
    assert!(
        seen_both.is_ok(),
        "doctor never saw both instances:\n{}",
        run.1
    );
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_ledger_under_more_than_one_instance_fails_naming_postgresql() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start().await.unwrap();
    // Two instances on one SQLite file: both start (one ledger).
    let shared = format!("sqlite:{}", dir.path().join("shared.sqlite3").display());
    let run = two_instances_then_doctor(dir.path(), &redis, &shared).await;
    assert_fails_naming(&run, "ledger.shared", "ledger_url = \"postgres://");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_postgresql_fix_passes_under_two_instances() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start().await.unwrap();
    let postgres = pushonce_tests::postgres::PostgresServer::shared()
        .await
        .unwrap();
    let url = postgres.database().await.unwrap();
    let (passed, out) = two_instances_then_doctor(dir.path(), &redis, &url).await;
    let line = line(&out, "ledger.shared");
    assert!(
        passed && line.starts_with("ok") && line.contains("2 instance(s)"),
        "doctor did not pass two instances on one PostgreSQL ledger:\n{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigured_channels_plugins_and_tokens_fail_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start().await.unwrap();
    let setup = Setup::new(dir.path(), &[]).on(&redis);

    let run = setup.with("PUSHONCE_WECHAT_SECRET", None).doctor().await;
    assert_fails_naming(
        &run,
        "channel.wechat.credentials",
        "set PUSHONCE_WECHAT_SECRET in the service's environment",
    );

    let run = setup
        .with("PUSHONCE_INBOX_CALLBACK_TOKEN", Some(""))
        .doctor()
        .await;
    assert_fails_naming(
        &run,
        "channel.inbox.callbacks",
        "set PUSHONCE_INBOX_CALLBACK_TOKEN to an unguessable token",
    );

    let untokened = Setup::new(
        dir.path(),
        &[("callback_token_env = \"PUSHONCE_SMS_CALLBACK_TOKEN\"\n", "")],
    )
    .on(&redis);
    let run = untokened.doctor().await;
    assert_fails_naming(
        &run,
        "channel.sms.callbacks",
        "set channels.sms.callback_token_env",
    );

    let run = setup
        .with("PUSHONCE_LISTEN", Some("0.0.0.0:8080"))
        .doctor()
        .await;
    assert_fails_naming(&run, "http.tokens", "listen on 127.0.0.1");

    let empty = tempfile::tempdir().unwrap();
    let run = setup
        .with("PUSHONCE_PLUGIN_DIR", empty.path().to_str())
        .doctor()
        .await;
    assert_fails_naming(&run, "plugins", "pushonce plugins list");
}

/// The `[channels.email]` section of a `ses-email` channel (the
/// simulator's SES and SNS endpoints, as `cargo xtask run` would name them).
const EMAIL_CHANNEL: &str = r#"[channels.email]
plugin = "ses-email@^1"
settings = { endpoint = "https://127.0.0.1:9090", sns_endpoint = "https://127.0.0.1:9090/sns", region = "us-east-1", access_key_id = "AKIDEXAMPLE", from = "noreply@example.com", topic_arns = "arn:aws:sns:us-east-1:123456789012:ses-notifications" }
secrets_from_env = { secret_access_key = "PUSHONCE_AWS_SECRET" }
allowed_hosts = ["127.0.0.1:9090"]
ca_file = "target/sim/ca.pem"
callback_token_env = "PUSHONCE_EMAIL_CALLBACK_TOKEN"
"#;

/// `[unsubscribe]` with the links on.
const UNSUBSCRIBE: &str = r#"[unsubscribe]
secret_env = "PUSHONCE_UNSUBSCRIBE_SECRET"
base_url = "https://push.example.com"
"#;

/// An email channel on a host that writes no unsubscribe links is a
/// warning naming `[unsubscribe] secret_env` (doctor still passes); with
/// the links on, the same check is ok, and so is that of a channel whose
/// provider instance is the email one (its messages carry the link too).
/// Channels whose plugins write no such headers have no such check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_email_channel_without_unsubscribe_links_is_a_warning_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start().await.unwrap();
    // Both sections go before `[reconcile]`, the file's next table.
    let with = |sections: &str| {
        Setup::new(
            dir.path(),
            &[("[reconcile]\n", &format!("{sections}\n[reconcile]\n"))],
        )
        .on(&redis)
    };
    let (passed, out) = with(EMAIL_CHANNEL).doctor().await;
    let warned = line(&out, "channel.email.unsubscribe");
    assert!(
        passed
            && warned.starts_with("warn")
            && warned.contains("[unsubscribe] secret_env is not set")
            && warned.contains("set [unsubscribe] secret_env"),
        "expected a warning naming [unsubscribe] secret_env, doctor passing:\n{out}"
    );
    assert!(
        !out.contains("channel.sms.unsubscribe"),
        "an SMS plugin writes no unsubscribe headers:\n{out}"
    );

    let chain = "[channels.mail]\nproviders = [\"email\"]\n";
    let linked = with(&format!("{EMAIL_CHANNEL}\n{chain}\n{UNSUBSCRIBE}")).with(
        "PUSHONCE_UNSUBSCRIBE_SECRET",
        Some("a-test-secret-of-more-than-32-bytes-0123456789"),
    );
    let (passed, out) = linked.doctor().await;
    assert!(
        passed
            && line(&out, "channel.email.unsubscribe").starts_with("ok")
            && line(&out, "channel.mail.unsubscribe").starts_with("ok"),
        "expected the unsubscribe checks ok with the links on:\n{out}"
    );
}

/// `[unsubscribe] secret_env` naming a variable that is unset, or holds
/// fewer than 32 bytes, stops `serve` at start: doctor fails the same way,
/// naming the variable, and exits non-zero; a long enough secret is ok.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unset_or_short_unsubscribe_secret_fails_as_serve_would_refuse_it() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start().await.unwrap();
    let setup = Setup::new(
        dir.path(),
        &[("[reconcile]\n", &format!("{UNSUBSCRIBE}\n[reconcile]\n"))],
    )
    .on(&redis);
    let var = "PUSHONCE_UNSUBSCRIBE_SECRET";

    let unset = setup.with(var, None).doctor().await;
    assert_fails_naming(&unset, "unsubscribe.secret", var);
    assert!(
        line(&unset.1, "unsubscribe.secret").contains("unset or empty"),
        "{}",
        unset.1
    );

    let short = setup.with(var, Some("twelve-bytes")).doctor().await;
    assert_fails_naming(&short, "unsubscribe.secret", var);
    assert!(
        line(&short.1, "unsubscribe.secret").contains("12 bytes long"),
        "{}",
        short.1
    );

    let (passed, out) = setup
        .with(var, Some("a-test-secret-of-more-than-32-bytes-0123456789"))
        .doctor()
        .await;
    assert!(
        passed && line(&out, "unsubscribe.secret").starts_with("ok"),
        "{out}"
    );
}

/// A Redis Cluster of three masters where one has AOF off and no replica
/// (the other two: AOF on and a replica each): `redis.durability` fails
/// naming that master, every time (the masters answer each `INFO` in no
/// fixed order, so the check is run several times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_without_aof_or_replica_fails_durability_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = RedisCluster::start(3).await.unwrap();
    let master = |i: usize| redis::Client::open(cluster.urls()[i].clone()).unwrap();
    let mut first = master(0).get_multiplexed_async_connection().await.unwrap();
    config_set(&mut first, "appendonly", "no").await;
    let mut replicas = Vec::new();
    for i in [1, 2] {
        let replica = RedisServer::start().await.unwrap();
        let mut conn = replica
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(cluster.port(i))
            .query_async(&mut conn)
            .await
            .unwrap();
        replica
            .wait_replica_synced(Duration::from_secs(20))
            .await
            .unwrap_or_else(|e| {
                panic!("master {i}'s replica never synced: {e}\n{}", replica.log())
            });
        replicas.push(replica);
    }
    let setup =
        Setup::new(dir.path(), &[]).with("PUSHONCE_REDIS_CLUSTER", Some(&cluster.urls_env()));
    let named = format!(
        "Redis at 127.0.0.1:{} has neither AOF nor a replica",
        cluster.port(0)
    );
    for _ in 0..5 {
        let run = setup.doctor().await;
        assert_fails_naming(&run, "redis.durability", "CONFIG SET appendonly yes");
        let line = line(&run.1, "redis.durability");
        assert!(line.contains(&named), "expected {named:?}:\n{}", run.1);
        for i in [1, 2] {
            let other = format!("127.0.0.1:{} has neither", cluster.port(i));
            assert!(!line.contains(&other), "{}", run.1);
        }
    }
}

/// A running host whose embedded Redis answers only errors for a while
/// (`-BUSY` here, a long script; `-LOADING` of a large AOF is the same to
/// doctor): doctor uses that server (and reports what it answers) instead
/// of starting a second `redis-server` on the same data directory, and the
/// host's socket still reaches the host's server afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_beside_a_busy_host_uses_its_redis_and_starts_no_second_one() {
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup::new(dir.path(), &[]);
    let addr = listen();
    let mut host = setup.serve(&addr);
    let base = format!("http://{addr}");
    host.wait_ready(&base, Duration::from_secs(60))
        .await
        .unwrap();
    let socket = dir.path().join("data/redis/redis.sock");
    let url = format!("redis+unix://{}", socket.display());
    let before = server_info(&url, "run_id")
        .await
        .expect("the host's Redis answers");
    let pid = server_info(&url, "process_id").await.unwrap();

    // A script that never ends: after 100 ms every other command is -BUSY.
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    config_set(&mut conn, "busy-reply-threshold", "100").await;
    let mut looping = client.get_multiplexed_async_connection().await.unwrap();
    // Answers only when killed: the client gives up after its response timeout.
    let _ = redis::cmd("EVAL")
        .arg("while true do end")
        .arg(0)
        .query_async::<redis::Value>(&mut looping)
        .await;
    let busy = wait_until(Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
                return false;
            };
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .is_err_and(|e| e.code() == Some("BUSY"))
        }
    })
    .await;

    let (_, out) = setup.doctor().await;
    // End the script whatever happened (retried: it may not have started).
    let ended = wait_until(Duration::from_secs(10), || {
        let client = client.clone();
        async move {
            let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
                return false;
            };
            let _ = redis::cmd("SCRIPT")
                .arg("KILL")
                .query_async::<()>(&mut conn)
                .await;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .is_ok()
        }
    })
    .await;
    if ended.is_err() {
        // Unreachable through its socket, still looping: stop it here.
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
    }
    busy.expect("the host's Redis never answered -BUSY");
    assert!(
        line(&out, "redis.embedded").contains("the running host's")
            && !out.contains("started the embedded Redis"),
        "doctor did not use the host's busy Redis:\n{out}"
    );
    ended.expect("the host's Redis answers again once the script is killed");
    assert_eq!(
        server_info(&url, "run_id").await.as_deref(),
        Some(before.as_str()),
        "the host's socket reaches another server now:\n{out}"
    );
    host.wait_ready(&base, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        host.terminate(Duration::from_secs(20))
            .await
            .unwrap()
            .success(),
        "log:\n{}",
        host.log()
    );
}
