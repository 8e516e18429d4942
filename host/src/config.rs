//! Host configuration: `pushonce.toml`, then environment overrides for URLs,
//! directories and secrets (`PUSHONCE_*`). Strict: an unknown key is an error
//! naming the file and line. Secrets are never stored here, only the names of
//! the environment variables that hold them.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Everything one host process needs to know to run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    /// Redis to use (`redis://`, `rediss://`, `redis+unix://`); absent (and no
    /// `redis_cluster`) means the host starts its own `redis-server` (AOF on)
    /// with data in `data_dir`. Env: `PUSHONCE_REDIS_URL`.
    pub redis_url: Option<String>,
    /// PEM file of the CA certificates a `rediss://` `redis_url` is verified
    /// against (a private CA, e.g. a managed service's); unset: the system's
    /// roots. An ACL user and password go in the URL,
    /// `rediss://user:password@host:6380` (never logged: errors show `***`).
    /// Env: `PUSHONCE_REDIS_CA_FILE`.
    pub redis_ca_file: Option<PathBuf>,
    /// A Redis Cluster instead: some of its masters' URLs
    /// (`["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]`), from which the
    /// client learns the rest. Exclusive with `redis_url`. Env:
    /// `PUSHONCE_REDIS_CLUSTER`, the URLs separated by commas.
    pub redis_cluster: Vec<String>,
    /// Run on a Redis whose `maxmemory-policy` is not `noeviction` (e.g. a
    /// managed Redis's default `volatile-lru`), leaning on the delivery
    /// ledger alone for keys whose permits it evicts: each evicted permit
    /// lets a re-posted event be accepted again, and only the ledger's claim
    /// stops its second send. Off by default: the host refuses to start on
    /// such a Redis (and `/readyz` answers 503 when a reconnect finds one),
    /// naming the policy and the fix. Refused with `ledger_url = "off"`.
    pub allow_evicting_redis: bool,
    /// Run although the other instances on this Redis use another delivery
    /// ledger. Off by default: each instance records its ledger's identity
    /// in Redis at start, and one whose ledger differs (e.g. several
    /// machines each on its own default SQLite file) refuses to start,
    /// naming both: on separate ledgers no instance stops another's second
    /// send of a key whose permit a Redis failover lost.
    pub allow_separate_ledgers: bool,
    /// Directory for the embedded Redis's data, the compiled-plugin cache
    /// and the default SQLite ledger.
    pub data_dir: PathBuf,
    /// The delivery ledger every send is claimed in (`UNIQUE (key)`, the last
    /// line of defence when Redis loses permits): absent means SQLite in
    /// `<data_dir>/ledger.sqlite3` (one machine); `postgres://user@host/db`
    /// a PostgreSQL shared by every instance (they must all name the same
    /// one); `sqlite:<path>` another SQLite file; `off` no ledger — UNSAFE:
    /// a Redis failover that loses acknowledged permits then sends re-posted
    /// events twice (for measurements and the failover test's control arm).
    /// Env: `PUSHONCE_LEDGER_URL`.
    pub ledger_url: Option<String>,
    /// How long a delivery ledger row is kept after its key's window ends
    /// (at least 1s). Until the window ends the row is the last line of
    /// defence for its key and is never removed; after this much more it is
    /// deleted in the background, in batches (`docs/ledger.md`,
    /// "Retention"). Look-ups and `pushonce ledger export` see a task this
    /// long after its window.
    #[serde(with = "humantime_serde")]
    pub ledger_history: Duration,
    /// Directory of plugin components (`*.wasm`).
    pub plugin_dir: PathBuf,
    /// Directory of policy files (`*.toml`).
    pub policy_dir: PathBuf,
    /// Number of shards (hash tags) the permits and queues are spread over.
    pub shards: u16,
    /// Dispatcher workers in this process.
    pub workers: usize,
    /// Whether this process dispatches: runs the dispatcher (its `workers`)
    /// and the reconciler. `false`: an API-only instance that accepts events
    /// and leaves their delivery to instances with `dispatch = true`, so API
    /// and workers scale (and are measured) separately.
    pub dispatch: bool,
    /// How long a worker's claim on a task lasts without being extended.
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// How long a task that ended stays in Redis when Redis is its only
    /// record before it expires (default `"7d"`): with `ledger_url = "off"`,
    /// for tasks the ledger holds no row of (`superseded`,
    /// `duplicate_prevented`) or did not confirm in time, for `dead` tasks
    /// and failed ones without a fallback (operators requeue or settle them
    /// from Redis), and for `sent` ones awaiting a receipt. With the ledger
    /// on (the default) every other task that ended — delivered, sent with
    /// nothing to await, failed with its fallback taken, settled by an
    /// operator — leaves Redis once the ledger holds its outcome: only its
    /// permit stays, for the window, and look-ups answer from the ledger.
    #[serde(with = "humantime_serde")]
    pub task_retention: Duration,
    /// Opt-in: keep tasks that ended for good in Redis this long (e.g.
    /// `"7d"`) instead of letting them leave once the delivery ledger holds
    /// their outcome (absent, the default). Costs Redis about 1.1 KB per
    /// message for that long (BENCHMARKS.md).
    #[serde(default, with = "humantime_serde")]
    pub keep_ended_tasks: Option<Duration>,
    /// Removed: refused with a message saying what replaced it
    /// (`keep_ended_tasks`; a delivered task now leaves Redis by default).
    #[serde(default, with = "humantime_serde")]
    pub delivered_retention: Option<Duration>,
    /// Keep an index of each event's tasks in Redis (the default), so
    /// `GET /v1/events/{biz_type}/{biz_id}` lists every task of an event,
    /// also those that have not reached a send attempt. `false`: every
    /// accept is cheaper in Redis (no index set per event: less CPU and
    /// memory, measured in BENCHMARKS.md) and that look-up lists the tasks
    /// the delivery ledger has, i.e. those that reached a send attempt, and
    /// the event's tasks still in Redis are found through their ledger rows.
    /// Needs the ledger (refused with `ledger_url = "off"`).
    pub event_index: bool,
    /// Replicas that must confirm an API accept's writes (Redis `WAIT`)
    /// before the API answers it; 0 (the default): answered once the primary
    /// has them. With N, an accepted event survives a failover to any replica
    /// that confirmed it; when fewer confirm within `wait_replicas_timeout`
    /// the API answers 503 and the accept stays on the primary (a re-post
    /// answers `duplicate` there). The dispatcher's fallback accepts do not
    /// wait: the delivery ledger covers what a failover loses of them.
    pub wait_replicas: u32,
    /// How long an accept waits for `wait_replicas` confirmations (at least 1ms).
    #[serde(with = "humantime_serde")]
    pub wait_replicas_timeout: Duration,
    /// Budgets of every plugin call.
    pub plugin_limits: PluginLimits,
    /// Channel instances by name (the names policies use in `channels`).
    pub channels: BTreeMap<String, ChannelConfig>,
    /// Bearer tokens, by the names of the environment variables holding them.
    pub auth: AuthConfig,
    /// The reconciler: when and how often tasks awaiting confirmation are checked.
    pub reconcile: ReconcileConfig,
    /// Providers' delivery callbacks.
    pub receipts: ReceiptsConfig,
    /// Years (UTC, inclusive) an event's `occurred_at` may fall in, e.g.
    /// `{ from = 2000, to = 2100 }` (the default); an event outside is
    /// refused with 422 naming `occurred_at` (a typo, seconds sent as
    /// milliseconds).
    pub occurred_at_years: crate::derive::YearRange,
    /// The HTTP listener: exposure, header timeout, connection cap.
    pub http: HttpConfig,
    /// Named frequency-cap groups (`[caps.marketing]`) that policies share
    /// through `cap_groups = ["marketing"]`: one count per user (and
    /// channel) across every business type naming the group (`docs/caps.md`).
    pub caps: BTreeMap<String, crate::caps::CapSpec>,
}

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

