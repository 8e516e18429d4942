//! The release (`cargo xtask dist`): built with the dev profile (the binary
//! the tests already built, so CI compiles nothing more), both artifacts'
//! contents compared with the expected set, then each unpacked — the archive
//! with `tar`, the Debian package with `dpkg-deb -x` — and its own binary
//! validates the shipped configuration and policies (`pushonce policies
//! check`, `pushonce doctor`) and serves one event end to end against the
//! provider simulator.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use pushonce::config::HostConfig;
use pushonce_tests::host::{order_shipped, repo_root};
use pushonce_tests::process::PushonceProcess;
use pushonce_tests::providers::{self, Sim};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The plugins the release ships: the key policies the example policies
/// name and the provider channels.
const PLUGINS: [&str; 11] = [
    "aliyun_sms",
    "apns",
    "fcm",
    "inbox",
    "per_event",
    "per_user_per_day",
    "per_user_per_job",
    "ses_email",
    "tencent_sms",
    "webhook",
    "wechat",
];

/// A random token of 32 hex digits, as `openssl rand -hex 16` makes one.
fn token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let half = || {
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    };
    format!("{:016x}{:016x}", half(), half())
}

/// `cargo` with the environment a developer's shell gives it: without the
/// variables cargo sets for a test (`CARGO_PKG_*`, `CARGO_MANIFEST_DIR`,
/// the dynamic library path…), which would otherwise make the nested build
/// see a changed environment and compile the workspace again (minutes).
fn nested_cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (key, _) in std::env::vars() {
        let keep = matches!(
            key.as_str(),
            "CARGO_HOME" | "CARGO_TERM_COLOR" | "CARGO_INCREMENTAL" | "CARGO_TARGET_DIR"
        ) || key.starts_with("CARGO_NET_")
            || key.starts_with("CARGO_HTTP_")
            || key.starts_with("CARGO_REGISTRIES_");
        if (key.starts_with("CARGO") && !keep)
            || matches!(
                key.as_str(),
                "LD_LIBRARY_PATH" | "OUT_DIR" | "RUSTC_BOOTSTRAP" | "RUST_TEST_THREADS"
            )
        {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// Runs `cmd`, failing with its output when it does not succeed.
fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The files of the repository's `docs/`, relative to the root.
fn docs(rel: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(repo_root().join(rel)).unwrap() {
        let path = rel.join(entry.unwrap().file_name());
        if repo_root().join(&path).is_dir() {
            docs(&path, out);
        } else {
            out.insert(path.to_str().unwrap().to_string());
        }
    }
}

/// What the release holds, as (archive path, installed path): every file
/// the archive has besides `SHA256SUMS`, and where the package puts it.
fn expected() -> BTreeMap<String, String> {
    let mut files = BTreeMap::new();
    let mut add = |archive: String, installed: String| files.insert(archive, installed);
    add("bin/pushonce".into(), "/usr/bin/pushonce".into());
    add("pushonce.toml".into(), "/etc/pushonce/pushonce.toml".into());
    add("pushonce.env".into(), "/etc/pushonce/pushonce.env".into());
    add(
        "pushonce.service".into(),
        "/lib/systemd/system/pushonce.service".into(),
    );
    for p in PLUGINS {
        add(
            format!("plugins/{p}.wasm"),
            format!("/usr/lib/pushonce/plugins/{p}.wasm"),
        );
    }
    for entry in std::fs::read_dir(repo_root().join("policies")).unwrap() {
        let name = entry.unwrap().file_name().to_str().unwrap().to_string();
        add(
            format!("policies/{name}"),
            format!("/etc/pushonce/policies/{name}"),
        );
    }
    let mut doc_files: BTreeSet<String> = ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"]
        .map(String::from)
        .into();
    docs(Path::new("docs"), &mut doc_files);
    for doc in doc_files {
        add(
            format!("doc/{doc}"),
            format!("/usr/share/doc/pushonce/{doc}"),
        );
    }
    files
}

/// The file entries of `dpkg-deb -c`: installed path → (mode string, owner).
fn deb_files(deb: &Path) -> BTreeMap<String, (String, String)> {
    let list = stdout(&run(Command::new("dpkg-deb").arg("-c").arg(deb)));
    list.lines()
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let path = words.last().unwrap().trim_start_matches('.').to_string();
            (path, (words[0].to_string(), words[1].to_string()))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_archive_and_the_debian_package_hold_the_release_and_serve_from_where_they_unpack() {
    let out = tempfile::tempdir().unwrap();
    run(nested_cargo()
        .current_dir(repo_root())
        .args(["xtask", "dist", "--profile", "dev", "--out"])
        .arg(out.path()));

    let triple = stdout(&run(Command::new("rustc").arg("-vV")))
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .unwrap();
    let name = format!("pushonce-{VERSION}-{triple}");
    let archive = out.path().join(format!("{name}.tar.gz"));
    let debs: Vec<PathBuf> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "one .deb in {:?}", out.path());
    let deb = &debs[0];
    assert!(
        deb.file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with(&format!("pushonce_{VERSION}_")),
        "{deb:?}"
    );
    // The sums beside the artifacts name both and hold.
    let sums = std::fs::read_to_string(out.path().join("SHA256SUMS")).unwrap();
    assert_eq!(sums.lines().count(), 2, "{sums}");
    run(Command::new("sha256sum")
        .current_dir(out.path())
        .args(["-c", "SHA256SUMS"]));

    // The archive: one directory, the expected files and SHA256SUMS.
    let expected = expected();
    let listed = stdout(&run(Command::new("tar").arg("-tzf").arg(&archive)));
    let in_archive: BTreeSet<String> = listed
        .lines()
        .filter(|l| !l.ends_with('/'))
        .map(|l| {
            l.strip_prefix(&format!("{name}/"))
                .unwrap_or_else(|| panic!("{l} is not under {name}/"))
                .to_string()
        })
        .collect();
    let mut want: BTreeSet<String> = expected.keys().cloned().collect();
    want.insert("SHA256SUMS".into());
    assert_eq!(in_archive, want, "the archive's files");

    // The package: the same files at their installed places, the
    // configuration, its secrets' file and the policies kept on upgrade.
    let in_deb = deb_files(deb);
    let want: BTreeSet<String> = expected.values().cloned().collect();
    assert_eq!(
        in_deb.keys().cloned().collect::<BTreeSet<_>>(),
        want,
        "the package's files"
    );
    assert!(in_deb.values().all(|(_, owner)| owner == "root/root"));
    assert_eq!(in_deb["/usr/bin/pushonce"].0, "-rwxr-xr-x");
    assert_eq!(in_deb["/etc/pushonce/pushonce.env"].0, "-rw-------");
    let control = tempfile::tempdir().unwrap();
    run(Command::new("dpkg-deb")
        .arg("-e")
        .arg(deb)
        .arg(control.path().join("DEBIAN")));
    let conffiles: BTreeSet<String> =
        std::fs::read_to_string(control.path().join("DEBIAN/conffiles"))
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
    let etc: BTreeSet<String> = expected
        .values()
        .filter(|p| p.starts_with("/etc/"))
        .cloned()
        .collect();
    assert_eq!(conffiles, etc, "conffiles");

    // Unpacked: the archive's sums hold; both trees hold the same files.
    let unpacked = tempfile::tempdir().unwrap();
    let (tar_root, deb_root) = (unpacked.path().join("tar"), unpacked.path().join("deb"));
    std::fs::create_dir_all(&tar_root).unwrap();
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&tar_root));
    let tar_root = tar_root.join(&name);
    run(Command::new("sha256sum")
        .current_dir(&tar_root)
        .args(["-c", "--quiet", "SHA256SUMS"]));
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&deb_root));
    for (a, i) in &expected {
        let (x, y) = (tar_root.join(a), deb_root.join(&i[1..]));
        assert!(
            std::fs::read(&x).unwrap() == std::fs::read(&y).unwrap(),
            "{a} differs from {i}"
        );
    }

    // The shipped configuration names the installed places, and the unit
    // runs the installed binary on it, hardened.
    let config_text = std::fs::read_to_string(tar_root.join("pushonce.toml")).unwrap();
    let config = HostConfig::parse(Path::new("pushonce.toml"), &config_text).unwrap();
    assert_eq!(config.plugin_dir, Path::new("/usr/lib/pushonce/plugins"));
    assert_eq!(config.policy_dir, Path::new("/etc/pushonce/policies"));
    assert_eq!(config.data_dir, Path::new("/var/lib/pushonce"));
    assert!(
        config
            .ledger_url
            .as_deref()
            .is_some_and(|u| u.starts_with("postgres://")),
        "the production ledger is PostgreSQL: {:?}",
        config.ledger_url
    );
    let unit = std::fs::read_to_string(tar_root.join("pushonce.service")).unwrap();
    for line in [
        "ExecStart=/usr/bin/pushonce serve --config /etc/pushonce/pushonce.toml",
        "EnvironmentFile=-/etc/pushonce/pushonce.env",
        "DynamicUser=yes",
        "StateDirectory=pushonce",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "NoNewPrivileges=yes",
    ] {
        assert!(unit.lines().any(|l| l == line), "the unit lacks {line}");
    }

    let installed = [
        Tree {
            what: "archive",
            bin: tar_root.join("bin/pushonce"),
            config: tar_root.join("pushonce.toml"),
            plugins: tar_root.join("plugins"),
            policies: tar_root.join("policies"),
        },
        Tree {
            what: "package",
            bin: deb_root.join("usr/bin/pushonce"),
            config: deb_root.join("etc/pushonce/pushonce.toml"),
            plugins: deb_root.join("usr/lib/pushonce/plugins"),
            policies: deb_root.join("etc/pushonce/policies"),
        },
    ];
    for tree in &installed {
        tree.validates_and_serves().await;
    }
}

