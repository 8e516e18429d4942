//! Provider callbacks: which channels' callbacks are served ([`callback_gates`]),
//! and the receipts they carry handled by the channel plugins'
//! `handle-callback`, settled in the lifecycle and written to the ledger
//! ([`PluginReceipts`]); the opt-outs a callback carries (contract 2.1: an
//! SMS answered "TD") stored in the recipients' preferences before the
//! provider is answered.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::error::ServiceError;
use crate::api::receipts::{
    CallbackGate, CallbackGates, ProviderReply, ProviderRequest, ReceiptHandler, ReceiptRefusal,
};
use crate::config::HostConfig;
use crate::ledger::Ledger;
use crate::ledger::preferences::ChangeRoute;
use crate::permit::Permits;
use crate::plugin::PluginRegistry;
use crate::plugin::bindings::{CallbackRequest, OptOut, OptOutRoute, OptOutSubject};
use crate::prefs::{OptOutRequest, OptOutSubject as Subject, PreferenceCache};
use crate::send::BoxFuture;
use crate::send::plugin::{CallbackAccess, PluginSender};
use crate::send::receipts::{ReceiptError, handle_callback};

/// Receipts handled by the channel plugins' `handle-callback`.
pub(super) struct PluginReceipts {
    /// Where tasks are settled.
    pub(super) permits: Permits,
    /// The channel instances.
    pub(super) sender: Arc<PluginSender>,
    /// How long a settlement naming no task is answered 503.
    pub(super) unmatched_grace: Duration,
    /// Where settled tasks are written as history.
    pub(super) ledger: Option<Ledger>,
    /// Where opt-outs are stored (the recipients' preferences).
    pub(super) preferences: Arc<PreferenceCache>,
    /// The channel each provider instance of a chain channel serves
    /// (`providers = [...]`): an opt-out through a provider's callback route
    /// switches the channel off.
    pub(super) chain_of: BTreeMap<String, String>,
}

impl PluginReceipts {
    /// Stores the opt-outs `channel`'s callback carried, counting each;
    /// an error names why they could not all be stored (answered 503: the
    /// provider pushes again, and storing again changes nothing).
    async fn store_opt_outs(&self, channel: &str, opt_outs: Vec<OptOut>) -> Result<(), String> {
        let target = self.chain_of.get(channel).map_or(channel, String::as_str);
        for o in opt_outs {
            let request = OptOutRequest {
                subject: match o.subject {
                    OptOutSubject::User(u) => Subject::User(u),
                    OptOutSubject::Address(forms) => Subject::Address(forms),
                },
                category: o.category,
                route: match o.route {
                    OptOutRoute::Reply => ChangeRoute::SmsReply,
                    OptOutRoute::Bounce => ChangeRoute::EmailBounce,
                    OptOutRoute::UnsubscribeLink => ChangeRoute::UnsubscribeLink,
                },
                detail: o.detail,
            };
            let result = self
                .preferences
                .store_opt_out(target, channel, &request)
                .await
                .map_err(|e| format!("an opt-out could not be stored ({e}); push it again"))?;
            tracing::info!(channel = %target, reported_by = %channel, result = result.as_str(),
                detail = request.detail.as_deref().unwrap_or(""), "opt-out reported by a callback");
            metrics::counter!(crate::metric_names::CALLBACK_OPT_OUTS,
                "channel" => target.to_string(), "result" => result.as_str())
            .increment(1);
        }
        Ok(())
    }
}

