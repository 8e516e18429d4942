//! What the deployment itself brings: the plugins and policies loaded, and
//! for each channel instance its plugin's capabilities, its credentials and
//! its callback route; the unsubscribe secret when `[unsubscribe]
//! secret_env` is set (`UnsubscribeLinks::from_config`, the check `serve`
//! makes at start); and the API and admin tokens when the host listens
//! beyond loopback (`HostConfig::check_exposure`, the check `serve` makes
//! before binding).

use std::sync::Arc;

use super::{Check, Deployment, Status};
use crate::config::ChannelConfig;
use crate::plugin::Plugin;
use crate::send::plugin::{PluginSender, SenderSetupError};
use crate::unsubscribe::{MIN_SECRET_BYTES, UnsubscribeLinks};

/// The deployment checks.
pub(super) async fn checks(d: &Deployment<'_>) -> Vec<Check> {
    let mut checks = vec![plugins(d)];
    checks.extend(channels(d).await);
    checks.extend(unsubscribe_secret(d));
    checks.push(exposure(d));
    checks
}

/// The secret that signs unsubscribe links, judged as `serve` judges it at
/// start (`None`: `[unsubscribe] secret_env` is unset, no links are written).
fn unsubscribe_secret(d: &Deployment<'_>) -> Option<Check> {
    let settings = &d.config.unsubscribe;
    let variable = settings.secret_env.as_deref()?;
    let name = "unsubscribe.secret";
    Some(match UnsubscribeLinks::from_config(settings, d.env) {
        Ok(_) => Check::ok(
            name,
            format!(
                "{variable} holds a secret of at least {MIN_SECRET_BYTES} bytes; links point at {}",
                settings.base_url.as_deref().unwrap_or_default()
            ),
        ),
        Err(e) => Check::fail(
            name,
            format!(
                "[unsubscribe] secret_env names {}, which is {}: the host will not start",
                e.variable, e.found
            ),
            format!(
                "set {} to a random secret of at least {} bytes (e.g. `openssl rand -hex 32`), the same on every instance, or remove [unsubscribe] secret_env to write no unsubscribe links",
                e.variable, e.min
            ),
        ),
    })
}

fn plugins(d: &Deployment<'_>) -> Check {
    let live = match &d.live {
        Ok(live) => live,
        Err(e) => {
            return Check::fail(
                "plugins",
                format!("plugins and policies refused: {e}"),
                format!(
                    "`pushonce plugins list --dir {}` and `pushonce policies check --config <this file>` name each problem",
                    d.config.plugin_dir.display()
                ),
            );
        }
    };
    let snapshot = live.current();
    let mut keys = Vec::new();
    let mut channels = Vec::new();
    for plugin in snapshot.registry.plugins() {
        match &plugin {
            Plugin::KeyPolicy(_) => keys.push(plugin.meta().id.clone()),
            Plugin::Channel(_) => channels.push(plugin.meta().id.clone()),
        }
    }
    let found = format!(
        "{} key polic(ies) [{}], {} channel plugin(s) [{}], {} policies from {}",
        keys.len(),
        keys.join(", "),
        channels.len(),
        channels.join(", "),
        snapshot.policies.by_biz_type.len(),
        d.config.policy_dir.display(),
    );
    if !snapshot.plugin_refusals.is_empty() {
        return Check::warn(
            "plugins",
            format!("{found}; refused: {}", snapshot.plugin_refusals.join("; ")),
            format!(
                "remove or rebuild the refused files in {}",
                d.config.plugin_dir.display()
            ),
        );
    }
    Check::ok("plugins", found)
}

