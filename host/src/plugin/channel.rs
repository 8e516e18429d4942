//! Channel plugins: `ChannelPlugin` is one loaded component; a
//! `ChannelInstance` is that plugin bound to one channel instance's settings
//! and outbound policy, with a pool of warm instances, called asynchronously.
//!
//! Every call refills the fuel (which also makes the guest yield to tokio
//! every `FUEL_YIELD` units), runs under a wall-clock budget, and reports
//! what its HTTP requests did ([`OutboundLog`]), so the caller can tell a
//! failure before anything left from one after a request may have gone out.
//! A store that trapped, overran or was cut off is dropped, never reused.
//! Warm instances keep guest state between calls (a WeChat access token).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::Store;

use super::PluginMeta;
use super::bindings::channel::{ChannelPluginIndices, ChannelPluginPre};
use super::bindings::{
    CallbackError, CallbackOutcome, CallbackRequest, CallbacksExport, CallbacksIndices,
    Capabilities, ChannelWorld, DeliveryStatus, ExtrasExport, ExtrasIndices, Message,
    MessageExtras, Receipt, SendError, SentMessage,
};
use super::bounds;
use super::cache_import::SharedCache;
use super::call::classify;
use super::error::CallError;
use super::http::{HttpClient, OutboundHooks, OutboundLog, OutboundPolicy};
use super::runtime::PluginRuntime;
use super::state::HostState;

/// Fuel between two yields of an async call to the tokio scheduler.
const FUEL_YIELD: u64 = 1_000_000;

/// A loaded channel plugin. `Send + Sync`: share it as `Arc<ChannelPlugin>`.
pub struct ChannelPlugin {
    /// Name, version, file, size.
    meta: PluginMeta,
    /// The shared engine and limits.
    runtime: Arc<PluginRuntime>,
    /// Linked and type-checked component, ready to instantiate.
    pre: ChannelPluginPre<HostState>,
    /// The channel world's exports.
    indices: ChannelPluginIndices,
    /// The optional `callbacks` export of contract 2.1 (`None`: a 2.0
    /// plugin, served by `channel.handle-callback`).
    callbacks: Option<CallbacksIndices>,
    /// The optional `extras` export of contract 2.2 (`None`: sends go
    /// through `channel.send`, without extras).
    extras: Option<ExtrasIndices>,
}

impl ChannelPlugin {
    /// `pre` with its exports looked up (the world's, and `callbacks` and
    /// `extras` when the component exports them).
    pub(crate) fn new(
        meta: PluginMeta,
        runtime: Arc<PluginRuntime>,
        pre: ChannelPluginPre<HostState>,
    ) -> wasmtime::Result<Self> {
        let indices = ChannelPluginIndices::new(pre.instance_pre())?;
        let callbacks = CallbacksIndices::new(pre.instance_pre()).ok();
        let extras = ExtrasIndices::new(pre.instance_pre()).ok();
        Ok(Self {
            meta,
            runtime,
            pre,
            indices,
            callbacks,
            extras,
        })
    }

    /// The same plugin with `meta` (filled in after `describe`).
    pub(crate) fn with_meta(mut self, meta: PluginMeta) -> Self {
        self.meta = meta;
        self
    }

    /// Whether the plugin exports the `callbacks` interface of contract 2.1
    /// (its callbacks may carry opt-outs).
    pub fn takes_opt_outs(&self) -> bool {
        self.callbacks.is_some()
    }

    /// Whether the plugin exports the `extras` interface of contract 2.2
    /// (its sends take the recipient's unsubscribe link).
    pub fn takes_extras(&self) -> bool {
        self.extras.is_some()
    }

