//! A policy's `[retry]` schedule (and a channel's own): attempts and backoff.

use serde::Deserialize;
use std::time::Duration;

use super::MAX_ATTEMPTS;

/// A retry schedule: exponential backoff with optional jitter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// Attempts in all, the first included; after the last the task is `dead`.
    #[serde(default = "RetrySpec::default_max_attempts")]
    pub max_attempts: u32,
    /// The delays between attempts.
    #[serde(default)]
    pub backoff: BackoffSpec,
}

/// Delay before attempt n+1: `min(initial * factor^(n-1), max)`, randomised when `jitter`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackoffSpec {
    /// Delay before the second attempt, e.g. `2s`.
    #[serde(default = "BackoffSpec::default_initial", with = "humantime_serde")]
    pub initial: Duration,
    /// Growth of the delay from one attempt to the next (≥ 1.0).
    #[serde(default = "BackoffSpec::default_factor")]
    pub factor: f64,
    /// Cap of any one delay, e.g. `5m`.
    #[serde(default = "BackoffSpec::default_max", with = "humantime_serde")]
    pub max: Duration,
    /// Spread delays randomly (full jitter between half and all of the delay)
    /// so that many retries do not hit a provider at the same instant.
    #[serde(default = "BackoffSpec::default_jitter")]
    pub jitter: bool,
}

impl RetrySpec {
    fn default_max_attempts() -> u32 {
        5
    }
}

impl Default for RetrySpec {
    fn default() -> Self {
        RetrySpec {
            max_attempts: Self::default_max_attempts(),
            backoff: BackoffSpec::default(),
        }
    }
}

impl BackoffSpec {
    fn default_initial() -> Duration {
        Duration::from_secs(2)
    }
    fn default_factor() -> f64 {
        2.0
    }
    fn default_max() -> Duration {
        Duration::from_secs(300)
    }
    fn default_jitter() -> bool {
        true
    }
}

impl Default for BackoffSpec {
    fn default() -> Self {
        BackoffSpec {
            initial: Self::default_initial(),
            factor: Self::default_factor(),
            max: Self::default_max(),
            jitter: Self::default_jitter(),
        }
    }
}

impl RetrySpec {
    /// Checks the schedule; the error names the field (relative to `retry`).
    pub(super) fn check(&self) -> Result<(), (String, String)> {
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS {
            return Err((
                "max_attempts".into(),
                format!("{} is not in 1..={MAX_ATTEMPTS}", self.max_attempts),
            ));
        }
        let b = &self.backoff;
        if b.initial.is_zero() {
            return Err(("backoff.initial".into(), "must be more than 0s".into()));
        }
        if !(b.factor.is_finite() && b.factor >= 1.0 && b.factor <= 100.0) {
            return Err((
                "backoff.factor".into(),
                format!("{} is not in 1.0..=100.0", b.factor),
            ));
        }
        if b.max < b.initial {
            return Err((
                "backoff.max".into(),
                format!(
                    "{} is shorter than backoff.initial ({})",
                    humantime::format_duration(b.max),
                    humantime::format_duration(b.initial)
                ),
            ));
        }
        Ok(())
    }
}