/// One unpacked release: its binary, configuration, plugins and policies.
struct Tree {
    what: &'static str,
    bin: PathBuf,
    config: PathBuf,
    plugins: PathBuf,
    policies: PathBuf,
}

impl Tree {
    /// The environment every run of this tree's binary gets: the unpacked
    /// plugin and policy directories in place of the installed ones.
    fn dirs(&self) -> Vec<(String, String)> {
        let s = |p: &Path| p.to_str().unwrap().to_string();
        vec![
            ("PUSHONCE_PLUGIN_DIR".into(), s(&self.plugins)),
            ("PUSHONCE_POLICY_DIR".into(), s(&self.policies)),
        ]
    }

    /// Runs this tree's binary with `args` and `env` only (no inherited
    /// `PUSHONCE_*`), in `dir`.
    fn pushonce(&self, dir: &Path, args: &[&str], env: &[(String, String)]) -> Output {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .current_dir(dir)
            .env("RUST_LOG", "warn")
            .env("RUST_BACKTRACE", "0");
        for (var, _) in std::env::vars().filter(|(k, _)| k.starts_with("PUSHONCE_")) {
            cmd.env_remove(var);
        }
        cmd.envs(env.iter().cloned()).output().unwrap()
    }

    async fn validates_and_serves(&self) {
        let what = self.what;
        let work = tempfile::tempdir().unwrap();
        let config = self.config.to_str().unwrap();

        // The shipped configuration and policies, as shipped.
        let check = self.pushonce(
            work.path(),
            &["policies", "check", "--config", config],
            &self.dirs(),
        );
        let listed = stdout(&check);
        assert!(
            check.status.success() && listed.contains("6 policies valid"),
            "{what}: policies check: {listed}{}",
            String::from_utf8_lossy(&check.stderr)
        );

        // Served: the shipped configuration with its channels pointed at
        // the simulator (endpoints, allowed hosts, its CA), Redis and the
        // ledger local, every secret from the environment as in production.
        let sim = providers::sim().await;
        let redis = RedisServer::start().await.unwrap();
        let served = work.path().join("pushonce.toml");
        std::fs::write(&served, at_simulator(&self.config, &sim)).unwrap();
        let listen = format!(
            "127.0.0.1:{}",
            pushonce::store::free_loopback_port().unwrap()
        );
        let (api_token, admin_token) = (token(), token());
        let mut env = self.dirs();
        env.extend(secrets(&self.config, &sim));
        env.extend(
            [
                ("PUSHONCE_REDIS_URL", redis.url()),
                ("PUSHONCE_LEDGER_URL", redis.ledger_url()),
                (
                    "PUSHONCE_DATA_DIR",
                    work.path().join("data").to_str().unwrap().to_string(),
                ),
                ("PUSHONCE_API_TOKEN", api_token.clone()),
                ("PUSHONCE_ADMIN_TOKEN", admin_token),
            ]
            .map(|(k, v)| (k.to_string(), v)),
        );
        let mut serve_env: Vec<(&str, &str)> =
            env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        serve_env.push(("PUSHONCE_LISTEN", &listen));
        let mut host = PushonceProcess::serve_binary(&self.bin, &served, &serve_env).unwrap();
        let base = format!("http://{listen}");
        host.wait_ready(&base, Duration::from_secs(120))
            .await
            .unwrap();

        let client = reqwest::Client::new();
        let answer = client
            .post(format!("{base}/v1/events"))
            .bearer_auth(&api_token)
            .json(&order_shipped(&format!("o-dist-{what}")))
            .send()
            .await
            .unwrap();
        let status = answer.status();
        let body: serde_json::Value = answer.json().await.unwrap();
        let results: Vec<&str> = body["results"]
            .as_array()
            .map(|r| r.iter().filter_map(|r| r["result"].as_str()).collect())
            .unwrap_or_default();
        assert!(
            status == 202 && results == ["accepted"; 3],
            "{what}: {status} {body}\nhost log:\n{}",
            host.log()
        );
        let channels = ["sms", "wechat", "app-push"];
        let delivered = wait_until(Duration::from_secs(60), || {
            let all = channels.iter().all(|c| sim.ledger(c).len() == 1);
            async move { all }
        })
        .await;
        assert!(
            delivered.is_ok(),
            "{what}: not one message at each provider within 60 s: {:?}\nhost log:\n{}",
            channels.map(|c| sim.ledger(c).len()),
            host.log()
        );

        // Doctor, with the shipped configuration as shipped (its channels
        // at the real providers) and the running host's environment.
        let doctor = self.pushonce(work.path(), &["doctor", "--config", config], &env);
        let report = stdout(&doctor);
        assert!(
            doctor.status.success() && !report.contains("FAIL") && report.contains("ok    plugins"),
            "{what}: doctor on the shipped configuration:\n{report}{}",
            String::from_utf8_lossy(&doctor.stderr)
        );

        let stopped = host.terminate(Duration::from_secs(20)).await.unwrap();
        assert!(stopped.success(), "{what}: exit {stopped}\n{}", host.log());
    }
}

