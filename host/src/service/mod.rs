//! The whole host assembled: configuration → Redis (a URL or the embedded
//! server) → `Live` (plugins and policies) → `Permits` → `Dispatcher` (with a
//! sender) and `Reconciler` (checking through the same sender) → the HTTP
//! API on a listener. [`start`] returns once the host
//! serves, so tests run it in-process on `127.0.0.1:0`; `pushonce serve`
//! calls it too.
//!
//! Shutdown is graceful and ordered: stop accepting connections, finish the
//! requests in flight, then stop the dispatcher and the reconciler (attempts
//! and checks in flight finish and are recorded, nothing half-done), then stop
//! the embedded Redis (AOF flushed).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::api::receipts::CallbackGates;
use crate::api::{self, ApiLimits, AppState, SharedReceiptHandler, SharedState, Token};
use crate::config::HostConfig;
use crate::corpus::CorpusSampler;
use crate::ledger::Ledger;
use crate::permit::{PermitConfig, Permits};
use crate::route::Live;
use crate::route::watch::{Trigger, reload_loop, watch_dirs};
use crate::send::Sender;
use crate::send::plugin::PluginSender;
use crate::store::{RedisConn, Store};

mod delivery;
mod error;
mod receipts;
mod reload;

use delivery::{Delivery, spawn_delivery};
pub use error::ServiceError;
use receipts::{PluginReceipts, callback_gates};
use reload::checked_reloader;

/// Reads an environment variable by name (tests give their own).
pub type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// What the host is started with besides its configuration.
#[derive(Clone)]
pub struct ServiceOptions {
    /// Where the tokens' environment variables are read.
    pub env: EnvLookup,
    /// The sender; [`default_sender`] when `None`.
    pub sender: Option<Arc<dyn Sender>>,
    /// Provider callbacks' handler; receipts answer 501 when `None`.
    pub receipts: Option<SharedReceiptHandler>,
    /// API limits.
    pub limits: ApiLimits,
    /// How long one dispatcher read blocks (bounds how fast it notices shutdown).
    pub dispatch_block: Duration,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            env: Arc::new(|name| std::env::var(name).ok()),
            sender: None,
            receipts: None,
            limits: ApiLimits::default(),
            dispatch_block: Duration::from_secs(1),
        }
    }
}

/// The host's sender: every configured channel instance through its channel
/// plugin (resolved in the registry in force at each send), with secrets read
/// through `env`.
pub fn channel_sender(
    config: &HostConfig,
    live: &Arc<Live>,
    env: &EnvLookup,
    conn: &RedisConn,
    namespace: &str,
) -> Result<Arc<PluginSender>, ServiceError> {
    let live = live.clone();
    let env = env.clone();
    PluginSender::new(
        &config.channels,
        Arc::new(move || live.current().registry.clone()),
        move |var| env(var),
    )
    .map(|s| Arc::new(s.with_shared_cache(conn, namespace)))
    .map_err(ServiceError::Sender)
}

/// A host serving on a listener.
pub struct Running {
    /// The address it listens on.
    addr: SocketAddr,
    /// Its plugins and policies.
    live: Arc<Live>,
    /// Asks for a reload (SIGHUP).
    triggers: mpsc::Sender<Trigger>,
    /// Turns true to shut down.
    stop: watch::Sender<bool>,
    /// The serving task; ends after the graceful shutdown.
    task: JoinHandle<Result<(), ServiceError>>,
}

impl Running {
    /// The address the API listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The plugins and policies in force.
    pub fn live(&self) -> &Arc<Live> {
        &self.live
    }

    /// Asks for a reload of plugins and policies, as SIGHUP does.
    pub fn reload_trigger(&self) -> mpsc::Sender<Trigger> {
        self.triggers.clone()
    }

    /// A handle that asks the host to shut down when sent `true`.
    pub fn stopper(&self) -> watch::Sender<bool> {
        self.stop.clone()
    }

