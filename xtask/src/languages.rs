//! Key-policy plugins written in JavaScript (`plugins/key-policies-js/<name>/`,
//! entry `src/<name>.js`, built by componentize-js) and Python
//! (`plugins/key-policies-py/<name>/`, module `app`, built by componentize-py
//! with WASI stubbed), against the same WIT as the Rust plugins. The
//! toolchains live in `<target>/plugin-toolchains/` (`js/` an npm prefix,
//! `py/` a virtualenv), installed by `cargo xtask setup`.
//!
//! Shared by `cargo xtask` and `tests/build.rs` (included there with
//! `#[path]`), so both build these plugins the same way: std only.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The componentize-js release the JavaScript plugins are built with.
pub const COMPONENTIZE_JS: &str = "0.23.0";
/// The componentize-py release the Python plugins are built with.
pub const COMPONENTIZE_PY: &str = "0.25.1";

/// The features componentize-js leaves out: a key policy needs none of
/// them, and without them the component imports nothing but its own WIT.
const JS_DISABLED: [&str; 5] = ["stdio", "random", "clocks", "http", "fetch-event"];

/// A plugin's language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    /// JavaScript, through componentize-js (StarlingMonkey).
    Js,
    /// Python, through componentize-py (CPython).
    Python,
}

/// One plugin's sources.
#[derive(Debug, Clone)]
pub struct Source {
    /// Its language.
    pub lang: Lang,
    /// Its directory, e.g. `plugins/key-policies-js/per-user-per-week`.
    pub dir: PathBuf,
    /// The directory's name, e.g. `per-user-per-week`.
    pub name: String,
}

impl Source {
    /// The component's file name, as cargo names Rust ones: `per_user_per_week.wasm`.
    pub fn wasm_name(&self) -> String {
        format!("{}.wasm", self.name.replace('-', "_"))
    }
}

/// Where the toolchains are installed below a target directory.
pub fn toolchains(target_dir: &Path) -> PathBuf {
    target_dir.join("plugin-toolchains")
}

/// The componentize-js command line script below `toolchains`.
pub fn componentize_js(toolchains: &Path) -> PathBuf {
    toolchains.join("js/node_modules/@bytecodealliance/componentize-js/src/cli.js")
}

/// The componentize-py program below `toolchains`.
pub fn componentize_py(toolchains: &Path) -> PathBuf {
    toolchains.join("py/bin/componentize-py")
}

/// Why `lang` cannot be built with `toolchains`, if it cannot.
pub fn missing(lang: Lang, toolchains: &Path) -> Option<String> {
    let (tool, what) = match lang {
        Lang::Js => (componentize_js(toolchains), "componentize-js (and Node.js)"),
        Lang::Python => (componentize_py(toolchains), "componentize-py"),
    };
    (!tool.is_file()).then(|| {
        format!(
            "{what} is not installed at {}: run `cargo xtask setup`",
            tool.display()
        )
    })
}

/// The JavaScript and Python plugins below `plugins`, sorted by name.
pub fn sources(plugins: &Path) -> Vec<Source> {
    let mut found = Vec::new();
    for (sub, lang) in [
        ("key-policies-js", Lang::Js),
        ("key-policies-py", Lang::Python),
    ] {
        let Ok(entries) = std::fs::read_dir(plugins.join(sub)) else {
            continue;
        };
        for dir in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
            if dir.is_dir() {
                let name = dir.file_name().unwrap().to_string_lossy().into_owned();
                found.push(Source { lang, dir, name });
            }
        }
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// Builds `src` into `out_dir/<wasm_name>` against the WIT in `wit`, working
/// on a copy of its sources in `work_dir` (the source tree stays untouched).
/// The error says why: a toolchain missing, or the tool's own output.
pub fn build(
    src: &Source,
    wit: &Path,
    toolchains: &Path,
    work_dir: &Path,
    out_dir: &Path,
) -> Result<PathBuf, String> {
    if let Some(reason) = missing(src.lang, toolchains) {
        return Err(reason);
    }
    let work = work_dir.join(&src.name);
    let _ = std::fs::remove_dir_all(&work);
    copy_dir(&src.dir, &work).map_err(|e| format!("copying {}: {e}", src.dir.display()))?;
    std::fs::create_dir_all(out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let out = out_dir.join(src.wasm_name());
    let mut cmd = match src.lang {
        Lang::Js => {
            let mut cmd = Command::new("node");
            cmd.arg(componentize_js(toolchains))
                .arg(work.join("src").join(format!("{}.js", src.name)))
                .arg("--wit")
                .arg(wit)
                .args(["-n", "key-policy-plugin", "-d"])
                .args(JS_DISABLED);
            cmd
        }
        Lang::Python => {
            let mut cmd = Command::new(componentize_py(toolchains));
            cmd.arg("-d").arg(wit).args([
                "-w",
                "pushonce:plugin/key-policy-plugin",
                "componentize",
                "-s",
                "app",
            ]);
            cmd
        }
    };
    cmd.current_dir(&work).arg("-o").arg(&out);
    let output = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(out)
}

/// Copies the files of `from` into `to`, recursively, leaving out build
/// output (`*.wasm`, `node_modules`, `__pycache__`).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let path = entry?.path();
        let name = path.file_name().unwrap();
        let skip = name == "node_modules"
            || name == "__pycache__"
            || path.extension().is_some_and(|e| e == "wasm");
        if skip {
            continue;
        }
        if path.is_dir() {
            copy_dir(&path, &to.join(name))?;
        } else {
            std::fs::copy(&path, to.join(name))?;
        }
    }
    Ok(())
}