/// Three checks per channel: its plugin and capabilities, its credentials,
/// its callback route; a fourth for a plugin that writes unsubscribe
/// headers (on a channel with providers, a provider instance's plugin):
/// whether the host writes the links.
async fn channels(d: &Deployment<'_>) -> Vec<Check> {
    let sender = match sender(d) {
        Ok(s) => s,
        Err((e, fix)) => return vec![Check::fail("channels", e, fix)],
    };
    let mut checks = Vec::new();
    for (name, cfg) in &d.config.channels {
        if !cfg.providers.is_empty() {
            checks.push(Check::ok(
                format!("channel.{name}.providers"),
                format!(
                    "fails over between {} (checked each on its own)",
                    cfg.providers.join(", ")
                ),
            ));
            // Its messages carry the link when a provider instance's plugin
            // writes the headers (the plan writes one for such a channel).
            if sender.as_ref().is_some_and(|s| s.takes_extras(name)) {
                checks.push(unsubscribe(d, name));
            }
            continue;
        }
        let takes_callbacks = match &sender {
            Some(sender) => match sender.capabilities(name, None).await {
                Ok(caps) => {
                    checks.push(Check::ok(
                        format!("channel.{name}.plugin"),
                        format!(
                            "{}: {}{}{}",
                            cfg.plugin,
                            if caps.honours_reference {
                                "honours its reference (a resend after unknown is safe)"
                            } else {
                                "no reference"
                            },
                            if caps.can_query && caps.query_lag_secs == u32::MAX {
                                // Tencent's receipts-only pull: it confirms, never denies.
                                ", status query (confirms only: never a resend on \"not found\")"
                                    .into()
                            } else if caps.can_query {
                                format!(", status query (lag {}s)", caps.query_lag_secs)
                            } else {
                                ", no status query".into()
                            },
                            if caps.callbacks {
                                ", delivery callbacks"
                            } else {
                                ""
                            },
                        ),
                    ));
                    Some(caps.callbacks)
                }
                Err(e) => {
                    checks.push(Check::fail(
                        format!("channel.{name}.plugin"),
                        e.to_string(),
                        format!(
                            "put a channel plugin matching `{}` in {} (`pushonce plugins list --dir {}` shows what is there)",
                            cfg.plugin,
                            d.config.plugin_dir.display(),
                            d.config.plugin_dir.display()
                        ),
                    ));
                    None
                }
            },
            None => None,
        };
        checks.push(credentials(d, name, cfg));
        checks.push(callbacks(d, name, cfg, takes_callbacks));
        if sender.as_ref().is_some_and(|s| s.takes_extras(name)) {
            checks.push(unsubscribe(d, name));
        }
    }
    checks
}

/// For a channel whose plugin writes one-click unsubscribe headers (it
/// takes extras, e.g. email): whether the host writes the links they carry.
fn unsubscribe(d: &Deployment<'_>, name: &str) -> Check {
    let check = format!("channel.{name}.unsubscribe");
    if d.config.unsubscribe.writes_links() {
        return Check::ok(
            check,
            "its messages carry the host's one-click unsubscribe link (List-Unsubscribe)",
        );
    }
    Check::warn(
        check,
        "the plugin writes one-click unsubscribe headers, but [unsubscribe] secret_env is not set: its messages carry no unsubscribe link, which Gmail and Yahoo ask of bulk senders",
        "set [unsubscribe] secret_env = \"PUSHONCE_UNSUBSCRIBE_SECRET\" (that variable at least 32 random bytes, the same on every instance) and base_url = the host as mail systems reach it (docs/preferences.md)",
    )
}

/// A sender for the capabilities calls only (`None` when the plugins were
/// refused: the `plugins` check says why): an unset secret is given a
/// stand-in value (the credentials check reports it), so one missing
/// secret does not hide every channel's capabilities.
fn sender(d: &Deployment<'_>) -> Result<Option<PluginSender>, (String, String)> {
    let Ok(live) = &d.live else {
        return Ok(None);
    };
    let live = Arc::clone(live);
    let env = d.env;
    PluginSender::new(
        &d.config.channels,
        Arc::new(move || live.current().registry.clone()),
        |var| {
            env(var)
                .filter(|v| !v.is_empty())
                // Unset secrets are the credentials check's: a stand-in as
                // strong as a real token lets the channel load.
                .or_else(|| Some("doctor-stand-in-0123456789abcdef".into()))
        },
    )
    .map(Some)
    .map_err(|e| {
        let fix = match &e {
            SenderSetupError::WeakCallbackToken { var, .. } => {
                format!("set {var} to an unguessable token, e.g. `openssl rand -hex 16`")
            }
            _ => "correct the channel's allowed_hosts or ca_file".to_string(),
        };
        (e.to_string(), fix)
    })
}

