//! One channel instance of `pushonce.toml` (`[channels.<name>]`): its plugin,
//! credentials, outbound limits and retry rules.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

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

    /// The channel instances a message of this channel (`name`) is sent
    /// through: its provider instances, or itself when it names none.
    pub fn sent_through<'a>(&'a self, name: &'a str) -> Vec<&'a str> {
        if self.providers.is_empty() {
            vec![name]
        } else {
            self.providers.iter().map(String::as_str).collect()
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
