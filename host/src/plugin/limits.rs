//! The limits every plugin call runs under, and the engine options that go
//! with them. One `Limits` value configures a whole `PluginRuntime`.

use std::time::Duration;

/// Budgets and caps for plugin calls; `Limits::default()` suits key policies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Fuel given to every call (and to every instantiation). A call that runs
    /// out traps with "ran out of its time budget". 50M units stop a tight
    /// loop in a few milliseconds; a real key policy uses a few thousand.
    pub fuel_per_call: u64,
    /// Fuel given to every call of a channel plugin. Larger than a key
    /// policy's: a channel plugin signs requests (an RSA-2048 JWT signature
    /// for FCM takes between 50M and 200M units); its wall-clock bound is the
    /// channel's `call_timeout`.
    pub channel_fuel_per_call: u64,
    /// Linear memory cap per instance, in bytes; growing past it traps.
    pub memory_bytes: usize,
    /// Warm instances kept per key-policy plugin between calls.
    pub warm_instances: usize,
    /// Use wasmtime's pooling instance allocator (faster instantiation).
    pub pooling: bool,
    /// Instance slots of the pooling allocator (all plugins together).
    pub pool_slots: u32,
    /// Bytes of a guest's stderr kept per call (for panic messages).
    pub stderr_bytes: usize,
    /// Largest plugin file read, in bytes; larger (or not a regular file)
    /// is refused by name.
    pub max_file_bytes: u64,
    /// Wall-clock bound of a load-time call (a channel plugin's instantiation
    /// and `describe`). Fuel stops a plugin that computes, not one that
    /// waits (a channel plugin may read clocks and poll); past this bound the
    /// file is refused by name and the rest of the directory loads.
    pub load_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            fuel_per_call: 50_000_000,
            channel_fuel_per_call: 1_000_000_000,
            memory_bytes: 64 << 20,
            warm_instances: 8,
            pooling: true,
            pool_slots: 256,
            stderr_bytes: 4096,
            max_file_bytes: 64 << 20,
            load_timeout: Duration::from_secs(5),
        }
    }
}

impl Limits {
    /// The memory cap in whole MiB, for messages.
    pub fn memory_mib(&self) -> usize {
        self.memory_bytes >> 20
    }

    /// The engine configuration these limits need: component model, fuel,
    /// and (optionally) the pooling allocator sized for the memory cap.
    pub(crate) fn engine_config(&self) -> wasmtime::Config {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        config.consume_fuel(true);
        if self.pooling {
            let mut pool = wasmtime::PoolingAllocationConfig::default();
            pool.total_component_instances(self.pool_slots)
                .total_core_instances(self.pool_slots * 4)
                .total_memories(self.pool_slots)
                .total_tables(self.pool_slots * 2)
                .max_memory_size(self.memory_bytes);
            config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
        }
        config
    }
}
