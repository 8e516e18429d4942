//! The smaller sections of `pushonce.toml`: receipts, HTTP, reconciler,
//! plugin limits and the API's tokens.

use std::time::Duration;

use serde::Deserialize;

/// Providers' delivery callbacks (`[receipts]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReceiptsConfig {
    /// How long a callback naming a message no task matches is answered 503
    /// (the provider retries: the send may not be recorded yet), counted from
    /// when that message id was first seen; after it the callback is accepted
    /// and counted as unmatched (`pushonce_receipts_unmatched_total`).
    #[serde(with = "humantime_serde")]
    pub unmatched_grace: Duration,
}

impl Default for ReceiptsConfig {
    fn default() -> Self {
        ReceiptsConfig {
            unmatched_grace: Duration::from_secs(120),
        }
    }
}

/// The HTTP listener (`[http]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Let the host listen on a non-loopback address (e.g. `0.0.0.0:8080`)
    /// while the API or admin token is unset, i.e. with `/v1` or `/admin`
    /// open to the network. Off by default: such a host refuses to start,
    /// naming the address and the token settings it misses.
    pub allow_open_network: bool,
    /// A connection that has not sent a whole request head within this time
    /// is closed (slow or stalled clients).
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Most connections served at once; further ones wait in the kernel's
    /// accept queue until one closes.
    pub max_connections: usize,
    /// Most connections one client address serves at once (at most
    /// `max_connections`); a further one from that address is closed at
    /// once, so one client cannot take the whole cap from the others.
    pub max_connections_per_client: usize,
    /// Most bytes one connection buffers while it reads a request head
    /// (hyper's read buffer; at least 8192). A head that does not fit is
    /// answered 431. Request heads buffered at once take at most
    /// `max_connections` times this (hyper offers no budget across
    /// connections); the default leaves room for the longest URI hyper
    /// accepts (64 KiB, 414 beyond) and 32 KiB of headers.
    pub max_head_bytes: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            allow_open_network: false,
            header_read_timeout: Duration::from_secs(10),
            max_connections: 1024,
            max_connections_per_client: 256,
            max_head_bytes: 96 * 1024,
        }
    }
}

/// The reconciler (`[reconcile]`): tasks `sent` without a receipt, or
/// `unknown`, are checked with the channel's status query once they are old
/// enough, then again with backoff, a bounded number of times.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileConfig {
    /// Pause between two passes over every shard's awaiting index.
    #[serde(with = "humantime_serde")]
    pub every: Duration,
    /// A task `sent` this long ago without a receipt is checked.
    #[serde(with = "humantime_serde")]
    pub sent_age: Duration,
    /// A task `unknown` this long is checked.
    #[serde(with = "humantime_serde")]
    pub unknown_age: Duration,
    /// Checks of one task before the reconciler gives up: a `sent` task stays
    /// `sent` and is no longer checked; an `unknown` one becomes `dead`
    /// (listed for operators, its permit kept).
    pub max_checks: u32,
    /// Times one `unknown` task may be re-queued because its provider's
    /// status query said (past its lag) that it never got the message —
    /// each a resend the query proved safe; a resend interrupted again
    /// (killed worker, cut-off answer) needs another. Past it the task is
    /// checked on like an undecided one, then `dead`.
    pub max_requeues: u32,
    /// Delay before the next check when a check could not settle the task.
    pub backoff: ReconcileBackoff,
    /// Most entries one pass claims per shard.
    pub batch: usize,
    /// Time budget of one check (the status query included); a claimed
    /// entry is left to this instance for that long, so no other instance
    /// checks the same task at the same time.
    #[serde(with = "humantime_serde")]
    pub check_timeout: Duration,
}

/// Exponential backoff between checks of one task, without jitter.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReconcileBackoff {
    /// Delay after the first check that could not settle the task.
    #[serde(with = "humantime_serde")]
    pub initial: Duration,
    /// Each further delay is the previous one times this factor (at least 1).
    pub factor: f64,
    /// No delay is longer than this.
    #[serde(with = "humantime_serde")]
    pub max: Duration,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            every: Duration::from_secs(5),
            sent_age: Duration::from_secs(600),
            unknown_age: Duration::from_secs(30),
            max_checks: 10,
            max_requeues: 3,
            backoff: ReconcileBackoff::default(),
            batch: 100,
            check_timeout: Duration::from_secs(30),
        }
    }
}

impl Default for ReconcileBackoff {
    fn default() -> Self {
        ReconcileBackoff {
            initial: Duration::from_secs(30),
            factor: 2.0,
            max: Duration::from_secs(1800),
        }
    }
}

impl ReconcileBackoff {
    /// The delay after check number `check` (1-based): `initial ·
    /// factor^(check−1)`, capped at `max`.
    pub(crate) fn delay_after(&self, check: u32) -> Duration {
        let exp = check.saturating_sub(1).min(64) as i32;
        let secs = self.initial.as_secs_f64() * self.factor.max(1.0).powi(exp);
        Duration::from_secs_f64(secs.min(self.max.as_secs_f64()).max(0.0))
    }
}

/// Budgets every plugin call runs under; a call over budget fails alone.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PluginLimits {
    /// Fuel units per key-policy call (about one per wasm instruction); stops endless loops.
    pub fuel: u64,
    /// Fuel units per channel-plugin call: larger, because channel plugins
    /// sign requests (RSA, ECDSA); a call is also bounded by the channel's
    /// `call_timeout`.
    pub channel_fuel: u64,
    /// Most linear memory one plugin instance may grow to, e.g. `"64 MiB"`.
    pub memory: bytesize::ByteSize,
    /// Plugin instances that can exist at once, all plugins together (slots of
    /// the pooling allocator; each reserves address space, not memory).
    pub instances: u32,
    /// Largest plugin file loaded, e.g. `"64 MiB"` (the default); a larger
    /// file, or one that is not a regular file, is refused by name.
    pub max_file_size: bytesize::ByteSize,
}

/// Where the API's bearer tokens come from.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Environment variable holding the token for `/v1` (business services).
    pub api_token_env: Option<String>,
    /// Environment variable holding the token for `/admin` (operators).
    pub admin_token_env: Option<String>,
}

impl Default for PluginLimits {
    fn default() -> Self {
        PluginLimits {
            fuel: 50_000_000,
            channel_fuel: 1_000_000_000,
            memory: bytesize::ByteSize::mib(64),
            instances: 256,
            max_file_size: bytesize::ByteSize::mib(64),
        }
    }
}
