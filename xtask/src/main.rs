//! `cargo xtask`: the developer's tasks, kept out of the host's build.
//!
//! - `setup`: install what a fresh machine lacks (the `wasm32-wasip2` target,
//!   `redis-server`, schemathesis in `target/schemathesis` for `tests/schemathesis.rs`,
//!   componentize-js and componentize-py in `target/plugin-toolchains` for the
//!   plugins written in JavaScript and Python).
//! - `plugins`: build every plugin in `plugins/` for `wasm32-wasip2` and copy the
//!   components to `target/plugins/`; the JavaScript and Python key policies
//!   too when their toolchains are installed (skipped, with the reason, when not).
//! - `test`: `setup`, build the binaries, then the whole test suite (`cargo test --workspace`).
//! - `run`: `setup`, `plugins`, then the provider simulator on 127.0.0.1:9090
//!   and the host with its defaults (`pushonce.toml`: embedded Redis, the
//!   four channels pointing at the simulator).
//! - `chaos`: `setup`, build `pushonce` and the `chaos` program in release,
//!   then run it (arguments after `chaos` go to it; `--help` lists them).

mod languages;

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    match args.first().map(String::as_str) {
        Some("setup") => setup(&root),
        Some("plugins") => build_plugins(&root).map(|_| ()),
        Some("test") => test(&root, &args[1..]),
        Some("run") => {
            setup(&root)?;
            let dir = build_plugins(&root)?;
            run_service(&root, &dir, &args[1..])
        }
        Some("chaos") => chaos(&root, &args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <setup|plugins|test|run|chaos> [args...]");
            std::process::exit(2);
        }
    }
}

/// `cargo xtask test [args]`: set-up, the binaries the tests spawn, the
/// plugins' native unit tests, then `cargo test --workspace [args]`.
fn test(root: &Path, args: &[String]) -> Result<()> {
    setup(root)?;
    // Tests spawn the real `pushonce` binary (kill -9, several instances).
    run(Command::new(cargo())
        .current_dir(root)
        .args(["build", "--workspace", "--bins"]))?;
    // The plugins' shared key encoder and their signatures (provider-auth,
    // checked against the providers' published vectors) are plain
    // Rust: their unit tests run natively.
    run(Command::new(cargo())
        .current_dir(root.join("plugins"))
        .args([
            "test",
            "-p",
            "key-util",
            "-p",
            "provider-auth",
            "--target-dir",
        ])
        .arg(target_dir(root).join("plugins-native")))?;
    run(Command::new(cargo())
        .current_dir(root)
        .args(["test", "--workspace"])
        .args(args))
}

/// `cargo xtask chaos [--] [args]`: builds the release host and the chaos
/// runner, then runs it with `args`.
fn chaos(root: &Path, args: &[String]) -> Result<()> {
    setup(root)?;
    run(Command::new(cargo()).current_dir(root).args([
        "build",
        "--release",
        "-p",
        "pushonce",
        "--bin",
        "pushonce",
        "-p",
        "pushonce-tests",
        "--bin",
        "chaos",
    ]))?;
    // `cargo xtask chaos -- --cluster`: the `--` only separates.
    let rest = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        _ => args,
    };
    run(Command::new(target_dir(root).join("release/chaos")).args(rest))
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Runs a command, failing with its command line when it does not succeed.
fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn has_program(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Installs what is missing: the `wasm32-wasip2` Rust target, `redis-server`,
/// PostgreSQL, Chromium with chromedriver and schemathesis.
fn setup(root: &Path) -> Result<()> {
    let targets = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("rustup is needed to add the wasm32-wasip2 target")?;
    if !String::from_utf8_lossy(&targets.stdout).contains("wasm32-wasip2") {
        eprintln!("xtask: installing the wasm32-wasip2 target");
        run(Command::new("rustup").args(["target", "add", "wasm32-wasip2"]))?;
    }
    if !(has_program("redis-server") && has_program("redis-benchmark")) {
        apt_install("redis-server redis-tools")
            .context("could not install redis-server; install it by hand (Debian: apt-get install redis-server)")?;
    }
    // The ledger's tests run a real PostgreSQL; Debian keeps its binaries
    // in /usr/lib/postgresql/<major>/bin, off PATH.
    if !has_postgres() {
        apt_install("postgresql").context(
            "could not install PostgreSQL; install it by hand (Debian: apt-get install postgresql)",
        )?;
    }
    // The console's browser test (tests/console.rs) drives a headless
    // Chromium through chromedriver.
    if !(has_program("chromium") && has_program("chromedriver")) {
        apt_install("chromium chromium-driver").context(
            "could not install Chromium; install it by hand (Debian: apt-get install chromium chromium-driver)",
        )?;
    }
    install_schemathesis(root)?;
    install_plugin_toolchains(root)
}

/// The target directory: `CARGO_TARGET_DIR`, else `target/`.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// Installs componentize-js (npm, into `plugin-toolchains/js`) and
/// componentize-py (pip, into the virtualenv `plugin-toolchains/py`) under
/// the target directory, at the pinned releases; a missing Node.js skips
/// the JavaScript one with a warning (its plugins are then skipped too).
fn install_plugin_toolchains(root: &Path) -> Result<()> {
    let dir = languages::toolchains(&target_dir(root));
    let js = dir.join("js");
    let js_pin = format!("\"version\": \"{}\"", languages::COMPONENTIZE_JS);
    let js_installed = std::fs::read_to_string(
        js.join("node_modules/@bytecodealliance/componentize-js/package.json"),
    )
    .is_ok_and(|p| p.contains(&js_pin));
    if !js_installed && has_program("npm") && has_program("node") {
        eprintln!(
            "xtask: installing componentize-js {} into {}",
            languages::COMPONENTIZE_JS,
            js.display()
        );
        std::fs::create_dir_all(&js)?;
        std::fs::write(js.join("package.json"), "{\"private\": true}\n")?;
        run(Command::new("npm")
            .current_dir(&js)
            .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
            .arg(format!(
                "@bytecodealliance/componentize-js@{}",
                languages::COMPONENTIZE_JS
            )))
        .context("npm could not install componentize-js (is the npm registry reachable?)")?;
    } else if !js_installed {
        eprintln!(
            "xtask: warning: Node.js/npm not found: the JavaScript plugins will not be built (Debian: apt-get install nodejs npm)"
        );
    }
    let py = dir.join("py");
    let py_installed = Command::new(languages::componentize_py(&dir))
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(languages::COMPONENTIZE_PY));
    if !py_installed {
        eprintln!(
            "xtask: installing componentize-py {} into {}",
            languages::COMPONENTIZE_PY,
            py.display()
        );
        run(Command::new("python3").args(["-m", "venv"]).arg(&py)).context(
            "python3 could not make a virtualenv (Debian: apt-get install python3-venv)",
        )?;
        run(Command::new(py.join("bin/pip"))
            .args(["install", "--quiet"])
            .arg(format!("componentize-py=={}", languages::COMPONENTIZE_PY)))
        .context("pip could not install componentize-py (is PyPI reachable?)")?;
    }
    Ok(())
}

