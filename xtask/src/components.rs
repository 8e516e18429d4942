//! The components a plugin workspace builds, copied out of the shared
//! `<target>/wasm` directory. Shared with the test crate's build script
//! (`tests/build.rs`): both build into that directory, and each copies only
//! its own workspace's members, never the other's.

use std::path::Path;
use std::process::Command;

/// `cargo build --release --target wasm32-wasip2` of the workspace at `ws`
/// into `target_dir`, with the `CARGO` that runs this program.
pub fn release_build(ws: &Path, target_dir: &Path) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(ws)
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .arg("--target-dir")
        .arg(target_dir);
    cmd
}

/// Copies the `.wasm` of every member of the workspace at `ws` found in
/// `built` into `dest`; returns how many were copied.
pub fn copy_members(ws: &Path, built: &Path, dest: &Path) -> std::io::Result<usize> {
    let manifest = std::fs::read_to_string(ws.join("Cargo.toml"))?;
    std::fs::create_dir_all(dest)?;
    let mut n = 0;
    for member in members(&manifest) {
        let Some(name) = Path::new(&member).file_name() else {
            continue;
        };
        let file = format!("{}.wasm", name.to_string_lossy().replace('-', "_"));
        let wasm = built.join(&file);
        if wasm.is_file() {
            std::fs::copy(&wasm, dest.join(&file))?;
            n += 1;
        }
    }
    Ok(n)
}

/// The quoted entries of the workspace's `members = [...]` list.
fn members(manifest: &str) -> Vec<String> {
    let Some(start) = manifest.find("members") else {
        return Vec::new();
    };
    let end = manifest[start..]
        .find(']')
        .map_or(manifest.len(), |e| e + start);
    manifest[start..end]
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}