    /// Shuts down gracefully and waits until everything stopped.
    pub async fn shutdown(self) -> Result<(), ServiceError> {
        let _ = self.stop.send(true);
        self.task.await?
    }

    /// Waits until the host stops (after a `stopper` was used, or an error).
    pub async fn wait(self) -> Result<(), ServiceError> {
        self.task.await?
    }
}

/// Starts the whole host on `listener`: returns once Redis is prepared, the
/// plugins and policies are loaded, the dispatcher runs and the API serves.
pub async fn start(
    config: HostConfig,
    listener: TcpListener,
    options: ServiceOptions,
) -> Result<Running, ServiceError> {
    let config = Arc::new(config);
    let addr = listener.local_addr().map_err(ServiceError::Serve)?;
    config.check_exposure(addr, |v| (options.env)(v))?;
    let parts = open_parts(&config, &options).await?;
    let reload = checked_reloader(config.clone(), &parts.live, &parts.permits, &parts.plugins);
    let (triggers, trigger_rx) = mpsc::channel(4);
    let watching = watch_dirs(&[&config.plugin_dir, &config.policy_dir], triggers.clone())
        .map_err(ServiceError::Watch)?;
    let reloading = tokio::spawn(reload_loop(reload.clone(), trigger_rx));
    let state = api_state(&config, &options, &parts, reload).await?;
    api::metrics::register_channels(config.channels.keys().map(String::as_str));
    api::metrics::register_caps(&parts.live.current().policies);
    let (stop, stop_rx) = watch::channel(false);
    let (dispatch_stop, dispatch_rx) = watch::channel(false);
    let Parts {
        store,
        permits,
        ledger,
        live,
        sender,
        ..
    } = parts;
    let retention = ledger
        .as_ref()
        .map(|l| l.start_retention(config.ledger_history));
    let delivery = spawn_delivery(
        &config,
        &store,
        permits,
        sender,
        ledger,
        options.dispatch_block,
        dispatch_rx,
    );
    let background = Background {
        dispatch_stop,
        delivery,
        store,
        watching,
        reloading,
        retention,
    };
    let task = tokio::spawn(serve_then_stop(
        listener,
        api::app(state),
        config.http.clone(),
        stop_rx,
        background,
    ));
    tracing::info!(%addr, "pushonce serving");
    Ok(Running {
        addr,
        live,
        triggers,
        stop,
        task,
    })
}

/// What the host is made of, opened and checked before anything serves.
struct Parts {
    /// Redis.
    store: Store,
    /// The permit layer of the dispatcher, the reconciler and the receipts.
    permits: Permits,
    /// The delivery ledger, when on.
    ledger: Option<Ledger>,
    /// The check that the instances on this Redis share that ledger.
    ledger_guard: Option<crate::ledger_guard::LedgerGuard>,
    /// Plugins and policies in force.
    live: Arc<Live>,
    /// What sends a task (the channel plugins, unless a test gave its own).
    sender: Arc<dyn Sender>,
    /// The channel plugins' sender (a reload checks their callbacks).
    plugins: Arc<PluginSender>,
    /// What settles provider callbacks.
    receipts: SharedReceiptHandler,
    /// Which channels take callbacks, and how they are gated.
    callbacks: CallbackGates,
    /// The provider circuits of the channel plugins' sender.
    provider_health: crate::send::circuit::ProviderHealth,
    /// The recipients' preferences, read by the API and changed by
    /// opt-outs that callbacks carry.
    preferences: Arc<crate::prefs::PreferenceCache>,
}

