//! The SDK for pushonce channel plugins (`wasm32-wasip2`, contract
//! `pushonce:channel@2`, world `channel-plugin-opt-outs` of 2.1: a plugin's
//! callback may carry opt-outs, [`Channel::handle_callback_with_opt_outs`]).
//!
//! A plugin implements [`Channel`] — `send`, and what its provider offers
//! beyond it — and calls `channel_sdk::export_channel!(MyPlugin);`, which
//! also answers `describe` from the crate's own metadata (name, version,
//! description in `Cargo.toml`). The defaults are what a provider without
//! them gets: no capabilities, no status query, no callbacks.
//!
//! - [`http`]: a blocking HTTP client over `wasi:http/outgoing-handler` whose
//!   errors say whether the request may have reached the provider
//!   ([`http::HttpError::NotSent`] vs [`http::HttpError::MaybeSent`]) — the
//!   difference between `retryable` and `unknown` (`?` converts them).
//! - [`cache`]: the shared cache (one access token for every instance).
//! - [`callback`]: reading a provider's callback and answering it.
//! - [`provider`]: what real providers need: JSON/form requests, refusals
//!   as errors (honouring `Retry-After`), a shared access token refreshed once
//!   when refused, nonces; the pure signatures and error tables of
//!   `provider-auth` as [`provider::auth`].
//! - [`setting`] / [`require`]: the channel instance's settings (secrets
//!   included) through the host's `config` import.

pub mod cache;
pub mod callback;
pub mod http;
pub mod provider;

/// The generated bindings of the `channel-plugin` world.
pub mod bindings {
    wit_bindgen::generate!({
        world: "pushonce:channel/channel-plugin-opt-outs",
        path: "../../wit",
        pub_export_macro: true,
        export_macro_name: "export_channel_world",
        default_bindings_module: "channel_sdk::bindings",
        generate_all,
    });
}

pub use bindings::Guest;
pub use bindings::exports::pushonce::channel::callbacks::Guest as CallbacksGuest;
pub use bindings::exports::pushonce::channel::callbacks::{
    CallbackOutcome, OptOut, OptOutRoute, OptOutSubject,
};
pub use bindings::exports::pushonce::channel::channel::Guest as ChannelGuest;
pub use bindings::pushonce::channel::types::{
    CallbackAnswer, CallbackError, CallbackReply, CallbackRequest, DeliveryStatus, Message,
    PluginInfo, ProviderCapabilities, Receipt, Retry, SendError, SentMessage, Settlement,
};
pub use serde_json;

/// A channel plugin. Only `send` is required; the defaults describe a
/// provider with no reference, no status query and no callbacks.
pub trait Channel {
    /// What the provider offers. Every `true` must be true of the real
    /// provider, with its documentation cited in the plugin's module doc.
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities::NONE
    }

    /// Send one message.
    fn send(msg: Message) -> Result<Receipt, SendError>;

    /// Ask the provider about a sent message (only called when
    /// `capabilities().can_query`).
    fn query(_msg: SentMessage) -> Result<DeliveryStatus, SendError> {
        Err(SendError::Permanent(
            "this provider has no status query".into(),
        ))
    }

    /// Handle a request the provider sent to the channel's callback URL
    /// (only routed when `capabilities().callbacks`).
    fn handle_callback(_req: CallbackRequest) -> Result<CallbackAnswer, CallbackError> {
        Err(CallbackError::Malformed(
            "this channel takes no callbacks".into(),
        ))
    }

    /// Handle a request to the channel's callback URL that may carry
    /// opt-outs besides receipts (a user's "unsubscribe" reply). The host
    /// calls this one; the default is [`Channel::handle_callback`] with no
    /// opt-outs.
    fn handle_callback_with_opt_outs(
        req: CallbackRequest,
    ) -> Result<CallbackOutcome, CallbackError> {
        Self::handle_callback(req).map(|a| CallbackOutcome {
            settlements: a.settlements,
            opt_outs: Vec::new(),
            reply: a.reply,
        })
    }
}

impl ProviderCapabilities {
    /// A provider that offers nothing: no reference, no query, no callbacks.
    pub const NONE: ProviderCapabilities = ProviderCapabilities {
        honours_reference: false,
        reference_window_secs: None,
        can_query: false,
        query_lag_secs: 0,
        callbacks: false,
    };

