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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

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
    /// `closed`, `open` or `half-open`, as `/admin/providers` and the console show it.
    pub fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half-open",
        }
    }

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

/// The longest failure reason kept for `/admin/providers` (characters).
const REASON_CHARS: usize = 500;

#[derive(Debug, Default)]
struct Circuit {
    /// Infrastructure failures in a row.
    failures: u32,
    /// Open until then (`None`: closed).
    open_until: Option<Instant>,
    /// A half-open try let through, and when (a try that never reports
    /// back is given up after `open_for`).
    trying_since: Option<Instant>,
    /// When it last opened (wall clock), while open or half-open.
    opened_at: Option<SystemTime>,
    /// When it turns half-open (wall clock), while open or half-open.
    half_open_at: Option<SystemTime>,
    /// When it last closed again (`None`: never opened).
    closed_at: Option<SystemTime>,
    /// The last infrastructure failure (or arrears): when, and why.
    last_failure: Option<(SystemTime, String)>,
}

impl Circuit {
    fn state(&self, now: Instant) -> CircuitState {
        match self.open_until {
            None => CircuitState::Closed,
            Some(until) if now < until => CircuitState::Open,
            Some(_) => CircuitState::HalfOpen,
        }
    }

    /// Opens it (again) for `open_for` from now; an open circuit keeps the
    /// time it first opened.
    fn open(&mut self, now: Instant, open_for: Duration, before: CircuitState) {
        let wall = SystemTime::now();
        self.open_until = Some(now + open_for);
        self.half_open_at = Some(wall + open_for);
        self.trying_since = None;
        if before != CircuitState::Open || self.opened_at.is_none() {
            self.opened_at = Some(wall);
        }
    }

    /// Closes it after a success (the last failure stays on record).
    fn close(&mut self, before: CircuitState) {
        self.failures = 0;
        self.open_until = None;
        self.trying_since = None;
        self.opened_at = None;
        self.half_open_at = None;
        if before != CircuitState::Closed {
            self.closed_at = Some(SystemTime::now());
        }
    }
}

/// How one provider's circuit stands, for `/admin/providers` and the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitView {
    /// The provider instance.
    pub provider: String,
    /// Closed, open or half-open.
    pub state: CircuitState,
    /// Since when it is in that state: opened, turned half-open, closed
    /// again (for a circuit that never opened: when this process set it up).
    pub since: SystemTime,
    /// Infrastructure failures in a row now.
    pub failures_in_a_row: u32,
    /// The last infrastructure failure (or arrears) seen at this provider:
    /// when, and the reason the send gave (secrets redacted).
    pub last_failure: Option<(SystemTime, String)>,
}

/// The circuits of every channel with `providers`, in this process: what
/// `/admin/providers` and the console show. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct ProviderHealth {
    /// Per channel (by name): its providers in order and their circuits.
    channels: Vec<(String, Vec<String>, Arc<Circuits>)>,
}

/// One channel with `providers`, as [`ProviderHealth::view`] shows it.
#[derive(Debug, Clone)]
pub struct ChannelHealth {
    /// The channel.
    pub channel: String,
    /// Failures in a row that open a circuit (`circuit_failures`).
    pub circuit_failures: u32,
    /// How long a circuit stays open (`circuit_open`).
    pub circuit_open: Duration,
    /// Each provider in the channel's order.
    pub providers: Vec<CircuitView>,
}

impl ProviderHealth {
    /// The health of `channels`: (channel, its providers in order, their circuits).
    pub fn new(channels: Vec<(String, Vec<String>, Arc<Circuits>)>) -> ProviderHealth {
        ProviderHealth { channels }
    }

    /// Every channel with providers, by name, each provider in order.
    pub fn view(&self) -> Vec<ChannelHealth> {
        self.channels
            .iter()
            .map(|(channel, providers, circuits)| ChannelHealth {
                channel: channel.clone(),
                circuit_failures: circuits.config.failures,
                circuit_open: circuits.config.open_for,
                providers: providers.iter().map(|p| circuits.view(p)).collect(),
            })
            .collect()
    }
}

/// The circuits of one channel's providers (and of every channel: keyed by
/// provider instance, which belongs to one channel's list or several).
#[derive(Debug)]
pub struct Circuits {
    config: CircuitConfig,
    circuits: Mutex<HashMap<String, Circuit>>,
    /// When this process set them up (a circuit that never opened is closed since then).
    created: SystemTime,
}

