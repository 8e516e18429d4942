//! `pushonce doctor` and `GET /admin/doctor`: a deployment checked the way
//! an operator would before going live, one line per check — `ok`, `warn`
//! or `FAIL`, what was found, and what to do about a failure.
//!
//! The checks reuse the host's own guards (the eviction refusal of
//! `crate::eviction`, the one-ledger check of `crate::ledger_guard`, the
//! exposure check of `HostConfig::check_exposure`) so that doctor and a
//! starting host never disagree; they only read (no migration, no record
//! written in Redis).
//!
//! - Redis ([`redis`]): reachable, its version, `maxmemory-policy`, AOF or
//!   replicas as `wait_replicas` asks, clock skew against its `TIME`.
//! - The ledger ([`ledger`]): reachable, migrations current, the one every
//!   instance on the Redis uses (a SQLite ledger with more than one
//!   instance seen fails, naming a PostgreSQL URL as the fix).
//! - The deployment ([`deploy`]): plugins loaded and each channel's
//!   capabilities, credentials and callback route; the unsubscribe secret
//!   (as `serve` refuses an unset or short one); the API and admin tokens
//!   when listening beyond loopback.

pub mod deploy;
pub mod ledger;
pub mod redis;

use std::sync::Arc;

use serde::Serialize;
use utoipa::ToSchema;

use crate::config::HostConfig;
use crate::ledger::LedgerPool;
use crate::permit::Permits;
use crate::route::Live;

/// How one check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = DoctorStatus)]
pub enum Status {
    /// As production needs it.
    Ok,
    /// Works, but trades something away (an opt-in, a degraded setup).
    Warn,
    /// Must be fixed before going live.
    Fail,
}

/// One check: what it looked at, what it found, what to do.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = DoctorCheck)]
pub struct Check {
    /// `ok`, `warn` or `fail`.
    pub status: Status,
    /// What was checked, e.g. `redis.maxmemory-policy`.
    pub check: String,
    /// What was found.
    pub found: String,
    /// What to do about a failure or a warning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    /// A passed check.
    pub fn ok(check: impl Into<String>, found: impl Into<String>) -> Check {
        Check {
            status: Status::Ok,
            check: check.into(),
            found: found.into(),
            fix: None,
        }
    }

    /// A warning and what to do about it.
    pub fn warn(
        check: impl Into<String>,
        found: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::with_fix(Status::Warn, check.into(), found.into(), fix.into())
    }

    /// A failure and its fix.
    pub fn fail(
        check: impl Into<String>,
        found: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::with_fix(Status::Fail, check.into(), found.into(), fix.into())
    }

    /// A check of `status` with what to do about it.
    fn with_fix(status: Status, check: String, found: String, fix: String) -> Check {
        Check {
            status,
            check,
            found,
            fix: Some(fix),
        }
    }

    /// A check whose finding is one of the host's own refusals, which say
    /// the fix after `Fix:` (or, when they do not, after the last colon).
    pub fn from_refusal(status: Status, check: impl Into<String>, text: &str) -> Check {
        let (found, fix) = match text.split_once(" Fix: ") {
            Some((found, fix)) => (found.to_string(), fix.to_string()),
            None => (text.to_string(), "see the finding".to_string()),
        };
        Check::with_fix(status, check.into(), found, fix)
    }

    /// The line printed for this check: `ok    check  found` or
    /// `FAIL  check  found — fix: …`.
    pub fn line(&self) -> String {
        let flat = |text: &str| {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("; ")
        };
        let status = match self.status {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        match &self.fix {
            Some(fix) if self.status != Status::Ok => {
                format!(
                    "{status}  {}: {} — fix: {}",
                    self.check,
                    flat(&self.found),
                    flat(fix)
                )
            }
            _ => format!("{status}  {}: {}", self.check, flat(&self.found)),
        }
    }
}

/// Every check of one deployment.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = DoctorReport)]
pub struct Report {
    /// No check failed (warnings allowed).
    pub ok: bool,
    /// The checks, in the order they ran.
    pub checks: Vec<Check>,
}

impl Report {
    /// A report of `checks`.
    pub fn new(checks: Vec<Check>) -> Report {
        Report {
            ok: checks.iter().all(|c| c.status != Status::Fail),
            checks,
        }
    }

    /// The failed checks.
    pub fn failures(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count()
    }
}

/// Reads an environment variable by name.
pub type Env<'a> = &'a (dyn Fn(&str) -> Option<String> + Send + Sync);

/// What the checks look at: the configuration, its environment, and the
/// parts opened from it (or why they could not be).
pub struct Deployment<'a> {
    /// The host configuration.
    pub config: &'a HostConfig,
    /// The service's environment (secrets, tokens).
    pub env: Env<'a>,
    /// The permit layer on the Redis (connection, key layout, group), or
    /// why Redis could not be reached.
    pub redis: Result<&'a Permits, String>,
    /// The delivery ledger's pool (`None`: `ledger_url = "off"`), or why it
    /// could not be opened.
    pub ledger: Option<Result<&'a LedgerPool, String>>,
    /// The plugins and policies, or why they were refused.
    pub live: Result<&'a Arc<Live>, String>,
}

/// Runs every check.
pub async fn examine(d: &Deployment<'_>) -> Report {
    let mut checks = redis::checks(d).await;
    checks.extend(ledger::checks(d).await);
    checks.extend(deploy::checks(d).await);
    Report::new(checks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_split_at_its_fix_and_a_failure_fails_the_report() {
        let c = Check::from_refusal(Status::Fail, "x", "it is bad. Fix: do this.");
        assert_eq!(c.found, "it is bad.");
        assert_eq!(c.fix.as_deref(), Some("do this."));
        assert_eq!(c.line(), "FAIL  x: it is bad. — fix: do this.");
        let report = Report::new(vec![Check::ok("a", "fine"), c]);
        assert!(!report.ok);
        assert_eq!(report.failures(), 1);
        assert!(Report::new(vec![Check::warn("w", "meh", "opt out")]).ok);
        let many = Check::fail("p", "refused:\n  a.toml: bad\n  b.toml: worse", "look");
        assert_eq!(
            many.line(),
            "FAIL  p: refused:; a.toml: bad; b.toml: worse — fix: look"
        );
    }
}
