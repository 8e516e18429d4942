//! `cargo xtask`: the developer's tasks, kept out of the host's build.
//!
//! - `setup`: install what a fresh machine lacks for the whole test suite
//!   (the `wasm32-wasip2` target, `redis-server`, PostgreSQL, Chromium,
//!   schemathesis in `target/schemathesis`, componentize-js and
//!   componentize-py in `target/plugin-toolchains`).
//! - `plugins`: build every plugin in `plugins/` for `wasm32-wasip2` and copy the
//!   components to `target/plugins/`; the JavaScript and Python key policies
//!   too when their toolchains are installed (skipped, with the reason, when not).
//! - `test`: `setup`, build the binaries, then the whole test suite
//!   (`cargo test --workspace`); `test --quick`: only what `redis-server`
//!   suffices for (unit tests and most integration tests).
//! - `run`: install only what running needs (the `wasm32-wasip2` target,
//!   `redis-server`), `plugins`, then the provider simulator on
//!   127.0.0.1:9090 and the host with its defaults (`pushonce.toml`:
//!   embedded Redis, the channels pointing at the simulator).
//! - `chaos`: `setup`, build `pushonce` and the `chaos` program in release,
//!   then run it (arguments after `chaos` go to it; `--help` lists them).
//! - `dist [--profile release|dev] [--out DIR]`: the release in
//!   `target/dist/`: `pushonce-<version>-<target>.tar.gz` and a Debian
//!   package of the same files (see `dist.rs`).

mod components;
mod dist;
mod languages;
mod plugins;
mod service;
mod setup;

use anyhow::{Context, Result, bail};
use components::target_dir;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    match args.first().map(String::as_str) {
        Some("setup") => setup::for_testing(&root),
        Some("plugins") => plugins::build(&root).map(|_| ()),
        Some("test") => test(&root, &args[1..]),
        Some("run") => {
            setup::for_running()?;
            let dir = plugins::build(&root)?;
            service::run(&root, &dir, &args[1..])
        }
        Some("chaos") => chaos(&root, &args[1..]),
        Some("dist") => dist::dist(&root, &args[1..]),
        _ => {
            eprintln!(
                "usage: cargo xtask <setup|plugins|test [--quick] [test args]|run [serve args]|chaos [args]|dist [--profile release|dev] [--out DIR]>"
            );
            std::process::exit(2);
        }
    }
}

/// The integration-test modules (`tests/it/`) and single tests that
/// `cargo xtask test --quick` skips, each with what it needs beyond
/// `redis-server`.
const QUICK_SKIPS: &[(&str, &str)] = &[
    ("chaos::", "minutes of chaos"),
    ("console::", "Chromium"),
    ("doctor::the_postgresql_fix", "PostgreSQL"),
    ("failover::", "PostgreSQL"),
    ("languages::", "the JavaScript and Python toolchains"),
    ("ledger::", "PostgreSQL"),
    ("ledger_retention::", "PostgreSQL"),
    ("ledger_dispatch::while_the_ledger_is_down", "PostgreSQL"),
    (
        "ledger_dispatch::readyz_names_a_ledger_that_is_down",
        "PostgreSQL",
    ),
    (
        "plugin_kit::",
        "cargo builds of scaffolded plugins, JS and Python",
    ),
    ("schemathesis::", "schemathesis"),
];

/// `cargo xtask test [--quick] [args]`: set-up, the binaries the tests
/// spawn, the plugins' native unit tests, then `cargo test --workspace
/// [args]`. `--quick` installs and runs only what needs no more than
/// `redis-server` ([`QUICK_SKIPS`]).
fn test(root: &Path, args: &[String]) -> Result<()> {
    let quick = args.first().is_some_and(|a| a == "--quick");
    let args = if quick { &args[1..] } else { args };
    if quick {
        setup::for_running()?;
    } else {
        setup::for_testing(root)?;
    }
    // Tests spawn the real `pushonce` binary (kill -9, several instances).
    build_binaries(root)?;
    // The plugins' shared key encoder and their signatures (provider-auth,
    // checked against the providers' published vectors) are plain
    // Rust: their unit tests run natively.
    run(cargo_command()
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
    if !quick {
        return run(cargo_command()
            .current_dir(root)
            .args(["test", "--workspace"])
            .args(args));
    }
    // Unit tests whole, then the integration tests less QUICK_SKIPS (a
    // `--skip` applies to every test binary of a run: kept off the unit tests).
    run(cargo_command()
        .current_dir(root)
        .args(["test", "--workspace", "--exclude", "pushonce-tests"])
        .args(args))?;
    eprintln!("xtask: --quick skips what needs more than redis-server:");
    for (name, needs) in QUICK_SKIPS {
        eprintln!("xtask:   {name} ({needs})");
    }
    let mut cmd = cargo_command();
    cmd.current_dir(root)
        .args(["test", "-p", "pushonce-tests"])
        .args(args);
    if !args.iter().any(|a| a == "--") {
        cmd.arg("--");
    }
    for (name, _) in QUICK_SKIPS {
        cmd.args(["--skip", name]);
    }
    run(&mut cmd)
}

/// Builds the workspace's binaries in the dev profile: the `pushonce` that
/// tests spawn and `cargo xtask run` serves with, and `provider-sim`. One
/// selection for both: building two binaries alone would unify the
/// dependencies' features differently and compile some of them, and the
/// host, a second time.
fn build_binaries(root: &Path) -> Result<()> {
    run(cargo_command()
        .current_dir(root)
        .args(["build", "--workspace", "--bins"]))
}

/// `cargo xtask chaos [--] [args]`: builds the release host and the chaos
/// runner, then runs it with `args`.
fn chaos(root: &Path, args: &[String]) -> Result<()> {
    setup::for_running()?;
    run(cargo_command().current_dir(root).args([
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

/// `cargo` for a nested build, without the variables `cargo run` set for
/// this program (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`…): a build script that
/// tracks one of them (ring's tracks `CARGO_MANIFEST_DIR`) would otherwise
/// find the environment changed since a build from the shell, and the two
/// would compile ring and everything above it again, each after the other
/// (minutes each time).
fn cargo_command() -> Command {
    let mut cmd = Command::new(cargo());
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if key.starts_with("CARGO_PKG_")
            || matches!(
                key,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_RUSTC_CURRENT_DIR"
            )
        {
            cmd.env_remove(key);
        }
    }
    cmd
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
