//! What the commands read: the default plugin and cache directories,
//! `name=value` parameters, a file or stdin, and the sample event that
//! `plugins check` and `pushonce-bench plugins` try policies on.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::event::Event;

/// `$PUSHONCE_PLUGIN_DIR`, else `target/plugins` (where `cargo xtask plugins` puts them).
pub fn default_plugin_dir() -> PathBuf {
    std::env::var_os("PUSHONCE_PLUGIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/plugins"))
}

/// `<data dir>/cache`, the data dir being `$PUSHONCE_DATA_DIR` or `./data`.
pub(crate) fn default_cache_dir() -> PathBuf {
    std::env::var_os("PUSHONCE_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("data"))
        .join("cache")
}

/// Parses `name=value`.
pub fn parse_param(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not name=value"))
}

/// Reads a file, naming it in the error.
pub fn read_to_string(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading stdin")?;
        return Ok(s);
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// The event `plugins check` and `pushonce-bench plugins` try policies on.
pub fn sample_event() -> Event {
    Event {
        biz_type: "ORDER_SHIPPED".into(),
        biz_id: "o-1001".into(),
        user_id: "u-42".into(),
        occurred_at_ms: 1_796_054_399_000, // 2026-11-30T15:59:59Z
        attributes: vec![("job_id".into(), "job-7".into())],
    }
}
