//! `cargo xtask setup`: what a fresh machine lacks, in two tiers — what
//! running the service needs ([`for_running`]) and what the whole test suite
//! needs besides ([`for_testing`]).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{has_program, languages, run, target_dir};

/// Installs what running the service needs and is missing: the
/// `wasm32-wasip2` Rust target (the plugins) and `redis-server` (the
/// embedded Redis; `redis-tools` brings `redis-benchmark` for the bench).
pub(crate) fn for_running() -> Result<()> {
    wasm_target()?;
    if !(has_program("redis-server") && has_program("redis-benchmark")) {
        apt_install("redis-server redis-tools")
            .context("could not install redis-server; install it by hand (Debian: apt-get install redis-server)")?;
    }
    Ok(())
}

/// Installs the `wasm32-wasip2` Rust target (the plugins' build) when it is
/// missing: all `cargo xtask dist` needs besides what a Rust build needs.
pub(crate) fn wasm_target() -> Result<()> {
    let targets = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("rustup is needed to add the wasm32-wasip2 target")?;
    if !String::from_utf8_lossy(&targets.stdout).contains("wasm32-wasip2") {
        eprintln!("xtask: installing the wasm32-wasip2 target");
        run(Command::new("rustup").args(["target", "add", "wasm32-wasip2"]))?;
    }
    Ok(())
}

/// Installs what the whole test suite needs and is missing: what running
/// needs, PostgreSQL, Chromium with chromedriver, schemathesis and the
/// JavaScript and Python plugin toolchains.
pub(crate) fn for_testing(root: &Path) -> Result<()> {
    for_running()?;
    // The ledger's tests run a real PostgreSQL; Debian keeps its binaries
    // in /usr/lib/postgresql/<major>/bin, off PATH.
    if !has_postgres() {
        apt_install("postgresql").context(
            "could not install PostgreSQL; install it by hand (Debian: apt-get install postgresql)",
        )?;
    }
    // The console's browser test (tests/it/console.rs) drives a headless
    // Chromium through chromedriver.
    if !(has_program("chromium") && has_program("chromedriver")) {
        apt_install("chromium chromium-driver").context(
            "could not install Chromium; install it by hand (Debian: apt-get install chromium chromium-driver)",
        )?;
    }
    install_schemathesis(root)?;
    install_plugin_toolchains(root)
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

/// The schemathesis release `tests/it/schemathesis.rs` runs (pinned: its checks
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
            "python3 is missing: schemathesis (tests/it/schemathesis.rs) needs it with pip and venv (Debian: apt-get install python3-venv python3-pip)"
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
