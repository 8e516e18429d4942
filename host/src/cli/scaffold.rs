//! `pushonce plugins new <channel|key-policy> NAME [--lang rust|js|python]`:
//! writes a buildable plugin project into `NAME/` (or `--dir`). Rust
//! projects vendor the SDK (`sdk/`) and the WIT (`wit/`) this host was built
//! with, so they build offline with `cargo build --release --target
//! wasm32-wasip2`; JavaScript and Python projects get the WIT and the key
//! encoding (`key-util`) in their language. Key policies come with a cases
//! file for `pushonce plugins test`, channels with a script of a provider's
//! answers for it. The templates are the files in
//! `scaffold/` beside this one; the SDK files are the repository's own.

use std::path::{Path, PathBuf};

/// What kind of plugin to scaffold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// A channel plugin (`pushonce:channel@2`).
    Channel,
    /// A key-policy plugin (`pushonce:plugin@1`).
    KeyPolicy,
}

/// The language of the scaffolded plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Lang {
    /// Rust, with the vendored SDK.
    Rust,
    /// JavaScript, built by componentize-js.
    Js,
    /// Python, built by componentize-py.
    Python,
}

/// Why a project cannot be written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScaffoldError {
    /// The name is not a plugin name.
    #[error("`{0}` is not a plugin name: use 1..=64 of [a-z0-9-], starting with a letter")]
    BadName(String),
    /// The directory exists and is not empty.
    #[error("{} already exists and is not empty: choose another NAME or --dir", .0.display())]
    Exists(PathBuf),
    /// The combination is not offered.
    #[error(
        "channel plugins are written in Rust: a channel needs the SDK's HTTP client over wasi:http and the provider's signatures (use --lang rust)"
    )]
    ChannelLanguage,
    /// A file could not be written.
    #[error("cannot write {}", file.display())]
    Write {
        /// The file.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A file of a project: its path in the project and its text (`{{name}}`
/// and `{{crate}}` are replaced).
type Template = (&'static str, &'static str);

/// The WIT of both worlds and the WASI packages the channel world uses.
const WIT: &[Template] = &[
    ("wit/plugin.wit", include_str!("../../../wit/plugin.wit")),
    ("wit/channel.wit", include_str!("../../../wit/channel.wit")),
    (
        "wit/deps/cli.wit",
        include_str!("../../../wit/deps/cli.wit"),
    ),
    (
        "wit/deps/clocks.wit",
        include_str!("../../../wit/deps/clocks.wit"),
    ),
    (
        "wit/deps/filesystem.wit",
        include_str!("../../../wit/deps/filesystem.wit"),
    ),
    (
        "wit/deps/http.wit",
        include_str!("../../../wit/deps/http.wit"),
    ),
    ("wit/deps/io.wit", include_str!("../../../wit/deps/io.wit")),
    (
        "wit/deps/random.wit",
        include_str!("../../../wit/deps/random.wit"),
    ),
    (
        "wit/deps/sockets.wit",
        include_str!("../../../wit/deps/sockets.wit"),
    ),
];

const KEY_UTIL: &[Template] = &[
    (
        "sdk/key-util/Cargo.toml",
        include_str!("../../../plugins/key-util/Cargo.toml"),
    ),
    (
        "sdk/key-util/src/lib.rs",
        include_str!("../../../plugins/key-util/src/lib.rs"),
    ),
];

const KEY_POLICY_SDK: &[Template] = &[
    (
        "sdk/key-policy-sdk/Cargo.toml",
        include_str!("../../../plugins/key-policy-sdk/Cargo.toml"),
    ),
    (
        "sdk/key-policy-sdk/src/lib.rs",
        include_str!("../../../plugins/key-policy-sdk/src/lib.rs"),
    ),
];

const CHANNEL_SDK: &[Template] = &[
    (
        "sdk/channel-sdk/Cargo.toml",
        include_str!("../../../plugins/channel-sdk/Cargo.toml"),
    ),
    (
        "sdk/channel-sdk/src/lib.rs",
        include_str!("../../../plugins/channel-sdk/src/lib.rs"),
    ),
    (
        "sdk/channel-sdk/src/cache.rs",
        include_str!("../../../plugins/channel-sdk/src/cache.rs"),
    ),
    (
        "sdk/channel-sdk/src/callback.rs",
        include_str!("../../../plugins/channel-sdk/src/callback.rs"),
    ),
    (
        "sdk/channel-sdk/src/http.rs",
        include_str!("../../../plugins/channel-sdk/src/http.rs"),
    ),
    (
        "sdk/channel-sdk/src/provider.rs",
        include_str!("../../../plugins/channel-sdk/src/provider.rs"),
    ),
    (
        "sdk/provider-auth/Cargo.toml",
        include_str!("../../../plugins/provider-auth/Cargo.toml"),
    ),
    (
        "sdk/provider-auth/src/lib.rs",
        include_str!("../../../plugins/provider-auth/src/lib.rs"),
    ),
    (
        "sdk/provider-auth/src/aliyun.rs",
        include_str!("../../../plugins/provider-auth/src/aliyun.rs"),
    ),
    (
        "sdk/provider-auth/src/apns.rs",
        include_str!("../../../plugins/provider-auth/src/apns.rs"),
    ),
    (
        "sdk/provider-auth/src/aws.rs",
        include_str!("../../../plugins/provider-auth/src/aws.rs"),
    ),
    (
        "sdk/provider-auth/src/aws/ses.rs",
        include_str!("../../../plugins/provider-auth/src/aws/ses.rs"),
    ),
    (
        "sdk/provider-auth/src/aws/sigv4.rs",
        include_str!("../../../plugins/provider-auth/src/aws/sigv4.rs"),
    ),
    (
        "sdk/provider-auth/src/aws/sns.rs",
        include_str!("../../../plugins/provider-auth/src/aws/sns.rs"),
    ),
    (
        "sdk/provider-auth/src/fcm.rs",
        include_str!("../../../plugins/provider-auth/src/fcm.rs"),
    ),
    (
        "sdk/provider-auth/src/jwt.rs",
        include_str!("../../../plugins/provider-auth/src/jwt.rs"),
    ),
    (
        "sdk/provider-auth/src/tencent.rs",
        include_str!("../../../plugins/provider-auth/src/tencent.rs"),
    ),
    (
        "sdk/provider-auth/src/time.rs",
        include_str!("../../../plugins/provider-auth/src/time.rs"),
    ),
    (
        "sdk/provider-auth/src/webhooks.rs",
        include_str!("../../../plugins/provider-auth/src/webhooks.rs"),
    ),
    (
        "sdk/provider-auth/src/wechat.rs",
        include_str!("../../../plugins/provider-auth/src/wechat.rs"),
    ),
];

/// The plugins' lock file: the dependency versions this host's plugins are
/// built and tested with (cargo drops the entries a project does not use).
const LOCK: Template = ("Cargo.lock", include_str!("../../../plugins/Cargo.lock"));
const GITIGNORE: Template = (".gitignore", include_str!("scaffold/gitignore"));
const CASES: Template = ("cases.toml", include_str!("scaffold/key-policy.cases.toml"));

const RUST_KEY_POLICY: &[Template] = &[
    (
        "Cargo.toml",
        include_str!("scaffold/rust-key-policy.Cargo.toml"),
    ),
    (
        "src/lib.rs",
        include_str!("scaffold/rust-key-policy.lib.rs"),
    ),
    CASES,
    LOCK,
    GITIGNORE,
];

const RUST_CHANNEL: &[Template] = &[
    (
        "Cargo.toml",
        include_str!("scaffold/rust-channel.Cargo.toml"),
    ),
    ("src/lib.rs", include_str!("scaffold/rust-channel.lib.rs")),
    ("cases.toml", include_str!("scaffold/channel.cases.toml")),
    LOCK,
    GITIGNORE,
];

const JS_KEY_POLICY: &[Template] = &[
    (
        "package.json",
        include_str!("scaffold/js-key-policy.package.json"),
    ),
    ("src/{{name}}.js", include_str!("scaffold/js-key-policy.js")),
    (
        "src/key-util.js",
        include_str!("../../../plugins/key-policies-js/per-user-per-week/src/key-util.js"),
    ),
    CASES,
    GITIGNORE,
];

const PY_KEY_POLICY: &[Template] = &[
    (
        "pyproject.toml",
        include_str!("scaffold/py-key-policy.pyproject.toml"),
    ),
    ("app.py", include_str!("scaffold/py-key-policy.app.py")),
    (
        "key_util.py",
        include_str!("../../../plugins/key-policies-py/per-tenant-per-hour/key_util.py"),
    ),
    CASES,
    GITIGNORE,
];

/// The files of a `kind` project in `lang`.
fn templates(kind: Kind, lang: Lang) -> Result<Vec<Template>, ScaffoldError> {
    let groups: Vec<&[Template]> = match (kind, lang) {
        (Kind::KeyPolicy, Lang::Rust) => vec![RUST_KEY_POLICY, KEY_POLICY_SDK, KEY_UTIL, WIT],
        (Kind::Channel, Lang::Rust) => vec![RUST_CHANNEL, CHANNEL_SDK, KEY_UTIL, WIT],
        (Kind::KeyPolicy, Lang::Js) => vec![JS_KEY_POLICY, WIT],
        (Kind::KeyPolicy, Lang::Python) => vec![PY_KEY_POLICY, WIT],
        (Kind::Channel, _) => return Err(ScaffoldError::ChannelLanguage),
    };
    Ok(groups.concat())
}

/// Writes a `kind` plugin `name` in `lang` into `dir`; returns the files written.
pub(crate) fn scaffold(
    kind: Kind,
    name: &str,
    lang: Lang,
    dir: &Path,
) -> Result<Vec<PathBuf>, ScaffoldError> {
    check_name(name)?;
    let files = templates(kind, lang)?;
    if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(ScaffoldError::Exists(dir.to_path_buf()));
    }
    let crate_name = name.replace('-', "_");
    let fill = |s: &str| {
        s.replace("{{name}}", name)
            .replace("{{crate}}", &crate_name)
    };
    let mut written = Vec::with_capacity(files.len());
    for (path, text) in files {
        let file = dir.join(fill(path));
        let write = |file: &Path| {
            std::fs::create_dir_all(file.parent().unwrap_or(dir))?;
            std::fs::write(file, fill(text))
        };
        write(&file).map_err(|source| ScaffoldError::Write {
            file: file.clone(),
            source,
        })?;
        written.push(file);
    }
    Ok(written)
}

