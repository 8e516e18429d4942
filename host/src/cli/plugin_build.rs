//! `pushonce plugins build [DIR] [--out DIR]`: builds a plugin project
//! written by `plugins new` and copies its component into a plugin
//! directory. The language comes from the project's files: `Cargo.toml`
//! (Rust: `cargo build --release --target wasm32-wasip2`, the component
//! found in cargo's own artifact messages, so `CARGO_TARGET_DIR` and
//! offline builds work as usual), `package.json` (JavaScript:
//! componentize-js) or `pyproject.toml` (Python: componentize-py) — the same
//! commands `cargo xtask plugins` builds the repository's plugins with. The
//! JavaScript and Python tools are looked up in
//! `$PUSHONCE_PLUGIN_TOOLCHAINS` (else `$CARGO_TARGET_DIR/plugin-toolchains`,
//! else `target/plugin-toolchains`: where `cargo xtask setup` installs
//! them), then in the project (`node_modules`), then on `PATH`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The features componentize-js leaves out (as `cargo xtask plugins`): a
/// key policy needs none, and without them the component imports nothing
/// but its own WIT.
const JS_DISABLED: [&str; 5] = ["stdio", "random", "clocks", "http", "fetch-event"];

/// The componentize-js script below an npm prefix.
const COMPONENTIZE_JS: &str = "node_modules/@bytecodealliance/componentize-js/src/cli.js";

/// Why a project cannot be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BuildError {
    /// No project file in the directory.
    #[error(
        "{} is not a plugin project: no Cargo.toml, package.json or pyproject.toml (write one with `pushonce plugins new`)",
        .0.display()
    )]
    NotAProject(PathBuf),
    /// The project file cannot be read or lacks the plugin's name.
    #[error("{}: {reason}", file.display())]
    Manifest {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A tool the language needs is not installed.
    #[error("{tool} is not installed: {hint}")]
    MissingTool {
        /// The tool.
        tool: String,
        /// How to get it.
        hint: String,
    },
    /// The build command failed; its output follows.
    #[error("{command} failed ({status}):\n{output}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed.
        output: String,
    },
    /// The build succeeded without producing a component.
    #[error("{command} produced no .wasm component")]
    NoComponent {
        /// The command line.
        command: String,
    },
    /// Copying the component failed.
    #[error("cannot copy {} to {}", from.display(), to.display())]
    Copy {
        /// The component built.
        from: PathBuf,
        /// Where it was to go.
        to: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A project's language, from its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lang {
    Rust,
    Js,
    Python,
}

fn detect(dir: &Path) -> Result<Lang, BuildError> {
    [
        ("Cargo.toml", Lang::Rust),
        ("package.json", Lang::Js),
        ("pyproject.toml", Lang::Python),
    ]
    .into_iter()
    .find(|(f, _)| dir.join(f).is_file())
    .map(|(_, l)| l)
    .ok_or_else(|| BuildError::NotAProject(dir.to_path_buf()))
}

/// Builds the project in `dir` and copies its component into `out`;
/// returns the copied file.
pub(crate) fn build(dir: &Path, out: &Path) -> Result<PathBuf, BuildError> {
    let lang = detect(dir)?;
    let scratch = dir.join("target").join("pushonce-build");
    let built = match lang {
        Lang::Rust => build_rust(dir)?,
        Lang::Js => build_js(dir, &scratch)?,
        Lang::Python => build_python(dir, &scratch)?,
    };
    let file_name = built.file_name().unwrap_or_default();
    let to = out.join(file_name);
    let copy = std::fs::create_dir_all(out).and_then(|()| std::fs::copy(&built, &to));
    copy.map_err(|source| BuildError::Copy {
        from: built.clone(),
        to: to.clone(),
        source,
    })?;
    Ok(to)
}

/// `cargo build --release --target wasm32-wasip2`; the component is the
/// cdylib artifact cargo reports.
fn build_rust(dir: &Path) -> Result<PathBuf, BuildError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.current_dir(dir).args([
        "build",
        "--release",
        "--target",
        "wasm32-wasip2",
        "--message-format=json-render-diagnostics",
    ]);
    let output = run(&mut cmd, &cargo, "install Rust from https://rustup.rs")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("wasm32-wasip2") && stderr.contains("target may not be installed") {
            return Err(BuildError::MissingTool {
                tool: "the Rust target wasm32-wasip2".into(),
                hint: "run `rustup target add wasm32-wasip2`".into(),
            });
        }
        // Cargo's messages on stdout are JSON; the rendered errors are on stderr.
        return Err(BuildError::Failed {
            command: command_line(&cmd),
            status: output.status,
            output: stderr.into_owned(),
        });
    }
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter_map(|m| {
            let files = m["filenames"].as_array()?.clone();
            files.into_iter().find_map(|f| {
                let f = f.as_str()?;
                f.ends_with(".wasm").then(|| PathBuf::from(f))
            })
        })
        .next_back()
        .ok_or_else(|| BuildError::NoComponent {
            command: command_line(&cmd),
        })
}

