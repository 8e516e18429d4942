//! Provider health (issue 37, item 3): a circuit per provider instance of a
//! channel with `providers`, in this host process, fed only by
//! infrastructure outcomes — an unknown answer (timeout, cut-off, 5xx, the
//! provider's internal error) or a request that never reached it (connect,
//! TLS) — never by a business refusal; arrears open it at once. While a
//! provider's circuit is open, new tasks of its channel start at the next
//! provider; once `open_for` has passed, one real message at a time is let
//! through (half-open), and its success closes the circuit.
//!
//! The circuit only picks where a *new* task starts: a task that has a
//! provider keeps it (its outcome may be unknown there), so a circuit never
//! moves a message that may have been taken.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::SendOutcome;
use super::providers::refusal_code;
use crate::metric_names as names;

/// How a circuit stands, for `/metrics` (`0` closed, `1` open, `2` half-open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Sending normally.
    Closed,
    /// Failing: new tasks start at the next provider.
    Open,
    /// Past its open time: one message at a time is let through to try it.
    HalfOpen,
}

impl CircuitState {
    fn gauge(self) -> f64 {
        match self {
            CircuitState::Closed => 0.0,
            CircuitState::Open => 1.0,
            CircuitState::HalfOpen => 2.0,
        }
    }
}

/// When a circuit opens and how long it stays open.
#[derive(Debug, Clone, Copy)]
pub struct CircuitConfig {
    /// Infrastructure failures in a row that open it.
    pub failures: u32,
    /// How long it stays open before a half-open try.
    pub open_for: Duration,
}

/// What one send said of its provider's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// The provider took it.
    Up,
    /// An infrastructure failure.
    Down,
    /// The account cannot send (arrears): open at once.
    Suspended,
    /// A business answer (a refusal about the message or the number): says
    /// nothing of the provider's health.
    Neutral,
}

/// Codes that say the account cannot send at all (arrears).
const ARREARS: &[&str] = &[
    "isv.AMOUNT_NOT_ENOUGH",
    "isv.OUT_OF_SERVICE",
    "UnauthorizedOperation.SerivceSuspendDueToArrears",
    "FailedOperation.InsufficientBalanceInSmsPackage",
];

/// What `outcome` says of the provider's health; `written`: whether a
/// request may have reached it.
pub fn health(outcome: &SendOutcome, written: bool) -> Health {
    match outcome {
        SendOutcome::Sent { .. } => Health::Up,
        SendOutcome::Unknown(_) => Health::Down,
        SendOutcome::Retryable { .. } if !written => Health::Down,
        SendOutcome::Retryable { reason, .. } | SendOutcome::Permanent(reason) => {
            match refusal_code(reason) {
                Some(code) if ARREARS.contains(&code) => Health::Suspended,
                _ => Health::Neutral,
            }
        }
    }
}

#[derive(Debug, Default)]
struct Circuit {
    /// Infrastructure failures in a row.
    failures: u32,
    /// Open until then (`None`: closed).
    open_until: Option<Instant>,
    /// A half-open try let through, and when (a try that never reports
    /// back is given up after `open_for`).
    trying_since: Option<Instant>,
}

impl Circuit {
    fn state(&self, now: Instant) -> CircuitState {
        match self.open_until {
            None => CircuitState::Closed,
            Some(until) if now < until => CircuitState::Open,
            Some(_) => CircuitState::HalfOpen,
        }
    }
}

/// The circuits of one channel's providers (and of every channel: keyed by
/// provider instance, which belongs to one channel's list or several).
#[derive(Debug)]
pub struct Circuits {
    config: CircuitConfig,
    circuits: Mutex<HashMap<String, Circuit>>,
}

impl Circuits {
    /// Circuits that open after `config.failures` and stay open `config.open_for`.
    pub fn new(config: CircuitConfig) -> Circuits {
        Circuits {
            config,
            circuits: Mutex::new(HashMap::new()),
        }
    }

    /// How `provider`'s circuit stands now.
    pub fn state(&self, provider: &str) -> CircuitState {
        let circuits = self.circuits.lock().unwrap_or_else(|e| e.into_inner());
        circuits
            .get(provider)
            .map_or(CircuitState::Closed, |c| c.state(Instant::now()))
    }

