//! `cargo xtask plugins`: the plugin components, built once into the
//! directory the tests' build script uses too.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::{components, languages, run, target_dir};

/// Builds the plugin workspace into `<target>/wasm` and copies its components
/// to `<target>/plugins/`.
pub(crate) fn build(root: &Path) -> Result<PathBuf> {
    let plugins = root.join("plugins");
    let wasm = components::wasm_dir(root);
    run(&mut components::release_build(&plugins, &wasm))?;
    let out = target_dir(root).join("plugins");
    // Only this workspace's components: the test plugins are built there too.
    let mut n = components::copy_members(&plugins, &wasm, &out)
        .with_context(|| format!("copying the plugins into {}", out.display()))?;
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
