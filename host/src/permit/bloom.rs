//! Bloom mode (`dedup = "bloom"` on a policy): instead of one permit string
//! per idempotency key kept for the window, the accept script checks and sets
//! k bits of a Bloom filter kept in a plain Redis string (`GETBIT`/`SETBIT`
//! from Lua; RedisBloom's `BF.*` commands are not used). The host computes
//! the k bit positions from the key; the script answers `duplicate` when all
//! are set, else sets them and enqueues the task, atomically.
//!
//! Each shard keeps its own filters (same hash tag as the task, the ready
//! stream and the event index: one slot on a cluster). A filter lives for
//! two periods of the window: the accept script checks the filter of the
//! current period and the previous one and sets bits in the current one, so
//! a re-post within one window of the first accept is always a duplicate
//! (at most two windows). Two filters are checked, so each is sized for
//! half the policy's false-positive rate. See `docs/caps.md`.

use std::sync::LazyLock;

use redis::Script;
use sha2::{Digest, Sha256};

use super::keys::Layout;
use super::scripts::{Call, Transition, script};
use super::{PermitError, Permits};
use crate::store::Batch;

/// Add or check many keys in one Bloom filter, without tasks (`bloom.lua`).
pub static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("bloom.lua")));

/// Most bits of one filter: a Redis string holds at most 512 MB (2^32 bits).
pub const MAX_BITS: u64 = 1 << 32;
/// Most hash functions (bit positions per key).
pub const MAX_HASHES: u32 = 30;

/// The size of one filter: m bits, k positions per key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BloomSizing {
    /// Bits in the filter (m).
    pub bits: u64,
    /// Bit positions per key (k).
    pub hashes: u32,
}

/// Why a filter cannot be sized.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SizingError {
    /// Expected items must be at least 1.
    #[error("expected items must be at least 1")]
    NoItems,
    /// The false-positive rate must lie strictly between 0 and 0.5.
    #[error("false-positive rate {0} is not in (0, 0.5)")]
    Rate(f64),
    /// The filter would not fit in one Redis string.
    #[error(
        "{items} items at a false-positive rate of {rate} need {bits} bits in one filter, \
         more than a Redis string holds (2^32 bits, 512 MB): use more shards or fewer items"
    )]
    TooLarge {
        /// Items per filter.
        items: u64,
        /// Rate per filter.
        rate: f64,
        /// Bits it would need.
        bits: u64,
    },
}

impl BloomSizing {
    /// One filter for `items` keys at false-positive rate `rate`, by the
    /// standard formulas m = -n ln p / (ln 2)^2 and k = (m / n) ln 2
    /// (k rounded, within 1..=30; m at least 64 bits, and grown to what the
    /// rounded k needs for the rate).
    pub fn for_filter(items: u64, rate: f64) -> Result<BloomSizing, SizingError> {
        if items == 0 {
            return Err(SizingError::NoItems);
        }
        if !(rate > 0.0 && rate < 0.5) {
            return Err(SizingError::Rate(rate));
        }
        let ln2 = std::f64::consts::LN_2;
        let n = items as f64;
        let m = (-n * rate.ln() / (ln2 * ln2)).ceil().max(64.0);
        if m > MAX_BITS as f64 {
            return Err(SizingError::TooLarge {
                items,
                rate,
                bits: m as u64,
            });
        }
        let k = ((m / n) * ln2).round().clamp(1.0, f64::from(MAX_HASHES));
        // k is rounded: grow m to the size at which k positions give the
        // rate exactly, (1 - e^(-kn/m))^k = p, so the rate never exceeds p.
        let m = m.max((-k * n / (1.0 - rate.powf(1.0 / k)).ln()).ceil());
        if m > MAX_BITS as f64 {
            return Err(SizingError::TooLarge {
                items,
                rate,
                bits: m as u64,
            });
        }
        Ok(BloomSizing {
            bits: m as u64,
            hashes: k as u32,
        })
    }

    /// Each shard's filter of a policy expecting `items` keys per window
    /// at false-positive rate `rate`, spread over `shards` shards: two
    /// filters are checked per accept, so each gets half the rate.
    pub fn per_shard(items: u64, rate: f64, shards: u16) -> Result<BloomSizing, SizingError> {
        if !(rate > 0.0 && rate < 0.5) {
            return Err(SizingError::Rate(rate));
        }
        let per = items.div_ceil(u64::from(shards.max(1)));
        BloomSizing::for_filter(per, rate / 2.0)
    }

    /// The k bit positions of `key`: double hashing (Kirsch–Mitzenmacher,
    /// g_i = h1 + i·h2 mod m) of two 64-bit words of the key's SHA-256
    /// (bytes 8..24: the shard is chosen from bytes 0..4, so the positions
    /// do not depend on it).
    pub fn positions(&self, key: &str) -> impl Iterator<Item = u64> + use<> {
        let digest = Sha256::digest(key.as_bytes());
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&digest[at..at + 8]);
            u64::from_le_bytes(b)
        };
        let m = u128::from(self.bits);
        let h1 = u128::from(word(8)) % m;
        // Odd, so that it is never 0 and the positions differ.
        let h2 = u128::from(word(16) | 1) % m;
        (0..u128::from(self.hashes)).map(move |i| ((h1 + i * h2) % m) as u64)
    }

    /// The filter's size in bytes (m / 8, rounded up).
    pub fn bytes(&self) -> u64 {
        self.bits.div_ceil(8)
    }

    /// The false-positive rate this filter has once it holds `items` keys:
    /// (1 - e^(-k n / m))^k.
    pub fn expected_rate(&self, items: u64) -> f64 {
        let k = f64::from(self.hashes);
        (1.0 - (-k * items as f64 / self.bits as f64).exp()).powf(k)
    }
}

