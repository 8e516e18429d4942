//! The SDK for pushonce key-policy plugins (`wasm32-wasip2`, contract
//! `pushonce:plugin@1`): a key policy is one function.
//!
//! ```ignore
//! use key_policy_sdk::{Event, Params, non_empty, part};
//!
//! fn derive(event: &Event, _channel: &str, _params: &Params) -> Result<String, String> {
//!     Ok(part(non_empty("user_id", &event.user_id)?))
//! }
//!
//! key_policy_sdk::export_key_policy!(derive);
//! ```
//!
//! The function gets the event, the channel and the policy file's `params`,
//! and returns the key body (a `String`, or a [`KeyDecision`] to set a
//! window too) or an error naming what is wrong with the input. The macro
//! also answers `describe` from the crate's own metadata ([`plugin_info!`]:
//! name, version and description in `Cargo.toml`). The key encoding and the
//! date helpers of `key-util` are re-exported: [`part`] makes any value a
//! safe, bounded, injective key part.

pub use key_util::{MAX_PART, attribute, civil_from_days, local_date, param, parse_offset, part};

/// The generated bindings of the `key-policy-plugin` world.
pub mod bindings {
    wit_bindgen::generate!({
        world: "pushonce:plugin/key-policy-plugin",
        path: "../../wit",
        pub_export_macro: true,
        export_macro_name: "export_key_policy_world",
        default_bindings_module: "key_policy_sdk::bindings",
    });
}

pub use bindings::Guest;
pub use bindings::exports::pushonce::plugin::key_policy::{Guest as KeyPolicyGuest, KeyDecision};
pub use bindings::pushonce::plugin::types::{Event, PluginInfo};

/// A policy file's `params`, in order (see [`param`]).
pub type Params = [(String, String)];

impl From<String> for KeyDecision {
    /// A key body with the policy file's window.
    fn from(key: String) -> KeyDecision {
        KeyDecision {
            key,
            window_secs: None,
        }
    }
}

/// `value`, or the error "event field `name` is empty".
pub fn non_empty<'a>(name: &str, value: &'a str) -> Result<&'a str, String> {
    if value.is_empty() {
        return Err(format!("event field `{name}` is empty"));
    }
    Ok(value)
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

/// Exports the function `$f` as the plugin's key policy:
/// `fn(&Event, &str, &Params) -> Result<impl Into<KeyDecision>, String>`,
/// with a `describe` built by [`plugin_info!`].
#[macro_export]
macro_rules! export_key_policy {
    ($f:path) => {
        const _: () = {
            struct __PushonceKeyPolicy;
            impl $crate::Guest for __PushonceKeyPolicy {
                fn describe() -> $crate::PluginInfo {
                    $crate::plugin_info!()
                }
            }
            impl $crate::KeyPolicyGuest for __PushonceKeyPolicy {
                fn derive_key(
                    event: $crate::Event,
                    channel: String,
                    params: Vec<(String, String)>,
                ) -> Result<$crate::KeyDecision, String> {
                    $f(&event, &channel, &params).map(Into::into)
                }
            }
            $crate::bindings::export_key_policy_world!(__PushonceKeyPolicy with_types_in $crate::bindings);
        };
    };
}