impl Circuits {
    /// Circuits that open after `config.failures` and stay open `config.open_for`.
    pub fn new(config: CircuitConfig) -> Circuits {
        Circuits {
            config,
            circuits: Mutex::new(HashMap::new()),
            created: SystemTime::now(),
        }
    }

    /// How `provider`'s circuit stands now, with since when and its last failure.
    pub fn view(&self, provider: &str) -> CircuitView {
        let circuits = self.circuits.lock().unwrap_or_else(|e| e.into_inner());
        let Some(c) = circuits.get(provider) else {
            return CircuitView {
                provider: provider.to_string(),
                state: CircuitState::Closed,
                since: self.created,
                failures_in_a_row: 0,
                last_failure: None,
            };
        };
        let state = c.state(Instant::now());
        let since = match state {
            CircuitState::Closed => c.closed_at,
            CircuitState::Open => c.opened_at,
            CircuitState::HalfOpen => c.half_open_at,
        };
        CircuitView {
            provider: provider.to_string(),
            state,
            since: since.unwrap_or(self.created),
            failures_in_a_row: c.failures,
            last_failure: c.last_failure.clone(),
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

    /// Feeds one send's `outcome` at `provider` of `channel` (`written`:
    /// whether a request may have reached it), keeping its reason when it
    /// was an infrastructure failure.
    pub fn report_outcome(
        &self,
        channel: &str,
        provider: &str,
        outcome: &SendOutcome,
        written: bool,
    ) {
        let health = health(outcome, written);
        let reason = match outcome {
            SendOutcome::Sent { .. } => "",
            SendOutcome::Retryable { reason, .. }
            | SendOutcome::Permanent(reason)
            | SendOutcome::Unknown(reason) => reason,
        };
        self.feed(channel, provider, health, reason);
    }

    /// Feeds one send's `health` at `provider` of `channel`.
    pub fn report(&self, channel: &str, provider: &str, health: Health) {
        self.feed(channel, provider, health, "");
    }

    fn feed(&self, channel: &str, provider: &str, health: Health, reason: &str) {
        let now = Instant::now();
        let state = {
            let mut circuits = self.circuits.lock().unwrap_or_else(|e| e.into_inner());
            let c = circuits.entry(provider.to_string()).or_default();
            let before = c.state(now);
            match health {
                Health::Neutral => return,
                Health::Up => c.close(before),
                Health::Suspended => {
                    c.failures = c.failures.max(self.config.failures);
                    c.open(now, self.config.open_for, before);
                }
                Health::Down => {
                    c.failures = c.failures.saturating_add(1);
                    if c.failures >= self.config.failures || before == CircuitState::HalfOpen {
                        c.open(now, self.config.open_for, before);
                    }
                }
            }
            if matches!(health, Health::Down | Health::Suspended) {
                let reason: String = reason.chars().take(REASON_CHARS).collect();
                c.last_failure = Some((SystemTime::now(), reason));
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
    fn the_view_says_since_when_and_the_last_failures_reason() {
        let c = Circuits::new(CircuitConfig {
            failures: 1,
            open_for: Duration::from_millis(30),
        });
        let fresh = c.view("a");
        assert_eq!(
            (fresh.state, fresh.since, fresh.last_failure),
            (CircuitState::Closed, c.created, None)
        );
        let before = SystemTime::now();
        c.report_outcome(
            "sms",
            "a",
            &SendOutcome::Unknown("503 ServiceUnavailable".into()),
            true,
        );
        let open = c.view("a");
        assert_eq!(
            (open.state, open.failures_in_a_row),
            (CircuitState::Open, 1)
        );
        assert!(open.since >= before);
        let (at, reason) = open.last_failure.clone().expect("a failure");
        assert_eq!(
            (at >= before, reason.as_str()),
            (true, "503 ServiceUnavailable")
        );
        // A refusal of the number is no failure of the provider: not recorded.
        c.report_outcome(
            "sms",
            "a",
            &SendOutcome::Permanent("refused the message: isv.MOBILE_NUMBER_ILLEGAL".into()),
            true,
        );
        assert_eq!(c.view("a").last_failure, open.last_failure);
        std::thread::sleep(Duration::from_millis(40));
        let half = c.view("a");
        assert_eq!(half.state, CircuitState::HalfOpen);
        assert!(half.since > open.since);
        c.report("sms", "a", Health::Up);
        let closed = c.view("a");
        assert_eq!(
            (closed.state, closed.failures_in_a_row),
            (CircuitState::Closed, 0)
        );
        assert!(closed.since >= half.since);
        assert_eq!(
            closed.last_failure, open.last_failure,
            "the last failure stays on record"
        );
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
