//! The components a plugin workspace builds, copied out of the shared
//! `<target>/wasm` directory. Shared with the test crate's build script
//! (`tests/build.rs`): both build into that directory, and each copies only
//! its own workspace's members, never the other's.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The target directory of the repository at `root`: `CARGO_TARGET_DIR`,
/// else `target/`.
pub fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

/// `<target>/wasm`, where every plugin workspace is built.
pub fn wasm_dir(root: &Path) -> PathBuf {
    target_dir(root).join("wasm")
}

/// `cargo build --release --target wasm32-wasip2` of the workspace at `ws`
/// into `wasm_dir`, with the `CARGO` that runs this program.
pub fn release_build(ws: &Path, wasm_dir: &Path) -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(ws)
        .args(["build", "--release", "--target", "wasm32-wasip2"])
        .arg("--target-dir")
        .arg(wasm_dir);
    cmd
}

/// Copies the `.wasm` of every member of the workspace at `ws`, as
/// [`release_build`] left it in `wasm_dir`, into `dest`; returns how many
/// were copied.
pub fn copy_members(ws: &Path, wasm_dir: &Path, dest: &Path) -> std::io::Result<usize> {
    let built = wasm_dir.join("wasm32-wasip2").join("release");
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