/// Opens Redis, the permit layer and the ledger, loads plugins and policies,
/// and sets up the channels and their callbacks.
async fn open_parts(
    config: &Arc<HostConfig>,
    options: &ServiceOptions,
) -> Result<Parts, ServiceError> {
    let store = Store::open(&config.redis_target()).await?;
    let permits = open_permits(config, &store).await?;
    let ledger = open_ledger(config).await?;
    let ledger_guard = ledger_guard(config, &permits, ledger.as_ref());
    if let Some(guard) = &ledger_guard {
        guard.check(&permits.connection()).await?;
    }
    let live = load_live(config).await?;
    let plugins = channel_sender(
        config,
        &live,
        &options.env,
        &permits.connection(),
        permits.layout().namespace(),
    )?;
    let sender: Arc<dyn Sender> = match &options.sender {
        Some(s) => s.clone(),
        None => plugins.clone(),
    };
    let preferences = Arc::new(
        crate::prefs::PreferenceCache::new(
            ledger.clone(),
            config.preferences.cache_ttl,
            &config.preferences.mandatory,
        )
        .recording_answers(config.ledger_history),
    );
    // A fallback's accept, and an attempt of a message accepted before
    // the bound, read the recipient's preferences again.
    let permits = permits.with_opt_outs(Arc::new(crate::prefs::RecipientOptOuts::new(
        preferences.clone(),
        {
            let live = live.clone();
            move |biz_type: &str| live.opt_out_policy(biz_type)
        },
    )));
    let receipts = receipts_handler(config, options, &permits, &plugins, &ledger, &preferences);
    let callbacks = callback_gates(config, &plugins).await?;
    warn_of_unlinked_channels(config, &plugins);
    let provider_health = plugins.provider_health();
    Ok(Parts {
        store,
        permits,
        ledger,
        ledger_guard,
        live,
        sender,
        plugins,
        receipts,
        callbacks,
        provider_health,
        preferences,
    })
}

/// The API's state. The API takes permits on its own multiplexed
/// connection, so an accept never queues behind the dispatcher's scripts on
/// the same socket.
async fn api_state(
    config: &HostConfig,
    options: &ServiceOptions,
    parts: &Parts,
    reload: crate::route::watch::Reloader,
) -> Result<AppState, ServiceError> {
    let api_permits = parts.permits.on(parts.store.manager().await?);
    let env = &options.env;
    let metrics = api::metrics::prometheus_handle();
    let recent = Arc::new(api::overview::Recent::default());
    api::overview::spawn_sampler(Arc::downgrade(&recent), metrics.clone());
    Ok(AppState::new(SharedState {
        live: parts.live.clone(),
        permits: api_permits,
        ledger: parts.ledger.clone(),
        ledger_guard: parts.ledger_guard.clone(),
        eviction: eviction_guard(config),
        limits: ApiLimits {
            occurred_at_years: config.occurred_at_years,
            send_at: config.send_at,
            ..options.limits
        },
        api_token: token(env, config.auth.api_token_env.as_deref(), "/v1"),
        admin_token: token(env, config.auth.admin_token_env.as_deref(), "/admin"),
        callbacks: parts.callbacks.clone(),
        receipts: Some(parts.receipts.clone()),
        reload,
        metrics,
        corpus: Arc::new(CorpusSampler::default()),
        recent,
        provider_health: parts.provider_health.clone(),
        preferences: parts.preferences.clone(),
        preferences_api_writes: config.preferences.api_token_writes,
        unsubscribe: unsubscribe_links(config, env)?.map(Arc::new),
    }))
}

/// Warns of each channel whose plugin would write one-click unsubscribe
/// headers (it takes extras, e.g. email) on a host that writes no links
/// (`[unsubscribe] secret_env` unset): its messages go without
/// `List-Unsubscribe`, which Gmail and Yahoo ask of bulk senders.
fn warn_of_unlinked_channels(config: &HostConfig, plugins: &PluginSender) {
    if config.unsubscribe.writes_links() {
        return;
    }
    for name in plugins.channels() {
        if plugins.takes_extras(name) {
            tracing::warn!(channel = %name, "the channel's plugin writes one-click unsubscribe headers, but [unsubscribe] secret_env is not set: its messages carry no unsubscribe link (docs/preferences.md)");
        }
    }
}

