//! One policy file (`policies/<name>.toml`): what operators edit to say, for one
//! business type, which key policy decides "the same notification", on which
//! channels, for how long (the window), how to retry and where to fall back.
//!
//! Parsing is strict (`deny_unknown_fields`): an unknown key is an error that
//! names the file, line and field. Checks that need the rest of the system (the
//! key policy exists, the channels are configured) live in `route::PolicySet`.

use crate::caps::{CapSpec, QuietSpec};
use crate::config::{FileError, parse_toml, read_file};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod digest;
mod retry;

pub use digest::{AfterBegin, DigestSpec};
pub use retry::{BackoffSpec, RetrySpec};

/// Longest dedup window a policy may ask for; longer is almost surely a typo.
pub(crate) const MAX_WINDOW: Duration = Duration::from_secs(366 * 24 * 3600);
/// Most attempts a retry schedule may allow for one task.
pub(crate) const MAX_ATTEMPTS: u32 = 100;

/// A policy file as written by an operator.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    /// The business type this file routes, e.g. `ORDER_SHIPPED`; unique across files.
    pub biz_type: String,
    /// The key policy plugin and its version requirement, `name@req`, e.g. `per-user-per-day@^1.2`.
    pub key_policy: String,
    /// Parameters handed to the key policy plugin (e.g. `tz = "+08:00"`).
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// The channels an event of this type is sent on, in order; each must be a
    /// channel instance of the host configuration.
    pub channels: Vec<String>,
    /// How long a delivered notification blocks another with the same key, e.g. `24h`.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// How failed sends are retried; defaults apply when absent.
    #[serde(default)]
    pub retry: RetrySpec,
    /// Backup channel per channel, used when a channel fails for good.
    #[serde(default)]
    pub fallback: BTreeMap<String, String>,
    /// What kind of message this is for recipients' preferences, e.g.
    /// `transactional`, `marketing`, `security` (1 to 64 of a-z, 0-9, `_`,
    /// `-`): a user who switched it off gets no message of this policy,
    /// unless `[preferences] mandatory` names it. Absent: only the user's
    /// channel preferences apply (`docs/preferences.md`).
    #[serde(default)]
    pub category: Option<String>,
    /// Whether a channel the recipient switched off hands its message to
    /// its `[fallback]` channel at accept, as a failure for good would
    /// (default `false`: an opted-out channel is answered `opted_out` and
    /// nothing takes its place).
    #[serde(default)]
    pub fallback_when_opted_out: bool,
    /// Per-channel overrides of the window, the retry schedule, the quiet
    /// hours or the template, for a channel or a fallback channel.
    #[serde(default)]
    pub(crate) overrides: BTreeMap<String, ChannelOverride>,
    /// This policy's own frequency caps by name (`[caps.daily]`): at most
    /// `max` messages per user (and channel) per rolling `window` or per
    /// calendar day (`per_day = true`). See `docs/caps.md`.
    #[serde(default)]
    pub caps: BTreeMap<String, CapSpec>,
    /// Cap groups of the host configuration (`[caps.<name>]` in
    /// `pushonce.toml`) this policy's messages count against, shared with
    /// every other policy naming them.
    #[serde(default)]
    pub cap_groups: Vec<String>,
    /// The recipient's time zone when the event does not name one
    /// (`tz_attribute`): a fixed offset such as `+08:00`, or `UTC` (the default).
    #[serde(default)]
    pub tz: Option<String>,
    /// The event attribute that holds the recipient's time zone (same form as `tz`).
    #[serde(default)]
    pub tz_attribute: Option<String>,
    /// Quiet hours in the recipient's time zone, e.g. `{ from = "22:00", to
    /// = "08:00" }`: an event accepted inside them is sent when they end.
    #[serde(default)]
    pub quiet: Option<QuietSpec>,
    /// The event attribute that marks an event urgent (`"true"`): urgent
    /// events skip the quiet hours (never the caps).
    #[serde(default)]
    pub urgent_attribute: Option<String>,
    /// How "the same notification" is remembered: `permit` (the default, one
    /// permit per key for the window, exact) or `bloom` (a Bloom filter sized
    /// by `[bloom]`: far less memory, but a false positive skips a message;
    /// refused with a fallback). See `docs/caps.md`.
    #[serde(default)]
    pub dedup: DedupMode,
    /// The Bloom filter's sizing, required with `dedup = "bloom"`.
    #[serde(default)]
    pub bloom: Option<BloomSpec>,
    /// Gather the events under one key into one message (`[digest]`): the
    /// first opens a digest sent at the window's end, later ones are added
    /// to it until its first attempt begins. See `docs/digest.md`.
    #[serde(default)]
    pub digest: Option<DigestSpec>,
}