/// One channel instance: which channel plugin, and its settings; or an
/// ordered list of provider instances (`providers`) it fails over between.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    /// The channel plugin and version requirement, `name@req`, e.g. `sms@^2`
    /// (empty on a channel that names `providers` instead).
    #[serde(default)]
    pub plugin: String,
    /// Provider instances, in order of preference: names of other
    /// `[channels.*]` entries, each with its own `plugin`, settings and
    /// credentials. A task starts at the first and moves to the next only
    /// when the provider it is at refused it before accepting it for a
    /// reason of its own (`docs/channels.md`, "Providers within a channel").
    /// A channel names either `plugin` or `providers`, never both.
    #[serde(default)]
    pub providers: Vec<String>,
    /// With `providers`: infrastructure failures in a row (timeouts, 5xx,
    /// connect errors, the provider's internal errors) that open a
    /// provider's circuit, in each host process; while it is open, new tasks
    /// start at the next provider (arrears open it at once).
    #[serde(default = "default_circuit_failures")]
    pub circuit_failures: u32,
    /// With `providers`: how long an open circuit stays open before one
    /// real message at a time is let through to try the provider again.
    #[serde(default = "default_circuit_open", with = "humantime_serde")]
    pub circuit_open: Duration,
    /// Settings handed to the plugin (endpoint, template defaults...).
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Settings whose values are read from environment variables at start:
    /// setting name → variable name. Their values never appear in logs or answers.
    #[serde(default)]
    pub secrets_from_env: BTreeMap<String, String>,
    /// Hosts (`name` or `name:port`) the plugin may reach over HTTP.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Environment variable holding the channel's callback path token: the
    /// provider calls `/v1/receipts/<channel>/<token>` (the token is the
    /// credential; it is compared in constant time and never logged). A
    /// channel whose plugin takes callbacks and has no token makes the host
    /// refuse to start, unless `open_callbacks = true`.
    #[serde(default)]
    pub callback_token_env: Option<String>,
    /// Serve `/v1/receipts/<channel>` without a path token (an explicit
    /// opt-in for a provider that cannot be given a secret URL; a warning at
    /// start). Default `false`: callback routes are closed.
    #[serde(default)]
    pub open_callbacks: bool,

    // ---- delivery settings (channels issue) ----
    /// After an `unknown` outcome, when the provider has neither a client
    /// reference nor a status query: `hold` (default: the task waits, visibly,
    /// for a receipt or an operator) or `resend` (accept a possible duplicate).
    #[serde(default)]
    pub on_unknown: OnUnknown,
    /// Sends in flight at once on this channel instance, per host process.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Most sends per second on this channel instance, per host process (0: no limit).
    #[serde(default)]
    pub rate_limit: f64,
    /// Let allowed host *names* resolve to private, loopback or link-local
    /// addresses (IP literals in `allowed_hosts` are always reachable).
    #[serde(default)]
    pub allow_private: bool,
    /// Let the plugin send plain `http://` requests (unencrypted; meant for
    /// local simulators). Off: only `https://` leaves the host.
    #[serde(default)]
    pub allow_plaintext: bool,
    /// PEM file of extra trusted root certificates for `https://` (a private
    /// CA), trusted besides the web PKI roots.
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Most time to resolve and connect to the provider.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Most time from the moment a request starts going out to the response
    /// head (the connection's set-up is `connect_timeout`'s), and between two
    /// body chunks.
    #[serde(default = "default_response_timeout", with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Most time one plugin call (a send, with all its requests) may take.
    #[serde(default = "default_call_timeout", with = "humantime_serde")]
    pub call_timeout: Duration,
    /// Largest response body a plugin may read.
    #[serde(default = "default_body_cap")]
    pub max_response_size: bytesize::ByteSize,
    /// Largest request body a plugin may send.
    #[serde(default = "default_body_cap")]
    pub max_request_size: bytesize::ByteSize,
}