/// Bloom mode for one accept: which filter, and how many keys it expects.
#[derive(Debug, Clone, PartialEq)]
pub struct BloomCheck {
    /// The filter's name: the business type and the channel (`ORDER:sms`).
    pub filter: String,
    /// Keys expected per window (all shards together).
    pub items: u64,
    /// The policy's false-positive rate.
    pub false_positive: f64,
}

impl BloomCheck {
    /// The sizing of each shard's filter. Policies are checked when they
    /// load ([`BloomSizing::per_shard`] with one shard); a check built by
    /// hand with values out of range is clamped into it (at least one item,
    /// a rate within 1e-9..0.25, at most [`MAX_BITS`]).
    pub fn sizing(&self, shards: u16) -> BloomSizing {
        let rate = if self.false_positive.is_finite() {
            self.false_positive.clamp(1e-9, 0.25)
        } else {
            0.25
        };
        BloomSizing::per_shard(self.items.max(1), rate, shards).unwrap_or_else(|_| {
            let k = (MAX_BITS as f64 / self.items.max(1) as f64 * std::f64::consts::LN_2)
                .round()
                .clamp(1.0, f64::from(MAX_HASHES));
            BloomSizing {
                bits: MAX_BITS,
                hashes: k as u32,
            }
        })
    }
}

impl Layout {
    /// The two filters of a shard, by the parity of the window period:
    /// `{po:<shard>}:bloom:<filter>:<window ms>:<m>:<k>:0` and `…:1`. The
    /// window and the sizing are part of the name: a policy whose window or
    /// sizing changed starts with empty filters (the old ones expire).
    pub fn bloom(
        &self,
        shard: u16,
        filter: &str,
        window_ms: u64,
        sizing: &BloomSizing,
    ) -> [String; 2] {
        let base = format!(
            "{}:bloom:{filter}:{window_ms}:{}:{}",
            self.tag(shard),
            sizing.bits,
            sizing.hashes
        );
        [format!("{base}:0"), format!("{base}:1")]
    }
}

/// `bloom.lua`'s `KEYS` and `ARGV` for one chunk of keys.
struct BloomArgs<'a> {
    /// KEYS[1]: the filter (any key name).
    filter: &'a str,
    /// ARGV[1]: `add`, else `check`.
    add: bool,
    /// ARGV[2], ARGV[3]: the filter's hash count and size in bytes.
    sizing: &'a BloomSizing,
    /// ARGV[4 ..]: the bit positions of each key, key after key.
    keys: &'a [String],
}

impl Transition for BloomArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default()
            .key(self.filter)
            .arg(if self.add { "add" } else { "check" })
            .num(self.sizing.hashes)
            .num(self.sizing.bytes())
            .nums(self.keys.iter().flat_map(|key| self.sizing.positions(key)))
    }
}

/// Keys per `bloom.lua` call of [`Permits::bloom_keys`].
const KEYS_PER_CALL: usize = 500;

impl Permits {
    /// Adds (`add`) or checks `keys` in the Bloom filter `filter` (any key
    /// name) of size `sizing`, with the accept script's bit functions but
    /// no tasks; answers how many had all their bits set (before adding).
    /// Pipelined, [`KEYS_PER_CALL`] keys per script call: for measuring a
    /// filter's false-positive rate and memory (tests, the benchmark).
    pub async fn bloom_keys(
        &self,
        filter: &str,
        sizing: &BloomSizing,
        keys: &[String],
        add: bool,
    ) -> Result<u64, PermitError> {
        let mut batch = Batch::new();
        for chunk in keys.chunks(KEYS_PER_CALL) {
            let args = BloomArgs {
                filter,
                add,
                sizing,
                keys: chunk,
            };
            batch.add(filter, args.call().evalsha(&SCRIPT));
        }
        let answers = batch.query(&mut self.connection(), Some(&SCRIPT)).await?;
        answers
            .into_iter()
            .map(|v| match v {
                redis::Value::Int(n) => Ok(n as u64),
                other => Err(PermitError::Unexpected {
                    script: "bloom",
                    answer: format!("{other:?}"),
                }),
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizing_follows_the_standard_formulas() {
        let s = BloomSizing::for_filter(1_000_000, 0.001).unwrap();
        // -1e6 ln(0.001) / ln(2)^2 = 14,377,587.2 bits; k = 14.38 ln 2 = 9.97,
        // rounded to 10, which needs a few more bits for the rate.
        assert!((14_377_588..14_400_000).contains(&s.bits), "{s:?}");
        assert_eq!(s.hashes, 10);
        assert!(s.expected_rate(1_000_000) <= 0.001);
        assert_eq!(BloomSizing::for_filter(0, 0.01), Err(SizingError::NoItems));
        assert!(BloomSizing::for_filter(10, 0.0).is_err());
        assert!(BloomSizing::for_filter(10, 0.7).is_err());
        assert!(matches!(
            BloomSizing::for_filter(1_000_000_000, 1e-9),
            Err(SizingError::TooLarge { .. })
        ));
    }

    #[test]
    fn positions_are_k_distinct_and_in_range() {
        let s = BloomSizing::for_filter(1000, 0.01).unwrap();
        let p: Vec<u64> = s.positions("order-1:sms").collect();
        assert_eq!(p.len(), s.hashes as usize);
        assert!(p.iter().all(|&b| b < s.bits));
        let again: Vec<u64> = s.positions("order-1:sms").collect();
        assert_eq!(p, again);
        let other: Vec<u64> = s.positions("order-2:sms").collect();
        assert_ne!(p, other);
    }
}
