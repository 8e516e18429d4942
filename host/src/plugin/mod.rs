//! Plugin runtime: loads WebAssembly component plugins with wasmtime, under limits.
//!
//! - `bindings`: Rust types of the WIT contract, one module per world.
//! - `runtime`: the shared `Engine` and linkers (`PluginRuntime`).
//! - `state`: what a `Store` holds (`HostState`): empty WASI, memory cap, stderr.
//! - `cache`: compiled components on disk, keyed by wasm hash and engine.
//! - `cache_import`: the `shared-cache` import of channel plugins (Redis,
//!   namespaced per channel instance).
//! - `registry`: loading files, refusing bad ones, semver resolution.
//! - `key_policy` / `channel`: handles of loaded plugins; key policies call
//!   `derive-key` on warm pooled instances.
//! - `http`: the outbound HTTP capability of channel plugins (`wasi:http`
//!   filtered by each channel instance's `OutboundPolicy`).
//! - `tls`: rustls configuration and the connector of that capability
//!   (connects only to checked addresses; HTTPS with ALPN h2/http1.1).
//! - `call`: turning traps into errors that name the plugin and the cause.
//! - `limits` / `error`: configuration and error types.

pub mod bindings;
pub mod bounds;
pub mod cache;
pub mod cache_import;
mod call;
pub mod channel;
pub mod error;
pub mod http;
pub mod key_policy;
pub mod limits;
pub mod registry;
pub mod runtime;
pub mod state;
pub mod tls;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use bindings::KeyDecision;
pub use cache::CacheOutcome;
pub use channel::{ChannelCallError, ChannelInstance, ChannelPlugin, ChannelSettings};
pub use error::{CallError, LoadError, ResolveError};
pub use http::{AllowedHost, HttpClient, OutboundLog, OutboundPolicy};
pub use key_policy::KeyPolicyPlugin;
pub use limits::Limits;
pub use registry::PluginRegistry;
pub use runtime::PluginRuntime;
pub use state::HostState;

/// Which WIT world a plugin implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum World {
    /// `key-policy-plugin`: derives idempotency keys.
    KeyPolicy,
    /// `channel-plugin`: sends through a provider.
    Channel,
}

impl std::fmt::Display for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            World::KeyPolicy => "key-policy",
            World::Channel => "channel",
        })
    }
}

/// What the host knows about one loaded plugin.
#[derive(Debug, Clone)]
pub struct PluginMeta {
    /// `name@version`.
    pub id: String,
    /// The name from `describe`.
    pub name: String,
    /// The version from `describe`.
    pub version: semver::Version,
    /// The one-line description from `describe`.
    pub description: String,
    /// The world it implements.
    pub world: World,
    /// The file it was loaded from.
    pub file: PathBuf,
    /// Size of the `.wasm` file in bytes.
    pub size: u64,
    /// Hex SHA-256 of the `.wasm` file.
    pub sha256: String,
    /// Compiled now or loaded from the disk cache.
    pub cache: CacheOutcome,
    /// Time to read, compile or load, link and describe it.
    pub load_time: Duration,
}

/// A loaded plugin of either world.
#[derive(Clone)]
pub enum Plugin {
    /// A key-policy plugin.
    KeyPolicy(Arc<KeyPolicyPlugin>),
    /// A channel plugin.
    Channel(Arc<ChannelPlugin>),
}

impl Plugin {
    /// Name, version, world, file.
    pub fn meta(&self) -> &PluginMeta {
        match self {
            Plugin::KeyPolicy(p) => p.meta(),
            Plugin::Channel(p) => p.meta(),
        }
    }
}

/// How the components of a registry were obtained.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// Compiled from wasm.
    pub compiled: usize,
    /// Loaded from the disk cache.
    pub from_cache: usize,
}

/// Counters of one plugin's calls since it was loaded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PluginStats {
    /// Calls made.
    pub calls: u64,
    /// Calls the plugin answered with its own error.
    pub refusals: u64,
    /// Calls that trapped or exceeded a limit.
    pub failures: u64,
    /// Instances created (first calls, pool misses, replacements after traps).
    pub instantiations: u64,
}
