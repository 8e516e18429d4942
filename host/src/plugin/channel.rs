//! `ChannelPlugin`: one loaded channel plugin. For now the host only loads,
//! registers and describes channel plugins; sending (async, with `wasi:http`)
//! is built by the channel issue on top of the `InstancePre` kept here.

use std::collections::HashMap;
use std::sync::Arc;

use wasmtime::Store;

use super::PluginMeta;
use super::bindings::channel::ChannelPluginPre;
use super::runtime::PluginRuntime;
use super::state::HostState;

/// A loaded channel plugin. `Send + Sync`: share it as `Arc<ChannelPlugin>`.
pub struct ChannelPlugin {
    /// Name, version, file, size.
    meta: PluginMeta,
    /// The shared engine and limits.
    runtime: Arc<PluginRuntime>,
    /// Linked and type-checked component, ready to instantiate.
    pre: ChannelPluginPre<HostState>,
}

impl ChannelPlugin {
    pub(crate) fn new(
        meta: PluginMeta,
        runtime: Arc<PluginRuntime>,
        pre: ChannelPluginPre<HostState>,
    ) -> Self {
        Self { meta, runtime, pre }
    }

    /// Name, version, world, file.
    pub fn meta(&self) -> &PluginMeta {
        &self.meta
    }

    /// `name@version`.
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    /// A new store (with channel settings `config`, under the runtime's
    /// limits) for instantiating this plugin: the channel issue's entry point.
    pub fn new_store(&self, config: HashMap<String, String>) -> Store<HostState> {
        let mut store = Store::new(
            self.runtime.engine(),
            HostState::new(self.runtime.limits(), config),
        );
        store.limiter(|s| &mut s.limiter);
        store
    }

    /// The pre-instantiated component.
    pub fn pre(&self) -> &ChannelPluginPre<HostState> {
        &self.pre
    }
}