/// What a channel does after an `unknown` outcome it cannot resolve by
/// resending with its reference or by a status query.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnUnknown {
    /// Keep the task `unknown` (no resend) until a receipt or an operator settles it.
    #[default]
    Hold,
    /// Send again with the same key (may duplicate at the provider).
    Resend,
}

fn default_concurrency() -> usize {
    16
}

fn default_circuit_failures() -> u32 {
    5
}

fn default_circuit_open() -> Duration {
    Duration::from_secs(30)
}

fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_response_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_call_timeout() -> Duration {
    Duration::from_secs(20)
}

fn default_body_cap() -> bytesize::ByteSize {
    bytesize::ByteSize::mib(1)
}

impl ChannelConfig {
    /// A channel instance of `plugin` with default settings.
    pub fn new(plugin: &str) -> ChannelConfig {
        ChannelConfig {
            plugin: plugin.to_string(),
            providers: Vec::new(),
            circuit_failures: default_circuit_failures(),
            circuit_open: default_circuit_open(),
            settings: BTreeMap::new(),
            secrets_from_env: BTreeMap::new(),
            allowed_hosts: Vec::new(),
            callback_token_env: None,
            open_callbacks: false,
            on_unknown: OnUnknown::Hold,
            concurrency: default_concurrency(),
            rate_limit: 0.0,
            allow_private: false,
            allow_plaintext: false,
            ca_file: None,
            connect_timeout: default_connect_timeout(),
            response_timeout: default_response_timeout(),
            call_timeout: default_call_timeout(),
            max_response_size: default_body_cap(),
            max_request_size: default_body_cap(),
        }
    }

    /// The outbound HTTP policy of this channel instance.
    pub fn outbound_policy(&self) -> Result<crate::plugin::OutboundPolicy, OutboundConfigError> {
        Ok(crate::plugin::OutboundPolicy {
            allowed: self
                .allowed_hosts
                .iter()
                .map(|h| crate::plugin::AllowedHost::parse(h))
                .collect::<Result<_, _>>()?,
            allow_private: self.allow_private,
            connect_timeout: self.connect_timeout,
            first_byte_timeout: self.response_timeout,
            between_bytes_timeout: self.response_timeout,
            max_request_bytes: self.max_request_size.as_u64(),
            max_response_bytes: self.max_response_size.as_u64(),
            allow_plaintext: self.allow_plaintext,
            tls: crate::plugin::tls::tls_config(self.ca_file.as_deref())?,
        })
    }
}

/// Why a channel's outbound settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OutboundConfigError {
    /// An `allowed_hosts` entry does not parse.
    #[error(transparent)]
    AllowedHost(#[from] crate::plugin::http::AllowedHostError),
    /// `ca_file` cannot be used.
    #[error(transparent)]
    Tls(#[from] crate::plugin::tls::TlsSetupError),
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

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            listen: "127.0.0.1:8080".parse().expect("a valid literal address"),
            redis_url: None,
            redis_ca_file: None,
            redis_cluster: Vec::new(),
            allow_evicting_redis: false,
            allow_separate_ledgers: false,
            data_dir: PathBuf::from("data"),
            ledger_url: None,
            ledger_history: Duration::from_secs(30 * 24 * 3600),
            plugin_dir: PathBuf::from("target/plugins"),
            policy_dir: PathBuf::from("policies"),
            shards: 16,
            workers: 8,
            dispatch: true,
            lease: Duration::from_secs(30),
            task_retention: Duration::from_secs(7 * 24 * 3600),
            keep_ended_tasks: None,
            delivered_retention: None,
            event_index: true,
            wait_replicas: 0,
            wait_replicas_timeout: Duration::from_millis(100),
            plugin_limits: PluginLimits::default(),
            channels: BTreeMap::new(),
            auth: AuthConfig::default(),
            reconcile: ReconcileConfig::default(),
            receipts: ReceiptsConfig::default(),
            occurred_at_years: crate::derive::YearRange::default(),
            http: HttpConfig::default(),
            caps: BTreeMap::new(),
        }
    }
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