/// The schemathesis release `tests/schemathesis.rs` runs (pinned: its checks
/// and options change between releases).
const SCHEMATHESIS: &str = "4.32.5";

/// Installs schemathesis [`SCHEMATHESIS`] with pip into a virtualenv,
/// `target/schemathesis` (nothing outside the repository is touched).
fn install_schemathesis(root: &Path) -> Result<()> {
    let venv = root.join("target").join("schemathesis");
    let bin = venv.join("bin");
    let installed = Command::new(bin.join("schemathesis"))
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(SCHEMATHESIS));
    if installed {
        return Ok(());
    }
    if !has_program("python3") {
        bail!(
            "python3 is missing: schemathesis (tests/schemathesis.rs) needs it with pip and venv (Debian: apt-get install python3-venv python3-pip)"
        );
    }
    eprintln!(
        "xtask: installing schemathesis {SCHEMATHESIS} into {}",
        venv.display()
    );
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv))
        .context("python3 could not make a virtualenv (Debian: apt-get install python3-venv)")?;
    run(Command::new(bin.join("pip"))
        .args(["install", "--quiet"])
        .arg(format!("schemathesis=={SCHEMATHESIS}")))
    .context("pip could not install schemathesis (is PyPI reachable?)")
}

/// `apt-get install -y` of `packages` (with sudo when not root).
fn apt_install(packages: &str) -> Result<()> {
    eprintln!("xtask: installing {packages} with apt-get");
    let sudo = if has_program("sudo") && !is_root() {
        "sudo "
    } else {
        ""
    };
    run(Command::new("sh").args([
        "-c",
        &format!(
            "{sudo}apt-get update -qq && DEBIAN_FRONTEND=noninteractive {sudo}apt-get install -y -qq {packages}"
        ),
    ]))
}

/// Whether some `/usr/lib/postgresql/<major>/bin/initdb` exists.
fn has_postgres() -> bool {
    std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| {
            dirs.filter_map(|d| d.ok())
                .any(|d| d.path().join("bin").join("initdb").exists())
        })
        .unwrap_or(false)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Builds the plugin workspace and copies every component to `target/plugins/`.
fn build_plugins(root: &Path) -> Result<PathBuf> {
    let plugins = root.join("plugins");
    let target_dir = root.join("target").join("wasm");
    run(Command::new(cargo())
        .current_dir(&plugins)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target_dir))?;
    let built = target_dir.join("wasm32-wasip2").join("release");
    let out = root.join("target").join("plugins");
    std::fs::create_dir_all(&out)?;
    let mut n = 0;
    for entry in std::fs::read_dir(&built)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "wasm") {
            std::fs::copy(&path, out.join(path.file_name().unwrap()))?;
            n += 1;
        }
    }
    n += build_other_languages(root, &out)?;
    eprintln!("xtask: {n} plugin(s) in {}", out.display());
    Ok(out)
}

