//! The chaos proof: no duplicate, no miss, while hosts are killed and Redis
//! restarts.
//!
//! [`run`] starts Redis (AOF on), the provider simulator with injected faults
//! and several `pushonce serve` processes sharing that Redis; posts every
//! event several times, concurrently, to different instances (a post that
//! meets a dead instance or a 503 is retried on another, as a business
//! service would); meanwhile kills random instances with `kill -9` and
//! restarts them, and restarts Redis; waits until nothing is queued or
//! waiting for a retry; then compares what the policies say should have been
//! sent with what the providers received (the simulator's ledger), message
//! by message, per provider and recipient.
//!
//! The expected side is computed here from the events and the chaos
//! policies, not from pushonce's answers: `ORDER_SHIPPED` is one message per
//! event per channel (an SMS in arrears falls back to app push, whose key is
//! the event's own app push: still one push); `RESUME_VIEWED` one per user
//! per day; `INTERVIEW_REMINDER` one per user per job.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use provider_sim::Faults;
use pushonce::permit::Layout;
use pushonce::store::RedisConn;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::cluster::RedisCluster;
use crate::postgres::PostgresServer;
use crate::providers::{self, Sim};
use crate::redis::RedisServer;
use crate::stack::{ServeConfig, ServeProcess};

/// What a chaos run does.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// Distinct events posted (spread over three business types).
    pub events: usize,
    /// Times each event is posted, concurrently, each to another instance.
    pub posts: usize,
    /// `pushonce serve` processes sharing the Redis.
    pub instances: usize,
    /// Events in flight at once.
    pub concurrency: usize,
    /// Kills spread evenly over the load (on top of the timed ones).
    pub kills: usize,
    /// Pause between two timed `kill -9`s of a random instance (it is
    /// restarted at once); they go on until the backlog has drained.
    pub kill_every: Duration,
    /// Redis restarts during the load, spread evenly over it.
    pub redis_restarts: usize,
    /// Share of sends each provider answers 5xx (429 gets half of it).
    pub fail_rate: f64,
    /// Share of sends each provider accepts and then cuts the answer off.
    pub drop_rate: f64,
    /// Share of the 5xx answers given after the provider accepted the
    /// message (`provider_sim::Faults::error_after_accept`).
    pub error_after_accept: f64,
    /// How long to wait for quiescence after the load.
    pub quiescence_timeout: Duration,
    /// Seed of the kills' choices.
    pub seed: u64,
    /// Print a progress line every this often.
    pub progress_every: Duration,
    /// Run on a Redis Cluster of three masters instead of one Redis.
    pub cluster: bool,
    /// The delivery ledger every instance claims in.
    pub ledger: ChaosLedger,
}

/// Which delivery ledger a chaos run's instances use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChaosLedger {
    /// One real PostgreSQL shared by every instance, as a deployment of
    /// several instances has it.
    Postgres,
    /// Each instance its own SQLite file (the embedded default of a single
    /// instance): claims are not shared between instances.
    SqlitePerInstance,
}

impl Default for ChaosConfig {
    fn default() -> Self {
        ChaosConfig {
            events: 20_000,
            posts: 3,
            instances: 3,
            concurrency: 64,
            kills: 6,
            kill_every: Duration::from_secs(5),
            redis_restarts: 2,
            fail_rate: 0.05,
            drop_rate: 0.02,
            error_after_accept: 0.5,
            quiescence_timeout: Duration::from_secs(600),
            seed: 7,
            progress_every: Duration::from_secs(5),
            cluster: false,
            ledger: ChaosLedger::Postgres,
        }
    }
}

