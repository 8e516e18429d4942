//! Backoff between attempts: exponential, capped, with "equal jitter".

use std::time::Duration;

use crate::permit::RetryPolicy;

/// The delay before the attempt after failed attempt number `attempt` (1-based):
/// `initial · factor^(attempt−1)`, capped at `max_delay`; with jitter, drawn
/// uniformly from [d/2, d]. `unit` is a number in [0, 1) (random in production).
pub(crate) fn delay_after(policy: &RetryPolicy, attempt: u32, unit: f64) -> Duration {
    let exp = attempt.saturating_sub(1).min(64) as i32;
    let base = policy.initial.as_secs_f64() * policy.factor.max(1.0).powi(exp);
    let capped = base.min(policy.max_delay.as_secs_f64()).max(0.0);
    let secs = if policy.jitter {
        capped / 2.0 + capped / 2.0 * unit.clamp(0.0, 1.0)
    } else {
        capped
    };
    Duration::from_secs_f64(secs)
}

/// [`delay_after`] with a random jitter draw.
pub(crate) fn random_delay_after(policy: &RetryPolicy, attempt: u32) -> Duration {
    delay_after(policy, attempt, rand::random::<f64>())
}

/// The shortest delay [`delay_after`] can give (the lower bound tests assert).
pub fn min_delay_after(policy: &RetryPolicy, attempt: u32) -> Duration {
    delay_after(policy, attempt, 0.0)
}

/// The delay before a retry the provider asked to wait `after` for
/// (`Retry-After`): at least `after`, but never longer than the policy's
/// `max_delay` (the schedule bounds every wait; a provider asking for more
/// gets `max_delay`, and the attempt spent counts against `max_attempts`).
pub(crate) fn respecting_retry_after(
    backoff: Duration,
    after: Option<Duration>,
    policy: &RetryPolicy,
) -> Duration {
    match after {
        Some(after) => backoff.max(after).min(policy.max_delay.max(backoff)),
        None => backoff,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_a_floor_under_the_cap() {
        let p = RetryPolicy::default();
        let s = Duration::from_secs;
        assert_eq!(respecting_retry_after(s(2), Some(s(3)), &p), s(3));
        assert_eq!(respecting_retry_after(s(4), Some(s(3)), &p), s(4));
        assert_eq!(respecting_retry_after(s(2), None, &p), s(2));
        assert_eq!(respecting_retry_after(s(2), Some(s(3600)), &p), s(300));
    }

    #[test]
    fn grows_then_caps() {
        let p = RetryPolicy {
            jitter: false,
            ..RetryPolicy::default()
        };
        assert_eq!(delay_after(&p, 1, 0.5), Duration::from_secs(2));
        assert_eq!(delay_after(&p, 2, 0.5), Duration::from_secs(4));
        assert_eq!(delay_after(&p, 3, 0.5), Duration::from_secs(8));
        assert_eq!(delay_after(&p, 20, 0.5), Duration::from_secs(300));
    }

    #[test]
    fn jitter_stays_in_half_to_full() {
        let p = RetryPolicy::default();
        assert_eq!(delay_after(&p, 2, 0.0), Duration::from_secs(2));
        assert_eq!(delay_after(&p, 2, 1.0), Duration::from_secs(4));
        for _ in 0..100 {
            let d = random_delay_after(&p, 2);
            assert!(d >= Duration::from_secs(2) && d <= Duration::from_secs(4));
        }
    }
}
