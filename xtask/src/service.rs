//! `cargo xtask run`: the provider simulator and the host on its defaults.

use std::path::Path;
use std::process::{Child, Command};

use anyhow::{Context, Result, bail};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::{build_binaries, target_dir};

/// Where `cargo xtask run` keeps the simulator's CA and test keys.
const SIM_DIR: &str = "target/sim";

/// Starts the provider simulator in the background (TLS on 127.0.0.1:9090,
/// control on 127.0.0.1:9091, its CA and keys under `target/sim`), then the
/// host in the foreground with the simulator's credentials in its
/// environment; stops the simulator when the host exits. SIGTERM or SIGINT
/// to this process is passed on to the host, whose graceful stop ends the
/// command with the host's own exit status.
///
/// Both are built with the dev profile and the selection the tests build
/// (dependencies optimised, `[profile.dev.package."*"]`): a fresh clone
/// serves sooner, and after `cargo xtask test` nothing is built again. A
/// production build is `cargo build --release`.
pub(crate) fn run(root: &Path, plugin_dir: &Path, extra: &[String]) -> Result<()> {
    eprintln!("xtask: building pushonce and provider-sim (the first build takes a while)");
    build_binaries(root)?;
    let bin = target_dir(root).join("debug");
    let dir = root.join(SIM_DIR);
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).with_context(|| format!("creating {}", keys.display()))?;
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
    let env = match simulator_env(&keys, &mut sim) {
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
    let status = serve_until_stopped(&mut host);
    let _ = sim.kill();
    let _ = sim.wait();
    let status = status?;
    if !status.success() {
        bail!("pushonce serve exited: {status}");
    }
    Ok(())
}

/// Runs the host, passing SIGTERM and SIGINT sent to this process on to it
/// (a Ctrl-C in a terminal reaches both; a `kill` of this process only this
/// one), and waits for it to exit.
fn serve_until_stopped(host: &mut Command) -> Result<std::process::ExitStatus> {
    let mut signals = Signals::new([SIGTERM, SIGINT]).context("installing signal handlers")?;
    let handle = signals.handle();
    let mut child = host.spawn().context("could not start pushonce serve")?;
    let pid = child.id().to_string();
    let forward = std::thread::spawn(move || {
        for signal in signals.forever() {
            let name = if signal == SIGINT { "-INT" } else { "-TERM" };
            let _ = Command::new("kill").args([name, &pid]).status();
        }
    });
    let status = child.wait().context("waiting for pushonce serve");
    handle.close();
    let _ = forward.join();
    status
}

/// The environment `pushonce.toml` names for the simulator's channels: the
/// credentials it generated (read from `credentials.json` once it is
/// written) and a fresh callback path token per channel.
fn simulator_env(keys: &Path, sim: &mut Child) -> Result<Vec<(String, String)>> {
    let file = keys.join("credentials.json");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Written by the simulator once it has its keys; read until it parses whole.
    let c: serde_json::Value = loop {
        let parsed = std::fs::read_to_string(&file)
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok());
        if let Some(c) = parsed {
            break c;
        }
        if let Some(status) = sim.try_wait()? {
            bail!("the provider simulator exited before writing its keys: {status}");
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "the provider simulator did not write {} within 30 s",
                file.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
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
        // For a channel in safe mode (`encoding_aes_key`, commented in pushonce.toml).
        (
            "PUSHONCE_WECHAT_AES_KEY".into(),
            field("wechat_encoding_aes_key"),
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