/// What a chaos run saw.
#[derive(Debug, Clone, Default)]
pub struct ChaosReport {
    /// Distinct events.
    pub events: usize,
    /// HTTP posts answered (accepted or duplicate), retries of a post not counted.
    pub posts: u64,
    /// Posts retried on another instance (connection lost, 503).
    pub post_retries: u64,
    /// Channel answers `accepted` / `duplicate`.
    pub accepted: u64,
    /// Channel answers `duplicate`.
    pub duplicate_answers: u64,
    /// Messages the policies call for.
    pub expected: u64,
    /// Expected messages the providers received.
    pub delivered: u64,
    /// Messages beyond the expected ones (per provider and recipient).
    pub duplicates: u64,
    /// Expected messages neither received nor visibly held.
    pub misses: u64,
    /// Tasks the delivery ledger stopped (`duplicate_prevented`): Redis had
    /// lost their permit, another task owned the key in the ledger.
    pub duplicate_prevented: u64,
    /// Tasks held for an operator (`unknown` or `dead`).
    pub held: u64,
    /// Held tasks per (channel, cause).
    pub held_by: BTreeMap<(String, String), u64>,
    /// Tasks resent after an ambiguous answer on a channel that cannot
    /// dedupe the resend (`possible_duplicate`), per channel.
    pub possible_duplicates: BTreeMap<String, u64>,
    /// Expected messages not at the provider whose task is visibly held.
    pub held_missing: u64,
    /// Held tasks not explained by an injected fault (on a channel that can
    /// deduplicate or be queried, or with another cause).
    pub held_unexplained: u64,
    /// Extra attempts (retries and resends) over every task.
    pub retries: u64,
    /// Tasks that failed for good and handed over to their fallback channel.
    pub fallbacks: u64,
    /// `kill -9`s of host instances.
    pub kills: u64,
    /// Redis restarts.
    pub redis_restarts: u64,
    /// Seconds of the load.
    pub load_seconds: f64,
    /// Seconds from the end of the load until nothing was queued or waiting.
    pub quiescence_seconds: f64,
    /// Examples of duplicates and misses, for the failure message.
    pub examples: Vec<String>,
}

impl ChaosReport {
    /// The table a user reads.
    pub fn table(&self, title: &str) -> String {
        let rows: Vec<(&str, String)> = vec![
            ("events", self.events.to_string()),
            ("posts answered", self.posts.to_string()),
            ("posts retried elsewhere", self.post_retries.to_string()),
            (
                "channel answers accepted / duplicate",
                format!("{} / {}", self.accepted, self.duplicate_answers),
            ),
            ("expected messages", self.expected.to_string()),
            ("delivered", self.delivered.to_string()),
            ("duplicates", self.duplicates.to_string()),
            (
                "duplicates prevented by the ledger",
                self.duplicate_prevented.to_string(),
            ),
            ("misses", self.misses.to_string()),
            (
                "held for an operator (unexplained)",
                format!("{} ({})", self.held, self.held_unexplained),
            ),
            (
                "  of which not at the provider",
                self.held_missing.to_string(),
            ),
        ];
        let held_rows: Vec<(String, String)> = self
            .held_by
            .iter()
            .map(|((channel, cause), n)| (format!("  held on {channel}: {cause}"), n.to_string()))
            .collect();
        let possible_rows: Vec<(String, String)> = self
            .possible_duplicates
            .iter()
            .map(|(channel, n)| {
                (
                    format!("possible duplicates (ambiguous answers resent) on {channel}"),
                    n.to_string(),
                )
            })
            .collect();
        let rows: Vec<(&str, String)> = rows
            .into_iter()
            .chain(held_rows.iter().map(|(k, v)| (k.as_str(), v.clone())))
            .chain(possible_rows.iter().map(|(k, v)| (k.as_str(), v.clone())))
            .chain(vec![
                ("retries", self.retries.to_string()),
                ("fallbacks", self.fallbacks.to_string()),
                ("kills (kill -9)", self.kills.to_string()),
                ("Redis restarts", self.redis_restarts.to_string()),
                ("load time", format!("{:.1} s", self.load_seconds)),
                (
                    "time to quiescence",
                    format!("{:.1} s", self.quiescence_seconds),
                ),
            ])
            .collect();
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        let mut out = format!(
            "{title}\n\n| {:width$} | value |\n|{}|-------|\n",
            "",
            "-".repeat(width + 2)
        );
        for (k, v) in rows {
            out.push_str(&format!("| {k:width$} | {v} |\n"));
        }
        out
    }

    /// Duplicates and misses are zero and every held task is explained.
    pub fn is_clean(&self) -> bool {
        self.duplicates == 0 && self.misses == 0 && self.held_unexplained == 0
    }
}

/// The Redis a chaos run uses.
pub enum Backend {
    /// One `redis-server` with AOF.
    Single(RedisServer),
    /// A Redis Cluster of three masters (AOF, `appendfsync always`); a
    /// "Redis restart" restarts the next master in turn.
    Cluster {
        /// The cluster.
        cluster: RedisCluster,
        /// The master restarted next.
        next: usize,
    },
}

