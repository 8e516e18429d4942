//! `pushonce plugins test <plugin.wasm> --cases FILE`: the author's test kit
//! for a key policy. Each case is an event (as the API takes it), a channel
//! and params, and what the plugin must answer: a key body, or an error
//! containing some text. Cases come as TOML (`[[case]]` tables, a `.toml`
//! file) or JSON lines (one case object per line, any other extension).
//! Every case runs through the host's own derivation, so a key the host
//! would refuse fails the case too; the result is a pass/fail table and an
//! error (a non-zero exit) when any case fails.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::derive::{DeriveError, derive};
use crate::event::{EventJson, YearRange, event_from_parsed};
use crate::plugin::{CallError, KeyPolicyPlugin};

/// One case of a cases file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Case {
    /// A name for the table (default: `#<n>`, its position in the file).
    pub name: Option<String>,
    /// The event, in the API's JSON form (`occurred_at`: RFC 3339 or epoch ms).
    pub event: EventJson,
    /// The channel the key is for (default `sms`).
    #[serde(default = "default_channel")]
    pub channel: String,
    /// The policy file's `params` for this case.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// The key body the plugin must give (without the host's
    /// `push:<policy>@<major>:<channel>:` prefix).
    pub key: Option<String>,
    /// Text the plugin's error must contain (the case expects an error).
    pub error: Option<String>,
    /// The window the plugin must ask for, in seconds (unchecked when absent).
    pub window_secs: Option<u32>,
}

fn default_channel() -> String {
    "sms".into()
}

/// The `[[case]]` tables of a TOML cases file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TomlCases {
    /// The cases, in order.
    case: Vec<Case>,
}

/// Why a cases file cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CasesError {
    /// The file cannot be read.
    #[error("cannot read cases file {}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The TOML does not parse as cases.
    #[error("{}: not a TOML cases file", file.display())]
    Toml {
        /// The file.
        file: PathBuf,
        /// Why.
        #[source]
        source: toml::de::Error,
    },
    /// One JSON line does not parse as a case.
    #[error("{}:{line}: not a JSON case", file.display())]
    Json {
        /// The file.
        file: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A case expects neither a key nor an error, or both.
    #[error("{}: case {case} must give exactly one of `key` and `error`", file.display())]
    Expectation {
        /// The file.
        file: PathBuf,
        /// The case's name.
        case: String,
    },
    /// The file holds no case.
    #[error("{}: no cases", file.display())]
    Empty {
        /// The file.
        file: PathBuf,
    },
}

/// Reads the cases of `file` (TOML when it ends in `.toml`, else JSON lines;
/// blank lines and lines starting with `#` or `//` are skipped).
pub(crate) fn read_cases(file: &Path) -> Result<Vec<Case>, CasesError> {
    let text = std::fs::read_to_string(file).map_err(|source| CasesError::Read {
        file: file.to_path_buf(),
        source,
    })?;
    let mut cases = if file.extension().is_some_and(|e| e == "toml") {
        let parsed: TomlCases = toml::from_str(&text).map_err(|source| CasesError::Toml {
            file: file.to_path_buf(),
            source,
        })?;
        parsed.case
    } else {
        json_lines(file, &text)?
    };
    for (i, case) in cases.iter_mut().enumerate() {
        let name = case
            .name
            .get_or_insert_with(|| format!("#{}", i + 1))
            .clone();
        if case.key.is_some() == case.error.is_some() {
            return Err(CasesError::Expectation {
                file: file.to_path_buf(),
                case: name,
            });
        }
    }
    if cases.is_empty() {
        return Err(CasesError::Empty {
            file: file.to_path_buf(),
        });
    }
    Ok(cases)
}

fn json_lines(file: &Path, text: &str) -> Result<Vec<Case>, CasesError> {
    let mut cases = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("//") {
            continue;
        }
        cases.push(
            serde_json::from_str(line).map_err(|source| CasesError::Json {
                file: file.to_path_buf(),
                line: i + 1,
                source,
            })?,
        );
    }
    Ok(cases)
}

/// The outcome of one case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// The case's name.
    pub name: String,
    /// Whether the plugin answered as expected.
    pub passed: bool,
    /// What was expected, for the table.
    pub expected: String,
    /// What the plugin answered, for the table.
    pub got: String,
}

/// Runs every case against `plugin`.
pub(crate) fn run_cases(plugin: &KeyPolicyPlugin, cases: Vec<Case>) -> Vec<Outcome> {
    cases.into_iter().map(|c| run_case(plugin, c)).collect()
}

/// The years a case's event may fall in: wider than the API's, since an
/// author tests the edges.
const CASE_YEARS: YearRange = YearRange {
    from: 1970,
    to: 9999,
};

fn run_case(plugin: &KeyPolicyPlugin, case: Case) -> Outcome {
    let name = case.name.clone().unwrap_or_default();
    let expected = match (&case.key, &case.error, case.window_secs) {
        (Some(k), _, Some(w)) => format!("{k} (window {w} s)"),
        (Some(k), _, None) => k.clone(),
        (None, Some(e), _) => format!("error containing `{e}`"),
        (None, None, _) => String::new(),
    };
    let params: Vec<(String, String)> = case.params.into_iter().collect();
    // Err((refused, text)): `refused` is the plugin's own answer to the
    // input; anything else (a bad case, a trap, a key the host refuses) fails.
    let answer = event_from_parsed(case.event, CASE_YEARS)
        .map_err(|e| (false, format!("bad event in the case: {e}")))
        .and_then(|event| {
            derive(plugin, &event, &case.channel, &params).map_err(|e| match e {
                DeriveError::Call(CallError::Refused { message, .. }) => (true, message),
                other => (false, format!("failed: {other}")),
            })
        });
    let prefix = format!(
        "push:{}@{}:{}:",
        plugin.meta().name,
        plugin.meta().version.major,
        case.channel
    );
    let (passed, got) = match answer {
        Ok(k) => {
            let body = k.key.strip_prefix(&prefix).unwrap_or(&k.key).to_string();
            let window_ok = case.window_secs.is_none() || case.window_secs == k.window_secs;
            let got = match k.window_secs {
                Some(w) if case.window_secs.is_some() => format!("{body} (window {w} s)"),
                _ => body.clone(),
            };
            (case.key.as_deref() == Some(body.as_str()) && window_ok, got)
        }
        Err((refused, message)) => {
            let passed = refused && case.error.as_deref().is_some_and(|e| message.contains(e));
            (passed, format!("error: {message}"))
        }
    };
    Outcome {
        name,
        passed,
        expected,
        got,
    }
}
