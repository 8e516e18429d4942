//! Test helpers for the plugin runtime: where `build.rs` put the real and the
//! test-only plugins, registries with a private cache directory, sample events.

use std::path::{Path, PathBuf};

use pushonce::event::Event;
use pushonce::plugin::{Limits, LoadError, PluginRegistry};

/// The directory with the real key-policy plugins, built by `build.rs`.
pub fn real_dir() -> PathBuf {
    PathBuf::from(env!("PUSHONCE_TEST_PLUGINS"))
}

/// The directory with the test-only plugins (misbehave, versioned, stable, wrong-world, http-probe).
pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("PUSHONCE_FIXTURE_PLUGINS"))
}

/// A real plugin's file, e.g. `real("per_event")`.
pub fn real(stem: &str) -> PathBuf {
    existing(real_dir().join(format!("{stem}.wasm")))
}

/// A test plugin's file, e.g. `fixture("misbehave")`.
pub fn fixture(stem: &str) -> PathBuf {
    existing(fixture_dir().join(format!("{stem}.wasm")))
}

fn existing(path: PathBuf) -> PathBuf {
    assert!(path.is_file(), "{} was not built", path.display());
    path
}

/// Limits for tests: the defaults with a small instance pool, so parallel
/// tests do not reserve much address space.
pub fn limits() -> Limits {
    Limits {
        pool_slots: 32,
        ..Limits::default()
    }
}

/// A registry holding the given plugin files, caching in `cache` (if any);
/// panics if one is refused.
pub fn registry_of(files: &[PathBuf], cache: Option<&Path>) -> PluginRegistry {
    let mut registry = PluginRegistry::new(&limits(), cache).expect("engine");
    for f in files {
        if let Err(e) = registry.load_file(f) {
            panic!("{e}");
        }
    }
    registry
}

/// A registry of the real plugins directory; panics on any refusal.
pub fn real_registry(cache: Option<&Path>) -> PluginRegistry {
    let (registry, refused) =
        PluginRegistry::load_dir(&real_dir(), &limits(), cache).expect("plugin dir");
    assert!(refused.is_empty(), "refused: {refused:?}");
    registry
}

/// Copies `files` into a new temporary directory (to build plugin dirs with
/// bad or duplicate files).
pub fn dir_with(files: &[(&str, &[u8])]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    dir
}

/// The refusal about file `name` among `refused`, or a panic listing them.
pub fn refusal_of<'a>(refused: &'a [LoadError], name: &str) -> &'a LoadError {
    refused
        .iter()
        .find(|r| {
            r.file()
                .and_then(|f| f.file_name())
                .is_some_and(|n| n == name)
        })
        .unwrap_or_else(|| panic!("no refusal for {name}: {refused:?}"))
}

/// Plugin file `bytes` with a custom section naming `build` appended: the
/// same plugin, behaving the same, from a file with another SHA-256 (as
/// each new build of a plugin has).
pub fn another_build(bytes: &[u8], build: u32) -> Vec<u8> {
    let name = "pushonce-test-build";
    let mut content = leb128(name.len());
    content.extend_from_slice(name.as_bytes());
    content.extend_from_slice(&build.to_le_bytes());
    let mut out = bytes.to_vec();
    out.push(0); // the custom section's id
    out.extend(leb128(content.len()));
    out.extend(content);
    out
}

/// `n` as unsigned LEB128 (how WebAssembly writes sizes).
fn leb128(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// An event with the given user and time (ms since the epoch), biz_type
/// `ORDER_SHIPPED`, biz_id `o-1` and `attributes`.
pub fn event(user: &str, occurred_at_ms: u64, attributes: &[(&str, &str)]) -> Event {
    Event {
        biz_type: "ORDER_SHIPPED".into(),
        biz_id: "o-1".into(),
        user_id: user.into(),
        occurred_at_ms,
        attributes: attributes
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// `name=value` pairs as owned params.
pub fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
