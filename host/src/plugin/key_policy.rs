//! `KeyPolicyPlugin`: one loaded key-policy plugin, callable from any thread.
//!
//! Calls reuse warm instances from a small pool: take one (or instantiate a
//! new one from the `InstancePre`), refill its fuel, call, and put it back.
//! An instance that trapped is dropped, never reused (wasmtime refuses to
//! re-enter it), so the next call gets a fresh one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use wasmtime::Store;

use super::bindings::key_policy::KeyPolicyPluginPre;
use super::bindings::{self, KeyDecision, KeyPolicyWorld};
use super::call::classify;
use super::error::CallError;
use super::runtime::PluginRuntime;
use super::state::HostState;
use super::{PluginMeta, PluginStats};
use crate::event::Event;

/// A warm instance and its store.
struct Warm {
    /// The store holding the instance's memory, fuel and WASI state.
    store: Store<HostState>,
    /// The instance's typed exports.
    world: KeyPolicyWorld,
}

/// A loaded key-policy plugin. `Send + Sync`: share it as `Arc<KeyPolicyPlugin>`.
pub struct KeyPolicyPlugin {
    /// Name, version, file, size.
    meta: PluginMeta,
    /// The shared engine and limits.
    runtime: Arc<PluginRuntime>,
    /// Linked and type-checked component, ready to instantiate.
    pre: KeyPolicyPluginPre<HostState>,
    /// Idle warm instances.
    pool: Mutex<Vec<Warm>>,
    /// Call counters.
    calls: AtomicU64,
    /// Calls that returned the plugin's own error.
    refusals: AtomicU64,
    /// Calls that trapped, ran out of fuel or memory.
    failures: AtomicU64,
    /// Instances created (warm pool misses and replacements after traps).
    instantiations: AtomicU64,
}

impl KeyPolicyPlugin {
    pub(crate) fn new(
        meta: PluginMeta,
        runtime: Arc<PluginRuntime>,
        pre: KeyPolicyPluginPre<HostState>,
    ) -> Self {
        Self {
            meta,
            runtime,
            pre,
            pool: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            instantiations: AtomicU64::new(0),
        }
    }

    /// Name, version, world, file.
    pub fn meta(&self) -> &PluginMeta {
        &self.meta
    }

    /// `name@version`.
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    /// Counters since load.
    pub fn stats(&self) -> PluginStats {
        PluginStats {
            calls: self.calls.load(Ordering::Relaxed),
            refusals: self.refusals.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            instantiations: self.instantiations.load(Ordering::Relaxed),
        }
    }