    /// Instantiates the plugin in `store`: the channel world's exports and,
    /// when exported, `callbacks` and `extras` (type-checked here: a
    /// mismatch is an error).
    pub(crate) async fn instantiate(
        &self,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<Exports> {
        let instance = self
            .pre
            .instance_pre()
            .instantiate_async(&mut *store)
            .await?;
        let world = self.indices.load(&mut *store, &instance)?;
        let callbacks = match &self.callbacks {
            Some(i) => Some(i.load(&mut *store, &instance)?),
            None => None,
        };
        let extras = match &self.extras {
            Some(i) => Some(i.load(&mut *store, &instance)?),
            None => None,
        };
        Ok(Exports {
            world,
            callbacks,
            extras,
        })
    }

    /// Name, version, world, file.
    pub fn meta(&self) -> &PluginMeta {
        &self.meta
    }

    /// `name@version`.
    pub fn id(&self) -> &str {
        &self.meta.id
    }

    /// The pre-instantiated component.
    pub fn pre(&self) -> &ChannelPluginPre<HostState> {
        &self.pre
    }
}

/// The settings of one channel instance, as its plugin calls see them.
#[derive(Clone)]
pub struct ChannelSettings {
    /// What the `config` import answers (settings and secrets). Never logged.
    pub config: Arc<HashMap<String, String>>,
    /// What the plugin may reach over HTTP.
    pub policy: Arc<OutboundPolicy>,
    /// The channel instance's pooled HTTP client.
    pub client: HttpClient,
    /// Wall-clock budget of one call.
    pub call_timeout: Duration,
    /// Warm instances kept between calls.
    pub warm_instances: usize,
    /// The channel instance's shared cache (`None`: the import answers `unavailable`).
    pub cache: Option<SharedCache>,
}

impl std::fmt::Debug for ChannelSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Setting values may be secrets: names only.
        let mut names: Vec<&String> = self.config.keys().collect();
        names.sort();
        f.debug_struct("ChannelSettings")
            .field("config_names", &names)
            .field("policy", &self.policy)
            .field("call_timeout", &self.call_timeout)
            .finish()
    }
}

/// A failed call, with what its HTTP requests did before it failed.
#[derive(Debug, Clone)]
pub struct ChannelCallError {
    /// Why the call failed.
    pub error: CallError,
    /// What the call's requests did (a request may have reached the provider).
    pub log: OutboundLog,
}

