//! What one wasmtime `Store` holds for a plugin instance (`HostState`), and the
//! linkers that decide which host functions a plugin may import.
//!
//! WASI is linked partially and with an empty context: only `wasi:io` and
//! `wasi:cli` (environment, exit, stdio, terminal), which a std Rust guest
//! imports even when it uses none of them. The environment and arguments are
//! empty, stdin is empty, stdout is discarded, and stderr goes to a small
//! bounded buffer so a guest's panic message can appear in the error. Every
//! other import (clocks, random, filesystem, sockets) is defined per component
//! as a trap: a key policy that reads a clock fails its call instead of
//! silently becoming non-deterministic.
//!
//! Channel plugins get more, through their own linker: the async `wasi:io`
//! (a send waits on the network), clocks and randomness, and
//! `wasi:http/outgoing-handler` + `wasi:http/types`, whose every request goes
//! through the store's [`OutboundHooks`] (the channel instance's policy).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use wasmtime::component::{HasData, HasSelf, Linker, ResourceTable};
use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream, WasiCli, WasiCliView};
use wasmtime_wasi::clocks::WasiClocksView;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings::{self, CacheError};
use super::cache_import::SharedCache;
use super::http::OutboundHooks;
use super::limits::Limits;

/// The data of one plugin instance's `Store`.
pub struct HostState {
    /// WASI context, built empty: no preopens, env, args, network or stdio.
    wasi: WasiCtx,
    /// Resources (streams) the guest holds.
    table: ResourceTable,
    /// The memory cap, and whether the last call ran into it.
    pub(crate) limiter: CapLimiter,
    /// The guest's stderr, bounded; cleared before every call.
    pub(crate) stderr: StderrCapture,
    /// Settings a channel plugin reads through the `config` import.
    config: HashMap<String, String>,
    /// `wasi:http` context (field size limit).
    http_ctx: wasmtime_wasi_http::WasiHttpCtx,
    /// The outbound policy of this store's channel instance; deny-all for key policies.
    pub(crate) hooks: OutboundHooks,
    /// The channel instance's shared cache; `None` answers `unavailable`.
    pub(crate) cache: Option<SharedCache>,
}

impl HostState {
    /// A fresh state under `limits`, with channel settings `config`.
    pub fn new(limits: &Limits, config: HashMap<String, String>) -> Self {
        let stderr = StderrCapture::new(limits.stderr_bytes);
        let mut builder = WasiCtx::builder();
        builder.stderr(stderr.clone());
        Self {
            wasi: builder.build(),
            table: ResourceTable::new(),
            limiter: CapLimiter::new(limits.memory_bytes),
            stderr,
            config,
            http_ctx: wasmtime_wasi_http::WasiHttpCtx::new(),
            hooks: OutboundHooks::deny_all(),
            cache: None,
        }
    }

    /// A fresh state for a channel plugin: settings `config`, outbound `hooks`.
    pub fn for_channel(
        limits: &Limits,
        config: HashMap<String, String>,
        hooks: OutboundHooks,
        cache: Option<SharedCache>,
    ) -> Self {
        let mut state = Self::new(limits, config);
        state.hooks = hooks;
        state.cache = cache;
        state
    }
}