/// How a policy dedups its keys.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DedupMode {
    /// One permit per idempotency key, kept for the window: exact.
    #[default]
    Permit,
    /// A Bloom filter per window period: a false positive skips a message.
    Bloom,
}

/// The sizing of a policy's Bloom filter (`[bloom]`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BloomSpec {
    /// Keys expected per channel in one window, e.g. `10_000_000`.
    pub items: u64,
    /// The false-positive rate wanted at that many keys, e.g. `0.001`: the
    /// share of new messages skipped as if they were duplicates.
    pub false_positive: f64,
}

/// What one channel does differently from the file's defaults.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChannelOverride {
    /// This channel's own dedup window.
    #[serde(default, with = "humantime_serde")]
    pub window: Option<Duration>,
    /// This channel's own retry schedule.
    #[serde(default)]
    pub retry: Option<RetrySpec>,
    /// This channel's own quiet hours (instead of the policy's).
    #[serde(default)]
    pub quiet: Option<QuietSpec>,
    /// The template (code or id) this channel's provider renders for the
    /// policy's events, e.g. an Aliyun `SMS_465910001` or a WeChat template
    /// id: providers name their templates each their own way, so one
    /// event's `template` cannot fit them all. It wins over the event's
    /// `template`; a digest's own `[digest] template` wins over it.
    #[serde(default)]
    pub template: Option<String>,
}

