//! `pushonce-bench skew`: how evenly a Zipf-distributed user mix spreads
//! over the shards and the masters of a Redis Cluster under layout 2
//! (an accept whose key names its recipient lands in the recipient's
//! shard), against layout 1 (every key in the shard of the key). No Redis:
//! the shard comes from `Layout`, the master from the CRC16 hash slot of
//! the shard's tag `{po:<shard>}` and the slot ranges `redis-cli --cluster
//! create` gives N masters (16384 slots split evenly, the first masters one
//! slot more).
//!
//! Messages: `--messages` per-event keys (`push:per-event@1:sms:ORDER:<n>:<user>`,
//! every key distinct), each to a user drawn from a Zipf law of exponent
//! `--s` over `--users` users (user `u-0` the most frequent).

use pushonce::permit::Layout;

/// Arguments of `pushonce-bench skew`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Distinct users.
    #[arg(long, default_value_t = 100_000)]
    users: usize,
    /// Messages (one key each).
    #[arg(long, default_value_t = 1_000_000)]
    messages: usize,
    /// Zipf exponent: the k-th most frequent user gets a share ∝ 1/k^s.
    #[arg(long, default_value_t = 1.0)]
    s: f64,
    /// Shards (`PermitConfig::shards`).
    #[arg(long, default_value_t = 16)]
    shards: u16,
    /// Cluster masters (slots split as `redis-cli --cluster create` does).
    #[arg(long, default_value_t = 3)]
    masters: u16,
    /// Seed of the user draw.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs the measurement and prints the tables.
pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.users > 0 && args.messages > 0,
        "users and messages must be > 0"
    );
    anyhow::ensure!(args.masters > 0, "masters must be > 0");
    let layout = Layout::new("po", args.shards);
    let shards = usize::from(layout.shards());
    let master_of_shard: Vec<usize> = (0..layout.shards())
        .map(|s| master_of_slot(slot(&format!("po:{s}")), args.masters))
        .collect();
    let zipf = Zipf::new(args.users, args.s);
    let mut rng = SplitMix(args.seed);
    let user_shard: Vec<u16> = (0..args.users)
        .map(|u| layout.recipient_shard(&format!("u-{u}")))
        .collect();
    let mut by_recipient = vec![0u64; shards];
    let mut by_key = vec![0u64; shards];
    let mut top_user = 0u64;
    for n in 0..args.messages {
        let user = zipf.sample(rng.next_f64());
        top_user += u64::from(user == 0);
        by_recipient[usize::from(user_shard[user])] += 1;
        let key = format!("push:per-event@1:sms:ORDER:{n}:u-{user}");
        by_key[usize::from(layout.shard_of(&key))] += 1;
    }
    println!(
        "{} messages, {} users, Zipf s = {}, {} shards, {} masters (seed {}); \
         the most frequent user got {} messages ({:.2} %)",
        args.messages,
        args.users,
        args.s,
        shards,
        args.masters,
        args.seed,
        top_user,
        100.0 * top_user as f64 / args.messages as f64
    );
    println!();
    println!("| shard | slot  | master | layout 2 (by recipient) | layout 1 (by key) |");
    println!("|-------|-------|--------|-------------------------|-------------------|");
    for s in 0..shards {
        println!(
            "| {s:>5} | {:>5} | {:>6} | {:>23} | {:>17} |",
            slot(&format!("po:{s}")),
            master_of_shard[s],
            by_recipient[s],
            by_key[s]
        );
    }
    println!(
        "| max/mean over shards   | {:>23.3} | {:>17.3} |",
        max_over_mean(&by_recipient),
        max_over_mean(&by_key)
    );
    println!();
    let per_master = |counts: &[u64]| {
        let mut m = vec![0u64; usize::from(args.masters)];
        for (s, c) in counts.iter().enumerate() {
            m[master_of_shard[s]] += c;
        }
        m
    };
    let (mr, mk) = (per_master(&by_recipient), per_master(&by_key));
    println!("| master | slots       | shards | layout 2 (by recipient) | layout 1 (by key) |");
    println!("|--------|-------------|--------|-------------------------|-------------------|");
    for m in 0..usize::from(args.masters) {
        let (lo, hi) = slot_range(m as u16, args.masters);
        let n = master_of_shard.iter().filter(|&&x| x == m).count();
        println!(
            "| {m:>6} | {:>11} | {n:>6} | {:>23} | {:>17} |",
            format!("{lo}-{hi}"),
            mr[m],
            mk[m]
        );
    }
    println!(
        "| max/mean over masters           | {:>23.3} | {:>17.3} |",
        max_over_mean(&mr),
        max_over_mean(&mk)
    );
    Ok(())
}

fn max_over_mean(counts: &[u64]) -> f64 {
    let total: u64 = counts.iter().sum();
    let mean = total as f64 / counts.len() as f64;
    *counts.iter().max().unwrap_or(&0) as f64 / mean
}

/// The Redis Cluster hash slot of a hash tag's content: CRC16 (XMODEM) mod
/// 16384 (`po:0` → 10530, `po:5` → 14727, `po:10` → 4649, `foo` → 12182,
/// as `CLUSTER KEYSLOT` answers on redis-server 7.0).
fn slot(tag: &str) -> u16 {
    let mut crc: u16 = 0;
    for &b in tag.as_bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc & 0x3fff
}

/// The slots `redis-cli --cluster create` gives master `m` of `masters`:
/// 16384 / masters each, rounded as redis-cli rounds (3 masters:
/// 0-5460, 5461-10922, 10923-16383).
fn slot_range(m: u16, masters: u16) -> (u16, u16) {
    let per = 16384.0 / f64::from(masters);
    let first = (f64::from(m) * per).round() as u16;
    let last = if m + 1 == masters {
        16383
    } else {
        ((f64::from(m + 1) * per).round() as u16).saturating_sub(1)
    };
    (first, last)
}

fn master_of_slot(slot: u16, masters: u16) -> usize {
    (0..masters)
        .position(|m| {
            let (lo, hi) = slot_range(m, masters);
            (lo..=hi).contains(&slot)
        })
        .unwrap_or(0)
}

/// A Zipf law over `n` ranks: inverse of the cumulative weights.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut total = 0.0;
        let mut cumulative = Vec::with_capacity(n);
        for k in 1..=n {
            total += 1.0 / (k as f64).powf(s);
            cumulative.push(total);
        }
        for c in &mut cumulative {
            *c /= total;
        }
        Zipf { cumulative }
    }

    /// The rank (0: the most frequent) of uniform draw `u` in [0, 1).
    fn sample(&self, u: f64) -> usize {
        self.cumulative
            .partition_point(|&c| c <= u)
            .min(self.cumulative.len() - 1)
    }
}

/// SplitMix64: a small deterministic generator, enough for a draw.
struct SplitMix(u64);

impl SplitMix {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}
