//! `PluginSender`: the [`Sender`] that sends through channel plugins.
//!
//! One `ChannelRuntime` per configured channel instance holds its settings
//! (secrets read from the environment once, at construction), its outbound
//! policy and pooled HTTP client, a concurrency limit and a rate limit. A send
//! resolves the plugin — the version the task recorded at accept
//! (`payload.plugin`), else the channel's requirement — against the *current*
//! registry (a closure, so a hot swap is seen by the next send), binds it to
//! the channel's settings (a `ChannelInstance`, cached per plugin file), and
//! maps the plugin's answer to a [`SendOutcome`]. A call that traps or runs
//! out of time is `Unknown` when one of its requests may have reached the
//! provider, else `Retryable`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::circuit::{CircuitConfig, CircuitState, Circuits, ProviderHealth};
use super::providers::{Handover, handover};
use super::redact::Redactor;
use super::{
    BoxFuture, Check, NO_STATUS_QUERY, OutgoingMessage, Payload, SendOutcome, Sender,
    UnknownVerdict,
};
use crate::config::OutboundConfigError;
use crate::config::{ChannelConfig, OnUnknown};
use crate::plugin::bindings::{Capabilities, DeliveryStatus, Message, SendError, SentMessage};
use crate::plugin::cache_import::SharedCache;
use crate::plugin::channel::{ChannelCallError, ChannelInstance, ChannelSettings};
use crate::plugin::{HttpClient, OutboundLog, PluginRegistry};
use crate::store::RedisConn;

/// Where the current plugin registry comes from (e.g. `route::Live::current().registry`).
pub(crate) type RegistrySource = Arc<dyn Fn() -> Arc<PluginRegistry> + Send + Sync>;

/// Why a `PluginSender` cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum SenderSetupError {
    /// A secret's environment variable is not set (its value is never shown).
    #[error(
        "channel {channel}: setting `{setting}` reads environment variable {var}, which is not set"
    )]
    MissingSecret {
        /// The channel instance.
        channel: String,
        /// The setting.
        setting: String,
        /// The variable.
        var: String,
    },
    /// The callback path token is guessable (its value is never shown).
    #[error(
        "channel {channel}: environment variable {var} (`callback_token_env`) holds a weak callback path token: {why}; make one with `openssl rand -hex 16`"
    )]
    WeakCallbackToken {
        /// The channel instance.
        channel: String,
        /// The variable.
        var: String,
        /// What is weak about it.
        why: String,
    },
    /// An `allowed_hosts` entry does not parse, or `ca_file` cannot be used.
    #[error("channel {channel}: {source}")]
    AllowedHost {
        /// The channel instance.
        channel: String,
        /// What is wrong.
        source: OutboundConfigError,
    },
}

/// How a channel's callback route may be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallbackAccess<'a> {
    /// Only at `/v1/receipts/<channel>/<token>`.
    Token(&'a str),
    /// At `/v1/receipts/<channel>` (`open_callbacks = true`).
    Open,
    /// Not at all (no token configured, not opened).
    Closed,
}

/// Why no plugin instance could be had for a channel.
#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    /// No channel instance of this name is configured.
    #[error("no channel instance named `{0}` is configured")]
    UnknownChannel(String),
    /// The plugin is not loaded.
    #[error("channel {channel}: {reason}")]
    Plugin {
        /// The channel instance.
        channel: String,
        /// The resolver's explanation.
        reason: String,
    },
}

/// A rate limit: one send every `1/qps`, spaced (no bursts).
struct RateLimit {
    /// Time between two sends.
    every: Duration,
    /// When the next send may start.
    next: Mutex<tokio::time::Instant>,
}

