//! Channels set up for end-to-end tests in process (`channels.rs`,
//! `reconcile.rs`): a real redis-server, the real provider simulator on
//! 127.0.0.1 over TLS, the real channel plugins pointing at it, a dispatcher
//! sending through a `PluginSender` (with its shared cache in that Redis, as
//! `pushonce serve` has it) and, when asked, a reconciler checking through
//! the same sender.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use pushonce::config::{ChannelConfig, ReconcileBackoff, ReconcileConfig};
use pushonce::dispatch::{DispatchConfig, Dispatcher};
use pushonce::permit::{AcceptRequest, Acceptance, PermitConfig, Permits, RetryPolicy, TaskStatus};
use pushonce::plugin::PluginRegistry;
use pushonce::reconcile::Reconciler;
use pushonce::send::Payload;
use pushonce::send::plugin::PluginSender;
use pushonce::store::RedisConn;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::plugins::{limits, real_dir};
use crate::redis::RedisServer;
use crate::wait_until;

/// How long a test waits for a task to reach a status.
pub const DEADLINE: Duration = Duration::from_secs(30);

pub use crate::providers::{Sim, sim};

/// A registry of the real plugins.
pub fn registry() -> Arc<PluginRegistry> {
    let (registry, refused) = PluginRegistry::load_dir(&real_dir(), &limits(), None).unwrap();
    assert!(refused.is_empty(), "refused: {refused:?}");
    Arc::new(registry)
}

/// A sender over `channels` with the real plugins, the secrets from `sim`'s environment.
pub fn sender(sim: &Sim, channels: &BTreeMap<String, ChannelConfig>) -> PluginSender {
    let registry = registry();
    sender_over(sim, channels, move || registry.clone())
}

/// [`sender`] resolving plugins in whatever `registry()` answers at each
/// send (as a host's sender follows its reloads).
pub fn sender_over(
    sim: &Sim,
    channels: &BTreeMap<String, ChannelConfig>,
    registry: impl Fn() -> Arc<PluginRegistry> + Send + Sync + 'static,
) -> PluginSender {
    let env = sim.env();
    PluginSender::new(channels, Arc::new(registry), move |var| {
        env.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone())
    })
    .unwrap()
}

/// [`sender`] with its shared cache (access tokens) in `redis`, as the host has it.
pub async fn cached_sender(
    sim: &Sim,
    channels: &BTreeMap<String, ChannelConfig>,
    redis: &RedisServer,
) -> PluginSender {
    let conn = RedisConn::Single(redis.manager().await.unwrap());
    sender(sim, channels).with_shared_cache(&conn, "pushonce-test")
}

/// Quick retries, many attempts.
pub fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 12,
        initial: Duration::from_millis(30),
        factor: 1.5,
        max_delay: Duration::from_millis(300),
        jitter: true,
    }
}

/// A reconciler that checks soon and often: `unknown` tasks after 1 s (time
/// for a test to change the simulator's faults first), `sent` ones after
/// 300 ms, up to `max_checks` times.
pub fn quick_reconcile(max_checks: u32) -> ReconcileConfig {
    ReconcileConfig {
        every: Duration::from_millis(50),
        sent_age: Duration::from_millis(300),
        unknown_age: Duration::from_secs(1),
        max_checks,
        max_requeues: 3,
        backoff: ReconcileBackoff {
            initial: Duration::from_millis(100),
            factor: 1.5,
            max: Duration::from_millis(300),
        },
        batch: 100,
        check_timeout: Duration::from_secs(5),
    }
}

/// One attempt only (an unknown outcome the dispatcher cannot settle at once
/// is held `unknown`), then [`quick_reconcile`].
pub fn one_attempt_then_reconcile(max_checks: u32) -> EnvOptions {
    EnvOptions {
        retry: RetryPolicy {
            max_attempts: 1,
            ..fast_retry()
        },
        reconcile: Some(quick_reconcile(max_checks)),
    }
}

/// How an [`Env`] is started besides its channels.
#[derive(Debug, Clone)]
pub struct EnvOptions {
    /// The retry schedule of accepted tasks.
    pub retry: RetryPolicy,
    /// Runs a reconciler with these settings (their ages go into the permit
    /// layer, which schedules the checks).
    pub reconcile: Option<ReconcileConfig>,
}

impl Default for EnvOptions {
    fn default() -> Self {
        EnvOptions {
            retry: fast_retry(),
            reconcile: None,
        }
    }
}

/// Redis, the simulator, a dispatcher (and a reconciler) sending through the plugins.
pub struct Env {
    /// The Redis server, stopped when dropped.
    _redis: RedisServer,
    /// The provider simulator.
    pub sim: Sim,
    /// The permit layer on that Redis.
    pub permits: Permits,
    /// The sender the dispatcher and the reconciler use.
    pub sender: Arc<PluginSender>,
    /// The retry schedule of accepted tasks.
    retry: RetryPolicy,
    /// Stops the dispatcher and the reconciler.
    stop: watch::Sender<bool>,
    /// The dispatcher's and reconciler's tasks.
    handles: Vec<JoinHandle<()>>,
}

