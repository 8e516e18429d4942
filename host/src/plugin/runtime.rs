//! `PluginRuntime`: the one wasmtime `Engine` all plugins share, the linkers
//! for both worlds, the limits, and the engine's configuration fingerprint
//! (part of every disk-cache key).

use std::sync::Arc;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Linker;

use super::error::LoadError;
use super::limits::Limits;
use super::state::{self, HostState};

/// The shared engine and linkers; cheap to share behind an `Arc`.
pub struct PluginRuntime {
    /// The engine every plugin is compiled for and runs in.
    engine: Engine,
    /// Imports a key-policy plugin may use.
    pub(crate) key_linker: Linker<HostState>,
    /// Imports a channel plugin may use.
    pub(crate) channel_linker: Linker<HostState>,
    /// Budgets and caps of every call.
    limits: Limits,
    /// Hex digest of the engine's compatibility hash: a `.cwasm` compiled by
    /// an engine with another fingerprint is never loaded.
    fingerprint: String,
}

impl PluginRuntime {
    /// Builds the engine and linkers for `limits`.
    pub fn new(limits: &Limits) -> Result<Arc<Self>, LoadError> {
        let engine = Engine::new(&limits.engine_config())
            .map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let key_linker =
            state::key_policy_linker(&engine).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let channel_linker =
            state::channel_linker(&engine).map_err(|e| LoadError::Engine(format!("{e:#}")))?;
        let fingerprint = fingerprint(&engine);
        Ok(Arc::new(Self {
            engine,
            key_linker,
            channel_linker,
            limits: limits.clone(),
            fingerprint,
        }))
    }

    /// The shared engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The limits calls run under.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Hex fingerprint of the engine configuration (16 hex digits).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}

/// Feeds a `std::hash::Hash` into SHA-256, so the digest is stable across
/// processes (unlike `DefaultHasher`'s contract).
struct ShaHasher(Sha256);

impl std::hash::Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        let d = self.0.clone().finalize();
        u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// The engine's `precompile_compatibility_hash` (compiler, flags, tunables
/// such as fuel, features, wasmtime version), digested with SHA-256.
fn fingerprint(engine: &Engine) -> String {
    use std::hash::Hash;
    let mut h = ShaHasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut h);
    hex::encode(&h.0.finalize()[..8])
}