impl wasmtime_wasi_http::WasiHttpView for HostState {
    fn http(&mut self) -> wasmtime_wasi_http::WasiHttpCtxView<'_> {
        wasmtime_wasi_http::WasiHttpCtxView {
            ctx: &mut self.http_ctx,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

impl HostState {
    /// The memory cap in whole MiB, for messages.
    pub(crate) fn limiter_cap_mib(&self) -> usize {
        self.limiter.cap_bytes >> 20
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl bindings::key_policy::pushonce::plugin::types::Host for HostState {}

impl bindings::channel::pushonce::channel::types::Host for HostState {}

impl bindings::channel::pushonce::channel::config::Host for HostState {
    fn get(&mut self, name: String) -> Option<String> {
        self.config.get(&name).cloned()
    }
}

impl HostState {
    /// The channel's shared cache, or `unavailable` when the host has none.
    fn shared_cache(&self) -> Result<SharedCache, CacheError> {
        self.cache
            .clone()
            .ok_or_else(|| CacheError::Unavailable("this host has no shared cache".into()))
    }
}

impl bindings::channel::pushonce::channel::shared_cache::Host for HostState {
    async fn get(&mut self, key: String) -> Result<Option<String>, CacheError> {
        self.shared_cache()?.get(&key).await
    }

    async fn set(&mut self, key: String, value: String, ttl_ms: u64) -> Result<(), CacheError> {
        self.shared_cache()?.set(&key, &value, ttl_ms).await
    }

    async fn compare_and_set(
        &mut self,
        key: String,
        expected: Option<String>,
        value: String,
        ttl_ms: u64,
    ) -> Result<bool, CacheError> {
        self.shared_cache()?
            .compare_and_set(&key, expected.as_deref(), &value, ttl_ms)
            .await
    }

    async fn compare_and_delete(
        &mut self,
        key: String,
        expected: String,
    ) -> Result<bool, CacheError> {
        self.shared_cache()?
            .compare_and_delete(&key, &expected)
            .await
    }

    async fn remember(
        &mut self,
        key: String,
        value: String,
        ttl_ms: u64,
    ) -> Result<Option<String>, CacheError> {
        self.shared_cache()?.remember(&key, &value, ttl_ms).await
    }
}

/// `wasi:io` host traits are implemented on the resource table itself.
struct IoTable;

impl HasData for IoTable {
    type Data<'a> = &'a mut ResourceTable;
}

/// The interfaces `add_wasi` links (unversioned names); any other import of a
/// key-policy plugin is defined as a trap by `stub_other_imports`.
pub(crate) const LINKED_INTERFACES: &[&str] = &[
    "wasi:io/error",
    "wasi:io/poll",
    "wasi:io/streams",
    "wasi:cli/environment",
    "wasi:cli/exit",
    "wasi:cli/stdin",
    "wasi:cli/stdout",
    "wasi:cli/stderr",
    "wasi:cli/terminal-input",
    "wasi:cli/terminal-output",
    "wasi:cli/terminal-stdin",
    "wasi:cli/terminal-stdout",
    "wasi:cli/terminal-stderr",
    "pushonce:plugin/types",
    "pushonce:channel/types",
    "pushonce:channel/config",
    "pushonce:channel/shared-cache",
];

/// What a channel plugin may import besides [`LINKED_INTERFACES`]; anything
/// else (filesystem, sockets) is a trap.
pub(crate) const CHANNEL_EXTRA_INTERFACES: &[&str] = &[
    "wasi:clocks/wall-clock",
    "wasi:clocks/monotonic-clock",
    "wasi:random/random",
    "wasi:random/insecure",
    "wasi:random/insecure-seed",
    "wasi:http/types",
    "wasi:http/outgoing-handler",
];

/// Defines every import of `component` that the linker does not provide
/// (clocks, random, filesystem, sockets...) as a function that traps with
/// "unknown import: `<interface>#<function>` has not been defined".
///
/// wasmtime's `define_unknown_imports_as_traps` is not used: it re-creates
/// each imported instance under the component's exact version (`@0.2.6`),
/// which shadows the semver-compatible WASI the linker has (`@0.2.12`) and
/// turned even `wasi:cli/environment` into a trap.
pub(crate) fn stub_other_imports(
    linker: &mut Linker<HostState>,
    component: &wasmtime::component::Component,
    extra: &[&str],
) -> wasmtime::Result<()> {
    use wasmtime::component::types::ComponentItem;
    let engine = component.engine().clone();
    let ty = component.component_type();
    for (name, item) in ty.imports(&engine) {
        let unversioned = name.split('@').next().unwrap_or(name);
        if LINKED_INTERFACES.contains(&unversioned) || extra.contains(&unversioned) {
            continue;
        }
        match item.ty {
            ComponentItem::ComponentInstance(instance) => {
                let mut inst = linker.instance(name)?;
                for (export, item) in instance.exports(&engine) {
                    match item.ty {
                        ComponentItem::ComponentFunc(_) => {
                            let full = format!("{name}#{export}");
                            inst.func_new(export, move |_, _, _, _| {
                                wasmtime::bail!("unknown import: `{full}` has not been defined")
                            })?;
                        }
                        ComponentItem::Resource(_) => {
                            inst.resource(
                                export,
                                wasmtime::component::ResourceType::host::<()>(),
                                |_, _| Ok(()),
                            )?;
                        }
                        _ => {}
                    }
                }
            }
            ComponentItem::ComponentFunc(_) => {
                let full = name.to_string();
                linker.root().func_new(name, move |_, _, _, _| {
                    wasmtime::bail!("unknown import: `{full}` has not been defined")
                })?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Adds the WASI interfaces plugins may import: `wasi:io` and `wasi:cli`.
fn add_wasi(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    use wasmtime_wasi::p2::bindings::{cli, io, sync};
    io::error::add_to_linker::<HostState, IoTable>(linker, |s| &mut s.table)?;
    sync::io::poll::add_to_linker::<HostState, IoTable>(linker, |s| &mut s.table)?;
    sync::io::streams::add_to_linker::<HostState, IoTable>(linker, |s| &mut s.table)?;
    let l = linker;
    cli::environment::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::exit::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_input::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_output::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    Ok(())
}

/// The linker for key-policy plugins: WASI (partial, empty) and nothing else.
pub fn key_policy_linker(engine: &wasmtime::Engine) -> wasmtime::Result<Linker<HostState>> {
    let mut linker = Linker::new(engine);
    add_wasi(&mut linker)?;
    Ok(linker)
}

/// The linker for channel plugins: async `wasi:io`, `wasi:cli` (empty),
/// clocks, random, `wasi:http` (outgoing handler and types, filtered by the
/// store's [`OutboundHooks`]) and `config`. Calls must be async.
pub fn channel_linker(engine: &wasmtime::Engine) -> wasmtime::Result<Linker<HostState>> {
    use wasmtime_wasi::clocks::WasiClocks;
    use wasmtime_wasi::p2::bindings::{cli, clocks, io, random};
    use wasmtime_wasi::random::WasiRandom;
    let mut linker = Linker::new(engine);
    let l = &mut linker;
    io::error::add_to_linker::<HostState, IoTable>(l, |s| &mut s.table)?;
    io::poll::add_to_linker::<HostState, IoTable>(l, |s| &mut s.table)?;
    io::streams::add_to_linker::<HostState, IoTable>(l, |s| &mut s.table)?;
    cli::environment::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::exit::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_input::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_output::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdin::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stdout::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    cli::terminal_stderr::add_to_linker::<HostState, WasiCli>(l, HostState::cli)?;
    clocks::wall_clock::add_to_linker::<HostState, WasiClocks>(l, HostState::clocks)?;
    clocks::monotonic_clock::add_to_linker::<HostState, WasiClocks>(l, HostState::clocks)?;
    random::random::add_to_linker::<HostState, WasiRandom>(l, |s| s.wasi.random())?;
    random::insecure::add_to_linker::<HostState, WasiRandom>(l, |s| s.wasi.random())?;
    random::insecure_seed::add_to_linker::<HostState, WasiRandom>(l, |s| s.wasi.random())?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(l)?;
    use bindings::channel::pushonce::channel as contract;
    contract::types::add_to_linker::<HostState, HasSelf<HostState>>(l, |s| s)?;
    contract::config::add_to_linker::<HostState, HasSelf<HostState>>(l, |s| s)?;
    contract::shared_cache::add_to_linker::<HostState, HasSelf<HostState>>(l, |s| s)?;
    Ok(linker)
}

/// A `ResourceLimiter` that applies the memory cap (wasmtime's `StoreLimits`,
/// trapping on a failed grow) and remembers that the cap was hit, so the error
/// can say "exceeded its memory cap" rather than only "trapped".
pub(crate) struct CapLimiter {
    /// wasmtime's limits: memory size cap, trap on grow failure.
    inner: StoreLimits,
    /// Set when a grow was refused; cleared before every call.
    pub(crate) hit: bool,
    /// The cap in bytes, for messages.
    cap_bytes: usize,
    /// Linear memory the instance holds, in bytes (all its memories).
    pub(crate) memory_bytes: usize,
}

impl CapLimiter {
    fn new(memory_bytes: usize) -> Self {
        Self {
            inner: StoreLimitsBuilder::new()
                .memory_size(memory_bytes)
                .trap_on_grow_failure(true)
                .build(),
            hit: false,
            cap_bytes: memory_bytes,
            memory_bytes: 0,
        }
    }
}

impl ResourceLimiter for CapLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let answer = self.inner.memory_growing(current, desired, maximum);
        if matches!(answer, Ok(true)) {
            self.memory_bytes += desired.saturating_sub(current);
        } else {
            self.hit = true;
        }
        answer
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.hit = true;
        self.inner.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// The guest's stderr: keeps the first `capacity` bytes written since the last
/// `clear`, silently drops the rest (a chatty plugin never fails because of it).
#[derive(Clone)]
pub(crate) struct StderrCapture {
    /// The bytes kept; shared between the store and its output streams.
    buf: Arc<Mutex<Vec<u8>>>,
    /// How many bytes to keep.
    capacity: usize,
}

impl StderrCapture {
    fn new(capacity: usize) -> Self {
        Self {
            buf: Arc::new(Mutex::new(Vec::new())),
            capacity,
        }
    }

    /// Forgets what was written.
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// What was written since the last `clear`, as lossy UTF-8.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.lock()).into_owned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.buf.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn append(&self, bytes: &[u8]) {
        let mut buf = self.lock();
        let room = self.capacity.saturating_sub(buf.len());
        buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

impl IsTerminal for StderrCapture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for StderrCapture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for StderrCapture {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for StderrCapture {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for StderrCapture {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.append(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
