//! The corpus of recent events: accepted requests' events are sampled
//! ([`CorpusSampler`]: all of them at low rates, about 100 a second under
//! load) into a capped Redis list, `{<ns>:corpus}:events` (newest first,
//! [`CORPUS_LEN`] kept), in the same pipeline as their permits; a reload's
//! key-stability check reads it with [`recent_events`].

use crate::event::Event;

/// How many recent events the corpus keeps.
pub(crate) const CORPUS_LEN: usize = 1000;

/// Recent events a reload derives keys for, old and new, before swapping.
pub(crate) const CORPUS_CHECK_LEN: usize = 200;

/// The Redis key of the corpus of recent events: `{<ns>:corpus}:events`.
pub fn corpus_key(namespace: &str) -> String {
    format!("{{{namespace}:corpus}}:events")
}

/// The commands that sample one event (its JSON text) into the corpus:
/// `LPUSH` then `LTRIM` to [`CORPUS_LEN`].
pub fn corpus_commands(namespace: &str, event_json: &str) -> [redis::Cmd; 2] {
    let key = corpus_key(namespace);
    let mut push = redis::cmd("LPUSH");
    push.arg(&key).arg(event_json);
    let mut trim = redis::cmd("LTRIM");
    trim.arg(&key).arg(0).arg(CORPUS_LEN - 1);
    [push, trim]
}

/// Decides which accepted events are sampled into the corpus: every event
/// while the host accepts fewer than [`CorpusSampler::PER_SECOND`] a second
/// (after a burst of as many), then about that many a second. The corpus
/// only needs recent, real events (the reload check reads the last
/// [`CORPUS_CHECK_LEN`]); writing every one added two commands on the one
/// corpus key to each accept. A GCRA rate limiter on one atomic: lock-free.
#[derive(Debug)]
pub struct CorpusSampler {
    /// Theoretical arrival time of the next sample, µs since `epoch`.
    tat: std::sync::atomic::AtomicU64,
    /// The sampler's clock origin.
    epoch: std::time::Instant,
}

impl Default for CorpusSampler {
    fn default() -> Self {
        CorpusSampler {
            tat: std::sync::atomic::AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        }
    }
}

impl CorpusSampler {
    /// Samples kept per second under load (and the burst allowed at once).
    pub(crate) const PER_SECOND: u64 = 100;

    /// Whether the event accepted now goes into the corpus.
    pub fn sample(&self) -> bool {
        self.sample_at(self.epoch.elapsed().as_micros() as u64)
    }

    /// [`CorpusSampler::sample`] at `now`, µs on the sampler's clock.
    fn sample_at(&self, now: u64) -> bool {
        use std::sync::atomic::Ordering;
        const INTERVAL_US: u64 = 1_000_000 / CorpusSampler::PER_SECOND;
        const BURST_US: u64 = 1_000_000;
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let start = tat.max(now);
            if start - now > BURST_US {
                return false;
            }
            match self.tat.compare_exchange_weak(
                tat,
                start + INTERVAL_US,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(current) => tat = current,
            }
        }
    }
}

/// The `n` most recent events of the corpus, newest first (entries that do
/// not parse are skipped). Events repeat when they were posted again.
pub async fn recent_events(
    conn: &mut impl redis::aio::ConnectionLike,
    namespace: &str,
    n: usize,
) -> Result<Vec<Event>, redis::RedisError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let texts: Vec<String> = redis::cmd("LRANGE")
        .arg(corpus_key(namespace))
        .arg(0)
        .arg(n - 1)
        .query_async(conn)
        .await?;
    Ok(texts
        .iter()
        .filter_map(|t| crate::event::event_from_json_within(t, crate::event::YearRange::ANY).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::CorpusSampler;

    #[test]
    fn corpus_sampler_keeps_everything_at_low_rates_and_about_100_a_second_under_load() {
        let s = CorpusSampler::default();
        // One event every 20 ms: all sampled.
        assert!((0..500u64).all(|i| s.sample_at(i * 20_000)));
        // 10 000 events within one second after that: a burst of about 100,
        // then one per 10 ms.
        let t0 = 10_000_000;
        let kept = (0..10_000u64).filter(|i| s.sample_at(t0 + i * 100)).count();
        assert!((150..=220).contains(&kept), "{kept}");
        // Quiet again: sampled again after the backlog of the burst passed.
        assert!(s.sample_at(t0 + 5_000_000));
    }
}