impl RateLimit {
    async fn wait(&self) {
        let at = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let now = tokio::time::Instant::now();
            let at = (*next).max(now);
            *next = at + self.every;
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

/// One configured channel instance.
struct ChannelRuntime {
    /// Its name (what policies list).
    name: String,
    /// Its plugin requirement, `name@req`.
    requirement: String,
    /// What to do after an unresolvable `unknown`.
    on_unknown: OnUnknown,
    /// Settings, policy, client and budgets its plugin calls get.
    settings: ChannelSettings,
    /// Sends in flight at once.
    slots: Arc<Semaphore>,
    /// Sends per second, if limited.
    rate: Option<RateLimit>,
    /// Plugin instances bound to this channel, by `name@version` and file hash.
    instances: Mutex<HashMap<String, Arc<ChannelInstance>>>,
    /// Capabilities answered per plugin instance key.
    capabilities: Mutex<HashMap<String, Capabilities>>,
    /// The channel's secrets, redacted from whatever its plugin says.
    redactor: Redactor,
    /// The callback path token (`callback_token_env`); never logged.
    callback_token: Option<String>,
    /// `open_callbacks`: serve callbacks without a path token.
    open_callbacks: bool,
}

/// Sends through channel plugins. Cheap to share as `Arc<PluginSender>`.
pub struct PluginSender {
    /// Channel instances by name.
    channels: BTreeMap<String, Arc<ChannelRuntime>>,
    /// Channels that fail over between provider instances (`providers`):
    /// their provider instances in order (each one of `channels`).
    chains: BTreeMap<String, Vec<String>>,
    /// The circuits of each such channel's providers, in this process.
    circuits: BTreeMap<String, Arc<Circuits>>,
    /// The current registry.
    registry: RegistrySource,
}

impl std::fmt::Debug for PluginSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginSender")
            .field("channels", &self.channels.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl ChannelRuntime {
    /// The runtime of channel instance `name`: its settings with secrets
    /// filled in from `env`, its outbound policy, slots and rate limit.
    fn from_config(
        name: &str,
        cfg: &ChannelConfig,
        env: &impl Fn(&str) -> Option<String>,
    ) -> Result<ChannelRuntime, SenderSetupError> {
        let (config, mut secrets) = settings_with_secrets(name, cfg, env)?;
        let callback_token = callback_token(name, cfg, env)?;
        secrets.extend(callback_token.clone());
        let policy = cfg
            .outbound_policy()
            .map_err(|source| SenderSetupError::AllowedHost {
                channel: name.to_string(),
                source,
            })?;
        let settings = ChannelSettings {
            config: Arc::new(config),
            client: HttpClient::new(&policy),
            policy: Arc::new(policy),
            call_timeout: cfg.call_timeout,
            warm_instances: cfg.concurrency.clamp(1, 64),
            cache: None,
        };
        Ok(ChannelRuntime {
            name: name.to_string(),
            requirement: cfg.plugin.clone(),
            on_unknown: cfg.on_unknown,
            settings,
            slots: Arc::new(Semaphore::new(cfg.concurrency.max(1))),
            rate: rate_limit(cfg.rate_limit),
            instances: Mutex::new(HashMap::new()),
            capabilities: Mutex::new(HashMap::new()),
            redactor: Redactor::new(secrets.iter().map(String::as_str)),
            callback_token,
            open_callbacks: cfg.open_callbacks,
        })
    }
}

/// The plugin's settings with each `secrets_from_env` setting read from
/// `env`, and the secret values (for redaction).
fn settings_with_secrets(
    name: &str,
    cfg: &ChannelConfig,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<(HashMap<String, String>, Vec<String>), SenderSetupError> {
    let mut config: HashMap<String, String> = cfg.settings.clone().into_iter().collect();
    let mut secrets = Vec::new();
    for (setting, var) in &cfg.secrets_from_env {
        let value = env(var).ok_or_else(|| SenderSetupError::MissingSecret {
            channel: name.to_string(),
            setting: setting.clone(),
            var: var.clone(),
        })?;
        secrets.push(value.clone());
        config.insert(setting.clone(), value);
    }
    Ok((config, secrets))
}

/// The token the provider's callbacks must carry, read from
/// `callback_token_env` when the channel names one (empty counts as
/// missing, a guessable one is refused: `send::path_token::path_token_weakness`).
fn callback_token(
    name: &str,
    cfg: &ChannelConfig,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Option<String>, SenderSetupError> {
    let Some(var) = &cfg.callback_token_env else {
        return Ok(None);
    };
    let token =
        env(var)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| SenderSetupError::MissingSecret {
                channel: name.to_string(),
                setting: "callback_token_env".into(),
                var: var.clone(),
            })?;
    if let Some(why) = super::path_token::path_token_weakness(&token) {
        return Err(SenderSetupError::WeakCallbackToken {
            channel: name.to_string(),
            var: var.clone(),
            why,
        });
    }
    Ok(Some(token))
}

/// The pacing of a channel's sends at `per_second` (none when 0).
fn rate_limit(per_second: f64) -> Option<RateLimit> {
    (per_second > 0.0).then(|| RateLimit {
        every: Duration::from_secs_f64(1.0 / per_second),
        next: Mutex::new(tokio::time::Instant::now()),
    })
}

impl PluginSender {
    /// A sender for the channel instances `channels`, resolving plugins in
    /// `registry()`; secrets are read with `env` (e.g. `|v| std::env::var(v).ok()`).
    pub fn new(
        channels: &BTreeMap<String, ChannelConfig>,
        registry: RegistrySource,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<PluginSender, SenderSetupError> {
        let mut out = BTreeMap::new();
        let mut chains = BTreeMap::new();
        let mut circuits = BTreeMap::new();
        for (name, cfg) in channels {
            if !cfg.providers.is_empty() {
                chains.insert(name.clone(), cfg.providers.clone());
                let config = CircuitConfig {
                    failures: cfg.circuit_failures.max(1),
                    open_for: cfg.circuit_open,
                };
                circuits.insert(name.clone(), Arc::new(Circuits::new(config)));
                continue;
            }
            out.insert(
                name.clone(),
                Arc::new(ChannelRuntime::from_config(name, cfg, &env)?),
            );
        }
        Ok(PluginSender {
            channels: out,
            chains,
            circuits,
            registry,
        })
    }

    /// Gives every channel instance its shared cache in Redis (`conn`,
    /// namespace `namespace`); before that, the cache answers `unavailable`.
    pub fn with_shared_cache(mut self, conn: &RedisConn, namespace: &str) -> PluginSender {
        for (name, rt) in self.channels.iter_mut() {
            if let Some(rt) = Arc::get_mut(rt) {
                rt.settings.cache = Some(SharedCache::new(conn.clone(), namespace, name));
            }
        }
        self
    }

    /// `channel`'s secrets redacted from `text` (unknown channel: unchanged).
    pub(crate) fn redact(&self, channel: &str, text: &str) -> String {
        match self.channels.get(channel) {
            Some(rt) => rt.redact(text),
            None => text.to_string(),
        }
    }

    /// How `channel`'s callbacks are reached: its path token, or open.
    pub fn callback_access(&self, channel: &str) -> Option<CallbackAccess<'_>> {
        let rt = self.channels.get(channel)?;
        Some(match &rt.callback_token {
            Some(token) => CallbackAccess::Token(token),
            None if rt.open_callbacks => CallbackAccess::Open,
            None => CallbackAccess::Closed,
        })
    }

    /// The configured channel instance names.
    pub fn channels(&self) -> impl Iterator<Item = &str> {
        self.channels.keys().map(String::as_str)
    }

    /// The plugin instance for `channel`: the exact `name@version` in
    /// `pinned` when it is still loaded, else the channel's requirement.
    pub fn instance(
        &self,
        channel: &str,
        pinned: Option<&str>,
    ) -> Result<Arc<ChannelInstance>, InstanceError> {
        let rt = self
            .channels
            .get(channel)
            .ok_or_else(|| InstanceError::UnknownChannel(channel.to_string()))?;
        rt.instance(&(self.registry)(), pinned)
    }

    /// What `channel`'s current plugin offers after an unknown outcome.
    pub async fn capabilities(
        &self,
        channel: &str,
        pinned: Option<&str>,
    ) -> Result<Capabilities, InstanceError> {
        let rt = self
            .channels
            .get(channel)
            .ok_or_else(|| InstanceError::UnknownChannel(channel.to_string()))?;
        let inst = rt.instance(&(self.registry)(), pinned)?;
        Ok(rt.capabilities_of(&inst).await)
    }

    /// The channel instance `msg` is sent through: its channel's, or on a
    /// channel with providers the task's provider (the first when it has none).
    fn instance_name<'a>(&'a self, msg: &'a OutgoingMessage) -> &'a str {
        match self.chains.get(&msg.channel) {
            Some(chain) => msg
                .provider
                .as_deref()
                .filter(|p| chain.iter().any(|c| c == p))
                .or(chain.first().map(String::as_str))
                .unwrap_or(&msg.channel),
            None => &msg.channel,
        }
    }

    /// Sends `msg`; with the outcome, whether the next provider may take it
    /// over (`super::providers::handover`).
    async fn send_one(&self, msg: &OutgoingMessage) -> (SendOutcome, Handover) {
        let name = self.instance_name(msg);
        let Some(rt) = self.channels.get(name) else {
            return (
                SendOutcome::Permanent(format!("no channel instance named `{name}` is configured")),
                Handover::Stays,
            );
        };
        let payload: Payload = match serde_json::from_str(&msg.payload) {
            Ok(p) => p,
            Err(e) => {
                return (
                    SendOutcome::Permanent(format!("the task's payload is not valid: {e}")),
                    Handover::Stays,
                );
            }
        };
        let pinned = self.pin(msg, payload.plugin.as_deref());
        let inst = match rt.instance(&(self.registry)(), pinned) {
            Ok(i) => i,
            Err(e) => {
                let outcome = SendOutcome::retryable(e.to_string());
                return (outcome, Handover::NotTaken("its plugin is not loaded"));
            }
        };
        let plugin_name = inst.plugin().meta().name.clone();
        let _slot = rt.slots.acquire().await;
        if let Some(rate) = &rt.rate {
            rate.wait().await;
        }
        let message = Message {
            task_id: msg.task_id.clone(),
            idempotency_key: msg.idempotency_key.clone(),
            recipient: payload.recipient,
            template: payload.template,
            params: payload.params,
            attempt: msg.attempt,
        };
        match inst.send(message).await {
            Ok(answer) => {
                let log = answer.log;
                let written = log.may_have_sent();
                let outcome = match answer.value {
                    Ok(receipt) => SendOutcome::Sent {
                        provider_message_id: rt.redact(&receipt.provider_message_id),
                        reference: receipt.reference.map(|r| rt.redact(&r)),
                    },
                    Err(SendError::Retryable(r)) => SendOutcome::Retryable {
                        reason: rt.redact(&explain(r.reason, &log)),
                        after: r.after_ms.map(Duration::from_millis),
                    },
                    Err(SendError::Permanent(r)) => {
                        SendOutcome::Permanent(rt.redact(&explain(r, &log)))
                    }
                    Err(SendError::Unknown(r)) => {
                        SendOutcome::Unknown(rt.redact(&explain(r, &log)))
                    }
                };
                let handover = handover(&plugin_name, &outcome, written);
                self.report_health(msg, name, &outcome, written);
                (outcome, handover)
            }
            Err(e) => {
                let written = e.log.may_have_sent();
                let outcome = failed_call(rt, e);
                let handover = handover(&plugin_name, &outcome, written);
                self.report_health(msg, name, &outcome, written);
                (outcome, handover)
            }
        }
    }

    /// Feeds the circuit of `provider` (on a channel with providers).
    fn report_health(
        &self,
        msg: &OutgoingMessage,
        provider: &str,
        outcome: &SendOutcome,
        written: bool,
    ) {
        if let Some(circuits) = self.circuits.get(&msg.channel) {
            circuits.report_outcome(&msg.channel, provider, outcome, written);
        }
    }

    /// The circuits of every channel with providers, in this process (for
    /// `/admin/providers` and the console).
    pub fn provider_health(&self) -> ProviderHealth {
        ProviderHealth::new(
            self.circuits
                .iter()
                .map(|(channel, circuits)| {
                    let chain = self.chains.get(channel).cloned().unwrap_or_default();
                    (channel.clone(), chain, circuits.clone())
                })
                .collect(),
        )
    }

    /// How `provider`'s circuit on `channel` stands in this process (closed
    /// when the channel has no providers).
    pub fn circuit_state(&self, channel: &str, provider: &str) -> CircuitState {
        self.circuits
            .get(channel)
            .map_or(CircuitState::Closed, |c| c.state(provider))
    }

    /// The channel runtime and plugin instance of `msg` (pinned version when still loaded).
    fn runtime_of(
        &self,
        msg: &OutgoingMessage,
    ) -> Result<(&Arc<ChannelRuntime>, Arc<ChannelInstance>), InstanceError> {
        let name = self.instance_name(msg);
        let rt = self
            .channels
            .get(name)
            .ok_or_else(|| InstanceError::UnknownChannel(name.to_string()))?;
        let pinned = serde_json::from_str::<Payload>(&msg.payload)
            .ok()
            .and_then(|p| p.plugin);
        let inst = rt.instance(&(self.registry)(), self.pin(msg, pinned.as_deref()))?;
        Ok((rt, inst))
    }

    /// The plugin version a task pinned at accept, for a single-plugin
    /// channel; none on a channel with providers, whose provider instances
    /// each resolve their own plugin (a pin written while the channel had
    /// one plugin must not run another provider's instance).
    fn pin<'a>(&self, msg: &OutgoingMessage, pinned: Option<&'a str>) -> Option<&'a str> {
        if self.chains.contains_key(&msg.channel) {
            None
        } else {
            pinned
        }
    }

    /// Asks the provider through the plugin's `query`, if it has one. An
    /// `unknown` answer earlier than the provider's query lag after the last
    /// attempt is not believed: it cannot tell (asked again later).
    async fn query(
        &self,
        rt: &ChannelRuntime,
        inst: &ChannelInstance,
        msg: &OutgoingMessage,
    ) -> Check {
        let caps = rt.capabilities_of(inst).await;
        if !caps.can_query {
            return Check::CannotTell(format!("channel {} {NO_STATUS_QUERY}", rt.name));
        }
        let Ok(payload) = serde_json::from_str::<Payload>(&msg.payload) else {
            return Check::CannotTell("the task's payload is not valid".into());
        };
        let sent = SentMessage {
            task_id: msg.task_id.clone(),
            idempotency_key: msg.idempotency_key.clone(),
            recipient: payload.recipient,
            template: payload.template,
            reference: msg.reference.clone(),
            provider_message_id: msg.provider_message_id.clone(),
            first_attempt_ms: msg.first_attempt_ms,
            last_attempt_ms: msg.last_attempt_ms,
        };
        let _slot = rt.slots.acquire().await;
        match inst.query(sent).await {
            Ok(a) => match a.value {
                Ok(DeliveryStatus::Delivered) => Check::Delivered,
                Ok(DeliveryStatus::Pending) => Check::Accepted,
                Ok(DeliveryStatus::Failed) => Check::Failed,
                Ok(DeliveryStatus::Unknown) => {
                    absent_unless_lagging(msg, &caps, rt.settings.call_timeout)
                }
                Err(e) => {
                    let why = rt.redact(&format!("status query failed: {}", error_text(&e)));
                    tracing::info!(task = %msg.task_id, error = %why, "status query failed");
                    Check::CannotTell(why)
                }
            },
            Err(e) => {
                let why = rt.redact(&format!("status query failed: {e}"));
                tracing::warn!(task = %msg.task_id, error = %why, "status query failed");
                Check::CannotTell(why)
            }
        }
    }

    async fn check_one(&self, msg: &OutgoingMessage, provider_message_id: Option<&str>) -> Check {
        let msg = OutgoingMessage {
            provider_message_id: provider_message_id
                .map(str::to_string)
                .or_else(|| msg.provider_message_id.clone()),
            ..msg.clone()
        };
        match self.runtime_of(&msg) {
            Ok((rt, inst)) => self.query(rt, &inst, &msg).await,
            Err(e) => Check::CannotTell(e.to_string()),
        }
    }

    /// Whether `msg`'s channel has a status query (when its plugin cannot be
    /// had, assumed so: a useless check costs less than a missed one).
    /// Receipts need no check: they settle a `sent` task by themselves.
    async fn queryable(&self, msg: &OutgoingMessage) -> bool {
        match self.runtime_of(msg) {
            Ok((rt, inst)) => rt.capabilities_of(&inst).await.can_query,
            Err(_) => true,
        }
    }

    /// After an unknown outcome: a query that finds the message records it
    /// sent; a believed `unknown` (past the not-found horizon) resends; a
    /// reference the provider still honours (inside its window) resends; a
    /// channel with a status query that cannot tell yet (inside the horizon,
    /// or the query failed) holds, for receipts and the reconciler's later
    /// checks to settle; else the channel's `on_unknown`. A resend the
    /// provider cannot dedupe is [`UnknownVerdict::ResendMayDuplicate`].
    async fn settle(&self, msg: &OutgoingMessage) -> UnknownVerdict {
        let Ok((rt, inst)) = self.runtime_of(msg) else {
            return UnknownVerdict::Hold;
        };
        let caps = rt.capabilities_of(&inst).await;
        let deduped = reference_honoured(msg, &caps, now_ms());
        match self.query(rt, &inst, msg).await {
            Check::Delivered | Check::Accepted | Check::Failed => {
                return UnknownVerdict::Sent {
                    provider_message_id: None,
                };
            }
            Check::Absent if deduped => return UnknownVerdict::Resend,
            Check::Absent => return UnknownVerdict::ResendMayDuplicate,
            Check::CannotTell(_) => {}
        }
        if deduped {
            return UnknownVerdict::Resend;
        }
        match rt.on_unknown {
            // Neither a receipt nor the query can tell yet: they may still.
            _ if caps.can_query => UnknownVerdict::Hold,
            OnUnknown::Hold => UnknownVerdict::Hold,
            OnUnknown::Resend => UnknownVerdict::ResendMayDuplicate,
        }
    }
}

/// `unknown` from the provider: absent, unless asked inside the not-found
/// horizon (then it cannot tell yet). The horizon runs from the moment the
/// last attempt's request could last have reached the provider — when its
/// send call returned, if known, else its start plus the channel's
/// `call_timeout`, past which the host drops the request — and lasts the
/// plugin's declared `query_lag_secs`.
fn absent_unless_lagging(
    msg: &OutgoingMessage,
    caps: &Capabilities,
    call_timeout: Duration,
) -> Check {
    let dropped_by = msg
        .last_attempt_ms
        .saturating_add(u64::try_from(call_timeout.as_millis()).unwrap_or(u64::MAX));
    let written_by = match msg.last_attempt_ended_ms {
        0 => dropped_by,
        ended => ended.min(dropped_by),
    };
    let horizon_ends = written_by.saturating_add(u64::from(caps.query_lag_secs) * 1000);
    let now = now_ms();
    if now < horizon_ends {
        Check::CannotTell(format!(
            "the provider's query may not show a message yet: `unknown` is believed {} s after the request could last have reached it (query_lag), {} ms to go",
            caps.query_lag_secs,
            horizon_ends - now
        ))
    } else {
        Check::Absent
    }
}

/// Whether a resend carrying the same reference is still deduplicated by the
/// provider: it honours references, and `now` is inside its window from the
/// first attempt (or it has none).
fn reference_honoured(msg: &OutgoingMessage, caps: &Capabilities, now: u64) -> bool {
    caps.honours_reference
        && caps
            .reference_window_secs
            .is_none_or(|w| now < msg.first_attempt_ms.saturating_add(u64::from(w) * 1000))
}

/// Milliseconds since the Unix epoch, by this host's clock.
fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A plugin's error, as text for operators.
fn error_text(e: &SendError) -> String {
    match e {
        SendError::Retryable(r) => format!("retryable: {}", r.reason),
        SendError::Permanent(r) => format!("permanent: {r}"),
        SendError::Unknown(r) => format!("unknown: {r}"),
    }
}

/// The plugin's reason, with the outbound policy's refusals and the causes
/// of requests that failed before writing (host-side text, for the task's
/// `last_error`; the plugin never sees it).
fn explain(reason: String, log: &OutboundLog) -> String {
    let mut out = reason;
    if !log.denied.is_empty() {
        out = format!(
            "{out} (refused by the outbound policy: {})",
            log.denied.join("; ")
        );
    }
    if !log.not_sent.is_empty() {
        out = format!("{out} (not sent: {})", log.not_sent.join("; "));
    }
    out
}

/// A call that failed in the host's eyes (trap, fuel, memory, timeout).
fn failed_call(rt: &ChannelRuntime, e: ChannelCallError) -> SendOutcome {
    let text = rt.redact(&e.to_string());
    tracing::warn!(channel = %rt.name, error = %text, may_have_sent = e.log.may_have_sent(), "channel plugin call failed");
    if e.log.may_have_sent() {
        SendOutcome::Unknown(format!("{text} after a request went out"))
    } else {
        SendOutcome::retryable(text)
    }
}

impl ChannelRuntime {
    /// `text` with this channel's secrets replaced by `[redacted]`.
    fn redact(&self, text: &str) -> String {
        self.redactor.redact(text)
    }

    fn instance(
        &self,
        registry: &PluginRegistry,
        pinned: Option<&str>,
    ) -> Result<Arc<ChannelInstance>, InstanceError> {
        let exact = pinned.and_then(|id| {
            let (name, version) = id.split_once('@')?;
            registry.resolve_channel(&format!("{name}@={version}")).ok()
        });
        let plugin =
            match exact {
                Some(p) => p,
                None => registry.resolve_channel(&self.requirement).map_err(|e| {
                    InstanceError::Plugin {
                        channel: self.name.clone(),
                        reason: e.to_string(),
                    }
                })?,
            };
        let key = format!("{}#{}", plugin.meta().id, plugin.meta().sha256);
        let mut instances = self.instances.lock().unwrap_or_else(|e| e.into_inner());
        Ok(instances
            .entry(key)
            .or_insert_with(|| Arc::new(ChannelInstance::new(plugin, self.settings.clone())))
            .clone())
    }

    async fn capabilities_of(&self, inst: &ChannelInstance) -> Capabilities {
        let key = format!(
            "{}#{}",
            inst.plugin().meta().id,
            inst.plugin().meta().sha256
        );
        if let Some(c) = self
            .capabilities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return *c;
        }
        match inst.capabilities().await {
            Ok(a) => {
                self.capabilities
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, a.value);
                a.value
            }
            Err(e) => {
                let why = self.redact(&e.to_string());
                tracing::warn!(channel = %self.name, error = %why, "capabilities call failed");
                Capabilities {
                    honours_reference: false,
                    reference_window_secs: None,
                    can_query: false,
                    query_lag_secs: 0,
                    callbacks: false,
                }
            }
        }
    }
}

