//! One configured channel instance: its settings with secrets from the
//! environment, its pacing, and the plugin instances bound to it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::{InstanceError, SenderSetupError};
use crate::config::{ChannelConfig, OnUnknown};
use crate::plugin::HttpClient;
use crate::plugin::bindings::Capabilities;
use crate::plugin::channel::{ChannelInstance, ChannelSettings};
use crate::plugin::{PluginMeta, PluginRegistry};
use crate::send::redact::Redactor;

/// A rate limit: one send every `1/qps`, spaced (no bursts).
pub(super) struct RateLimit {
    /// Time between two sends.
    every: Duration,
    /// When the next send may start.
    next: Mutex<tokio::time::Instant>,
}

impl RateLimit {
    pub(super) async fn wait(&self) {
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
pub(super) struct ChannelRuntime {
    /// Its name (what policies list).
    pub(super) name: String,
    /// Its plugin requirement, `name@req`.
    pub(super) requirement: String,
    /// What to do after an unresolvable `unknown`.
    pub(super) on_unknown: OnUnknown,
    /// Settings, policy, client and budgets its plugin calls get.
    pub(super) settings: ChannelSettings,
    /// Sends in flight at once.
    pub(super) slots: Arc<Semaphore>,
    /// Sends per second, if limited.
    pub(super) rate: Option<RateLimit>,
    /// Plugin instances bound to this channel, by `name@version` and file
    /// hash; only of plugin files loaded in the registry last asked.
    pub(super) instances: Mutex<HashMap<String, Arc<ChannelInstance>>>,
    /// Capabilities answered per plugin instance key.
    pub(super) capabilities: Mutex<HashMap<String, Capabilities>>,
    /// The channel's secrets, redacted from whatever its plugin says.
    pub(super) redactor: Redactor,
    /// The callback path token (`callback_token_env`); never logged.
    pub(super) callback_token: Option<String>,
    /// `open_callbacks`: serve callbacks without a path token.
    pub(super) open_callbacks: bool,
}

impl ChannelRuntime {
    /// The runtime of channel instance `name`: its settings with secrets
    /// filled in from `env`, its outbound policy, slots and rate limit.
    pub(super) fn from_config(
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
    if let Some(why) = crate::send::path_token::path_token_weakness(&token) {
        return Err(SenderSetupError::WeakCallbackToken {
            channel: name.to_string(),
            var: var.clone(),
            why,
        });
    }
    Ok(Some(token))
}

/// The key of a plugin file's instance and capabilities: `name@version#sha256`.
fn instance_key(meta: &PluginMeta) -> String {
    format!("{}#{}", meta.id, meta.sha256)
}

/// The pacing of a channel's sends at `per_second` (none when 0).
fn rate_limit(per_second: f64) -> Option<RateLimit> {
    (per_second > 0.0).then(|| RateLimit {
        every: Duration::from_secs_f64(1.0 / per_second),
        next: Mutex::new(tokio::time::Instant::now()),
    })
}

impl ChannelRuntime {
    /// `text` with this channel's secrets replaced by `[redacted]`, then cut
    /// to `plugin::bounds::MAX_TEXT` (after the redaction, so no part of a
    /// secret is left at the cut).
    pub(super) fn redact(&self, text: &str) -> String {
        crate::plugin::bounds::cut(self.redactor.redact(text))
    }

    pub(super) fn instance(
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
        let key = instance_key(plugin.meta());
        let mut instances = self.instances.lock().unwrap_or_else(|e| e.into_inner());
        self.forget_unloaded(&mut instances, registry);
        Ok(instances
            .entry(key)
            .or_insert_with(|| Arc::new(ChannelInstance::new(plugin, self.settings.clone())))
            .clone())
    }

    /// Drops the instances, and the capabilities, of plugin files that
    /// `registry` no longer loads (a reload replaced or removed them), so
    /// their compiled code and pool slots are freed once the calls still
    /// holding one end.
    fn forget_unloaded(
        &self,
        instances: &mut HashMap<String, Arc<ChannelInstance>>,
        registry: &PluginRegistry,
    ) {
        instances.retain(|_, i| registry.holds_channel(i.plugin().meta()));
        self.capabilities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|key, _| instances.contains_key(key));
    }

    pub(super) async fn capabilities_of(&self, inst: &ChannelInstance) -> Capabilities {
        let key = instance_key(inst.plugin().meta());
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