impl Env {
    /// Starts everything with default options; `tweak` adjusts the channels.
    pub async fn start(tweak: impl FnOnce(&mut BTreeMap<String, ChannelConfig>)) -> Env {
        Env::start_with(tweak, EnvOptions::default()).await
    }

    /// Starts everything with `options`; `tweak` adjusts the channels.
    pub async fn start_with(
        tweak: impl FnOnce(&mut BTreeMap<String, ChannelConfig>),
        options: EnvOptions,
    ) -> Env {
        Env::start_with_sim(|_, chans| tweak(chans), options).await
    }

    /// [`Env::start_with`] whose `tweak` also sees the simulator (to add a
    /// channel pointing at it, e.g. [`Sim::tencent_channel`]).
    pub async fn start_with_sim(
        tweak: impl FnOnce(&Sim, &mut BTreeMap<String, ChannelConfig>),
        options: EnvOptions,
    ) -> Env {
        let redis = RedisServer::start().await.unwrap();
        let sim = sim().await;
        let mut chans = sim.channels();
        tweak(&sim, &mut chans);
        let mut config = PermitConfig::default();
        if let Some(r) = &options.reconcile {
            config.check_sent_after = r.sent_age;
            config.check_unknown_after = r.unknown_age;
        }
        let permits = redis.permits(config).await.unwrap();
        permits.prepare().await.unwrap();
        let sender = Arc::new(cached_sender(&sim, &chans, &redis).await);
        let (stop, rx) = watch::channel(false);
        let dispatcher = Dispatcher::new(
            redis.client(),
            permits.clone(),
            sender.clone(),
            DispatchConfig {
                workers: 8,
                lease: Duration::from_secs(5),
                block: Duration::from_millis(100),
                promote_every: Duration::from_millis(20),
                ..DispatchConfig::default()
            },
            rx.clone(),
        );
        let mut handles = vec![tokio::spawn(async move { dispatcher.run().await.unwrap() })];
        if let Some(r) = options.reconcile {
            let reconciler = Reconciler::new(permits.clone(), sender.clone(), r);
            handles.push(tokio::spawn(reconciler.run(rx)));
        }
        Env {
            _redis: redis,
            sim,
            permits,
            sender,
            retry: options.retry,
            stop,
            handles,
        }
    }

    /// Stops the dispatcher (and reconciler) and waits for them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for handle in self.handles {
            tokio::time::timeout(Duration::from_secs(10), handle)
                .await
                .expect("dispatcher and reconciler stop")
                .unwrap();
        }
    }

    /// Accepts a task on `channel` under key `push:per-event@1:<channel>:<key>`.
    pub async fn accept(&self, channel: &str, key: &str, payload: &Payload) -> String {
        let req = AcceptRequest {
            key: format!("push:per-event@1:{channel}:{key}"),
            channel: channel.into(),
            window: Duration::from_secs(3600),
            biz_type: "ORDER_SHIPPED".into(),
            biz_id: key.into(),
            event_json: "{}".into(),
            payload: serde_json::to_string(payload).unwrap(),
            policy_name: "per-event".into(),
            policy_version: "1.0.0".into(),
            retry: self.retry,
            gate: Default::default(),
            recipient: None,
            send_at_ms: None,
        };
        match self.permits.accept(&req).await.unwrap() {
            Acceptance::Accepted { task_id } => task_id,
            other => panic!("not accepted: {other:?}"),
        }
    }

    /// The task's status, if it exists.
    pub async fn status(&self, task: &str) -> Option<TaskStatus> {
        self.permits.task(task).await.unwrap().map(|t| t.status)
    }

    /// Waits until the task is in `want` (panics with the task after [`DEADLINE`]).
    pub async fn wait_status(&self, task: &str, want: TaskStatus) {
        let ok = wait_until(DEADLINE, || async { self.status(task).await == Some(want) }).await;
        if ok.is_err() {
            let t = self.permits.task(task).await.unwrap();
            panic!("task {task} never became {want}: {t:?}");
        }
    }

    /// What the provider of `channel` accepted, per the simulator's ledger.
    pub fn ledger(&self, channel: &str) -> Vec<provider_sim::Accepted> {
        self.sim.ledger(channel)
    }
}

/// A payload to `recipient` with `template` and one parameter.
pub fn payload(recipient: &str, template: &str) -> Payload {
    Payload {
        recipient: recipient.into(),
        template: template.into(),
        params: vec![("order".into(), "o-1".into())],
        plugin: None,
        fallback: None,
        unsubscribe: None,
    }
}