    /// Whether a new task may start at `provider` now: closed, or half-open
    /// with no other try in flight (this call takes the try).
    pub fn admit(&self, provider: &str) -> bool {
        let now = Instant::now();
        let mut circuits = self.circuits.lock().unwrap_or_else(|e| e.into_inner());
        let c = circuits.entry(provider.to_string()).or_default();
        match c.state(now) {
            CircuitState::Closed => true,
            CircuitState::Open => false,
            CircuitState::HalfOpen => {
                let free = c
                    .trying_since
                    .is_none_or(|at| now.duration_since(at) >= self.config.open_for);
                if free {
                    c.trying_since = Some(now);
                }
                free
            }
        }
    }

    /// Feeds one send's `health` at `provider` of `channel`.
    pub fn report(&self, channel: &str, provider: &str, health: Health) {
        let now = Instant::now();
        let state = {
            let mut circuits = self.circuits.lock().unwrap_or_else(|e| e.into_inner());
            let c = circuits.entry(provider.to_string()).or_default();
            let before = c.state(now);
            match health {
                Health::Neutral => return,
                Health::Up => *c = Circuit::default(),
                Health::Suspended => {
                    c.failures = c.failures.max(self.config.failures);
                    c.open_until = Some(now + self.config.open_for);
                    c.trying_since = None;
                }
                Health::Down => {
                    c.failures = c.failures.saturating_add(1);
                    if c.failures >= self.config.failures || before == CircuitState::HalfOpen {
                        c.open_until = Some(now + self.config.open_for);
                        c.trying_since = None;
                    }
                }
            }
            let after = c.state(now);
            if after != before {
                tracing::warn!(channel, provider, from = ?before, to = ?after, "provider circuit changed");
            }
            after
        };
        metrics::gauge!(names::PROVIDER_CIRCUIT, "channel" => channel.to_string(), "provider" => provider.to_string())
            .set(state.gauge());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_on_failures_in_a_row_lets_one_try_through_and_closes_on_success() {
        let c = Circuits::new(CircuitConfig {
            failures: 2,
            open_for: Duration::from_millis(30),
        });
        c.report("sms", "a", Health::Down);
        c.report("sms", "a", Health::Neutral);
        assert!(c.admit("a"), "one failure and a refusal leave it closed");
        c.report("sms", "a", Health::Down);
        assert_eq!(c.state("a"), CircuitState::Open);
        assert!(!c.admit("a"));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(c.state("a"), CircuitState::HalfOpen);
        assert!(c.admit("a"), "one try");
        assert!(!c.admit("a"), "one at a time");
        c.report("sms", "a", Health::Down);
        assert_eq!(
            c.state("a"),
            CircuitState::Open,
            "a failed try opens it again"
        );
        std::thread::sleep(Duration::from_millis(40));
        assert!(c.admit("a"));
        c.report("sms", "a", Health::Up);
        assert_eq!(c.state("a"), CircuitState::Closed);
        c.report("sms", "a", Health::Suspended);
        assert_eq!(c.state("a"), CircuitState::Open, "arrears open it at once");
    }

    #[test]
    fn only_infrastructure_outcomes_and_arrears_count() {
        let refusal =
            |code: &str| SendOutcome::Permanent(format!("Aliyun SMS refused the message: {code}"));
        assert_eq!(
            health(&refusal("isv.MOBILE_NUMBER_ILLEGAL"), true),
            Health::Neutral
        );
        assert_eq!(
            health(&refusal("SignatureDoesNotMatch"), true),
            Health::Neutral
        );
        assert_eq!(
            health(&refusal("isv.OUT_OF_SERVICE"), true),
            Health::Suspended
        );
        assert_eq!(
            health(&SendOutcome::Unknown("503".into()), true),
            Health::Down
        );
        assert_eq!(
            health(&SendOutcome::retryable("connection refused"), false),
            Health::Down
        );
        assert_eq!(
            health(
                &SendOutcome::retryable("refused the message: Throttling.User"),
                true
            ),
            Health::Neutral
        );
    }
}