impl ReceiptHandler for PluginReceipts {
    fn handle<'a>(
        &'a self,
        channel: &'a str,
        req: ProviderRequest,
    ) -> BoxFuture<'a, Result<ProviderReply, ReceiptRefusal>> {
        Box::pin(async move {
            let req = CallbackRequest {
                method: req.method,
                path: req.path,
                query: req.query,
                headers: req.headers,
                body: req.body,
            };
            let (permits, grace) = (&self.permits, self.unmatched_grace);
            match handle_callback(permits, &self.sender, channel, req, grace).await {
                Ok(done) => {
                    // Opt-outs first, even when some settlement must wait:
                    // storing one again changes nothing, and a provider
                    // may stop re-sending before the wait is over.
                    if !done.opt_outs.is_empty() {
                        self.store_opt_outs(channel, done.opt_outs)
                            .await
                            .map_err(ReceiptRefusal::OptOutsUnstored)?;
                    }
                    if !done.report.not_yet.is_empty() {
                        return Err(ReceiptRefusal::NotYet(format!(
                            "{} settlement(s) name sends not recorded yet ({}); send the callback again",
                            done.report.not_yet.len(),
                            done.report.not_yet.join(", ")
                        )));
                    }
                    if let Some(ledger) = &self.ledger {
                        let report = &done.report;
                        permits
                            .note_receipts(ledger, channel, &report.settled, &report.late)
                            .await;
                    }
                    Ok(ProviderReply {
                        status: done.reply.status,
                        headers: done.reply.headers,
                        body: done.reply.body,
                    })
                }
                Err(ReceiptError::Permit(e)) => Err(ReceiptRefusal::Unavailable(e)),
                Err(ReceiptError::Forbidden { reason, .. }) => {
                    Err(ReceiptRefusal::Forbidden(reason))
                }
                Err(ReceiptError::Malformed { reason, .. }) => {
                    Err(ReceiptRefusal::Malformed(reason))
                }
                Err(e) => Err(ReceiptRefusal::Failed(e.to_string())),
            }
        })
    }
}

/// Which channels' callbacks are served, and how: closed by default. A
/// channel whose plugin takes callbacks with neither a path token nor
/// `open_callbacks = true` is refused (the host does not start), naming the
/// channel and the setting; an open one is served with a warning. Every
/// reload checks the same rule on the plugins it would swap in
/// ([`unreachable_callbacks`]): the gates are not rebuilt.
pub(super) async fn callback_gates(
    config: &HostConfig,
    sender: &PluginSender,
) -> Result<CallbackGates, ServiceError> {
    let mut gates = BTreeMap::new();
    for (name, cfg) in &config.channels {
        if !cfg.providers.is_empty() {
            // Callbacks come to each provider instance's own route.
            continue;
        }
        let takes = match sender.capabilities(name, None).await {
            Ok(c) => c.callbacks,
            Err(e) => {
                tracing::warn!(channel = %name, error = %e, "cannot tell whether the channel takes callbacks");
                false
            }
        };
        match sender.callback_access(name) {
            Some(CallbackAccess::Token(t)) => {
                gates.insert(name.clone(), CallbackGate::token(t));
            }
            Some(CallbackAccess::Open) => {
                tracing::warn!(channel = %name, "open_callbacks = true: /v1/receipts/{name} is open to anyone who can reach it");
                gates.insert(name.clone(), CallbackGate::Open);
            }
            Some(CallbackAccess::Closed) | None if takes => {
                return Err(ServiceError::CallbacksUnreachable {
                    channel: name.clone(),
                });
            }
            Some(CallbackAccess::Closed) | None => {}
        }
    }
    Ok(Arc::new(gates))
}

/// The rule of [`callback_gates`] on a reload's new plugins: every channel
/// with no callback route (no path token, not opened) whose plugin in
/// `registry` takes callbacks, as `channels.<name>.callback_token_env: why`.
/// A reload with one is refused, as a start is: its receipts would never
/// arrive, so a message that fails after the provider accepted it would
/// never be settled nor handed to its fallback.
pub(super) async fn unreachable_callbacks(
    config: &HostConfig,
    sender: &PluginSender,
    registry: &PluginRegistry,
) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, cfg) in &config.channels {
        let closed = matches!(
            sender.callback_access(name),
            Some(CallbackAccess::Closed) | None
        );
        if !cfg.providers.is_empty() || !closed {
            continue;
        }
        match sender.capabilities_in(name, registry).await {
            Ok((plugin, c)) if c.callbacks => {
                let why = ServiceError::CallbacksUnreachable {
                    channel: name.clone(),
                };
                lines.push(format!(
                    "channels.{name}.callback_token_env: plugin {plugin} would be swapped in: {why}"
                ));
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(channel = %name, error = %e, "cannot tell whether the channel's new plugin takes callbacks");
            }
        }
    }
    lines
}