/// A TOML file that could not be read or parsed; names the file, and the line
/// and dotted field path when parsing failed. Shared by every strict TOML file
/// pushonce reads (host configuration, policies).
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The file.
        file: PathBuf,
        /// What the filesystem said.
        source: std::io::Error,
    },
    /// TOML syntax, an unknown key, a wrong type or a missing field.
    #[error("{file}:{line}: {message}")]
    Parse {
        /// The file.
        file: PathBuf,
        /// 1-based line of the offending item (1 when the parser gave no position).
        line: usize,
        /// `field.path: why`, from the parser.
        message: String,
    },
}

/// Why the host configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or parsed.
    #[error(transparent)]
    File(#[from] FileError),
    /// An environment override that does not parse.
    #[error("environment variable {var}: {reason}")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// A value that parses but cannot work.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field at fault.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// 1-based line of a byte offset in `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

impl HostConfig {
    /// Parses `text` as the configuration file `file`.
    pub fn parse(file: &Path, text: &str) -> Result<HostConfig, ConfigError> {
        Ok(parse_toml(file, text)?)
    }

    /// Loads the configuration: the file when given (or `pushonce.toml` when it
    /// exists), defaults otherwise, then the environment overrides, then checks.
    pub fn load(file: Option<&Path>) -> Result<HostConfig, ConfigError> {
        let default_file = Path::new("pushonce.toml");
        let file = file.or(default_file.exists().then_some(default_file));
        let mut config = match file {
            Some(file) => Self::parse(file, &read_file(file)?)?,
            None => HostConfig::default(),
        };
        config.apply_env(|name| std::env::var(name).ok())?;
        config.check()?;
        Ok(config)
    }

    /// Applies the `PUSHONCE_*` overrides found by `get`.
    pub(crate) fn apply_env(
        &mut self,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        if let Some(v) = get("PUSHONCE_LISTEN") {
            self.listen = v.parse().map_err(|e| ConfigError::Env {
                var: "PUSHONCE_LISTEN",
                reason: format!("`{v}` is not an address like 127.0.0.1:8080: {e}"),
            })?;
        }
        if let Some(v) = get("PUSHONCE_REDIS_URL") {
            self.redis_url = (!v.is_empty()).then_some(v);
        }
        if let Some(v) = get("PUSHONCE_REDIS_CA_FILE") {
            self.redis_ca_file = (!v.is_empty()).then(|| PathBuf::from(v));
        }
        if let Some(v) = get("PUSHONCE_LEDGER_URL") {
            self.ledger_url = (!v.is_empty()).then_some(v);
        }
        if let Some(v) = get("PUSHONCE_REDIS_CLUSTER") {
            self.redis_cluster = v
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(String::from)
                .collect();
        }
        for (var, dir) in [
            ("PUSHONCE_DATA_DIR", &mut self.data_dir),
            ("PUSHONCE_PLUGIN_DIR", &mut self.plugin_dir),
            ("PUSHONCE_POLICY_DIR", &mut self.policy_dir),
        ] {
            if let Some(v) = get(var) {
                *dir = PathBuf::from(v);
            }
        }
        Ok(())
    }

    /// The ledger's URL: `None` when it is off, else `ledger_url` or the
    /// SQLite file in `data_dir`.
    pub fn ledger(&self) -> Option<String> {
        match self.ledger_url.as_deref() {
            Some("off") => None,
            Some(url) => Some(url.to_string()),
            None => Some(crate::ledger::Ledger::sqlite_url(&self.data_dir)),
        }
    }

    /// Checks values that parse but cannot work.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.check_workers_and_plugins()?;
        self.check_reconcile()?;
        self.check_http_and_events()?;
        self.check_caps()?;
        self.check_providers()?;
        self.check_retention_and_index()?;
        self.check_redis()
    }

    /// Without the event index, event look-ups come from the ledger alone;
    /// a delivered retention and the ledger's history are positive times.
    fn check_retention_and_index(&self) -> Result<(), ConfigError> {
        if self.delivered_retention.is_some() {
            return Err(invalid(
                "delivered_retention",
                "was removed: a delivered task now leaves Redis once the delivery ledger holds it (the default); set keep_ended_tasks = \"1h\" (or longer) to keep ended tasks in Redis",
            ));
        }
        if self
            .keep_ended_tasks
            .is_some_and(|d| d < Duration::from_secs(1))
        {
            return Err(invalid("keep_ended_tasks", "must be at least 1s"));
        }
        if self.task_retention < Duration::from_secs(1) {
            return Err(invalid("task_retention", "must be at least 1s"));
        }
        if self.ledger_history < Duration::from_secs(1) {
            return Err(invalid("ledger_history", "must be at least 1s"));
        }
        if !self.event_index && self.ledger().is_none() {
            return Err(invalid(
                "event_index",
                "false needs the delivery ledger (event look-ups then come from it); ledger_url is \"off\"",
            ));
        }
        Ok(())
    }

    /// Every channel names a plugin or providers, not both; each provider is
    /// a configured single-plugin channel, named once.
    fn check_providers(&self) -> Result<(), ConfigError> {
        for (name, cfg) in &self.channels {
            let field = |f: &str| format!("channels.{name}.{f}");
            match (cfg.plugin.is_empty(), cfg.providers.is_empty()) {
                (true, true) => {
                    return Err(invalid(
                        &field("plugin"),
                        "is missing: name a channel plugin (`plugin = \"aliyun-sms@^1\"`) or provider instances (`providers = [...]`)",
                    ));
                }
                (false, false) => {
                    return Err(invalid(
                        &field("providers"),
                        "cannot be set beside `plugin`: a channel sends through one plugin, or fails over between provider instances that each name their own",
                    ));
                }
                _ => {}
            }
            for (i, provider) in cfg.providers.iter().enumerate() {
                let Some(p) = self.channels.get(provider) else {
                    return Err(invalid(
                        &field("providers"),
                        &format!("names `{provider}`, which is not a configured channel instance"),
                    ));
                };
                if !p.providers.is_empty() {
                    return Err(invalid(
                        &field("providers"),
                        &format!(
                            "names `{provider}`, which has providers of its own: a provider names a `plugin`"
                        ),
                    ));
                }
                if cfg.circuit_failures == 0 {
                    return Err(invalid(&field("circuit_failures"), "must be at least 1"));
                }
                if cfg.providers[..i].contains(provider) {
                    return Err(invalid(
                        &field("providers"),
                        &format!("names `{provider}` twice"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every cap group on its own (`max`, exactly one period).
    fn check_caps(&self) -> Result<(), ConfigError> {
        for (name, cap) in &self.caps {
            cap.check()
                .map_err(|(field, reason)| ConfigError::Invalid {
                    field: format!("caps.{name}.{field}"),
                    reason,
                })?;
        }
        Ok(())
    }

    /// Shards, workers, the lease, replica waits and the plugin limits.
    fn check_workers_and_plugins(&self) -> Result<(), ConfigError> {
        if self.shards == 0 {
            return Err(invalid("shards", "must be at least 1"));
        }
        if self.workers == 0 {
            return Err(invalid("workers", "must be at least 1"));
        }
        if self.lease < Duration::from_millis(100) {
            return Err(invalid("lease", "must be at least 100ms"));
        }
        if self.wait_replicas > 0 && self.wait_replicas_timeout < Duration::from_millis(1) {
            // `WAIT n 0` would block an accept for ever.
            return Err(invalid("wait_replicas_timeout", "must be at least 1ms"));
        }
        if self.plugin_limits.fuel < 1_000 {
            return Err(invalid("plugin_limits.fuel", "must be at least 1000"));
        }
        if self.plugin_limits.instances < 4 {
            return Err(invalid("plugin_limits.instances", "must be at least 4"));
        }
        if self.plugin_limits.memory < bytesize::ByteSize::mib(1) {
            return Err(invalid("plugin_limits.memory", "must be at least 1 MiB"));
        }
        Ok(())
    }

    /// The reconciler's pace and limits.
    fn check_reconcile(&self) -> Result<(), ConfigError> {
        let r = &self.reconcile;
        if r.every < Duration::from_millis(10) {
            return Err(invalid("reconcile.every", "must be at least 10ms"));
        }
        if r.max_checks == 0 {
            return Err(invalid("reconcile.max_checks", "must be at least 1"));
        }
        if r.batch == 0 {
            return Err(invalid("reconcile.batch", "must be at least 1"));
        }
        if r.check_timeout < Duration::from_millis(100) {
            return Err(invalid("reconcile.check_timeout", "must be at least 100ms"));
        }
        if r.backoff.factor.is_nan() || r.backoff.factor < 1.0 {
            return Err(invalid("reconcile.backoff.factor", "must be at least 1.0"));
        }
        Ok(())
    }

    /// The HTTP server's limits and the accepted years of `occurred_at`.
    fn check_http_and_events(&self) -> Result<(), ConfigError> {
        if self.http.max_connections == 0 {
            return Err(invalid("http.max_connections", "must be at least 1"));
        }
        if self.http.max_connections_per_client == 0 {
            return Err(invalid(
                "http.max_connections_per_client",
                "must be at least 1",
            ));
        }
        if self.http.max_head_bytes < 8192 {
            return Err(invalid(
                "http.max_head_bytes",
                "must be at least 8192 (hyper's smallest read buffer)",
            ));
        }
        if self.http.header_read_timeout < Duration::from_millis(10) {
            return Err(invalid("http.header_read_timeout", "must be at least 10ms"));
        }
        let years = self.occurred_at_years;
        if !(1970..=9999).contains(&years.from) || !(years.from..=9999).contains(&years.to) {
            return Err(invalid(
                "occurred_at_years",
                "needs 1970 <= from <= to <= 9999",
            ));
        }
        Ok(())
    }

    /// The Redis URL, its CA file, the cluster's node URLs, and the
    /// eviction opt-in (it needs the ledger).
    fn check_redis(&self) -> Result<(), ConfigError> {
        if self.allow_evicting_redis && self.ledger().is_none() {
            return Err(invalid(
                "allow_evicting_redis",
                "true needs the delivery ledger (it alone then refuses a key whose permit Redis evicted); ledger_url is \"off\"",
            ));
        }
        if let Some(url) = &self.redis_url {
            let known = ["redis://", "rediss://", "redis+unix://", "unix://"];
            if !known.iter().any(|p| url.starts_with(p)) {
                return Err(invalid(
                    "redis_url",
                    "must start with redis://, rediss://, redis+unix:// or unix://",
                ));
            }
        }
        if self.redis_ca_file.is_some()
            && !self
                .redis_url
                .as_deref()
                .is_some_and(|u| u.starts_with("rediss://"))
        {
            return Err(invalid(
                "redis_ca_file",
                "applies to a rediss:// redis_url only (set redis_url = \"rediss://...\")",
            ));
        }
        if !self.redis_cluster.is_empty() {
            if self.redis_url.is_some() {
                return Err(invalid(
                    "redis_cluster",
                    "set either redis_url (one Redis) or redis_cluster (a Redis Cluster), not both",
                ));
            }
            if let Some(bad) = self
                .redis_cluster
                .iter()
                .find(|u| !u.starts_with("redis://") && !u.starts_with("rediss://"))
            {
                return Err(ConfigError::Invalid {
                    field: "redis_cluster".into(),
                    reason: format!(
                        "`{}`: every node URL must start with redis:// or rediss:// (host:port)",
                        bad.split('@').next_back().unwrap_or_default()
                    ),
                });
            }
        }
        Ok(())
    }

    /// The Redis this configuration names: a cluster, one URL, or the
    /// embedded server under `<data_dir>/redis`.
    pub(crate) fn redis_target(&self) -> crate::store::RedisTarget {
        use crate::store::RedisTarget;
        match (&self.redis_url, self.redis_cluster.is_empty()) {
            (None, false) => RedisTarget::Cluster(self.redis_cluster.clone()),
            (Some(url), _) => match &self.redis_ca_file {
                Some(ca_file) => RedisTarget::TlsUrl {
                    url: url.clone(),
                    ca_file: ca_file.clone(),
                },
                None => RedisTarget::Url(url.clone()),
            },
            (None, true) => RedisTarget::Embedded {
                data_dir: self.data_dir.join("redis"),
            },
        }
    }

    /// Refuses a listen address beyond loopback while `/v1` or `/admin` has
    /// no token (read through `env`), unless `http.allow_open_network`.
    pub fn check_exposure(
        &self,
        listen: SocketAddr,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        if listen.ip().is_loopback() || self.http.allow_open_network {
            return Ok(());
        }
        let set =
            |var: &Option<String>| var.as_deref().and_then(&env).is_some_and(|v| !v.is_empty());
        let missing: Vec<&str> = [
            ("auth.api_token_env", &self.auth.api_token_env),
            ("auth.admin_token_env", &self.auth.admin_token_env),
        ]
        .into_iter()
        .filter(|(_, var)| !set(var))
        .map(|(name, _)| name)
        .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(ConfigError::Invalid {
            field: "listen".into(),
            reason: format!(
                "{listen} is reachable beyond this machine and {} gives no token (unset, or its \
                 variable empty), so /v1 or /admin would be open to the network: set it to a \
                 variable holding a token, listen on 127.0.0.1, or set \
                 http.allow_open_network = true",
                missing.join(" / "),
            ),
        })
    }

    /// Where compiled plugins are cached.
    pub fn cache_dir(&self) -> PathBuf {
        self.data_dir.join("cache")
    }
}

/// Reads a text file (a regular file of at most 1 MiB), naming it in the error.
pub(crate) fn read_file(file: &Path) -> Result<String, FileError> {
    crate::files::read_text_file(file).map_err(|source| FileError::Read {
        file: file.to_path_buf(),
        source,
    })
}

/// Deserialises the TOML `text` of `file` strictly, naming the line and the
/// dotted path of the field at fault (serde_path_to_error), so operators see
/// `file:line: field.path: why`.
pub(crate) fn parse_toml<T: serde::de::DeserializeOwned>(
    file: &Path,
    text: &str,
) -> Result<T, FileError> {
    let error = |line: usize, message: String| FileError::Parse {
        file: file.to_path_buf(),
        line,
        message,
    };
    let de = toml::de::Deserializer::parse(text).map_err(|e| {
        error(
            e.span().map(|s| line_of(text, s.start)).unwrap_or(1),
            e.message().trim().to_string(),
        )
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.message().trim().to_string();
        error(
            inner.span().map(|s| line_of(text, s.start)).unwrap_or(1),
            if path == "." || message.contains(&format!("`{path}`")) {
                message
            } else {
                format!("{path}: {message}")
            },
        )
    })
}

/// A configuration value that parses but cannot work.
fn invalid(field: &str, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatch_defaults_to_on_and_can_be_switched_off() {
        let file = Path::new("pushonce.toml");
        assert!(HostConfig::parse(file, "workers = 4\n").unwrap().dispatch);
        let api_only = HostConfig::parse(file, "dispatch = false\n").unwrap();
        assert!(!api_only.dispatch);
        api_only.check().unwrap();
    }

    #[test]
    fn redis_cluster_from_file_and_env_and_never_with_redis_url() {
        let file = Path::new("pushonce.toml");
        let mut c = HostConfig::parse(
            file,
            "redis_cluster = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]\n",
        )
        .unwrap();
        c.check().unwrap();
        assert!(matches!(
            c.redis_target(),
            crate::store::RedisTarget::Cluster(urls) if urls.len() == 2
        ));
        c.apply_env(|v| {
            (v == "PUSHONCE_REDIS_CLUSTER")
                .then(|| "redis://10.0.0.1:7000, redis://10.0.0.2:7000".into())
        })
        .unwrap();
        assert_eq!(
            c.redis_cluster,
            ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]
        );
        c.redis_url = Some("redis://127.0.0.1:6379".into());
        let err = c.check().unwrap_err().to_string();
        assert!(
            err.starts_with("redis_cluster:") && err.contains("not both"),
            "{err}"
        );
        c.redis_url = None;
        c.redis_cluster = vec!["redis+unix:///tmp/r.sock".into()];
        let err = c.check().unwrap_err().to_string();
        assert!(err.contains("redis://"), "{err}");
        c.apply_env(|v| (v == "PUSHONCE_REDIS_CLUSTER").then(String::new))
            .unwrap();
        assert!(
            c.redis_cluster.is_empty(),
            "an empty value means no cluster"
        );
    }

    #[test]
    fn ended_tasks_leave_redis_by_default_and_keeping_them_is_an_opt_in() {
        let file = Path::new("pushonce.toml");
        let default = HostConfig::parse(file, "").unwrap();
        default.check().unwrap();
        assert_eq!(default.keep_ended_tasks, None);
        assert_eq!(crate::service::permit_config(&default).keep_ended, None);
        let kept = HostConfig::parse(file, "keep_ended_tasks = \"7d\"\n").unwrap();
        kept.check().unwrap();
        assert_eq!(
            crate::service::permit_config(&kept).keep_ended,
            Some(Duration::from_secs(7 * 24 * 3600))
        );
        let err = HostConfig::parse(file, "keep_ended_tasks = \"10ms\"\n")
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("keep_ended_tasks:") && err.contains("at least 1s"),
            "{err}"
        );
        let err = HostConfig::parse(file, "delivered_retention = \"1h\"\n")
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("delivered_retention:") && err.contains("keep_ended_tasks"),
            "{err}"
        );
        let err = HostConfig::parse(file, "task_retention = \"1ms\"\n")
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("task_retention:"), "{err}");
    }

    #[test]
    fn ledger_history_defaults_to_30_days_and_is_at_least_a_second() {
        let file = Path::new("pushonce.toml");
        let default = HostConfig::parse(file, "").unwrap();
        assert_eq!(default.ledger_history, Duration::from_secs(30 * 24 * 3600));
        let short = HostConfig::parse(file, "ledger_history = \"5s\"\n").unwrap();
        assert_eq!(short.ledger_history, Duration::from_secs(5));
        short.check().unwrap();
        let err = HostConfig::parse(file, "ledger_history = \"500ms\"\n")
            .unwrap()
            .check()
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("ledger_history:") && err.contains("at least 1s"),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_names_file_line_and_field() {
        let err = HostConfig::parse(
            Path::new("pushonce.toml"),
            "shards = 4\n[channels.sms]\nplugin = \"sms@^1\"\nallowed_host = [\"x\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("pushonce.toml:4: "), "{err}");
        assert!(err.contains("allowed_host"), "{err}");
    }

    #[test]
    fn wrong_type_names_the_field_path() {
        let err = HostConfig::parse(
            Path::new("pushonce.toml"),
            "[plugin_limits]\nmemory = \"lots\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("pushonce.toml:2: plugin_limits.memory: "),
            "{err}"
        );
    }

    #[test]
    fn environment_overrides_the_file() {
        let mut c = HostConfig::parse(
            Path::new("pushonce.toml"),
            "listen = \"127.0.0.1:9000\"\nredis_url = \"redis://127.0.0.1:1/\"\n",
        )
        .unwrap();
        c.apply_env(|v| match v {
            "PUSHONCE_LISTEN" => Some("127.0.0.1:9100".into()),
            "PUSHONCE_REDIS_URL" => Some(String::new()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.listen.port(), 9100);
        assert_eq!(c.redis_url, None, "an empty URL means the embedded Redis");
        let bad = c.apply_env(|v| (v == "PUSHONCE_LISTEN").then(|| "nowhere".into()));
        assert!(bad.unwrap_err().to_string().contains("PUSHONCE_LISTEN"));
    }

    #[test]
    fn a_channel_with_providers_names_configured_single_plugin_channels() {
        let parse = |text: &str| {
            HostConfig::parse(Path::new("pushonce.toml"), text).and_then(|c| c.check().map(|_| c))
        };
        let ok = parse(
            "[channels.sms]\nproviders = [\"sms-aliyun\", \"sms-tencent\"]\n\
             [channels.sms-aliyun]\nplugin = \"aliyun-sms@^1\"\n\
             [channels.sms-tencent]\nplugin = \"tencent-sms@^1\"\n",
        )
        .unwrap();
        assert_eq!(ok.channels["sms"].providers, ["sms-aliyun", "sms-tencent"]);
        for (text, says) in [
            (
                "[channels.sms]\nproviders = [\"nope\"]\n",
                "not a configured channel",
            ),
            (
                "[channels.sms]\nplugin = \"a@^1\"\nproviders = [\"b\"]\n[channels.b]\nplugin = \"b@^1\"\n",
                "beside `plugin`",
            ),
            ("[channels.sms]\nsettings = {}\n", "plugin: is missing"),
            (
                "[channels.sms]\nproviders = [\"b\", \"b\"]\n[channels.b]\nplugin = \"b@^1\"\n",
                "twice",
            ),
        ] {
            let err = parse(text).unwrap_err().to_string();
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    #[test]
    fn checks_refuse_values_that_cannot_work() {
        let c = HostConfig {
            redis_url: Some("http://127.0.0.1".into()),
            ..HostConfig::default()
        };
        assert!(c.check().unwrap_err().to_string().starts_with("redis_url:"));
        let c = HostConfig {
            shards: 0,
            ..HostConfig::default()
        };
        assert!(c.check().unwrap_err().to_string().starts_with("shards:"));
        let mut c = HostConfig::default();
        c.reconcile.max_checks = 0;
        let err = c.check().unwrap_err().to_string();
        assert!(err.starts_with("reconcile.max_checks:"), "{err}");
        let c = HostConfig {
            event_index: false,
            ledger_url: Some("off".into()),
            ..HostConfig::default()
        };
        let err = c.check().unwrap_err().to_string();
        assert!(
            err.starts_with("event_index: false needs the delivery ledger"),
            "{err}"
        );
        let c = HostConfig {
            event_index: false,
            ..HostConfig::default()
        };
        c.check().unwrap();
        let c = HostConfig {
            allow_evicting_redis: true,
            ledger_url: Some("off".into()),
            ..HostConfig::default()
        };
        let err = c.check().unwrap_err().to_string();
        assert!(
            err.starts_with("allow_evicting_redis: true needs the delivery ledger"),
            "{err}"
        );
    }

    #[test]
    fn http_and_occurred_at_years_are_read_and_checked() {
        let file = Path::new("pushonce.toml");
        let c = HostConfig::parse(
            file,
            "occurred_at_years = { from = 2010, to = 2030 }\n[http]\nheader_read_timeout = \"2s\"\nmax_connections = 8\n",
        )
        .unwrap();
        c.check().unwrap();
        assert_eq!(c.occurred_at_years.from, 2010);
        assert_eq!(c.http.header_read_timeout, Duration::from_secs(2));
        assert_eq!(c.http.max_connections, 8);
        assert!(!c.http.allow_open_network);
        for (text, field) in [
            (
                "occurred_at_years = { from = 2100, to = 2000 }\n",
                "occurred_at_years:",
            ),
            ("[http]\nmax_connections = 0\n", "http.max_connections:"),
            ("redis_ca_file = \"/ca.pem\"\n", "redis_ca_file:"),
        ] {
            let c = HostConfig::parse(file, text).unwrap();
            let err = c.check().unwrap_err().to_string();
            assert!(err.starts_with(field), "{err}");
        }
    }

    #[test]
    fn reconcile_table_reads_durations_and_refuses_unknown_keys() {
        let c = HostConfig::parse(
            Path::new("pushonce.toml"),
            "[reconcile]\nunknown_age = \"2s\"\nmax_checks = 3\n[reconcile.backoff]\ninitial = \"1s\"\n",
        )
        .unwrap();
        assert_eq!(c.reconcile.unknown_age, Duration::from_secs(2));
        assert_eq!(c.reconcile.max_checks, 3);
        assert_eq!(
            c.reconcile.sent_age,
            Duration::from_secs(600),
            "default kept"
        );
        let b = &c.reconcile.backoff;
        assert_eq!(b.delay_after(1), Duration::from_secs(1));
        assert_eq!(b.delay_after(3), Duration::from_secs(4));
        assert_eq!(b.delay_after(40), b.max);
        let err = HostConfig::parse(Path::new("pushonce.toml"), "[reconcile]\nevery_ = \"1s\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("pushonce.toml:2: "), "{err}");
    }
}

#[cfg(test)]
mod example {
    use super::*;

    #[test]
    fn the_repository_pushonce_toml_is_valid() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pushonce.toml");
        let text = std::fs::read_to_string(&file).unwrap();
        let config = HostConfig::parse(&file, &text).unwrap_or_else(|e| panic!("{e}"));
        config.check().unwrap();
        let channels: Vec<&str> = config.channels.keys().map(String::as_str).collect();
        assert_eq!(
            channels,
            ["apns", "app-push", "inbox", "sms", "webhook", "wechat"]
        );
    }
}