impl Sender for PluginSender {
    fn send<'a>(&'a self, msg: &'a OutgoingMessage) -> BoxFuture<'a, SendOutcome> {
        Box::pin(async move { self.send_one(msg).await.0 })
    }

    fn send_for_handover<'a>(
        &'a self,
        msg: &'a OutgoingMessage,
    ) -> BoxFuture<'a, (SendOutcome, Handover)> {
        Box::pin(self.send_one(msg))
    }

    fn providers(&self, channel: &str) -> Vec<String> {
        self.chains.get(channel).cloned().unwrap_or_default()
    }

    fn start_provider(&self, channel: &str) -> Option<String> {
        let chain = self.chains.get(channel)?;
        let circuits = self.circuits.get(channel)?;
        chain
            .iter()
            .find(|p| circuits.admit(p))
            .or(chain.first())
            .cloned()
    }

    fn settle_unknown<'a>(&'a self, msg: &'a OutgoingMessage) -> BoxFuture<'a, UnknownVerdict> {
        Box::pin(self.settle(msg))
    }

    fn check<'a>(
        &'a self,
        msg: &'a OutgoingMessage,
        provider_message_id: Option<&'a str>,
    ) -> BoxFuture<'a, Check> {
        Box::pin(self.check_one(msg, provider_message_id))
    }

    fn can_check<'a>(&'a self, msg: &'a OutgoingMessage) -> BoxFuture<'a, bool> {
        Box::pin(self.queryable(msg))
    }

    fn dedupes<'a>(&'a self, msg: &'a OutgoingMessage) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            match self.runtime_of(msg) {
                Ok((rt, inst)) => {
                    reference_honoured(msg, &rt.capabilities_of(&inst).await, now_ms())
                }
                // No plugin to ask: assume not (a possible duplicate counted
                // costs less than one missed).
                Err(_) => false,
            }
        })
    }
}