    /// The same, with a provider that dedupes on the reference for
    /// `window_secs` (`None`: for good).
    pub const fn reference(mut self, window_secs: Option<u32>) -> ProviderCapabilities {
        self.honours_reference = true;
        self.reference_window_secs = window_secs;
        self
    }

    /// The same, with a status query that may lag a send by `lag_secs`.
    pub const fn query(mut self, lag_secs: u32) -> ProviderCapabilities {
        self.can_query = true;
        self.query_lag_secs = lag_secs;
        self
    }

    /// The same, with delivery callbacks this plugin handles.
    pub const fn callbacks(mut self) -> ProviderCapabilities {
        self.callbacks = true;
        self
    }
}

/// This plugin's [`PluginInfo`], from the calling crate's `Cargo.toml`
/// (`name`, `version`, `description`).
#[macro_export]
macro_rules! plugin_info {
    () => {
        $crate::PluginInfo {
            name: env!("CARGO_PKG_NAME").into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: env!("CARGO_PKG_DESCRIPTION").into(),
        }
    };
}

/// Exports `$t: Channel` as the plugin's `channel` interface, with a
/// `describe` built by [`plugin_info!`] from the calling crate's
/// `Cargo.toml` (name, version, description).
#[macro_export]
macro_rules! export_channel {
    ($t:ty) => {
        const _: () = {
            struct __PushonceChannel;
            impl $crate::Guest for __PushonceChannel {
                fn describe() -> $crate::PluginInfo {
                    $crate::plugin_info!()
                }
            }
            impl $crate::ChannelGuest for __PushonceChannel {
                fn capabilities() -> $crate::ProviderCapabilities {
                    <$t as $crate::Channel>::capabilities()
                }
                fn send(msg: $crate::Message) -> Result<$crate::Receipt, $crate::SendError> {
                    <$t as $crate::Channel>::send(msg)
                }
                fn query(
                    msg: $crate::SentMessage,
                ) -> Result<$crate::DeliveryStatus, $crate::SendError> {
                    <$t as $crate::Channel>::query(msg)
                }
                fn handle_callback(
                    req: $crate::CallbackRequest,
                ) -> Result<$crate::CallbackAnswer, $crate::CallbackError> {
                    <$t as $crate::Channel>::handle_callback(req)
                }
            }
            impl $crate::CallbacksGuest for __PushonceChannel {
                fn handle_callback(
                    req: $crate::CallbackRequest,
                ) -> Result<$crate::CallbackOutcome, $crate::CallbackError> {
                    <$t as $crate::Channel>::handle_callback_with_opt_outs(req)
                }
            }
            $crate::bindings::export_channel_world!(__PushonceChannel with_types_in $crate::bindings);
        };
    };
}

impl SendError {
    /// A retryable error without a retry-after hint.
    pub fn retryable(reason: impl Into<String>) -> SendError {
        SendError::Retryable(Retry {
            reason: reason.into(),
            after_ms: None,
        })
    }

    /// A retryable error the provider asked to wait `after_ms` for.
    pub fn retry_after(reason: impl Into<String>, after_ms: Option<u64>) -> SendError {
        SendError::Retryable(Retry {
            reason: reason.into(),
            after_ms,
        })
    }
}

impl From<http::HttpError> for SendError {
    /// Refused by the host's outbound policy: permanent (an operator must
    /// change `allowed_hosts`); not sent: retryable; maybe sent: unknown.
    fn from(e: http::HttpError) -> SendError {
        match e {
            http::HttpError::Denied(_) => SendError::Permanent(e.to_string()),
            http::HttpError::NotSent(_) => SendError::retryable(e.to_string()),
            http::HttpError::MaybeSent(_) => SendError::Unknown(e.to_string()),
        }
    }
}

/// The setting `name` of this channel instance, if configured.
pub fn setting(name: &str) -> Option<String> {
    bindings::pushonce::channel::config::get(name)
}

/// The setting `name`, or a permanent error naming the missing setting (never its value).
pub fn require(name: &str) -> Result<String, SendError> {
    setting(name)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| SendError::Permanent(format!("channel setting `{name}` is not configured")))
}

/// Percent-encodes `s` for a URL query component (RFC 3986 unreserved kept).
pub fn url_encode(s: &str) -> String {
    provider::auth::percent_encode(s)
}

/// Template parameters as a JSON object (order kept by the list).
pub fn params_json(params: &[(String, String)]) -> serde_json::Value {
    serde_json::Value::Object(
        params
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect(),
    )
}

/// The current time in ms since the Unix epoch (the host lends channel
/// plugins a wall clock).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