impl std::fmt::Display for ChannelCallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.error)?;
        if !self.log.denied.is_empty() {
            write!(
                f,
                " (refused by the outbound policy: {})",
                self.log.denied.join("; ")
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for ChannelCallError {}

/// A successful call's answer, with what its HTTP requests did.
#[derive(Debug, Clone)]
pub struct Answer<T> {
    /// The plugin's answer.
    pub value: T,
    /// What the call's requests did (refusals explain a plugin's error).
    pub log: OutboundLog,
}

/// The typed exports of one instance.
pub(crate) struct Exports {
    /// The channel world's exports.
    world: ChannelWorld,
    /// Its `callbacks` export, when the plugin has one (contract 2.1).
    callbacks: Option<CallbacksExport>,
    /// Its `extras` export, when the plugin has one (contract 2.2).
    extras: Option<ExtrasExport>,
}

impl Exports {
    /// The plugin's `describe`.
    pub(crate) async fn describe(
        &self,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<super::bindings::ChannelPluginInfo> {
        self.world.call_describe(store).await
    }
}

/// A warm instance and its store.
struct Warm {
    /// Store with the instance's memory, fuel, WASI and HTTP state.
    store: Store<HostState>,
    /// The instance's typed exports.
    exports: Exports,
}

/// One channel plugin bound to one channel instance's settings.
pub struct ChannelInstance {
    /// The plugin.
    plugin: Arc<ChannelPlugin>,
    /// Settings, policy, client, budgets.
    settings: ChannelSettings,
    /// Idle warm instances.
    pool: Mutex<Vec<Warm>>,
}

impl ChannelInstance {
    /// Binds `plugin` to `settings`.
    pub fn new(plugin: Arc<ChannelPlugin>, settings: ChannelSettings) -> ChannelInstance {
        ChannelInstance {
            plugin,
            settings,
            pool: Mutex::new(Vec::new()),
        }
    }

    /// The plugin (`meta().id` is `name@version`).
    pub fn plugin(&self) -> &Arc<ChannelPlugin> {
        &self.plugin
    }

    /// What the provider offers after an unknown outcome.
    pub async fn capabilities(&self) -> Result<Answer<Capabilities>, ChannelCallError> {
        self.call(|w, s| {
            Box::pin(async move { w.pushonce_channel_channel().call_capabilities(s).await })
        })
        .await
    }

    /// Sends one message, with no extras.
    pub async fn send(
        &self,
        msg: Message,
    ) -> Result<Answer<Result<Receipt, SendError>>, ChannelCallError> {
        self.send_with(msg, MessageExtras { unsubscribe: None })
            .await
    }

    /// Sends one message: through `extras.send` with `extras` when the
    /// plugin exports it (contract 2.2), else `channel.send`.
    pub async fn send_with(
        &self,
        msg: Message,
        extras: MessageExtras,
    ) -> Result<Answer<Result<Receipt, SendError>>, ChannelCallError> {
        let answer = self
            .call_with(move |e, s| {
                Box::pin(async move {
                    match &e.extras {
                        Some(x) => x.call_send(s, &msg, &extras).await,
                        None => e.world.pushonce_channel_channel().call_send(s, &msg).await,
                    }
                })
            })
            .await?;
        self.bounded(answer, |value| match value {
            Ok(receipt) => match bounds::receipt_fault(&receipt) {
                Some(fault) => Err(fault),
                None => Ok(Ok(receipt)),
            },
            Err(e) => Ok(Err(e)),
        })
    }

    /// Asks the provider about a message that was sent, or may have been.
    pub async fn query(
        &self,
        msg: SentMessage,
    ) -> Result<Answer<Result<DeliveryStatus, SendError>>, ChannelCallError> {
        self.call(move |w, s| {
            Box::pin(async move { w.pushonce_channel_channel().call_query(s, &msg).await })
        })
        .await
    }

    /// Handles one request the provider sent to the channel's callback URL:
    /// through `callbacks.handle-callback` when the plugin exports it
    /// (contract 2.1, opt-outs included), else `channel.handle-callback`
    /// (no opt-outs).
    pub async fn handle_callback(
        &self,
        req: CallbackRequest,
    ) -> Result<Answer<Result<CallbackOutcome, CallbackError>>, ChannelCallError> {
        let answer = self
            .call_with(move |e, s| {
                Box::pin(async move {
                    if let Some(c) = &e.callbacks {
                        return c.call_handle_callback(s, &req).await;
                    }
                    let answer = e
                        .world
                        .pushonce_channel_channel()
                        .call_handle_callback(s, &req)
                        .await?;
                    Ok(answer.map(|a| CallbackOutcome {
                        settlements: a.settlements,
                        opt_outs: Vec::new(),
                        reply: a.reply,
                    }))
                })
            })
            .await?;
        self.bounded(answer, |value| match value {
            Ok(outcome) => bounds::callback_outcome(outcome).map(Ok),
            Err(e) => Ok(Err(e)),
        })
    }

    /// `answer` as `check` leaves it where it enters the host
    /// ([`super::bounds`]); an answer `check` refuses is a failed call,
    /// [`CallError::Malformed`], with the call's log (a request may have
    /// gone out).
    fn bounded<T>(
        &self,
        answer: Answer<T>,
        check: impl FnOnce(T) -> Result<T, String>,
    ) -> Result<Answer<T>, ChannelCallError> {
        let Answer { value, log } = answer;
        match check(value) {
            Ok(value) => Ok(Answer { value, log }),
            Err(what) => Err(ChannelCallError {
                error: CallError::Malformed {
                    plugin: self.plugin.id().to_string(),
                    what,
                },
                log,
            }),
        }
    }

    fn new_store(&self, log: &Arc<Mutex<OutboundLog>>) -> Store<HostState> {
        let limits = self.plugin.runtime.limits();
        let hooks = OutboundHooks {
            policy: self.settings.policy.clone(),
            client: Some(self.settings.client.clone()),
            log: log.clone(),
        };
        let config = (*self.settings.config).clone();
        let mut store = Store::new(
            self.plugin.runtime.engine(),
            HostState::for_channel(limits, config, hooks, self.settings.cache.clone()),
        );
        store.limiter(|s| &mut s.limiter);
        store
    }

    fn take_warm(&self) -> Option<Warm> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn put_warm(&self, warm: Warm) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < self.settings.warm_instances {
            pool.push(warm);
        }
    }

    /// A new instance for a call that found no warm one, with its fuel set.
    async fn new_warm(
        &self,
        call_log: &Arc<Mutex<OutboundLog>>,
        fuel: u64,
    ) -> Result<Warm, (CallError, OutboundLog)> {
        let id = self.plugin.id();
        let mut store = self.new_store(call_log);
        store
            .set_fuel(fuel)
            .and_then(|()| store.fuel_async_yield_interval(Some(FUEL_YIELD)))
            .map_err(|e| {
                (
                    CallError::Instantiate {
                        plugin: id.to_string(),
                        reason: format!("{e:#}"),
                    },
                    OutboundLog::default(),
                )
            })?;
        match self.plugin.instantiate(&mut store).await {
            Ok(exports) => Ok(Warm { store, exports }),
            Err(e) => {
                let err = classify(id, e, store.data(), fuel);
                let log = store.data().hooks.log();
                Err((
                    match err {
                        CallError::Trap { cause, .. } => CallError::Instantiate {
                            plugin: id.to_string(),
                            reason: cause,
                        },
                        other => other,
                    },
                    log,
                ))
            }
        }
    }

    /// Runs one call of the channel world's exports (see [`Self::call_with`]).
    async fn call<T, F>(&self, f: F) -> Result<Answer<T>, ChannelCallError>
    where
        F: for<'a> FnOnce(
            &'a ChannelWorld,
            &'a mut Store<HostState>,
        ) -> std::pin::Pin<
            Box<dyn Future<Output = wasmtime::Result<T>> + Send + 'a>,
        >,
        T: Send,
    {
        self.call_with(move |e, s| f(&e.world, s)).await
    }

    /// Runs one export call on a warm (or new) instance under the budgets;
    /// `f` sees the instance's exports (the optional ones included).
    async fn call_with<T, F>(&self, f: F) -> Result<Answer<T>, ChannelCallError>
    where
        F: for<'a> FnOnce(
            &'a Exports,
            &'a mut Store<HostState>,
        ) -> std::pin::Pin<
            Box<dyn Future<Output = wasmtime::Result<T>> + Send + 'a>,
        >,
        T: Send,
    {
        let id = self.plugin.id().to_string();
        let fuel = self.plugin.runtime.limits().channel_fuel_per_call;
        let budget = self.settings.call_timeout;
        // This call's log, shared with the store's hooks and read even when
        // the call is cut off (the store is dropped with the future then).
        let call_log: Arc<Mutex<OutboundLog>> = Arc::default();
        let run = async {
            let mut warm = match self.take_warm() {
                Some(w) => w,
                None => self.new_warm(&call_log, fuel).await?,
            };
            {
                let state = warm.store.data_mut();
                state.limiter.hit = false;
                state.stderr.clear();
                state.hooks.log = call_log.clone();
            }
            if let Err(e) = warm.store.set_fuel(fuel) {
                return Err((
                    CallError::Trap {
                        plugin: id.clone(),
                        cause: format!("{e:#}"),
                    },
                    OutboundLog::default(),
                ));
            }
            let Warm { mut store, exports } = warm;
            let result = f(&exports, &mut store).await;
            let log = store.data().hooks.log();
            match result {
                Ok(value) => {
                    self.put_warm(Warm { store, exports });
                    Ok(Answer { value, log })
                }
                Err(e) => Err((classify(&id, e, store.data(), fuel), log)),
            }
        };
        match tokio::time::timeout(budget, run).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err((error, log))) => Err(ChannelCallError { error, log }),
            Err(_) => Err(ChannelCallError {
                error: CallError::TimedOut {
                    plugin: id,
                    millis: budget.as_millis() as u64,
                },
                log: call_log.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            }),
        }
    }
}