/// Every `secrets_from_env` variable set and not empty.
fn credentials(d: &Deployment<'_>, name: &str, cfg: &ChannelConfig) -> Check {
    let check = format!("channel.{name}.credentials");
    let unset: Vec<String> = cfg
        .secrets_from_env
        .iter()
        .filter(|(_, var)| (d.env)(var).is_none_or(|v| v.is_empty()))
        .map(|(setting, var)| format!("`{setting}` reads {var}"))
        .collect();
    if !unset.is_empty() {
        let vars: Vec<&str> = cfg
            .secrets_from_env
            .values()
            .filter(|var| (d.env)(var).is_none_or(|v| v.is_empty()))
            .map(String::as_str)
            .collect();
        return Check::fail(
            check,
            format!(
                "{}, which is unset or empty: the host will not start",
                unset.join(", ")
            ),
            format!(
                "set {} in the service's environment (e.g. a systemd EnvironmentFile)",
                vars.join(", ")
            ),
        );
    }
    if cfg.secrets_from_env.is_empty() {
        return Check::ok(check, "the plugin takes no secrets from the environment");
    }
    let vars: Vec<&str> = cfg.secrets_from_env.values().map(String::as_str).collect();
    Check::ok(check, format!("set: {}", vars.join(", ")))
}

/// The callback route: a path token when the plugin takes callbacks
/// (`takes`: `None` when its capabilities could not be read).
fn callbacks(d: &Deployment<'_>, name: &str, cfg: &ChannelConfig, takes: Option<bool>) -> Check {
    let check = format!("channel.{name}.callbacks");
    let token = cfg
        .callback_token_env
        .as_deref()
        .map(|var| (var, (d.env)(var).filter(|v| !v.is_empty())));
    match token {
        Some((var, None)) => Check::fail(
            check,
            format!(
                "callback_token_env names {var}, which is unset or empty: the host will not start"
            ),
            format!(
                "set {var} to an unguessable token (e.g. `openssl rand -hex 32`) in the service's environment"
            ),
        ),
        Some((var, Some(_))) => Check::ok(
            check,
            format!(
                "callback URL https://<this host>/v1/receipts/{name}/<the token in {var}>: give it to the provider"
            ),
        ),
        None if cfg.open_callbacks => Check::warn(
            check,
            format!("open_callbacks = true: /v1/receipts/{name} answers anyone who can reach it"),
            format!(
                "set channels.{name}.callback_token_env to a variable holding a token, give the provider the URL with it, and remove open_callbacks"
            ),
        ),
        None if takes == Some(true) => Check::fail(
            check,
            format!(
                "the plugin takes delivery callbacks, but channels.{name}.callback_token_env is not set: the host will not start"
            ),
            format!(
                "set channels.{name}.callback_token_env = \"PUSHONCE_{}_CALLBACK_TOKEN\" and that variable to an unguessable token, then give the provider https://<this host>/v1/receipts/{name}/<token>",
                name.to_uppercase().replace('-', "_")
            ),
        ),
        None if takes.is_none() => Check::warn(
            check,
            "no callback_token_env, and the plugin's capabilities could not be read: whether it takes callbacks is unknown",
            "fix the channel's plugin first, then run doctor again",
        ),
        None => Check::ok(check, "the plugin takes no delivery callbacks"),
    }
}

/// The tokens of `/v1` and `/admin` when listening beyond loopback.
fn exposure(d: &Deployment<'_>) -> Check {
    let listen = d.config.listen;
    let name = "http.tokens";
    if let Err(e) = d.config.check_exposure(listen, d.env) {
        let text = e.to_string();
        return match text.split_once(": set it to") {
            Some((found, fix)) => Check::fail(name, found, format!("set it to{fix}")),
            None => Check::from_refusal(Status::Fail, name, &text),
        };
    }
    let set = |var: &Option<String>| {
        var.as_deref()
            .and_then(|v| (d.env)(v))
            .is_some_and(|v| !v.is_empty())
    };
    let (api, admin) = (
        set(&d.config.auth.api_token_env),
        set(&d.config.auth.admin_token_env),
    );
    if listen.ip().is_loopback() {
        return Check::ok(
            name,
            format!(
                "listening on {listen} (loopback only); API token {}, admin token {}",
                if api { "set" } else { "unset" },
                if admin { "set" } else { "unset" }
            ),
        );
    }
    if !(api && admin) {
        return Check::warn(
            name,
            format!("listening on {listen} with http.allow_open_network = true and a token unset"),
            "set auth.api_token_env and auth.admin_token_env to variables holding tokens, unless a proxy in front authenticates",
        );
    }
    Check::ok(
        name,
        format!("listening on {listen}; API and admin tokens set"),
    )
}