impl Backend {
    /// Starts one Redis, or a cluster of three masters.
    pub async fn start(cluster: bool) -> anyhow::Result<Backend> {
        Ok(if cluster {
            Backend::Cluster {
                cluster: RedisCluster::start(3).await?,
                next: 0,
            }
        } else {
            Backend::Single(RedisServer::start().await?)
        })
    }

    /// The Redis lines of a host's configuration.
    fn config_lines(&self) -> String {
        match self {
            Backend::Single(r) => format!("redis_url = \"{}\"", r.url()),
            Backend::Cluster { cluster, .. } => {
                let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
                format!("redis_cluster = [{}]", urls.join(", "))
            }
        }
    }

    /// What the table calls this backend.
    pub fn describe(&self) -> &'static str {
        match self {
            Backend::Single(_) => "one Redis",
            Backend::Cluster { .. } => "Redis Cluster (3 masters)",
        }
    }

    /// Restarts Redis (`SHUTDOWN`, which fsyncs the AOF, then a new process
    /// on the same data); on a cluster, the next master in turn.
    async fn restart(&mut self) -> anyhow::Result<()> {
        match self {
            Backend::Single(r) => r.restart().await,
            Backend::Cluster { cluster, next } => {
                let i = *next % cluster.len();
                *next += 1;
                cluster.restart_node(i).await
            }
        }
    }

    /// A connection for the backlog polls (reconnecting; on a cluster,
    /// replaced when it stops answering).
    async fn connection(&self) -> anyhow::Result<RedisConn> {
        Ok(match self {
            Backend::Single(r) => r.manager().await?.into(),
            Backend::Cluster { cluster, .. } => cluster.connection().await?,
        })
    }
}

/// Entries still in the ready streams, retries waiting and tasks awaiting a
/// reconciler check, over every
/// shard (one command per key, so no command crosses a shard).
async fn backlog(conn: &mut RedisConn, layout: &Layout) -> anyhow::Result<u64> {
    let mut total = 0u64;
    for shard in 0..layout.shards() {
        let ready: u64 = redis::cmd("XLEN")
            .arg(layout.ready(shard))
            .query_async(conn)
            .await?;
        let delayed: u64 = redis::cmd("ZCARD")
            .arg(layout.delayed(shard))
            .query_async(conn)
            .await?;
        // Tasks awaiting a reconciler check (an `unknown` SMS waits for its
        // status query past the provider's lag): not quiet until checked.
        let awaiting: u64 = redis::cmd("ZCARD")
            .arg(layout.awaiting(shard))
            .query_async(conn)
            .await?;
        total += ready + delayed + awaiting;
    }
    Ok(total)
}

/// Shards of the chaos hosts' key layout.
const SHARDS: u16 = 8;

/// The chaos policies: the repository's three business types with a short
/// retry schedule (so a run ends in minutes) and room for many attempts.
/// `INTERVIEW_REMINDER` carries a frequency cap (per user, far above the
/// three or so reminders a candidate gets, so it never binds): every one of
/// its accepts counts in the user's cap inside the accept script, on a
/// Redis Cluster too (the cap and the permits share the user's hash slot).
const POLICIES: [(&str, &str); 3] = [
    (
        "order-shipped.toml",
        r#"biz_type = "ORDER_SHIPPED"
key_policy = "per-event@^1"
channels = ["sms", "wechat", "app-push"]
window = "24h"
[retry]
max_attempts = 12
backoff = { initial = "200ms", factor = 2.0, max = "2s", jitter = true }
[fallback]
sms = "app-push"
"#,
    ),
    (
        "resume-viewed.toml",
        r#"biz_type = "RESUME_VIEWED"
key_policy = "per-user-per-day@^1"
params = { tz = "+08:00" }
channels = ["inbox", "sms", "wechat"]
window = "48h"
[retry]
max_attempts = 12
backoff = { initial = "200ms", factor = 2.0, max = "2s", jitter = true }
"#,
    ),
    (
        "interview-reminder.toml",
        r#"biz_type = "INTERVIEW_REMINDER"
key_policy = "per-user-per-job@^1"
params = { job_attr = "job_id" }
channels = ["inbox", "sms", "app-push"]
window = "7d"
[retry]
max_attempts = 12
backoff = { initial = "200ms", factor = 2.0, max = "2s", jitter = true }
[caps.reminders]
max = 100
window = "1h"
scope = "user"
"#,
    ),
];