/// Why a policy file was refused. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read or parsed.
    #[error(transparent)]
    File(#[from] FileError),
    /// The file parsed but says something that cannot work.
    #[error("{file}: {field}: {reason}")]
    Invalid {
        /// The policy file.
        file: PathBuf,
        /// The field at fault, e.g. `fallback.sms`.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl PolicyFile {
    /// Parses `text` as the policy file `file` and checks what it can check alone.
    pub fn parse(file: &Path, text: &str) -> Result<PolicyFile, PolicyError> {
        let policy: PolicyFile = parse_toml(file, text)?;
        policy.check(file)?;
        Ok(policy)
    }

    /// Reads and parses one policy file.
    pub fn load(file: &Path) -> Result<PolicyFile, PolicyError> {
        Self::parse(file, &read_file(file)?)
    }

    /// The window of a key on `channel`: the one the key policy asked for
    /// (`derived_secs`, at least 1 s), else the channel's override, else the file's.
    pub fn window_for(&self, channel: &str, derived_secs: Option<u32>) -> Duration {
        derived_secs
            .map(|s| Duration::from_secs(u64::from(s).max(1)))
            .or_else(|| self.overrides.get(channel).and_then(|o| o.window))
            .unwrap_or(self.window)
    }

    /// The template `channel`'s override names, if any.
    pub fn template_for(&self, channel: &str) -> Option<&str> {
        self.overrides.get(channel)?.template.as_deref()
    }

    /// Checks that need nothing but the file itself.
    fn check(&self, file: &Path) -> Result<(), PolicyError> {
        let invalid = |field: &str, reason: String| PolicyError::Invalid {
            file: file.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        if self.biz_type.trim().is_empty() {
            return Err(invalid("biz_type", "must not be empty".into()));
        }
        if !self.key_policy.contains('@') {
            return Err(invalid(
                "key_policy",
                format!(
                    "`{}` must be `name@version-requirement`, e.g. `per-event@^1`",
                    self.key_policy
                ),
            ));
        }
        if self.channels.is_empty() {
            return Err(invalid("channels", "must name at least one channel".into()));
        }
        let mut seen = std::collections::BTreeSet::new();
        for c in &self.channels {
            if !seen.insert(c) {
                return Err(invalid("channels", format!("`{c}` is listed twice")));
            }
        }
        check_window(&self.window).map_err(|r| invalid("window", r))?;
        self.retry
            .check()
            .map_err(|(f, r)| invalid(&format!("retry.{f}"), r))?;
        for (channel, o) in &self.overrides {
            if !self.channels.contains(channel) && !self.fallback.values().any(|to| to == channel) {
                return Err(invalid(
                    &format!("overrides.{channel}"),
                    format!(
                        "`{channel}` is not one of this policy's channels or fallback channels"
                    ),
                ));
            }
            if let Some(t) = &o.template {
                check_template(t)
                    .map_err(|r| invalid(&format!("overrides.{channel}.template"), r))?;
            }
            if let Some(w) = &o.window {
                check_window(w).map_err(|r| invalid(&format!("overrides.{channel}.window"), r))?;
            }
            if let Some(r) = &o.retry {
                r.check()
                    .map_err(|(f, r)| invalid(&format!("overrides.{channel}.retry.{f}"), r))?;
            }
            if let Some(q) = &o.quiet {
                q.parse()
                    .map_err(|(f, r)| invalid(&format!("overrides.{channel}.quiet.{f}"), r))?;
            }
        }
        self.check_gates().map_err(|(f, r)| invalid(&f, r))?;
        self.check_dedup().map_err(|(f, r)| invalid(&f, r))?;
        self.check_digest().map_err(|(f, r)| invalid(&f, r))?;
        if let Some(category) = &self.category {
            crate::config::check_category(category).map_err(|r| invalid("category", r))?;
        }
        if self.fallback_when_opted_out && self.fallback.is_empty() {
            return Err(invalid(
                "fallback_when_opted_out",
                "has no effect without a `[fallback]` table".into(),
            ));
        }
        self.check_fallback()
            .map_err(|(f, r)| invalid(&format!("fallback.{f}"), r))
    }

    /// The caps, the time zone and the quiet hours, each on its own.
    fn check_gates(&self) -> Result<(), (String, String)> {
        for (name, cap) in &self.caps {
            cap.check()
                .map_err(|(f, r)| (format!("caps.{name}.{f}"), r))?;
        }
        if let Some(tz) = &self.tz {
            crate::caps::parse_offset(tz).map_err(|r| ("tz".to_string(), r))?;
        }
        if let Some(q) = &self.quiet {
            q.parse().map_err(|(f, r)| (format!("quiet.{f}"), r))?;
        }
        Ok(())
    }

    /// A digest: well formed, with permits (a Bloom filter cannot tell which
    /// digest holds an event) and without a fallback (a fallback message
    /// would carry one event, not the digest).
    fn check_digest(&self) -> Result<(), (String, String)> {
        let Some(digest) = &self.digest else {
            return Ok(());
        };
        digest.check()?;
        if self.dedup == DedupMode::Bloom {
            return Err((
                "digest".into(),
                "cannot be used with `dedup = \"bloom\"`: a digest needs a permit per key".into(),
            ));
        }
        if !self.fallback.is_empty() {
            return Err((
                "digest".into(),
                "cannot be used with `[fallback]` yet: a fallback message would carry one \
                 event, not the digest"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Bloom mode: sized, and no fallback (a false positive would skip the
    /// message silently, and with it the reason a fallback exists).
    fn check_dedup(&self) -> Result<(), (String, String)> {
        match (self.dedup, &self.bloom) {
            (DedupMode::Permit, Some(_)) => Err((
                "bloom".into(),
                "is only read with `dedup = \"bloom\"`".into(),
            )),
            (DedupMode::Bloom, None) => Err((
                "bloom".into(),
                "`dedup = \"bloom\"` needs `[bloom]` with `items` and `false_positive`, \
                 e.g. `bloom = { items = 10_000_000, false_positive = 0.001 }`"
                    .into(),
            )),
            (DedupMode::Bloom, Some(_)) if !self.fallback.is_empty() => Err((
                "dedup".into(),
                format!(
                    "policy `{}`: `dedup = \"bloom\"` cannot be used with a fallback: a \
                     false positive skips the message silently, so the fallback \
                     ({}) would never be tried for it; use the permit mode",
                    self.biz_type,
                    self.fallback
                        .iter()
                        .map(|(a, b)| format!("{a} -> {b}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
            (DedupMode::Bloom, Some(b)) => {
                crate::permit::BloomSizing::per_shard(b.items, b.false_positive, 1)
                    .map(|_| ())
                    .map_err(|e| ("bloom".into(), e.to_string()))
            }
            (DedupMode::Permit, None) => Ok(()),
        }
    }

    /// Every fallback starts from a channel of the policy, and no chain loops.
    fn check_fallback(&self) -> Result<(), (String, String)> {
        for (from, to) in &self.fallback {
            if !self.channels.contains(from) {
                return Err((
                    from.clone(),
                    format!("`{from}` is not one of this policy's channels"),
                ));
            }
            let mut chain = vec![from.as_str(), to.as_str()];
            let mut at = to.as_str();
            while let Some(next) = self.fallback.get(at) {
                if chain.contains(&next.as_str()) {
                    chain.push(next);
                    return Err((
                        from.clone(),
                        format!("fallback cycle: {}", chain.join(" -> ")),
                    ));
                }
                chain.push(next);
                at = next;
            }
        }
        Ok(())
    }
}

/// A template name: not blank, and held to the API's rule for an event's
/// `template` (`event::check_text`).
fn check_template(t: &str) -> Result<(), String> {
    if t.trim().is_empty() {
        return Err("must not be empty".into());
    }
    crate::event::check_text(t, crate::event::MAX_ID)
}

/// A window between a second and [`MAX_WINDOW`].
fn check_window(w: &Duration) -> Result<(), String> {
    if *w < Duration::from_secs(1) {
        return Err(format!(
            "{} is shorter than 1s",
            humantime::format_duration(*w)
        ));
    }
    if *w > MAX_WINDOW {
        return Err(format!(
            "{} is longer than the maximum of 366 days",
            humantime::format_duration(*w)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PolicyFile, PolicyError> {
        PolicyFile::parse(Path::new("policies/x.toml"), text)
    }

    const BASE: &str = "biz_type = \"ORDER_SHIPPED\"\nkey_policy = \"per-event@^1\"\nchannels = [\"sms\", \"app-push\"]\nwindow = \"24h\"\n";

    #[test]
    fn example_policies_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                PolicyFile::load(&path).unwrap_or_else(|e| panic!("{e}"));
                n += 1;
            }
        }
        assert!(n >= 3, "expected the three example policies, found {n}");
    }

    #[test]
    fn a_digest_is_checked_naming_its_field() {
        let ok = parse(&format!("{BASE}[digest]\nat = \"20:00\"\n")).unwrap();
        let d = ok.digest.unwrap();
        assert_eq!((d.max_items, d.after_begin), (20, AfterBegin::Next));
        for (text, field) in [
            (
                format!("{BASE}[digest]\nmax_items = 5\n"),
                "digest: needs exactly one",
            ),
            (
                format!("{BASE}[digest]\nwindow = \"1h\"\nat = \"20:00\"\n"),
                "digest: needs exactly one",
            ),
            (
                format!("{BASE}[digest]\nat = \"8pm\"\n"),
                "digest.at: `8pm`",
            ),
            (
                format!("{BASE}[digest]\nwindow = \"1h\"\nmax_items = 0\n"),
                "digest.max_items: 0",
            ),
            (
                format!("{BASE}[fallback]\nsms = \"app-push\"\n[digest]\nwindow = \"1h\"\n"),
                "digest: cannot be used with `[fallback]`",
            ),
        ] {
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn a_channel_or_fallback_channel_names_its_own_template() {
        let p = parse(&format!(
            "{BASE}[fallback]\nsms = \"email\"\n\
             [overrides.sms]\ntemplate = \"SMS_465910001\"\n\
             [overrides.email]\ntemplate = \"order-shipped\"\n"
        ))
        .unwrap();
        assert_eq!(p.template_for("sms"), Some("SMS_465910001"));
        assert_eq!(p.template_for("email"), Some("order-shipped"));
        assert_eq!(p.template_for("app-push"), None);
        for (text, field) in [
            (
                format!("{BASE}[overrides.sms]\ntemplate = \" \"\n"),
                "overrides.sms.template: must not be empty",
            ),
            (
                format!(
                    "{BASE}[overrides.sms]\ntemplate = \"{}\"\n",
                    "t".repeat(129)
                ),
                "overrides.sms.template: is 129 characters long; at most 128",
            ),
            (
                format!("{BASE}[overrides.wechat]\ntemplate = \"x\"\n"),
                "overrides.wechat: `wechat` is not one of this policy's channels or fallback channels",
            ),
        ] {
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn defaults_fill_the_retry_schedule() {
        let p = parse(BASE).unwrap();
        assert_eq!(p.window, Duration::from_secs(86400));
        assert_eq!(p.retry, RetrySpec::default());
        assert!(p.fallback.is_empty());
    }

    #[test]
    fn unknown_key_names_file_line_and_field() {
        let err = parse(&format!("{BASE}\n[retry]\nmax_attempt = 3\n")).unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("policies/x.toml:7: "), "{text}");
        assert!(text.contains("max_attempt"), "{text}");
    }

    #[test]
    fn malformed_toml_names_the_line() {
        let err = parse("biz_type = \"A\"\nwindow = 24h\n").unwrap_err();
        assert!(err.to_string().starts_with("policies/x.toml:2: "), "{err}");
    }

    #[test]
    fn bad_duration_names_the_field() {
        let err = parse(&BASE.replace("\"24h\"", "\"24 parsecs\"")).unwrap_err();
        assert!(err.to_string().contains("window"), "{err}");
    }

    #[test]
    fn fallback_cycle_is_refused_with_the_chain() {
        let err = parse(&format!(
            "{BASE}\n[fallback]\nsms = \"app-push\"\n\"app-push\" = \"sms\"\n"
        ))
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "policies/x.toml: fallback.app-push: fallback cycle: app-push -> sms -> app-push"
        );
    }

    #[test]
    fn insane_values_are_refused() {
        let cases = [
            (BASE.replace("\"24h\"", "\"500ms\""), "window"),
            (BASE.replace("\"24h\"", "\"400days\""), "window"),
            (
                format!("{BASE}[retry]\nmax_attempts = 0\n"),
                "retry.max_attempts",
            ),
            (
                format!("{BASE}[retry]\nbackoff = {{ initial = \"10s\", max = \"1s\" }}\n"),
                "retry.backoff.max",
            ),
            (
                format!("{BASE}[retry]\nbackoff = {{ factor = 0.5 }}\n"),
                "retry.backoff.factor",
            ),
            (BASE.replace("per-event@^1", "per-event"), "key_policy"),
            (format!("{BASE}category = \"Marketing!\"\n"), "category"),
            (
                format!("{BASE}fallback_when_opted_out = true\n"),
                "fallback_when_opted_out",
            ),
            (BASE.replace("\"app-push\"]", "\"sms\"]"), "channels"),
            (
                format!("{BASE}[fallback]\nwechat = \"sms\"\n"),
                "fallback.wechat",
            ),
            (format!("{BASE}dedup = \"bloom\"\n"), "bloom"),
            (
                format!("{BASE}[bloom]\nitems = 10\nfalse_positive = 0.01\n"),
                "bloom",
            ),
            (
                format!("{BASE}dedup = \"bloom\"\n[bloom]\nitems = 10\nfalse_positive = 0.9\n"),
                "bloom",
            ),
            (
                format!(
                    "{BASE}dedup = \"bloom\"\nbloom = {{ items = 10, false_positive = 0.01 }}\n\
                     [fallback]\nsms = \"app-push\"\n"
                ),
                "dedup",
            ),
        ];
        for (text, field) in cases {
            match parse(&text) {
                Err(PolicyError::Invalid { field: f, .. }) => assert_eq!(f, field, "{text}"),
                other => panic!("expected {field} to be refused, got {other:?}"),
            }
        }
    }
}

/// "No panic on any input": the policy loader over arbitrary text, text
/// shaped like a policy, and arbitrary bytes read from a file.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn any_text_parses_or_is_refused_naming_the_file(text in any::<String>()) {
            if let Err(e) = PolicyFile::parse(Path::new("policies/x.toml"), &text) {
                prop_assert!(e.to_string().starts_with("policies/x.toml"), "{e}");
            }
        }

        #[test]
        fn policy_shaped_text_parses_or_is_refused_naming_the_file(
            text in r#"(biz_type|key_policy|channels|window|params|fallback|retry|max_attempts|backoff|initial|factor|jitter|\[retry\]|\[fallback\]| = |"|\[|\]|\{|\}|,|[a-z0-9_.@^-]{1,8}|[0-9]{1,30}(s|ms|d|h)?|-?[0-9.e+]{1,20}| |\n){0,80}"#
        ) {
            if let Err(e) = PolicyFile::parse(Path::new("policies/x.toml"), &text) {
                prop_assert!(e.to_string().starts_with("policies/x.toml"), "{e}");
            }
        }

        #[test]
        fn any_bytes_in_a_file_load_or_are_refused_naming_the_file(
            bytes in proptest::collection::vec(any::<u8>(), 0..512)
        ) {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("x.toml");
            std::fs::write(&file, &bytes).unwrap();
            if let Err(e) = PolicyFile::load(&file) {
                prop_assert!(e.to_string().starts_with(&file.display().to_string()), "{e}");
            }
        }
    }
}
