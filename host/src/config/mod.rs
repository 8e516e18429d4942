//! Host configuration: `pushonce.toml`, then environment overrides for URLs,
//! directories and secrets (`PUSHONCE_*`). Strict: an unknown key is an error
//! naming the file and line. Secrets are never stored here, only the names of
//! the environment variables that hold them.

mod channel;
mod check;
mod preferences;
mod sections;
#[cfg(test)]
mod tests;
mod unsubscribe;

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use channel::{ChannelConfig, OnUnknown, OutboundConfigError};
pub use preferences::{PreferencesConfig, check_category};
pub use sections::{
    AuthConfig, HttpConfig, PluginLimits, ReceiptsConfig, ReconcileBackoff, ReconcileConfig,
};
pub use unsubscribe::UnsubscribeConfig;

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
    /// Most ready entries a worker batch takes from one shard per read
    /// (default 16; at most `workers` are in flight): a batch's tasks are
    /// begun, claimed in the ledger, marked and recorded with one call
    /// each, and sent at once. Each task keeps its own lease and outcome;
    /// 1 handles every message alone.
    pub dispatch_batch: usize,
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
    /// also those that have not reached a send attempt, from the event's
    /// records in Redis (which are its index: key layout 5). `false`: that
    /// look-up lists the tasks the delivery ledger has, i.e. those that
    /// reached a send attempt, and cancelling is refused; since layout 5 it
    /// saves no Redis memory or work (it did when the index was a key of its
    /// own). Needs the ledger (refused with `ledger_url = "off"`).
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
    pub occurred_at_years: crate::event::YearRange,
    /// How far from now an event's `send_at` may be, e.g.
    /// `{ grace = "5m", horizon = "30d" }` (the default): more than `grace`
    /// in the past or more than `horizon` ahead is refused with 422 naming
    /// `send_at` and the bound.
    pub send_at: crate::event::SendAtBounds,
    /// The HTTP listener: exposure, header timeout, connection cap.
    pub http: HttpConfig,
    /// Named frequency-cap groups (`[caps.marketing]`) that policies share
    /// through `cap_groups = ["marketing"]`: one count per user (and
    /// channel) across every business type naming the group (`docs/caps.md`).
    pub caps: BTreeMap<String, crate::caps::CapSpec>,
    /// Recipient preferences: mandatory categories, the cache's bound, who
    /// may change them (`docs/preferences.md`).
    pub preferences: PreferencesConfig,
    /// One-click unsubscribe links: their secret, URL and lifetime
    /// (`docs/preferences.md`).
    pub unsubscribe: UnsubscribeConfig,
    /// Not a setting: the file this configuration was read from and its
    /// settings then (none when built in code). A reload applies plugins
    /// and policies only; it compares the file with these to say which
    /// edits wait for a restart ([`HostConfig::edited_since_start`]).
    #[serde(skip)]
    pub source: Option<(PathBuf, toml::Table)>,
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
            dispatch_batch: crate::dispatch::DEFAULT_BATCH,
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
            occurred_at_years: crate::event::YearRange::default(),
            send_at: crate::event::SendAtBounds::default(),
            http: HttpConfig::default(),
            caps: BTreeMap::new(),
            preferences: PreferencesConfig::default(),
            unsubscribe: UnsubscribeConfig::default(),
            source: None,
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

/// The keys of `then` and `now` whose values differ, prefixed by `prefix`;
/// top-level tables are compared entry by entry.
fn edited(then: &toml::Table, now: &toml::Table, prefix: &str) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = then.keys().chain(now.keys()).collect();
    let mut out = Vec::new();
    for key in keys {
        match (then.get(key), now.get(key)) {
            (a, b) if a == b => {}
            (Some(toml::Value::Table(a)), Some(toml::Value::Table(b))) if prefix.is_empty() => {
                out.extend(edited(a, b, &format!("{key}.")));
            }
            _ => out.push(format!("{prefix}{key}")),
        }
    }
    out
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
            Some(file) => {
                let text = read_file(file)?;
                let mut config = Self::parse(file, &text)?;
                config.source = text.parse().ok().map(|t| (file.to_path_buf(), t));
                config
            }
            None => HostConfig::default(),
        };
        config.apply_env(|name| std::env::var(name).ok())?;
        config.check()?;
        Ok(config)
    }

    /// The settings of the file this configuration was read from that were
    /// edited since (a table's entries one level down, e.g. `channels.sms`,
    /// `plugin_limits.fuel`), in order: only a restart applies them. Empty when
    /// it was not read from a file or is unchanged; an error when the file
    /// cannot be read or parsed now (a restart would fail too).
    pub fn edited_since_start(&self) -> Result<Vec<String>, String> {
        let Some((file, then)) = &self.source else {
            return Ok(Vec::new());
        };
        let text = read_file(file).map_err(|e| e.to_string())?;
        let now: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| format!("{}: {}", file.display(), e.message()))?;
        Ok(edited(then, &now, ""))
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