/// One generated event and the messages it calls for.
struct Planned {
    /// The request body.
    body: Value,
    /// `(provider, recipient, dedup unit)`: the message this event calls for
    /// on each channel; events sharing a unit share the message.
    messages: Vec<(&'static str, String, String)>,
}

/// Event `i` of the run: business type by `i % 3`.
fn plan(i: usize, events: usize) -> Planned {
    let n = i / 3;
    match i % 3 {
        0 => {
            // One message per order and channel; every 97th phone is in arrears.
            let phone = if n % 97 == 5 {
                format!("137{n:08}")
            } else {
                format!("139{n:08}")
            };
            let unit = format!("o-{n}");
            let mut messages = vec![
                ("wechat", format!("openid-o{n}"), unit.clone()),
                ("app-push", format!("device-o{n}"), unit.clone()),
            ];
            if !phone.starts_with("137") {
                messages.push(("sms", phone.clone(), unit.clone()));
            }
            Planned {
                body: json!({
                    "biz_type": "ORDER_SHIPPED", "biz_id": unit, "user_id": format!("u-o{n}"),
                    "occurred_at": "2026-11-30T08:00:00Z", "template": "order_shipped",
                    "params": {"order": format!("o-{n}")},
                    "recipients": {"sms": phone, "wechat": format!("openid-o{n}"), "app-push": format!("device-o{n}")}
                }),
                messages,
            }
        }
        1 => {
            // About four views per candidate, over two days (UTC+8).
            let users = (events / 12).max(1);
            let k = n % users;
            let day = (n / users) % 2;
            let at = if day == 0 {
                "2026-11-29T10:00:00+08:00"
            } else {
                "2026-11-30T10:00:00+08:00"
            };
            let unit = format!("r-{k}-day{day}");
            Planned {
                body: json!({
                    "biz_type": "RESUME_VIEWED", "biz_id": format!("view-{n}"), "user_id": format!("u-r{k}"),
                    "occurred_at": at, "template": "resume_viewed",
                    "recipients": {"inbox": format!("u-r{k}"), "sms": format!("136{k:08}"), "wechat": format!("openid-r{k}")}
                }),
                messages: vec![
                    ("inbox", format!("u-r{k}"), unit.clone()),
                    ("sms", format!("136{k:08}"), unit.clone()),
                    ("wechat", format!("openid-r{k}"), unit),
                ],
            }
        }
        _ => {
            // About three reminders per candidate, over five jobs.
            let users = (events / 9).max(1);
            let k = n % users;
            let job = (n / users) % 5;
            let unit = format!("i-{k}-job{job}");
            Planned {
                body: json!({
                    "biz_type": "INTERVIEW_REMINDER", "biz_id": format!("iv-{n}"), "user_id": format!("u-i{k}"),
                    "occurred_at": "2026-11-30T09:00:00Z", "template": "interview_reminder",
                    "attributes": {"job_id": format!("job-{job}")},
                    "recipients": {"inbox": format!("u-i{k}"), "sms": format!("135{k:08}"), "app-push": format!("device-i{k}")}
                }),
                messages: vec![
                    ("inbox", format!("u-i{k}"), unit.clone()),
                    ("sms", format!("135{k:08}"), unit.clone()),
                    ("app-push", format!("device-i{k}"), unit),
                ],
            }
        }
    }
}

/// Counters the posters share.
#[derive(Default)]
struct PostCounts {
    posts: AtomicU64,
    retries: AtomicU64,
    accepted: AtomicU64,
    duplicates: AtomicU64,
    done_events: AtomicU64,
}

/// Runs one chaos scenario; `progress` receives a line now and then.
pub async fn run(
    config: &ChaosConfig,
    progress: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<ChaosReport> {
    let dir = tempfile::tempdir()?;
    let policies = dir.path().join("policies");
    std::fs::create_dir_all(&policies)?;
    for (name, text) in POLICIES {
        std::fs::write(policies.join(name), text)?;
    }
    let mut backend = Backend::start(config.cluster).await?;
    let sim = providers::sim().await;
    let mut serve = ServeConfig::new("", &sim);
    serve.redis = backend.config_lines();
    // Kept for the run: every instance claims in it.
    let postgres = match config.ledger {
        ChaosLedger::Postgres => {
            let pg = PostgresServer::start(true).await?;
            serve.ledger_url = Some(pg.database().await?);
            Some(pg)
        }
        ChaosLedger::SqlitePerInstance => None,
    };
    serve.shards = SHARDS;
    serve.workers = 16;
    serve.lease = "3s".into();
    // The reconciler checks quickly, so held tasks reach `dead` within a run
    // and sends whose receipt was lost (posted to a killed instance) are
    // confirmed by a status query.
    serve.extra = r#"
[reconcile]
every = "1s"
sent_age = "5s"
unknown_age = "2s"
max_checks = 3
backoff = { initial = "1s", factor = 2.0, max = "4s" }
"#
    .into();
    if config.ledger == ChaosLedger::SqlitePerInstance {
        // What the host refuses by default: it is this mode's point.
        serve.extra.insert_str(0, "allow_separate_ledgers = true\n");
    }
    let mut hosts: Vec<ServeProcess> = Vec::new();
    for i in 0..config.instances.max(1) {
        hosts.push(
            ServeProcess::start(&serve, &dir.path().join(format!("host-{i}")), &policies).await?,
        );
    }
    let bases: Vec<String> = hosts.iter().map(|h| h.base().to_string()).collect();
    inject_faults(&sim, config, &bases[0]);
    progress(&format!(
        "chaos: {} events × {} posts to {} instances; {} ({}); simulator {}",
        config.events,
        config.posts,
        hosts.len(),
        backend.describe(),
        serve.redis,
        sim.base()
    ));

    let counts = Arc::new(PostCounts::default());
    let mut report = ChaosReport {
        events: config.events,
        ..ChaosReport::default()
    };

    // The load.
    let started = Instant::now();
    let load = tokio::spawn(post_all(config.clone(), bases.clone(), counts.clone()));
    // The chaos: kills, Redis restarts, progress lines, until the load ends.
    // They go on after the load, while the dispatchers drain the backlog:
    // kills then hit sends in flight.
    let layout = Layout::new("po", SHARDS);
    let mut conn = backend.connection().await?;
    let mut rng = config.seed.max(1);
    let mut next_kill = Instant::now() + config.kill_every;
    let mut next_progress = Instant::now() + config.progress_every;
    let mut next_backlog_check = Instant::now();
    let (mut restarts_done, mut progress_kills) = (0usize, 0usize);
    let mut load_done = false;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let done = counts.done_events.load(Ordering::Relaxed) as usize;
        if !load_done && load.is_finished() {
            load_done = true;
            report.load_seconds = started.elapsed().as_secs_f64();
            progress("chaos: load done; draining the backlog under kills");
        }
        // Scheduled restarts and kills that the load outran happen while draining.
        let scheduled_left = restarts_done < config.redis_restarts || progress_kills < config.kills;
        if load_done && !scheduled_left && Instant::now() >= next_backlog_check {
            next_backlog_check = Instant::now() + Duration::from_millis(500);
            if backlog(&mut conn, &layout).await.unwrap_or(1) == 0 {
                break;
            }
            if started.elapsed().as_secs_f64()
                > report.load_seconds + config.quiescence_timeout.as_secs_f64()
            {
                anyhow::bail!(
                    "the backlog did not drain within {:?} of the load",
                    config.quiescence_timeout
                );
            }
        }
        // Restart k of n falls at k/(n+1) of the events; so do the kills
        // spread over the load, on top of one every `kill_every`.
        let share = |k: usize, n: usize| config.events * (k + 1) / (n + 1);
        if restarts_done < config.redis_restarts
            && (load_done || done >= share(restarts_done, config.redis_restarts))
        {
            progress(&format!("chaos: restarting {}", backend.describe()));
            backend.restart().await.context("restarting Redis")?;
            restarts_done += 1;
            report.redis_restarts += 1;
        }
        let by_progress = progress_kills < config.kills
            && (load_done || done >= share(progress_kills, config.kills));
        if by_progress || Instant::now() >= next_kill {
            progress_kills += usize::from(by_progress);
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let i = ((rng >> 33) as usize) % hosts.len();
            progress(&format!("chaos: kill -9 {}", hosts[i].base()));
            hosts[i].kill9();
            report.kills += 1;
            tokio::time::sleep(Duration::from_millis(300)).await;
            hosts[i]
                .restart()
                .await
                .context("restarting a killed host")?;
            next_kill = Instant::now() + config.kill_every;
        }
        if Instant::now() >= next_progress {
            progress(&format!(
                "chaos: {done}/{} events posted, {} post retries, {} kills, {:.0} s",
                config.events,
                counts.retries.load(Ordering::Relaxed),
                report.kills,
                started.elapsed().as_secs_f64()
            ));
            next_progress = Instant::now() + config.progress_every;
        }
    }
    load.await??;
    report.posts = counts.posts.load(Ordering::Relaxed);
    report.post_retries = counts.retries.load(Ordering::Relaxed);
    report.accepted = counts.accepted.load(Ordering::Relaxed);
    report.duplicate_answers = counts.duplicates.load(Ordering::Relaxed);

    // Quiescence: nothing in the ready streams or the retry sets, and the
    // providers' ledger unchanged, twice in a row a second apart.
    progress("chaos: waiting for quiescence");
    let quiet_from = started + Duration::from_secs_f64(report.load_seconds);
    let mut last = (u64::MAX, usize::MAX);
    let mut stable = 0;
    let mut next_progress = Instant::now() + config.progress_every;
    loop {
        let backlog = backlog(&mut conn, &layout).await.unwrap_or(u64::MAX);
        let ledger_len: usize = sim.state.ledger().values().map(Vec::len).sum();
        stable = if backlog == 0 && (backlog, ledger_len) == last {
            stable + 1
        } else {
            0
        };
        last = (backlog, ledger_len);
        if stable >= 2 {
            break;
        }
        if quiet_from.elapsed() > config.quiescence_timeout {
            anyhow::bail!(
                "no quiescence within {:?}: backlog {backlog}",
                config.quiescence_timeout
            );
        }
        if Instant::now() >= next_progress {
            progress(&format!(
                "chaos: backlog {backlog}, {ledger_len} messages at the providers"
            ));
            next_progress = Instant::now() + config.progress_every;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    report.quiescence_seconds = quiet_from.elapsed().as_secs_f64();

    progress("chaos: comparing the providers' ledger with the plan");
    let tasks = collect_tasks(config, &bases).await?;
    account(config, &sim, &tasks, &mut report);
    for host in hosts.iter_mut() {
        let _ = host.terminate(Duration::from_secs(10)).await;
    }
    drop(postgres);
    Ok(report)
}

/// Faults on every provider, SMS arrears for the planned phones, and
/// receipts (to the first instance) from the providers that send them.
fn inject_faults(sim: &Sim, config: &ChaosConfig, receipts_base: &str) {
    let arrears: BTreeMap<String, String> = (0..config.events)
        .filter(|i| i % 3 == 0 && (i / 3) % 97 == 5)
        .map(|i| {
            (
                format!("137{:08}", i / 3),
                "isv.AMOUNT_NOT_ENOUGH".to_string(),
            )
        })
        .collect();
    for provider in provider_sim::PROVIDERS {
        let faults = Faults {
            fail_5xx: config.fail_rate,
            fail_429: config.fail_rate / 2.0,
            drop_after_accept: config.drop_rate,
            error_after_accept: config.error_after_accept,
            permanent: if provider == "aliyun-sms" {
                arrears.clone()
            } else {
                BTreeMap::new()
            },
            ..Faults::default()
        };
        sim.state.set_faults(provider, faults);
    }
    sim.send_receipts_to(receipts_base, 200, &[]);
}

/// Posts every event `posts` times, concurrently, to different instances.
async fn post_all(
    config: ChaosConfig,
    bases: Vec<String>,
    counts: Arc<PostCounts>,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(config.concurrency)
        .build()?;
    let slots = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..config.events {
        let slot = slots.clone().acquire_owned().await?;
        let (client, bases, counts) = (client.clone(), bases.clone(), counts.clone());
        let posts = config.posts.max(1);
        let events = config.events;
        set.spawn(async move {
            let body = Arc::new(plan(i, events).body);
            let mut each = tokio::task::JoinSet::new();
            for p in 0..posts {
                let (client, bases, counts, body) =
                    (client.clone(), bases.clone(), counts.clone(), body.clone());
                each.spawn(async move { post_one(&client, &bases, i + p, &body, &counts).await });
            }
            let mut result = Ok(());
            while let Some(done) = each.join_next().await {
                if let Err(e) = done.map_err(anyhow::Error::from).and_then(|r| r) {
                    result = Err(e);
                }
            }
            counts.done_events.fetch_add(1, Ordering::Relaxed);
            drop(slot);
            result
        });
        while let Some(done) = set.try_join_next() {
            done??;
        }
    }
    while let Some(done) = set.join_next().await {
        done??;
    }
    Ok(())
}

/// Posts one event, starting at instance `start`, until an instance answers
/// with a verdict per channel: a dead instance or a 503 moves on to the next.
async fn post_one(
    client: &reqwest::Client,
    bases: &[String],
    start: usize,
    body: &Value,
    counts: &PostCounts,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut i = start;
    loop {
        let base = &bases[i % bases.len()];
        let answer = client
            .post(format!("{base}/v1/events"))
            .json(body)
            .send()
            .await;
        match answer {
            Ok(r) if r.status().is_success() => {
                let v: Value = r.json().await.unwrap_or(Value::Null);
                if let Some(results) = v["results"].as_array() {
                    counts.posts.fetch_add(1, Ordering::Relaxed);
                    for r in results {
                        match r["result"].as_str() {
                            Some("capped") => anyhow::bail!(
                                "{base} answered `capped`: the chaos cap must never bind; event {body}"
                            ),
                            Some("accepted") => counts.accepted.fetch_add(1, Ordering::Relaxed),
                            _ => counts.duplicates.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                    return Ok(());
                }
            }
            Ok(r) if r.status().is_client_error() && r.status().as_u16() != 429 => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                anyhow::bail!("{base} refused an event with {status}: {text}; event {body}");
            }
            _ => {}
        }
        if Instant::now() > deadline {
            anyhow::bail!("no instance took event {body} within 300 s");
        }
        counts.retries.fetch_add(1, Ordering::Relaxed);
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every task of every event, read through the API (`GET /v1/events/…`).
async fn collect_tasks(config: &ChaosConfig, bases: &[String]) -> anyhow::Result<Vec<Value>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let slots = Arc::new(Semaphore::new(32));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..config.events {
        let body = plan(i, config.events).body;
        let url = format!(
            "{}/v1/events/{}/{}",
            bases[i % bases.len()],
            body["biz_type"].as_str().unwrap_or_default(),
            body["biz_id"].as_str().unwrap_or_default()
        );
        let (client, slot) = (client.clone(), slots.clone().acquire_owned().await?);
        set.spawn(async move {
            // Instances answer 503 while Redis is away: ask again, up to a deadline.
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut answer = Value::Null;
            while Instant::now() < deadline {
                match client.get(&url).send().await {
                    Ok(r) if r.status().is_success() => {
                        answer = r.json().await.unwrap_or(Value::Null);
                        break;
                    }
                    Ok(r) if r.status().as_u16() == 404 => break,
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
            drop(slot);
            answer["tasks"].as_array().cloned().unwrap_or_default()
        });
    }
    let mut tasks = Vec::new();
    let mut seen = BTreeSet::new();
    while let Some(list) = set.join_next().await {
        for t in list? {
            if seen.insert(t["id"].as_str().unwrap_or_default().to_string()) {
                tasks.push(t);
            }
        }
    }
    Ok(tasks)
}

/// Why a held task is held, in the words of the chaos table: its
/// `held_cause` (what the attempt that held it saw, kept whatever the
/// reconciler did since), or for a task without one what its `last_error`
/// says.
fn hold_cause(task: &Value) -> String {
    let cause = &task["held_cause"];
    let named = match cause["kind"].as_str() {
        Some("worker_vanished") if cause["request_started"] == false => "kill before its send",
        Some("worker_vanished") => "kill mid-send",
        // The host holds an ambiguous 5xx like a cut-off answer; the SDK's
        // text tells them apart.
        Some("cut_off_after_write")
            if !task["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("no complete answer")) =>
        {
            "ambiguous 5xx answer"
        }
        Some("cut_off_after_write") => "cut-off answer",
        Some("retries_exhausted") => "retries exhausted",
        Some("query_could_not_tell") => "query could not tell",
        _ => return hold_cause_from_text(task),
    };
    named.to_string()
}

/// [`hold_cause`] from `last_error`, for a task held without a recorded
/// cause. The reconciler writes `reconcile check N: <why>` and keeps what
/// first held the task after `; held after: `: the dispatcher's reason for
/// a task re-claimed from a killed worker, or the SDK's "no complete
/// answer" for an answer cut off after the request was written. A check
/// that ran a status query and could not tell is its own cause.
fn hold_cause_from_text(task: &Value) -> String {
    let error = task["last_error"].as_str().unwrap_or_default();
    let (check, origin) = match error.split_once("; held after: ") {
        Some((check, origin)) => (check, origin),
        None if error.starts_with("reconcile check ") => (error, ""),
        None => ("", error),
    };
    let cause = if !check.is_empty() && !check.contains("has no status query") {
        "query could not tell"
    } else if origin.starts_with(pushonce::dispatch::worker::RECLAIMED_REASON) {
        "kill mid-send"
    } else if origin.contains("no complete answer") {
        "cut-off answer"
    } else {
        "other"
    };
    cause.to_string()
}

/// Compares the plan with the ledger and the tasks' final states.
fn account(config: &ChaosConfig, sim: &Sim, tasks: &[Value], report: &mut ChaosReport) {
    // Expected: distinct dedup units per (provider, recipient).
    let mut units: HashMap<(String, String), BTreeSet<String>> = HashMap::new();
    for i in 0..config.events {
        for (provider, recipient, unit) in plan(i, config.events).messages {
            units
                .entry((provider.to_string(), recipient))
                .or_default()
                .insert(unit);
        }
    }
    let mut got: HashMap<(String, String), u64> = HashMap::new();
    for (channel, _, _) in providers::CHANNELS {
        for m in sim.ledger(channel) {
            *got.entry((channel.to_string(), m.recipient.clone()))
                .or_default() += 1;
        }
    }
    // Held tasks per (provider = channel, recipient).
    let mut held: HashMap<(String, String), u64> = HashMap::new();
    for t in tasks {
        let status = t["status"].as_str().unwrap_or_default();
        let channel = t["channel"].as_str().unwrap_or_default().to_string();
        report.retries += t["attempts"].as_u64().unwrap_or(0).saturating_sub(1);
        if status == "failed"
            && t["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("fallback to"))
        {
            report.fallbacks += 1;
        }
        if status == "duplicate_prevented" {
            report.duplicate_prevented += 1;
        }
        if t["possible_duplicate"] == true {
            *report
                .possible_duplicates
                .entry(channel.clone())
                .or_default() += 1;
        }
        if status == "unknown" || status == "dead" {
            report.held += 1;
            let cause = hold_cause(t);
            *report
                .held_by
                .entry((channel.clone(), cause.clone()))
                .or_default() += 1;
            // Only a channel whose provider can neither deduplicate a resend
            // (inside its window) nor be queried holds: FCM (`app-push`);
            // the faults that leave it unknown are the injected cut-off
            // answers, 5xx answers (ambiguous) and kills mid-send.
            let explained = [
                "cut-off answer",
                "ambiguous 5xx answer",
                "kill mid-send",
                "kill before its send",
            ];
            if channel != "app-push" || !explained.contains(&cause.as_str()) {
                report.held_unexplained += 1;
                report.examples.push(format!("unexplained hold: {t}"));
            }
            let recipient = t["payload"]["recipient"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            *held.entry((channel, recipient)).or_default() += 1;
        }
    }
    for (who, expected) in &units {
        let expected = expected.len() as u64;
        let got = got.get(who).copied().unwrap_or(0);
        report.expected += expected;
        report.delivered += got.min(expected);
        if got > expected {
            report.duplicates += got - expected;
            report
                .examples
                .push(format!("duplicate: {who:?} got {got}, expected {expected}"));
        } else if got < expected {
            let missing = expected - got;
            let visible = held.get(who).copied().unwrap_or(0).min(missing);
            report.held_missing += visible;
            if missing > visible {
                report.misses += missing - visible;
                report
                    .examples
                    .push(format!("miss: {who:?} got {got}, expected {expected}"));
            }
        }
    }
    for (who, n) in &got {
        if !units.contains_key(who) {
            report.duplicates += n;
            report.examples.push(format!("unexpected: {who:?} got {n}"));
        }
    }
    report.examples.truncate(20);
}