/// The configuration at `file` with each channel pointed at the simulator:
/// its endpoint settings, allowed hosts and CA; everything else as shipped.
fn at_simulator(file: &Path, sim: &Sim) -> String {
    let mut doc: toml::Table = std::fs::read_to_string(file).unwrap().parse().unwrap();
    let sim_channels = sim.channels();
    let channels = doc.get_mut("channels").unwrap().as_table_mut().unwrap();
    for (name, channel) in channels.iter_mut() {
        let channel = channel.as_table_mut().unwrap();
        let at_sim = &sim_channels[name];
        let taken_from_env: BTreeSet<String> = channel
            .get("secrets_from_env")
            .and_then(|s| s.as_table())
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default();
        let settings = channel
            .entry("settings")
            .or_insert_with(|| toml::Table::new().into())
            .as_table_mut()
            .unwrap();
        for (key, value) in &at_sim.settings {
            if !taken_from_env.contains(key) {
                settings.insert(key.clone(), value.clone().into());
            }
        }
        channel.insert("allowed_hosts".into(), at_sim.allowed_hosts.clone().into());
        channel.insert(
            "ca_file".into(),
            sim.ca_file().to_str().unwrap().to_string().into(),
        );
        channel.remove("allow_private");
    }
    toml::to_string(&doc).unwrap()
}

/// A value for every variable the configuration at `file` names: each
/// channel's secrets as the simulator issued them, and callback path tokens.
fn secrets(file: &Path, sim: &Sim) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(file).unwrap();
    let config = HostConfig::parse(file, &text).unwrap();
    let sim_channels = sim.channels();
    let mut env = Vec::new();
    for (name, channel) in &config.channels {
        let at_sim = &sim_channels[name];
        for (setting, var) in &channel.secrets_from_env {
            let value = at_sim
                .settings
                .get(setting)
                .cloned()
                .or_else(|| {
                    at_sim
                        .secrets_from_env
                        .get(setting)
                        .and_then(|v| sim.env_var(v))
                })
                .unwrap_or_else(|| panic!("the simulator has no {name}.{setting}"));
            env.push((var.clone(), value));
        }
        if let Some(var) = &channel.callback_token_env {
            env.push((var.clone(), token()));
        }
    }
    env
}
