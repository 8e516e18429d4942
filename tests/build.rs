//! Build script of the test crate: builds the real plugins (`plugins/`) and
//! the test-only plugins (`tests/fixtures/plugins/`) for `wasm32-wasip2` in
//! release, in `<target>/wasm` (where `cargo xtask plugins` builds them too), and tells the tests
//! where the components are: `PUSHONCE_TEST_PLUGINS` (the real plugins) and
//! `PUSHONCE_FIXTURE_PLUGINS` (misbehave, versioned, stable, wrong-world, http-probe).
//! The JavaScript and Python key policies are built too when their toolchains
//! are installed (`cargo xtask setup`): `PUSHONCE_LANG_PLUGINS` is their
//! directory, `PUSHONCE_LANG_SKIPPED` says which were not built and why.
//!
//! The nested cargo gets a clean environment: the variables cargo sets for a
//! build script (target, flags, wrappers, jobserver) would otherwise leak into
//! a build for another target.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Building the JavaScript and Python plugins, shared with `cargo xtask plugins`.
#[path = "../xtask/src/languages.rs"]
#[allow(dead_code)]
mod languages;

/// The shared plugin build and its components, shared with `cargo xtask plugins`.
#[path = "../xtask/src/components.rs"]
mod components;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir
        .parent()
        .expect("tests/ is below the root")
        .to_path_buf();
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    check_target();

    let wit = root.join("wit");
    let plugins = root.join("plugins");
    let fixtures = manifest_dir.join("fixtures").join("plugins");
    println!("cargo:rerun-if-changed={}", wit.display());
    for ws in [&plugins, &fixtures] {
        for entry in std::fs::read_dir(ws).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().is_some_and(|n| n != "target") {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }

    // One build of the plugins: `cargo xtask plugins` uses the same directory.
    let target_dir = components::wasm_dir(&root);
    let real = build_workspace(&plugins, &target_dir, &out.join("plugins"), "real plugins");
    let fixture = build_workspace(
        &fixtures,
        &target_dir,
        &out.join("fixtures"),
        "test plugins",
    );
    build_other_languages(&root, &out);
    println!("cargo:rustc-env=PUSHONCE_TEST_PLUGINS={}", real.display());
    // Where the plugins' dependencies are compiled (a scaffolded project reuses them).
    println!(
        "cargo:rustc-env=PUSHONCE_WASM_TARGET_DIR={}",
        target_dir.display()
    );
    println!(
        "cargo:rustc-env=PUSHONCE_FIXTURE_PLUGINS={}",
        fixture.display()
    );
}

/// Fails early, with the fix, when the wasm32-wasip2 standard library is missing.
fn check_target() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if let Some(sysroot) = sysroot
        && !sysroot.join("lib/rustlib/wasm32-wasip2").is_dir()
    {
        panic!(
            "the wasm32-wasip2 target is not installed for {}: run `rustup target add wasm32-wasip2` (or `cargo xtask setup`)",
            sysroot.display()
        );
    }
}

/// Builds the workspace at `ws` and copies its components into `dest`
/// (emptied first, so a removed plugin does not linger).
fn build_workspace(ws: &Path, target_dir: &Path, dest: &Path, what: &str) -> PathBuf {
    let mut cmd = components::release_build(ws, target_dir);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        let keep = matches!(key.as_str(), "CARGO_HOME" | "CARGO_TERM_COLOR")
            || key.starts_with("CARGO_NET_")
            || key.starts_with("CARGO_HTTP_")
            || key.starts_with("CARGO_REGISTRIES_");
        let strip = (key.starts_with("CARGO_") && !keep)
            || matches!(
                key.as_str(),
                "RUSTFLAGS"
                    | "RUSTDOCFLAGS"
                    | "RUSTC_WRAPPER"
                    | "RUSTC_WORKSPACE_WRAPPER"
                    | "RUSTC_LINKER"
                    | "TARGET"
                    | "HOST"
                    | "PROFILE"
                    | "OPT_LEVEL"
                    | "DEBUG"
                    | "OUT_DIR"
                    | "NUM_JOBS"
                    | "CARGO_MAKEFLAGS"
                    | "MAKEFLAGS"
                    | "MFLAGS"
            );
        if strip {
            cmd.env_remove(&key);
        }
    }
    let output = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo to build the {what}: {e}"));
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("wasm32-wasip2") && stderr.contains("not installed") {
            "\nhint: run `rustup target add wasm32-wasip2` (or `cargo xtask setup`)"
        } else {
            ""
        };
        panic!(
            "building the {what} in {} failed ({}):\n{stderr}{hint}",
            ws.display(),
            output.status
        );
    }
    let _ = std::fs::remove_dir_all(dest);
    components::copy_members(ws, target_dir, dest)
        .unwrap_or_else(|e| panic!("copying the {what} into {}: {e}", dest.display()));
    dest.to_path_buf()
}

/// Builds the JavaScript and Python plugins into `OUT_DIR/languages`; one
/// whose toolchain is missing is skipped (named with the reason in
/// `PUSHONCE_LANG_SKIPPED`), one that fails to build fails the build.
fn build_other_languages(root: &Path, out: &Path) {
    let toolchains = languages::toolchains(&components::target_dir(root));
    let dest = out.join("languages");
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::create_dir_all(&dest).unwrap();
    let mut skipped = Vec::new();
    for src in languages::sources(&root.join("plugins")) {
        if let Some(reason) = languages::missing(src.lang, &toolchains) {
            skipped.push(format!("{}: {reason}", src.name));
            continue;
        }
        let work = out.join("language-sources");
        if let Err(e) = languages::build(&src, &root.join("wit"), &toolchains, &work, &dest) {
            panic!("building plugin {} failed: {e}", src.name);
        }
    }
    // Installing a toolchain (`cargo xtask setup`) makes the next build use it.
    for tool in [
        languages::componentize_js(&toolchains),
        languages::componentize_py(&toolchains),
    ] {
        println!("cargo:rerun-if-changed={}", tool.display());
    }
    println!("cargo:rustc-env=PUSHONCE_LANG_PLUGINS={}", dest.display());
    // Where `pushonce plugins build` finds the tools in tests/plugin_kit.
    println!(
        "cargo:rustc-env=PUSHONCE_PLUGIN_TOOLCHAINS={}",
        toolchains.display()
    );
    println!(
        "cargo:rustc-env=PUSHONCE_LANG_SKIPPED={}",
        skipped.join("; ")
    );
}