/// A plugin name: `[a-z][a-z0-9-]{0,63}`.
fn check_name(name: &str) -> Result<(), ScaffoldError> {
    let ok = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ScaffoldError::BadName(name.to_string()))
    }
}

/// The build command of a `lang` project, for the message after writing it.
pub(crate) fn build_command(lang: Lang) -> &'static str {
    match lang {
        Lang::Rust => "cargo build --release --target wasm32-wasip2",
        Lang::Js => "npm install && npm run build",
        Lang::Python => {
            "pip install componentize-py==0.25.1 && componentize-py -d wit -w pushonce:plugin/key-policy-plugin componentize -s app -o <name>.wasm"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// The `.rs` files under `dir`, at any depth.
    fn rust_files(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                found.extend(rust_files(&path));
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
        found
    }

    /// A module added to `channel-sdk` or `provider-auth` and not listed
    /// here breaks every scaffolded channel project ("file not found for
    /// module"). Unit-test files are left out, as their test data is.
    #[test]
    fn the_channel_sdk_template_lists_every_source_file_of_the_sdk() {
        let plugins = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins");
        let mut missing = Vec::new();
        for krate in ["channel-sdk", "provider-auth"] {
            for file in rust_files(&plugins.join(krate).join("src")) {
                let relative = file.strip_prefix(&plugins).unwrap();
                if relative.ends_with("tests.rs") {
                    continue;
                }
                let name = format!("sdk/{}", relative.display());
                if !CHANNEL_SDK.iter().any(|(listed, _)| *listed == name) {
                    missing.push(name);
                }
            }
        }
        assert!(
            missing.is_empty(),
            "add to CHANNEL_SDK in host/src/cli/scaffold.rs: {missing:?}"
        );
    }
}
