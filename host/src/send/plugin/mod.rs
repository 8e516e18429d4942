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

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::circuit::{CircuitConfig, CircuitState, Circuits, ProviderHealth};
use super::providers::{Handover, handover};
use super::{BoxFuture, Check, OutgoingMessage, SendOutcome, Sender, UnknownVerdict};
use crate::config::ChannelConfig;
use crate::config::OutboundConfigError;
use crate::plugin::bindings::{Capabilities, Message, MessageExtras, SendError, UnsubscribeLink};
use crate::plugin::cache_import::SharedCache;
use crate::plugin::channel::{ChannelCallError, ChannelInstance};
use crate::plugin::{OutboundLog, PluginRegistry};
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

mod runtime;
mod unknown;

use runtime::ChannelRuntime;
use unknown::{now_ms, reference_honoured};

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

    /// `channel`'s secrets redacted from `text`, cut to
    /// `plugin::bounds::MAX_TEXT` (unknown channel: only cut).
    pub(crate) fn redact(&self, channel: &str, text: &str) -> String {
        match self.channels.get(channel) {
            Some(rt) => rt.redact(text),
            None => crate::plugin::bounds::cut(text.to_string()),
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

    /// Whether `channel`'s current plugin takes extras (contract 2.2: it
    /// writes the one-click unsubscribe headers the host's link fills), or
    /// on a channel with providers any of its provider instances' plugins;
    /// false when none is loaded.
    pub fn takes_extras(&self, channel: &str) -> bool {
        let itself = [channel.to_string()];
        let through = self.chains.get(channel).map_or(&itself[..], Vec::as_slice);
        through.iter().any(|name| {
            self.instance(name, None)
                .is_ok_and(|i| i.plugin().takes_extras())
        })
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

    /// What the plugin `registry` resolves `channel`'s requirement to
    /// offers, with its `name@version`: a reload's check of the plugins it
    /// would swap in (bound to the channel's settings off to the side: the
    /// instances in use are left alone).
    pub async fn capabilities_in(
        &self,
        channel: &str,
        registry: &PluginRegistry,
    ) -> Result<(String, Capabilities), InstanceError> {
        let rt = self
            .channels
            .get(channel)
            .ok_or_else(|| InstanceError::UnknownChannel(channel.to_string()))?;
        let plugin =
            registry
                .resolve_channel(&rt.requirement)
                .map_err(|e| InstanceError::Plugin {
                    channel: channel.to_string(),
                    reason: e.to_string(),
                })?;
        let id = plugin.meta().id.clone();
        let inst = ChannelInstance::new(plugin, rt.settings.clone());
        Ok((id, rt.capabilities_of(&inst).await))
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
        let payload = match &msg.payload {
            Ok(p) => p,
            Err(e) => return (SendOutcome::Permanent(e.to_string()), Handover::Stays),
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
            recipient: payload.recipient.clone(),
            template: payload.template.clone(),
            params: payload.params.clone(),
            attempt: msg.attempt,
        };
        match inst.send_with(message, extras_of(payload)).await {
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
        let pinned = msg.payload.as_ref().ok().and_then(|p| p.plugin.as_deref());
        let inst = rt.instance(&(self.registry)(), self.pin(msg, pinned))?;
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

    fn takes_receipts<'a>(&'a self, msg: &'a OutgoingMessage) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            match self.runtime_of(msg) {
                Ok((rt, inst)) => rt.capabilities_of(&inst).await.callbacks,
                // No plugin to ask: assume it may (a task kept longer costs
                // less than a fallback never taken).
                Err(_) => true,
            }
        })
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

/// What the host adds to `payload`'s message for a plugin that takes extras
/// (contract 2.2): the unsubscribe link written at accept.
fn extras_of(payload: &super::Payload) -> MessageExtras {
    MessageExtras {
        unsubscribe: payload.unsubscribe.as_ref().map(|u| UnsubscribeLink {
            url: u.url.clone(),
            category: u.category.clone(),
        }),
    }
}