    /// Calls the plugin's `derive-key` on a warm instance. The answer's `key`
    /// is the plugin's raw body: `crate::derive` validates and composes it.
    pub fn derive_key(
        &self,
        event: &Event,
        channel: &str,
        params: &[(String, String)],
    ) -> Result<KeyDecision, CallError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let warm = self.lock_pool().pop();
        let mut warm = match warm {
            Some(w) => w,
            None => self.instantiate().inspect_err(|_| self.fail())?,
        };
        match self.call(&mut warm, event, channel, params) {
            Ok(answer) => {
                self.put_back(warm);
                if answer.is_err() {
                    self.refusals.fetch_add(1, Ordering::Relaxed);
                }
                answer.map_err(|message| CallError::Refused {
                    plugin: self.meta.id.clone(),
                    message: super::bounds::cut(message),
                })
            }
            Err(e) => {
                self.fail();
                Err(e)
            }
        }
    }

    /// Like `derive_key`, but on a new instance that is dropped afterwards:
    /// measures instantiation cost (benchmarks) and never touches the pool.
    pub fn derive_key_fresh(
        &self,
        event: &Event,
        channel: &str,
        params: &[(String, String)],
    ) -> Result<KeyDecision, CallError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut warm = self.instantiate().inspect_err(|_| self.fail())?;
        let answer = self
            .call(&mut warm, event, channel, params)
            .inspect_err(|_| self.fail())?;
        answer.map_err(|message| {
            self.refusals.fetch_add(1, Ordering::Relaxed);
            CallError::Refused {
                plugin: self.meta.id.clone(),
                message: super::bounds::cut(message),
            }
        })
    }

    /// Drops every idle warm instance (memory is returned; the next call instantiates).
    pub fn clear_pool(&self) {
        self.lock_pool().clear();
    }

    fn fail(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    fn lock_pool(&self) -> std::sync::MutexGuard<'_, Vec<Warm>> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn put_back(&self, warm: Warm) {
        let mut pool = self.lock_pool();
        if pool.len() < self.runtime.limits().warm_instances {
            pool.push(warm);
        }
    }

    /// A new store and instance, with the instantiation itself under budget.
    fn instantiate(&self) -> Result<Warm, CallError> {
        self.instantiations.fetch_add(1, Ordering::Relaxed);
        let limits = self.runtime.limits();
        let mut store = Store::new(
            self.runtime.engine(),
            HostState::new(limits, HashMap::new()),
        );
        store.limiter(|s| &mut s.limiter);
        let instantiate_error = |reason: String| CallError::Instantiate {
            plugin: self.meta.id.clone(),
            reason,
        };
        store
            .set_fuel(limits.fuel_per_call)
            .map_err(|e| instantiate_error(format!("{e:#}")))?;
        match self.pre.instantiate(&mut store) {
            Ok(world) => Ok(Warm { store, world }),
            Err(e) => Err(
                match classify(&self.meta.id, e, store.data(), limits.fuel_per_call) {
                    CallError::Trap { cause, .. } => instantiate_error(cause),
                    other => other,
                },
            ),
        }
    }

    /// One `derive-key` call with a full fuel budget and a clean stderr.
    fn call(
        &self,
        warm: &mut Warm,
        event: &Event,
        channel: &str,
        params: &[(String, String)],
    ) -> Result<Result<KeyDecision, String>, CallError> {
        let fuel = self.runtime.limits().fuel_per_call;
        warm.store.data().stderr.clear();
        warm.store.data_mut().limiter.hit = false;
        if let Err(e) = warm.store.set_fuel(fuel) {
            return Err(CallError::Instantiate {
                plugin: self.meta.id.clone(),
                reason: format!("{e:#}"),
            });
        }
        warm.world
            .pushonce_plugin_key_policy()
            .call_derive_key(&mut warm.store, &wit_event(event), channel, params)
            .map_err(|e| classify(&self.meta.id, e, warm.store.data(), fuel))
    }

    /// The linear memory (bytes, all memories) a fresh instance holds after
    /// one `derive-key` call: what each warm instance of this plugin costs.
    pub fn memory_after_one_call(
        &self,
        event: &Event,
        channel: &str,
        params: &[(String, String)],
    ) -> Result<usize, CallError> {
        let mut warm = self.instantiate()?;
        self.call(&mut warm, event, channel, params)?.ok();
        Ok(warm.store.data().limiter.memory_bytes)
    }

    /// The fuel one `derive-key` call uses, measured on a fresh instance
    /// (for benchmarks and for choosing `Limits::fuel_per_call`).
    pub fn fuel_used_by_one_call(
        &self,
        event: &Event,
        channel: &str,
        params: &[(String, String)],
    ) -> Result<u64, CallError> {
        let mut warm = self.instantiate()?;
        self.call(&mut warm, event, channel, params)?.ok();
        let left = warm.store.get_fuel().unwrap_or(0);
        Ok(self.runtime.limits().fuel_per_call - left)
    }
}

/// The event as the WIT record the plugin is called with: the domain type
/// stops at this boundary.
fn wit_event(event: &Event) -> bindings::Event {
    bindings::Event {
        biz_type: event.biz_type.clone(),
        biz_id: event.biz_id.clone(),
        user_id: event.user_id.clone(),
        occurred_at_ms: event.occurred_at_ms,
        attributes: event.attributes.clone(),
    }
}