/// The signer of one-click unsubscribe links, when `[unsubscribe]
/// secret_env` is set; its variable unset or short stops the start.
fn unsubscribe_links(
    config: &HostConfig,
    env: &EnvLookup,
) -> Result<Option<crate::unsubscribe::UnsubscribeLinks>, ServiceError> {
    Ok(crate::unsubscribe::UnsubscribeLinks::from_config(
        &config.unsubscribe,
        &**env,
    )?)
}

/// What runs beside the API and stops after it.
struct Background {
    /// Asks the dispatcher and the reconciler to stop.
    dispatch_stop: watch::Sender<bool>,
    /// The dispatcher and the reconciler.
    delivery: Delivery,
    /// Redis (the embedded server stops with it).
    store: Store,
    /// The directory watcher (stops when dropped).
    watching: crate::route::watch::DirWatch,
    /// The reload loop.
    reloading: JoinHandle<()>,
    /// The removal of ledger rows past their window and `ledger_history`
    /// (stops when dropped).
    retention: Option<crate::ledger::Retention>,
}

/// Serves the API until `stop`, then stops what runs beside it: the
/// dispatcher (attempts in flight finish and are recorded), Redis, the watcher.
async fn serve_then_stop(
    listener: TcpListener,
    app: axum::Router,
    http: crate::config::HttpConfig,
    stop: watch::Receiver<bool>,
    background: Background,
) -> Result<(), ServiceError> {
    crate::listener::serve(listener, app, &http, stop).await;
    tracing::info!("API stopped; stopping the dispatcher (attempts in flight finish)");
    let _ = background.dispatch_stop.send(true);
    let stopped = background.delivery.stop().await;
    background.store.shutdown().await;
    drop(background.watching);
    drop(background.retention);
    background.reloading.abort();
    stopped
}

/// The permit layer on the store, its Redis checked not to evict (before
/// anything is written), its scripts and groups prepared.
async fn open_permits(config: &HostConfig, store: &Store) -> Result<Permits, ServiceError> {
    let permits = Permits::new(store.manager().await?, permit_config(config));
    eviction_guard(config).check(&permits.connection()).await?;
    permits.prepare().await?;
    Ok(permits)
}

/// The permit layer's settings from the host configuration.
pub(crate) fn permit_config(config: &HostConfig) -> PermitConfig {
    PermitConfig {
        shards: config.shards,
        retention: config.task_retention,
        keep_ended: config.keep_ended_tasks,
        event_index: config.event_index,
        check_sent_after: config.reconcile.sent_age,
        check_unknown_after: config.reconcile.unknown_age,
        wait_replicas: config.wait_replicas,
        wait_replicas_timeout: config.wait_replicas_timeout,
        ..PermitConfig::default()
    }
}

/// What the host accepts of Redis's `maxmemory-policy`, from the configuration.
fn eviction_guard(config: &HostConfig) -> crate::eviction::EvictionGuard {
    crate::eviction::EvictionGuard {
        allow_evicting: config.allow_evicting_redis,
        ledger: config.ledger().is_some(),
    }
}

/// The check that every instance on this Redis claims in the same ledger
/// (`None` with the ledger off: there is nothing to share).
fn ledger_guard(
    config: &HostConfig,
    permits: &Permits,
    ledger: Option<&Ledger>,
) -> Option<crate::ledger_guard::LedgerGuard> {
    ledger.map(|l| {
        crate::ledger_guard::LedgerGuard::new(
            permits.layout().namespace(),
            l.backend(),
            l.id(),
            config.allow_separate_ledgers,
        )
    })
}

/// The plugins and policies, loaded and checked (off the async threads: it
/// compiles components).
async fn load_live(config: &Arc<HostConfig>) -> Result<Arc<Live>, ServiceError> {
    let config = config.clone();
    Ok(Arc::new(
        tokio::task::spawn_blocking(move || Live::load(config)).await??,
    ))
}