/// Builds the JavaScript and Python plugins into `out`; one whose toolchain
/// is missing is skipped with the reason. Returns how many were built.
fn build_other_languages(root: &Path, out: &Path) -> Result<usize> {
    let target = target_dir(root);
    let toolchains = languages::toolchains(&target);
    let work = target.join("plugin-sources");
    let mut n = 0;
    for src in languages::sources(&root.join("plugins")) {
        if let Some(reason) = languages::missing(src.lang, &toolchains) {
            eprintln!("xtask: skipped plugin {}: {reason}", src.name);
            continue;
        }
        eprintln!("xtask: building plugin {} ({:?})", src.name, src.lang);
        languages::build(&src, &root.join("wit"), &toolchains, &work, out)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("building plugin {}", src.name))?;
        n += 1;
    }
    Ok(n)
}

/// Where `cargo xtask run` keeps the simulator's CA and test keys.
const SIM_DIR: &str = "target/sim";

/// Starts the provider simulator in the background (TLS on 127.0.0.1:9090,
/// control on 127.0.0.1:9091, its CA and keys under `target/sim`), then the
/// host in the foreground with the simulator's credentials in its
/// environment; stops the simulator when the host exits.
fn run_service(root: &Path, plugin_dir: &Path, extra: &[String]) -> Result<()> {
    run(Command::new(cargo()).current_dir(root).args([
        "build",
        "--release",
        "--bin",
        "pushonce",
        "--bin",
        "provider-sim",
    ]))?;
    let bin = root.join("target").join("release");
    let dir = root.join(SIM_DIR);
    let keys = dir.join("keys");
    let _ = std::fs::remove_file(keys.join("credentials.json"));
    let mut sim = Command::new(bin.join("provider-sim"))
        .args([
            "--listen",
            "127.0.0.1:9090",
            "--control-listen",
            "127.0.0.1:9091",
        ])
        .arg("--ca-out")
        .arg(dir.join("ca.pem"))
        .arg("--keys-dir")
        .arg(&keys)
        .spawn()
        .context("could not start the provider simulator")?;
    let env = match simulator_env(&keys) {
        Ok(env) => env,
        Err(e) => {
            let _ = sim.kill();
            return Err(e);
        }
    };
    eprintln!(
        "xtask: provider simulator on https://127.0.0.1:9090 (CA {SIM_DIR}/ca.pem; ledger: curl http://127.0.0.1:9091/_sim/ledger)"
    );
    let mut host = Command::new(bin.join("pushonce"));
    host.current_dir(root)
        .arg("serve")
        .args(extra)
        .env("PUSHONCE_PLUGIN_DIR", plugin_dir);
    for (name, value) in env {
        // An operator's own value wins.
        if std::env::var_os(&name).is_none() {
            host.env(name, value);
        }
    }
    let status = host.status();
    let _ = sim.kill();
    let _ = sim.wait();
    let status = status.context("could not start pushonce serve")?;
    if !status.success() {
        bail!("pushonce serve exited: {status}");
    }
    Ok(())
}

/// The environment `pushonce.toml` names for the simulator's channels: the
/// credentials it generated (read from `credentials.json` once it is
/// written) and a fresh callback path token per channel.
fn simulator_env(keys: &Path) -> Result<Vec<(String, String)>> {
    let file = keys.join("credentials.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Written by the simulator once it has its keys; read until it parses whole.
    let c: serde_json::Value = loop {
        let parsed = std::fs::read_to_string(&file)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok());
        match parsed {
            Some(c) => break c,
            None if std::time::Instant::now() > deadline => {
                bail!(
                    "the provider simulator did not write {} within 30 s",
                    file.display()
                )
            }
            None => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    };
    let field = |name: &str| c[name].as_str().unwrap_or_default().to_string();
    let account = std::fs::read_to_string(keys.join("fcm-service-account.json"))?;
    let token = || format!("{:032x}", rand::random::<u128>());
    Ok(vec![
        (
            "PUSHONCE_ALIYUN_KEY_ID".into(),
            field("aliyun_access_key_id"),
        ),
        (
            "PUSHONCE_ALIYUN_SECRET".into(),
            field("aliyun_access_key_secret"),
        ),
        ("PUSHONCE_WECHAT_APPID".into(), field("wechat_appid")),
        ("PUSHONCE_WECHAT_SECRET".into(), field("wechat_secret")),
        (
            "PUSHONCE_WECHAT_TOKEN".into(),
            field("wechat_callback_token"),
        ),
        ("PUSHONCE_FCM_SERVICE_ACCOUNT".into(), account),
        ("PUSHONCE_APNS_TEAM".into(), field("apns_team_id")),
        ("PUSHONCE_APNS_KEY_ID".into(), field("apns_key_id")),
        ("PUSHONCE_APNS_KEY".into(), field("apns_private_key_pem")),
        ("PUSHONCE_WEBHOOK_SECRET".into(), field("webhook_secret")),
        ("PUSHONCE_INBOX_CALLBACK_TOKEN".into(), token()),
        ("PUSHONCE_SMS_CALLBACK_TOKEN".into(), token()),
        ("PUSHONCE_WECHAT_CALLBACK_TOKEN".into(), token()),
    ])
}