/// A load-time call that ran past its bound ([`super::Limits::load_timeout`]).
#[derive(Debug, thiserror::Error)]
#[error("did not answer within {} ms", .0.as_millis())]
pub(crate) struct LoadTimedOut(pub(crate) Duration);

/// Polls a future to completion on this thread, for calls at load time (a
/// channel plugin's instantiation and `describe`), so loading works from sync
/// code and from inside a tokio runtime alike; gives up with [`LoadTimedOut`]
/// after `limit`, dropping the future (and with it the call). A plugin may
/// wait on a clock there: the thread parks until woken or for a short while,
/// and a tokio context is entered (a spare one when none is current) so the
/// wait is registered instead of panicking.
pub(crate) fn block_on_within<F, T>(fut: F, limit: Duration) -> wasmtime::Result<T>
where
    F: Future<Output = wasmtime::Result<T>>,
{
    use std::task::{Context, Poll, Wake, Waker};
    use std::time::Instant;

    /// Wakes the loading thread.
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    /// The context entered when none is current.
    static SPARE: std::sync::OnceLock<Option<tokio::runtime::Runtime>> = std::sync::OnceLock::new();

    let _context = match tokio::runtime::Handle::try_current() {
        Ok(_) => None,
        Err(_) => SPARE
            .get_or_init(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .ok()
            })
            .as_ref()
            .map(tokio::runtime::Runtime::enter),
    };
    let deadline = Instant::now() + limit;
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(wasmtime::Error::new(LoadTimedOut(limit)));
        }
        // Not every waiting future is woken (a timer on a spare runtime
        // nobody drives): look again soon.
        std::thread::park_timeout(left.min(Duration::from_millis(10)));
    }
}