/// componentize-js on `src/<name>.js` (`name` from package.json).
fn build_js(dir: &Path, scratch: &Path) -> Result<PathBuf, BuildError> {
    let name = manifest_name(&dir.join("package.json"), |text| {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        v["name"]
            .as_str()
            .map(str::to_string)
            .ok_or("no `name`".into())
    })?;
    let (program, script) = componentize_js(dir)?;
    let out = wasm_path(scratch, &name)?;
    let mut cmd = Command::new(program);
    cmd.current_dir(dir);
    if let Some(script) = script {
        cmd.arg(script);
    }
    cmd.arg(Path::new("src").join(format!("{name}.js")))
        .args(["--wit", "wit", "-n", "key-policy-plugin", "-d"])
        .args(JS_DISABLED)
        .arg("-o")
        .arg(&out);
    let output = run(&mut cmd, "node", "install Node.js (https://nodejs.org)")?;
    finish(&cmd, &output, out)
}

/// componentize-py on module `app` (`name` from pyproject.toml).
fn build_python(dir: &Path, scratch: &Path) -> Result<PathBuf, BuildError> {
    let name = manifest_name(&dir.join("pyproject.toml"), |text| {
        let v: toml::Value = toml::from_str(text).map_err(|e| e.to_string())?;
        v.get("project")
            .and_then(|p| p.get("name"))
            .and_then(|n| n.as_str())
            .map(str::to_string)
            .ok_or("no `[project] name`".into())
    })?;
    let program = componentize_py();
    let out = wasm_path(scratch, &name)?;
    let mut cmd = Command::new(&program);
    cmd.current_dir(dir)
        .args(["-d", "wit", "-w", "pushonce:plugin/key-policy-plugin"])
        .args(["componentize", "-s", "app", "-o"])
        .arg(&out);
    let hint = "run `pip install componentize-py==0.25.1` (or `cargo xtask setup` in the pushonce repository)";
    let output = run(&mut cmd, "componentize-py", hint)?;
    finish(&cmd, &output, out)
}

/// Where the JavaScript and Python tools are installed.
fn toolchains() -> PathBuf {
    if let Some(dir) = std::env::var_os("PUSHONCE_PLUGIN_TOOLCHAINS") {
        return PathBuf::from(dir);
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
        .join("plugin-toolchains")
}

/// `node <cli.js>` from the toolchains or the project, else
/// `componentize-js` on PATH.
fn componentize_js(dir: &Path) -> Result<(PathBuf, Option<PathBuf>), BuildError> {
    for prefix in [toolchains().join("js"), dir.to_path_buf()] {
        let script = prefix.join(COMPONENTIZE_JS);
        if script.is_file() {
            let script = std::path::absolute(&script).unwrap_or(script);
            return Ok((PathBuf::from("node"), Some(script)));
        }
    }
    match on_path("componentize-js") {
        Some(program) => Ok((program, None)),
        None => Err(BuildError::MissingTool {
            tool: "componentize-js".into(),
            hint: format!(
                "not in {}, the project's node_modules or PATH: run `npm install` in the project (or `cargo xtask setup` in the pushonce repository)",
                toolchains().join("js").display()
            ),
        }),
    }
}

/// componentize-py from the toolchains, else from PATH.
fn componentize_py() -> PathBuf {
    let venv = toolchains().join("py/bin/componentize-py");
    if venv.is_file() {
        return venv;
    }
    on_path("componentize-py").unwrap_or_else(|| PathBuf::from("componentize-py"))
}

fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn manifest_name(
    file: &Path,
    parse: impl Fn(&str) -> Result<String, String>,
) -> Result<String, BuildError> {
    let manifest = |reason: String| BuildError::Manifest {
        file: file.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(file).map_err(|e| manifest(e.to_string()))?;
    parse(&text).map_err(manifest)
}

/// `<scratch>/<crate>.wasm` (absolute: the tools run in the project).
fn wasm_path(scratch: &Path, name: &str) -> Result<PathBuf, BuildError> {
    let copy_error = |source| BuildError::Copy {
        from: scratch.to_path_buf(),
        to: scratch.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(scratch).map_err(copy_error)?;
    let dir = std::path::absolute(scratch).map_err(copy_error)?;
    Ok(dir.join(format!("{}.wasm", name.replace('-', "_"))))
}

/// Runs `cmd`; a program that cannot be started is a missing tool.
fn run(cmd: &mut Command, tool: &str, hint: &str) -> Result<Output, BuildError> {
    cmd.output().map_err(|e| BuildError::MissingTool {
        tool: tool.to_string(),
        hint: format!("{hint} ({e})"),
    })
}

fn finish(cmd: &Command, output: &Output, out: PathBuf) -> Result<PathBuf, BuildError> {
    if !output.status.success() {
        return Err(failed(cmd, output));
    }
    if !out.is_file() {
        return Err(BuildError::NoComponent {
            command: command_line(cmd),
        });
    }
    Ok(out)
}

fn failed(cmd: &Command, output: &Output) -> BuildError {
    BuildError::Failed {
        command: command_line(cmd),
        status: output.status,
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    }
}

fn command_line(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}