/// The receipts handler: the one given in `options`, else the channel
/// plugins' `handle-callback`.
fn receipts_handler(
    config: &HostConfig,
    options: &ServiceOptions,
    permits: &Permits,
    plugins: &Arc<PluginSender>,
    ledger: &Option<Ledger>,
    preferences: &Arc<crate::prefs::PreferenceCache>,
) -> SharedReceiptHandler {
    let chain_of = config
        .channels
        .iter()
        .flat_map(|(name, c)| c.providers.iter().map(|p| (p.clone(), name.clone())))
        .collect();
    match &options.receipts {
        Some(r) => r.clone(),
        None => Arc::new(PluginReceipts {
            permits: permits.clone(),
            sender: plugins.clone(),
            unmatched_grace: config.receipts.unmatched_grace,
            ledger: ledger.clone(),
            preferences: preferences.clone(),
            chain_of,
        }),
    }
}

/// Opens the delivery ledger the configuration names (`None` when it is
/// `off`: unsafe, warned about).
async fn open_ledger(config: &HostConfig) -> Result<Option<Ledger>, ServiceError> {
    let Some(url) = config.ledger() else {
        tracing::warn!(
            "ledger_url = \"off\": no delivery ledger; a Redis failover that loses permits will send re-posted events twice"
        );
        return Ok(None);
    };
    if url.starts_with("sqlite:") {
        std::fs::create_dir_all(&config.data_dir).map_err(|source| ServiceError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;
    }
    let ledger = Ledger::open(&url).await?;
    tracing::info!(backend = ledger.backend(), "delivery ledger open");
    Ok(Some(ledger))
}

/// Runs the host on `listener` until `shutdown` completes, then stops gracefully.
pub async fn run(
    config: HostConfig,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    options: ServiceOptions,
) -> Result<(), ServiceError> {
    let running = start(config, listener, options).await?;
    let stopper = running.stopper();
    tokio::spawn(async move {
        shutdown.await;
        let _ = stopper.send(true);
    });
    running.wait().await
}

/// The token named by `var` (read through `env`); warns when the surface is open.
fn token(env: &EnvLookup, var: Option<&str>, surface: &str) -> Token {
    let secret = var.and_then(|v| env(v)).filter(|s| !s.is_empty());
    if secret.is_none() {
        match var {
            Some(v) => tracing::warn!(
                surface,
                variable = v,
                "token variable unset or empty: {surface} is open to anyone who can reach it"
            ),
            None => tracing::warn!(
                surface,
                "no token configured: {surface} is open to anyone who can reach it"
            ),
        }
    }
    Token::new(secret.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_secret(secret: Option<&'static str>) -> (HostConfig, EnvLookup) {
        let mut config = HostConfig::default();
        config.unsubscribe.secret_env = Some("UNSUB_SECRET".into());
        config.unsubscribe.base_url = Some("https://push.example.com".into());
        let env: EnvLookup = Arc::new(move |name| {
            (name == "UNSUB_SECRET")
                .then_some(secret)
                .flatten()
                .map(String::from)
        });
        (config, env)
    }

    #[test]
    fn an_unset_or_short_unsubscribe_secret_stops_the_start_by_name() {
        for (secret, found) in [(None, "unset or empty"), (Some("short"), "5 bytes long")] {
            let (config, env) = with_secret(secret);
            let refused = unsubscribe_links(&config, &env).expect_err("refused");
            let text = refused.to_string();
            assert!(
                text.contains("UNSUB_SECRET") && text.contains(found),
                "{text}"
            );
        }
        let (config, env) = with_secret(Some("a secret of at least thirty-two bytes"));
        assert!(unsubscribe_links(&config, &env).unwrap().is_some());
        let (mut config, env) = with_secret(None);
        config.unsubscribe.secret_env = None;
        assert!(unsubscribe_links(&config, &env).unwrap().is_none());
    }
}
