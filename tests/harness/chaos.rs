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
//! per day; `INTERVIEW_REMINDER` one per user per job; `PROFILE_LIKED` is
//! a digest (per user per day, sent two seconds after the first like of
//! each generation): every like in exactly one message's `digest_items`.
//! A cancel stream cancels every tenth order right after it is posted and
//! another tenth two seconds later (mostly too late); a channel answered
//! `cancelled` must get no message, one answered `too_late` its message.
//! With the shared PostgreSQL ledger, some résumé-view users switch WeChat
//! off a third into the load (`PUT /v1/users/{id}/preferences`): a post
//! begun once the change took effect (answered, plus the preference cache's
//! bound) must be answered `opted_out` on WeChat, and a WeChat message whose
//! posts were all answered `opted_out`, or whose task its attempt stopped
//! (accepted before the opt-out, attempted after it), is not expected (nor
//! sent).

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
    /// Distinct events posted (spread over four business types).
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
    /// An outage of the SMS channel's first provider (`None`: `sms` is
    /// Aliyun alone, as before).
    pub provider_outage: Option<ProviderOutage>,
}

/// An outage of provider A (Aliyun) of an `sms` channel that fails over to
/// provider B (Tencent): A's gateway answers 503 to every send and every
/// status query from `start` after the load began, for `length`. B gets no
/// injected faults (an unknown outcome at Tencent can only be settled by a
/// receipt, so its faults would hold tasks for an operator by design, not
/// because of the outage), and no SMS number is in arrears (arrears are the
/// account's: they would move every SMS to B and open A's circuit at once).
#[derive(Debug, Clone, Copy)]
pub struct ProviderOutage {
    /// When A goes dark, counted from the start of the load.
    pub start: Duration,
    /// How long it stays dark.
    pub length: Duration,
    /// How long after A recovers the tasks held at A may take to settle.
    pub settle_timeout: Duration,
}

/// Infrastructure failures in a row that open a provider's circuit in an
/// outage run (the default of `circuit_failures`).
const OUTAGE_CIRCUIT_FAILURES: u32 = 5;

/// How long an open circuit stays open in an outage run.
const OUTAGE_CIRCUIT_OPEN: &str = "5s";

/// What a provider outage did.
#[derive(Debug, Clone, Default)]
pub struct OutageReport {
    /// When A went dark and for how long, seconds into the load.
    pub start_s: f64,
    /// How long it stayed dark.
    pub length_s: f64,
    /// Whether the load was still being posted when A recovered.
    pub within_load: bool,
    /// SMS tasks held (`unknown`) when A recovered.
    pub held_at_recovery: u64,
    /// Of those, held because a host was killed, not because of the
    /// outage: at B (mid-send, or re-claimed before its send: Tencent's query cannot prove a message absent,
    /// so only its receipt settles such a task, else it is held for an
    /// operator, by design: docs/channels.md), or before any request went
    /// (no provider yet).
    pub held_after_kill: u64,
    /// Of those, at A with an unknown outcome whose last request went out
    /// while A was dark.
    pub sent_into_the_outage: u64,
    /// Of those, at A with an unknown outcome from before A went dark (its
    /// status queries then failed with A).
    pub unknown_before: u64,
    /// Held tasks neither at A with an unknown outcome nor after a kill.
    pub held_otherwise: u64,
    /// Of the tasks held at A when it recovered, those sent or delivered afterwards.
    pub settled: u64,
    /// Seconds from A's recovery until the last of them settled.
    pub settle_seconds: Option<f64>,
    /// SMS messages A and B received.
    pub sent_by_a: u64,
    /// Messages B received.
    pub sent_by_b: u64,
}

/// A held SMS task as seen when A recovered.
#[derive(Debug, Clone)]
struct HeldAtRecovery {
    /// Task id.
    id: String,
    /// Its provider then.
    provider: String,
    /// Its status then.
    status: String,
    /// When its last request went out (ms since the epoch).
    last_attempt_at: u64,
    /// Why it is held, in the table's words.
    cause: String,
}

impl HeldAtRecovery {
    /// At A with an unknown outcome.
    fn unknown_at_a(&self) -> bool {
        self.provider == providers::SMS_PROVIDERS[0] && self.status == "unknown"
    }

    /// Held because a worker was killed: at B mid-send, or before any
    /// request of the task went out (it has no provider yet).
    fn after_a_kill(&self) -> bool {
        (self.provider == providers::SMS_PROVIDERS[1] && self.cause.starts_with("kill "))
            || (self.provider.is_empty() && self.cause.starts_with("kill "))
    }
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
            provider_outage: None,
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
    /// Entries a worker held that were acked before it began their task
    /// (a reclaimer that raced a slow worker's record): begun from one, the
    /// task would have had no entry left should that worker die.
    pub entries_gone: u64,
    /// Seconds of the load.
    pub load_seconds: f64,
    /// Seconds from the end of the load until nothing was queued or waiting.
    pub quiescence_seconds: f64,
    /// Likes posted (the digest business type) and digest messages sent.
    pub digest_events: u64,
    /// Digest messages the inbox provider received.
    pub digest_messages: u64,
    /// Likes in no sent digest and not in a held one.
    pub digest_missing: u64,
    /// Likes in more than one sent digest.
    pub digest_twice: u64,
    /// Digest messages whose `digest_count` is not their number of items.
    pub digest_miscounted: u64,
    /// Cancels answered per channel: `cancelled` / `too_late`.
    pub cancels: (u64, u64),
    /// Users who switched WeChat off during the load, and the WeChat
    /// answers `opted_out` their events got.
    pub opt_outs: (u64, u64),
    /// Posts begun after an opt-out took effect whose WeChat answer was not
    /// `opted_out` (each would be a message the user asked not to get).
    pub accepted_after_opt_out: u64,
    /// WeChat tasks accepted before their user's opt-out and stopped at
    /// their attempt (ended `cancelled`, nothing sent): their message is
    /// not expected.
    pub stopped_at_send: u64,
    /// Examples of duplicates and misses, for the failure message.
    pub examples: Vec<String>,
    /// What the provider outage did, when the run had one.
    pub outage: Option<OutageReport>,
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
        let digest_rows = vec![
            (
                "likes (digest) / digest messages",
                format!("{} / {}", self.digest_events, self.digest_messages),
            ),
            (
                "  likes missing from digests",
                self.digest_missing.to_string(),
            ),
            ("  likes in two digests", self.digest_twice.to_string()),
            (
                "  digests whose count is not their items",
                self.digest_miscounted.to_string(),
            ),
            (
                "cancels per channel: cancelled / too late",
                format!("{} / {}", self.cancels.0, self.cancels.1),
            ),
            (
                "WeChat opt-outs during the load / answers opted_out",
                format!("{} / {}", self.opt_outs.0, self.opt_outs.1),
            ),
            (
                "  accepted after the opt-out took effect",
                self.accepted_after_opt_out.to_string(),
            ),
            (
                "  accepted before it, stopped at their send",
                self.stopped_at_send.to_string(),
            ),
        ];
        let outage_rows = self.outage.as_ref().map(outage_rows).unwrap_or_default();
        let rows: Vec<(&str, String)> = rows
            .into_iter()
            .chain(held_rows.iter().map(|(k, v)| (k.as_str(), v.clone())))
            .chain(possible_rows.iter().map(|(k, v)| (k.as_str(), v.clone())))
            .chain(digest_rows)
            .chain(outage_rows.iter().map(|(k, v)| (*k, v.clone())))
            .chain(vec![
                ("retries", self.retries.to_string()),
                ("fallbacks", self.fallbacks.to_string()),
                ("kills (kill -9)", self.kills.to_string()),
                ("Redis restarts", self.redis_restarts.to_string()),
                (
                    "entries acked before their begin (not begun)",
                    self.entries_gone.to_string(),
                ),
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

    /// Duplicates and misses are zero and every held task is explained;
    /// after a provider outage, every task held when A recovered was at A
    /// with an unknown outcome, and settled.
    pub fn is_clean(&self) -> bool {
        let outage_clean = self
            .outage
            .as_ref()
            .is_none_or(|o| o.held_otherwise == 0 && o.settled == o.held_at_a());
        let digests_clean =
            self.digest_missing == 0 && self.digest_twice == 0 && self.digest_miscounted == 0;
        self.duplicates == 0
            && self.misses == 0
            && self.accepted_after_opt_out == 0
            && self.held_unexplained == 0
            && outage_clean
            && digests_clean
    }
}

impl OutageReport {
    /// Tasks held at A with an unknown outcome when A recovered.
    pub fn held_at_a(&self) -> u64 {
        self.sent_into_the_outage + self.unknown_before
    }
}

/// The table's rows of a provider outage.
fn outage_rows(o: &OutageReport) -> Vec<(&'static str, String)> {
    vec![
        (
            "provider outage: A (sms-aliyun) dark, sends and queries",
            format!(
                "{:.1} s from {:.1} s into the load{}",
                o.length_s,
                o.start_s,
                if o.within_load {
                    ""
                } else {
                    " (the load had ended before A recovered)"
                }
            ),
        ),
        (
            "  SMS sent by A / by B",
            format!("{} / {}", o.sent_by_a, o.sent_by_b),
        ),
        ("  held when A recovered", o.held_at_recovery.to_string()),
        (
            "    at A, unknown: sent into the outage / from before it",
            format!("{} / {}", o.sent_into_the_outage, o.unknown_before),
        ),
        (
            "    after a kill: at B mid-send, or before any request",
            o.held_after_kill.to_string(),
        ),
        ("    held otherwise", o.held_otherwise.to_string()),
        (
            "    of those at A, settled after A recovered",
            format!(
                "{} of {}{}",
                o.settled,
                o.held_at_a(),
                o.settle_seconds
                    .map(|s| format!(", the last {s:.1} s after"))
                    .unwrap_or_default()
            ),
        ),
    ]
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

/// The chaos policies: the repository's three business types and a digest with a short
/// retry schedule (so a run ends in minutes) and room for many attempts.
/// `INTERVIEW_REMINDER` carries a frequency cap (per user, far above the
/// three or so reminders a candidate gets, so it never binds): every one of
/// its accepts counts in the user's cap inside the accept script, on a
/// Redis Cluster too (the cap and the permits share the user's hash slot).
const POLICIES: [(&str, &str); 4] = [
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
    (
        "profile-liked.toml",
        r#"biz_type = "PROFILE_LIKED"
key_policy = "per-user-per-day@^1"
params = { tz = "+08:00" }
channels = ["inbox"]
window = "48h"
[retry]
max_attempts = 12
backoff = { initial = "200ms", factor = 2.0, max = "2s", jitter = true }
[digest]
window = "2s"
max_items = 100
template = "profile_liked_digest"
"#,
    ),
];

/// The template of the digest business type's messages.
const DIGEST_TEMPLATE: &str = "profile_liked_digest";

/// One generated event and the messages it calls for.
struct Planned {
    /// The request body.
    body: Value,
    /// `(provider, recipient, dedup unit)`: the message this event calls for
    /// on each channel; events sharing a unit share the message.
    messages: Vec<(&'static str, String, String)>,
    /// For an order the cancel stream cancels: its unit, and how long after
    /// its posts were answered.
    cancel: Option<(String, Duration)>,
}

/// Event `i` of the run: every fourth a like (the digest type), the others
/// by their own count modulo 3; `arrears`: every 97th order's phone is in
/// arrears at Aliyun (not in an outage run).
fn plan(i: usize, events: usize, arrears: bool) -> Planned {
    if i % 4 == 3 {
        // About four likes per user and day, over two days (UTC+8).
        let n = i / 4;
        let users = (events / 32).max(1);
        let k = n % users;
        let at = if (n / users).is_multiple_of(2) {
            "2026-11-29T10:00:00+08:00"
        } else {
            "2026-11-30T10:00:00+08:00"
        };
        return Planned {
            body: json!({
                "biz_type": "PROFILE_LIKED", "biz_id": format!("like-{n}"), "user_id": format!("u-l{k}"),
                "occurred_at": at, "template": "profile_liked",
                "params": {"liker": format!("m-{n}")},
                "recipients": {"inbox": format!("u-l{k}")}
            }),
            messages: Vec::new(),
            cancel: None,
        };
    }
    let i = i - i / 4;
    let n = i / 3;
    match i % 3 {
        0 => {
            // One message per order and channel; every 97th phone is in arrears.
            let phone = if arrears && n % 97 == 5 {
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
                cancel: match n % 10 {
                    7 => Some((unit, Duration::ZERO)),
                    3 => Some((unit, Duration::from_secs(2))),
                    _ => None,
                },
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
                cancel: None,
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
                cancel: None,
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
    /// `(channel, unit)` of every channel a cancel answered `cancelled`.
    cancelled: std::sync::Mutex<BTreeSet<(String, String)>>,
    /// Channels a cancel answered `too_late`.
    too_late: AtomicU64,
    /// When each opt-out was answered, by user.
    opted_out_at: std::sync::Mutex<HashMap<String, Instant>>,
    /// The WeChat answers of the users who opt out.
    wechat_answers: std::sync::Mutex<Vec<WechatAnswer>>,
}

/// One post's WeChat answer, for a user who opts out of WeChat.
struct WechatAnswer {
    /// The user.
    user: String,
    /// The event's WeChat dedup unit.
    unit: String,
    /// The WeChat idempotency key the answer names.
    key: String,
    /// When the answered POST began.
    began: Instant,
    /// Its WeChat result (`accepted`, `duplicate`, `opted_out`, …).
    result: String,
}

/// Whether résumé-view user `u-r<k>` switches WeChat off during the load.
fn opts_out(k: usize) -> bool {
    k % 40 == 3
}

/// The preference cache's bound on the chaos hosts (`[preferences]
/// cache_ttl`): a change takes effect on every instance within it.
const PREFS_TTL: Duration = Duration::from_secs(2);

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
    if config.provider_outage.is_some() {
        serve.channels = sim.toml_with_sms_providers(OUTAGE_CIRCUIT_FAILURES, OUTAGE_CIRCUIT_OPEN);
    }
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
    // In an outage run, a task held at A is checked until past the outage
    // (every check fails while A is dark), as a deployment sets
    // `max_checks` to outlast its providers' outages.
    let max_checks = match config.provider_outage {
        Some(o) => 3 + (o.length.as_secs() + 30).div_ceil(4),
        None => 3,
    };
    serve.extra = format!(
        r#"
[reconcile]
every = "1s"
sent_age = "5s"
unknown_age = "2s"
max_checks = {max_checks}
backoff = {{ initial = "1s", factor = 2.0, max = "4s" }}

[preferences]
cache_ttl = "{}ms"
"#,
        PREFS_TTL.as_millis()
    );
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
    // The outage runs on its own clock (the kills and restarts here wait
    // for hosts and Redis): not yet (0), A dark (1), A recovered (2).
    let outage_phase = Arc::new(AtomicU64::new(if config.provider_outage.is_some() {
        0
    } else {
        2
    }));
    let (quiet_tx, quiet_rx) = tokio::sync::watch::channel(false);
    let outage_run = match config.provider_outage {
        Some(o) => Some(tokio::spawn(outage(
            o,
            OutageParts {
                config: config.clone(),
                state: sim.state.clone(),
                conn: backend.connection().await?,
                bases: bases.clone(),
                started,
                counts: counts.clone(),
                phase: outage_phase.clone(),
                quiet: quiet_rx,
            },
        ))),
        None => None,
    };
    let mut phase_told = 0;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let done = counts.done_events.load(Ordering::Relaxed) as usize;
        let phase = outage_phase.load(Ordering::Relaxed);
        if phase > phase_told {
            phase_told = phase;
            progress(if phase == 1 {
                "chaos: provider A (aliyun-sms) goes dark: every send and query answers 503"
            } else {
                "chaos: provider A recovers"
            });
        }
        if !load_done && load.is_finished() {
            load_done = true;
            report.load_seconds = started.elapsed().as_secs_f64();
            progress("chaos: load done; draining the backlog under kills");
        }
        // Scheduled restarts and kills that the load outran happen while draining.
        let scheduled_left = restarts_done < config.redis_restarts || progress_kills < config.kills;
        if load_done && !scheduled_left && phase_told == 2 && Instant::now() >= next_backlog_check {
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
    let cancelled = std::mem::take(&mut *counts.cancelled.lock().unwrap());
    report.cancels = (
        cancelled.len() as u64,
        counts.too_late.load(Ordering::Relaxed),
    );
    let (stopped, may_have) = account_opt_outs(&counts, &tasks, &mut report);
    let not_expected: BTreeSet<(String, String)> =
        cancelled.iter().cloned().chain(stopped).collect();
    account(config, &sim, &tasks, &not_expected, &may_have, &mut report);
    add_log_lines(&hosts, &mut report.examples);
    report.entries_gone = hosts
        .iter()
        .map(|h| h.all_logs().matches(ENTRY_GONE_LOG).count() as u64)
        .sum();
    if let Some(outage_run) = outage_run {
        let _ = quiet_tx.send(true);
        let run = outage_run.await??;
        let mut o = run.report;
        o.settled = run.settling.settled;
        o.settle_seconds = run.settling.seconds;
        for t in run.settling.unsettled.iter().take(10) {
            report
                .examples
                .push(format!("held when A recovered, not settled: {t}"));
        }
        outage_summary(&mut o, &run.held, run.dark_at_ms, &sim);
        for t in run
            .held
            .iter()
            .filter(|t| !t.unknown_at_a() && !t.after_a_kill())
        {
            report.examples.push(format!(
                "held when A recovered, not an unknown outcome at A: {} at {:?} ({}, {})",
                t.id, t.provider, t.status, t.cause
            ));
        }
        report.outage = Some(o);
    }
    for host in hosts.iter_mut() {
        let _ = host.terminate(Duration::from_secs(10)).await;
    }
    drop(postgres);
    Ok(report)
}

/// Faults on every provider, SMS arrears for the planned phones, and
/// receipts (to the first instance) from the providers that send them.
fn inject_faults(sim: &Sim, config: &ChaosConfig, receipts_base: &str) {
    background_faults(&sim.state, config);
    if config.provider_outage.is_some() {
        sim.send_sms_provider_receipts_to(receipts_base, 200);
    } else {
        sim.send_receipts_to(receipts_base, 200, &[]);
    }
}

/// The faults every provider has for the whole run. In an outage run: no
/// arrears, and none at Tencent.
fn background_faults(state: &provider_sim::SimState, config: &ChaosConfig) {
    let outage = config.provider_outage.is_some();
    let arrears: BTreeMap<String, String> = (0..config.events)
        .filter(|i| !outage && i % 3 == 0 && (i / 3) % 97 == 5)
        .map(|i| {
            (
                format!("137{:08}", i / 3),
                "isv.AMOUNT_NOT_ENOUGH".to_string(),
            )
        })
        .collect();
    for provider in provider_sim::PROVIDERS {
        let faults = if outage && provider == "tencent-sms" {
            Faults::default()
        } else {
            Faults {
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
            }
        };
        state.set_faults(provider, faults);
    }
}

/// Milliseconds since the epoch now.
fn epoch_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `GET /v1/tasks/{id}` from the first instance that answers.
async fn task_from_any(client: &reqwest::Client, bases: &[String], id: &str) -> Option<Value> {
    for base in bases {
        if let Ok(r) = client.get(format!("{base}/v1/tasks/{id}")).send().await
            && r.status().is_success()
            && let Ok(v) = r.json::<Value>().await
        {
            return Some(v);
        }
    }
    None
}

/// Every SMS task held (`unknown`) now, read from the held index of every
/// shard and each task through the API.
async fn held_sms(conn: &mut RedisConn, layout: &Layout, bases: &[String]) -> Vec<HeldAtRecovery> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client");
    let mut ids: Vec<String> = Vec::new();
    for shard in 0..layout.shards() {
        // Redis may be restarting: ask again, a bounded number of times.
        for _ in 0..50 {
            let got: Result<Vec<String>, _> = redis::cmd("ZRANGE")
                .arg(layout.held(shard))
                .arg(0)
                .arg(-1)
                .query_async(conn)
                .await;
            if let Ok(got) = got {
                ids.extend(got);
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Fetched 32 at a time: A stays dark while they are read.
    let slots = Arc::new(Semaphore::new(32));
    let mut fetches = tokio::task::JoinSet::new();
    for id in ids {
        let (client, bases, slots) = (client.clone(), bases.to_vec(), slots.clone());
        fetches.spawn(async move {
            let _slot = slots.acquire_owned().await;
            let task = task_from_any(&client, &bases, &id).await;
            (id, task)
        });
    }
    let mut held = Vec::new();
    while let Some(fetched) = fetches.join_next().await {
        let Ok((id, Some(t))) = fetched else {
            continue;
        };
        if t["channel"] != "sms" {
            continue;
        }
        held.push(HeldAtRecovery {
            id,
            provider: t["provider"].as_str().unwrap_or_default().to_string(),
            status: t["status"].as_str().unwrap_or_default().to_string(),
            last_attempt_at: t["last_attempt_at"].as_u64().unwrap_or(0),
            cause: hold_cause(&t),
        });
    }
    held
}

/// What became of the tasks held when A recovered.
#[derive(Debug, Default)]
struct Settling {
    /// Sent or delivered since.
    settled: u64,
    /// Seconds after A's recovery when the last one settled (all did).
    seconds: Option<f64>,
    /// The tasks that did not settle, as the API last showed them.
    unsettled: Vec<Value>,
}

/// Waits until every task of `ids` is `sent` or `delivered` (settled), or
/// ended otherwise (`failed`, `dead`: not settled), or `timeout` after
/// `recovered`, or the run is quiet (`quiet` true: one last look).
async fn wait_settled(
    ids: Vec<String>,
    bases: Vec<String>,
    recovered: Instant,
    timeout: Duration,
    quiet: tokio::sync::watch::Receiver<bool>,
) -> Settling {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client");
    let mut last: BTreeMap<String, Value> = BTreeMap::new();
    let mut settled: BTreeSet<String> = BTreeSet::new();
    let mut ended: BTreeSet<String> = BTreeSet::new();
    let mut last_settled = None;
    loop {
        // After quiescence nothing moves any more: the pass that follows is the last.
        let quiet_now = *quiet.borrow();
        for id in &ids {
            if settled.contains(id) || ended.contains(id) {
                continue;
            }
            let Some(t) = task_from_any(&client, &bases, id).await else {
                continue;
            };
            match t["status"].as_str() {
                Some("sent" | "delivered") => {
                    settled.insert(id.clone());
                    last_settled = Some(recovered.elapsed().as_secs_f64());
                }
                Some("failed" | "dead" | "duplicate_prevented") => {
                    ended.insert(id.clone());
                }
                _ => {}
            }
            last.insert(id.clone(), t);
        }
        let all_settled = settled.len() == ids.len();
        if all_settled
            || settled.len() + ended.len() == ids.len()
            || recovered.elapsed() > timeout
            || quiet_now
        {
            return Settling {
                settled: settled.len() as u64,
                seconds: if all_settled {
                    Some(last_settled.unwrap_or(0.0))
                } else {
                    None
                },
                unsettled: ids
                    .iter()
                    .filter(|id| !settled.contains(*id))
                    .map(|id| last.get(id).cloned().unwrap_or_else(|| json!({ "id": id })))
                    .collect(),
            };
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the outage task needs.
struct OutageParts {
    config: ChaosConfig,
    state: provider_sim::SimState,
    conn: RedisConn,
    bases: Vec<String>,
    started: Instant,
    counts: Arc<PostCounts>,
    /// 0 before, 1 dark, 2 recovered.
    phase: Arc<AtomicU64>,
    /// True once the run is quiet.
    quiet: tokio::sync::watch::Receiver<bool>,
}

/// What the outage task saw.
struct OutageRun {
    report: OutageReport,
    held: Vec<HeldAtRecovery>,
    dark_at_ms: u64,
    settling: Settling,
}

/// Provider A's outage on its own clock: dark at `o.start` after the load
/// began, the held SMS tasks read while still dark at `o.start + o.length`,
/// then A's usual faults back, and the tasks held at A watched until they
/// settle.
async fn outage(o: ProviderOutage, mut parts: OutageParts) -> anyhow::Result<OutageRun> {
    let mut report = OutageReport::default();
    tokio::time::sleep_until((parts.started + o.start).into()).await;
    let dark_at_ms = epoch_ms_now();
    report.start_s = parts.started.elapsed().as_secs_f64();
    parts.state.set_faults(
        "aliyun-sms",
        Faults {
            fail_5xx: 1.0,
            fail_queries: true,
            ..Faults::default()
        },
    );
    parts.phase.store(1, Ordering::Relaxed);
    tokio::time::sleep_until((parts.started + o.start + o.length).into()).await;
    // Read while A is still dark, so none of them settles in between.
    let layout = Layout::new("po", SHARDS);
    let held = held_sms(&mut parts.conn, &layout, &parts.bases).await;
    background_faults(&parts.state, &parts.config);
    let recovered = Instant::now();
    report.length_s = parts.started.elapsed().as_secs_f64() - report.start_s;
    report.within_load =
        (parts.counts.done_events.load(Ordering::Relaxed) as usize) < parts.config.events;
    parts.phase.store(2, Ordering::Relaxed);
    let settling = wait_settled(
        held.iter()
            .filter(|t| t.unknown_at_a())
            .map(|t| t.id.clone())
            .collect(),
        parts.bases.clone(),
        recovered,
        o.settle_timeout,
        parts.quiet.clone(),
    )
    .await;
    Ok(OutageRun {
        report,
        held,
        dark_at_ms,
        settling,
    })
}

/// Fills in what the tasks held at A's recovery were, and who sent the SMS.
fn outage_summary(o: &mut OutageReport, held: &[HeldAtRecovery], dark_at_ms: u64, sim: &Sim) {
    o.held_at_recovery = held.len() as u64;
    for t in held {
        if t.after_a_kill() {
            o.held_after_kill += 1;
        } else if !t.unknown_at_a() {
            o.held_otherwise += 1;
        } else if t.last_attempt_at >= dark_at_ms {
            o.sent_into_the_outage += 1;
        } else {
            o.unknown_before += 1;
        }
    }
    o.sent_by_a = sim.ledger("sms").len() as u64;
    o.sent_by_b = sim.ledger(providers::TENCENT.0).len() as u64;
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
    // Preferences live in the ledger's database: shared only with PostgreSQL.
    let opt_outs_at = (config.ledger == ChaosLedger::Postgres).then_some(config.events * 3 / 10);
    for i in 0..config.events {
        if opt_outs_at == Some(i) {
            let (client, bases, counts) = (client.clone(), bases.clone(), counts.clone());
            let events = config.events;
            set.spawn(async move { opt_out_all(&client, &bases, events, &counts).await });
        }
        let slot = slots.clone().acquire_owned().await?;
        let (client, bases, counts) = (client.clone(), bases.clone(), counts.clone());
        let posts = config.posts.max(1);
        let events = config.events;
        let arrears = config.provider_outage.is_none();
        set.spawn(async move {
            let planned = plan(i, events, arrears);
            let watched = Arc::new(watched_wechat(&planned));
            let cancel = planned.cancel;
            let body = Arc::new(planned.body);
            let mut each = tokio::task::JoinSet::new();
            for p in 0..posts {
                let (client, bases, counts, body, watched) = (
                    client.clone(),
                    bases.clone(),
                    counts.clone(),
                    body.clone(),
                    watched.clone(),
                );
                each.spawn(async move {
                    post_one(&client, &bases, i + p, &body, &watched, &counts).await
                });
            }
            let mut result = Ok(());
            while let Some(done) = each.join_next().await {
                if let Err(e) = done.map_err(anyhow::Error::from).and_then(|r| r) {
                    result = Err(e);
                }
            }
            counts.done_events.fetch_add(1, Ordering::Relaxed);
            drop(slot);
            if let Some((unit, after)) = cancel
                && result.is_ok()
            {
                tokio::time::sleep(after).await;
                result = cancel_one(&client, &bases, i, &unit, &counts).await;
            }
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

/// Sends `body` to `path` (`method`: POST, PUT), starting at instance
/// `start`, until an instance answers 2xx with a JSON body whose `field` is
/// an array (an answer cut off by a kill has none): a dead instance, a 429
/// or a 5xx moves on to the next instance; another 4xx fails the run. The
/// answer, and when the request that got it began.
async fn send_until_answered(
    client: &reqwest::Client,
    bases: &[String],
    start: usize,
    (method, path): (reqwest::Method, &str),
    body: &Value,
    field: &str,
    counts: &PostCounts,
) -> anyhow::Result<(Value, Instant)> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut i = start;
    loop {
        let base = &bases[i % bases.len()];
        let began = Instant::now();
        let request = client.request(method.clone(), format!("{base}{path}"));
        match request.json(body).send().await {
            Ok(r) if r.status().is_success() => {
                let v: Value = r.json().await.unwrap_or(Value::Null);
                if v[field].is_array() {
                    return Ok((v, began));
                }
            }
            Ok(r) if r.status().is_client_error() && r.status().as_u16() != 429 => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                anyhow::bail!("{base} refused {method} {path} with {status}: {text}; body {body}");
            }
            _ => {}
        }
        if Instant::now() > deadline {
            anyhow::bail!("no instance took {method} {path} {body} within 300 s");
        }
        counts.retries.fetch_add(1, Ordering::Relaxed);
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Posts one event until an instance answers with a verdict per channel,
/// and counts the verdicts; keeps the WeChat answer of a `watched` user
/// (one who opts out), with its event's WeChat unit.
async fn post_one(
    client: &reqwest::Client,
    bases: &[String],
    start: usize,
    body: &Value,
    watched: &Option<(String, String)>,
    counts: &PostCounts,
) -> anyhow::Result<()> {
    let post = (reqwest::Method::POST, "/v1/events");
    let (v, began) =
        send_until_answered(client, bases, start, post, body, "results", counts).await?;
    counts.posts.fetch_add(1, Ordering::Relaxed);
    if let Some((user, unit)) = watched {
        let wechat = v["results"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["channel"] == "wechat");
        let field = |name: &str| wechat.and_then(|r| r[name].as_str()).unwrap_or_default();
        counts.wechat_answers.lock().unwrap().push(WechatAnswer {
            user: user.clone(),
            unit: unit.clone(),
            key: field("key").to_string(),
            began,
            result: if wechat.is_some() {
                field("result").to_string()
            } else {
                "none".to_string()
            },
        });
    }
    for r in v["results"].as_array().into_iter().flatten() {
        match r["result"].as_str() {
            Some("capped") => {
                anyhow::bail!("`capped` answered: the chaos cap must never bind; event {body}")
            }
            Some("accepted" | "digested") => counts.accepted.fetch_add(1, Ordering::Relaxed),
            _ => counts.duplicates.fetch_add(1, Ordering::Relaxed),
        };
    }
    Ok(())
}

/// The user and WeChat unit of a résumé view whose user opts out of WeChat.
fn watched_wechat(planned: &Planned) -> Option<(String, String)> {
    let user = planned.body["user_id"].as_str()?;
    let k: usize = user.strip_prefix("u-r")?.parse().ok()?;
    if !opts_out(k) {
        return None;
    }
    let (_, _, unit) = planned.messages.iter().find(|(p, _, _)| *p == "wechat")?;
    Some((user.to_string(), unit.clone()))
}

/// Switches WeChat off for every résumé-view user who opts out
/// (`PUT /v1/users/<id>/preferences`, moving on to the next instance while
/// one is dead, as posts do), and notes when each change was answered.
async fn opt_out_all(
    client: &reqwest::Client,
    bases: &[String],
    events: usize,
    counts: &PostCounts,
) -> anyhow::Result<()> {
    let users = (events / 12).max(1);
    let body = json!({"channels_off": ["wechat"]});
    for k in (0..users).filter(|k| opts_out(*k)) {
        let user = format!("u-r{k}");
        let path = format!("/v1/users/{user}/preferences");
        let put = (reqwest::Method::PUT, path.as_str());
        send_until_answered(client, bases, k, put, &body, "channels_off", counts).await?;
        counts
            .opted_out_at
            .lock()
            .unwrap()
            .insert(user, Instant::now());
    }
    Ok(())
}

/// Cancels order `unit` (`POST /v1/events/ORDER_SHIPPED/<unit>/cancel`)
/// until an instance answers; records each channel's answer.
async fn cancel_one(
    client: &reqwest::Client,
    bases: &[String],
    start: usize,
    unit: &str,
    counts: &PostCounts,
) -> anyhow::Result<()> {
    let path = format!("/v1/events/ORDER_SHIPPED/{unit}/cancel");
    let post = (reqwest::Method::POST, path.as_str());
    let (v, _) =
        send_until_answered(client, bases, start, post, &json!({}), "channels", counts).await?;
    for c in v["channels"].as_array().into_iter().flatten() {
        let channel = c["channel"].as_str().unwrap_or_default().to_string();
        if c["result"] == "cancelled" {
            counts
                .cancelled
                .lock()
                .unwrap()
                .insert((channel, unit.to_string()));
        } else {
            counts.too_late.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Every task of every event, read through the API (`GET /v1/events/…`).
async fn collect_tasks(config: &ChaosConfig, bases: &[String]) -> anyhow::Result<Vec<Value>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let slots = Arc::new(Semaphore::new(32));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..config.events {
        let body = plan(i, config.events, config.provider_outage.is_none()).body;
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

/// The digest business type: every like in exactly one sent digest (or in
/// a digest held for an operator), each digest's count its items.
fn account_digests(config: &ChaosConfig, sim: &Sim, tasks: &[Value], report: &mut ChaosReport) {
    let likes: BTreeSet<String> = (0..config.events)
        .map(|i| plan(i, config.events, true).body)
        .filter(|b| b["biz_type"] == "PROFILE_LIKED")
        .map(|b| b["biz_id"].as_str().unwrap_or_default().to_string())
        .collect();
    report.digest_events = likes.len() as u64;
    let mut seen: HashMap<String, u64> = HashMap::new();
    for m in sim.ledger("inbox") {
        if m.template != DIGEST_TEMPLATE {
            continue;
        }
        report.digest_messages += 1;
        let param = |name: &str| m.params[name].as_str().unwrap_or_default().to_string();
        let items: Vec<Value> = serde_json::from_str(&param("digest_items")).unwrap_or_default();
        if param("digest_count") != items.len().to_string() {
            report.digest_miscounted += 1;
            report
                .examples
                .push(format!("digest miscounted: {:?}", m.params));
        }
        for item in items {
            *seen
                .entry(item["biz_id"].as_str().unwrap_or_default().to_string())
                .or_default() += 1;
        }
    }
    // A digest held for an operator holds its likes: not missing.
    let held_users: BTreeSet<String> = tasks
        .iter()
        .filter(|t| t["status"] == "unknown" || t["status"] == "dead")
        .filter(|t| t["payload"]["template"] == DIGEST_TEMPLATE)
        .filter_map(|t| t["payload"]["recipient"].as_str().map(str::to_string))
        .collect();
    for like in &likes {
        match seen.get(like).copied().unwrap_or(0) {
            0 => {
                let n: usize = like.trim_start_matches("like-").parse().unwrap_or(0);
                let user = format!("u-l{}", n % (config.events / 32).max(1));
                if !held_users.contains(&user) {
                    report.digest_missing += 1;
                    report.examples.push(format!("like in no digest: {like}"));
                    report
                        .examples
                        .extend(tasks_of(tasks, &("inbox".to_string(), user)));
                }
            }
            1 => {}
            _ => {
                report.digest_twice += 1;
                report.examples.push(format!("like in two digests: {like}"));
            }
        }
    }
}

/// A message the plan expects: (channel, dedup unit).
type Unit = (String, String);

/// What a task stopped at its attempt by an opt-out says
/// (`dispatch::opted_out`).
const STOPPED_AT_SEND: &str = "off after the accept";
/// What one of them adds when an earlier attempt (a killed worker's) may
/// have reached the provider: its message may be there, or not.
const MAY_HAVE_REACHED: &str = "may have reached the provider";

/// The opt-outs' side of the report: WeChat answers `opted_out`, and posts
/// begun after their user's opt-out took effect (answered, plus
/// [`PREFS_TTL`]) that were not answered `opted_out`. Returns the WeChat
/// units no message is due for: every post of which was answered
/// `opted_out` or accepted a task that its attempt then stopped (the user
/// had switched WeChat off since: it ended `cancelled`), and that have no
/// other WeChat task among `tasks`; and of those, the ones whose stopped
/// task an earlier attempt may have sent (a killed worker's): one message
/// at the provider is no duplicate there. (A post whose first answer a
/// kill cut off may have been accepted before the opt-out, and answered
/// `opted_out` on the instance it was retried on: its task is sent, or
/// stopped.)
fn account_opt_outs(
    counts: &PostCounts,
    tasks: &[Value],
    report: &mut ChaosReport,
) -> (Vec<Unit>, BTreeSet<Unit>) {
    let at = counts.opted_out_at.lock().unwrap();
    let answers = counts.wechat_answers.lock().unwrap();
    report.opt_outs.0 = at.len() as u64;
    let wechat = tasks.iter().filter(|t| t["channel"] == "wechat");
    let (stopped, accepted): (Vec<&Value>, Vec<&Value>) = wechat.partition(|t| {
        t["status"] == "cancelled"
            && t["last_error"]
                .as_str()
                .is_some_and(|e| e.contains(STOPPED_AT_SEND))
    });
    report.stopped_at_send = stopped.len() as u64;
    let keys = |ts: &[&Value]| -> BTreeSet<String> {
        ts.iter()
            .filter_map(|t| t["key"].as_str().map(str::to_string))
            .collect()
    };
    let maybe: Vec<&Value> = stopped
        .iter()
        .copied()
        .filter(|t| {
            t["last_error"]
                .as_str()
                .is_some_and(|e| e.contains(MAY_HAVE_REACHED))
        })
        .collect();
    let (stopped, accepted, maybe) = (keys(&stopped), keys(&accepted), keys(&maybe));
    let mut maybe_sent = BTreeSet::new();
    let mut taken: BTreeMap<&str, bool> = BTreeMap::new();
    for a in answers.iter() {
        let opted_out = a.result == "opted_out";
        report.opt_outs.1 += u64::from(opted_out);
        let stopped_at_send = stopped.contains(&a.key);
        *taken.entry(a.unit.as_str()).or_default() |=
            (!opted_out && !stopped_at_send) || accepted.contains(&a.key);
        if maybe.contains(&a.key) {
            maybe_sent.insert(("wechat".to_string(), a.unit.clone()));
        }
        let in_effect = at.get(&a.user).is_some_and(|t| a.began > *t + PREFS_TTL);
        if in_effect && !opted_out {
            report.accepted_after_opt_out += 1;
            report.examples.push(format!(
                "WeChat answered {} for {} ({}) after the opt-out took effect",
                a.result, a.user, a.unit
            ));
        }
    }
    let not_due: Vec<Unit> = taken
        .into_iter()
        .filter(|(_, taken)| !taken)
        .map(|(unit, _)| ("wechat".to_string(), unit.to_string()))
        .collect();
    maybe_sent.retain(|u| not_due.contains(u));
    (not_due, maybe_sent)
}

/// What a host logs for an entry acked before its task was begun
/// (`dispatch::worker`).
const ENTRY_GONE_LOG: &str = "entry acked meanwhile";

/// For each task a miss printed (`  task "<id>" …`): the hosts' log lines
/// naming it (all runs of each host: a restarted host appends), so its
/// history can be read after the run's data is gone.
fn add_log_lines(hosts: &[ServeProcess], examples: &mut Vec<String>) {
    let ids: Vec<String> = examples
        .iter()
        .filter_map(|e| e.strip_prefix("  task \""))
        .filter_map(|e| e.split('"').next())
        .map(str::to_string)
        .collect();
    for id in ids {
        for (i, host) in hosts.iter().enumerate() {
            let log = host.all_logs();
            let lines = log.lines().filter(|l| l.contains(&id)).take(30);
            examples.extend(lines.map(|l| format!("    host {i}: {l}")));
        }
    }
}

/// For a miss: every task of `(channel, recipient)`, as the look-ups
/// answered it at the end (status, key, attempts, provider log, last
/// error), so a miss can be traced after the run's data is gone.
fn tasks_of(tasks: &[Value], (channel, recipient): &(String, String)) -> Vec<String> {
    // A ledger row has no payload: matched by the user in its key
    // (`openid-r7`, `device-o7` and `u-r7` are user `u-r7`, `u-o7`).
    let user = recipient
        .split_once('-')
        .map(|(_, id)| format!(":u-{}", id.trim_start_matches("u-")));
    tasks
        .iter()
        .filter(|t| t["channel"] == channel.as_str())
        .filter(|t| {
            t["payload"]["recipient"] == recipient.as_str()
                || (t["payload"].is_null()
                    && user.as_ref().is_some_and(|u| {
                        t["key"].as_str().is_some_and(|k| {
                            k.contains(&format!("{u}:")) || k.ends_with(u.as_str())
                        })
                    }))
        })
        .map(|t| {
            format!(
                "  task {} {} key {} attempts {} from_ledger {} provider_log {} last_error {}",
                t["id"],
                t["status"],
                t["key"],
                t["attempts"],
                t["from_ledger"],
                t["provider_log"],
                t["last_error"]
            )
        })
        .collect()
}

/// Compares the plan with the ledger and the tasks' final states.
fn account(
    config: &ChaosConfig,
    sim: &Sim,
    tasks: &[Value],
    not_expected: &BTreeSet<(String, String)>,
    may_have: &BTreeSet<(String, String)>,
    report: &mut ChaosReport,
) {
    // Expected: distinct dedup units per (provider, recipient), but the
    // `(channel, unit)`s a cancel answered `cancelled` and the WeChat units
    // only ever answered `opted_out` or stopped at their send; of those,
    // the ones in `may_have` may have one message each at the provider.
    let mut units: HashMap<(String, String), BTreeSet<String>> = HashMap::new();
    let mut lenient: HashMap<(String, String), u64> = HashMap::new();
    for i in 0..config.events {
        for (provider, recipient, unit) in
            plan(i, config.events, config.provider_outage.is_none()).messages
        {
            let which = (provider.to_string(), unit.clone());
            if not_expected.contains(&which) {
                if may_have.contains(&which) {
                    *lenient
                        .entry((provider.to_string(), recipient))
                        .or_default() += 1;
                }
                continue;
            }
            units
                .entry((provider.to_string(), recipient))
                .or_default()
                .insert(unit);
        }
    }
    let mut got: HashMap<(String, String), u64> = HashMap::new();
    for (channel, _, _) in providers::CHANNELS {
        for m in sim.ledger(channel) {
            if m.template == DIGEST_TEMPLATE {
                continue;
            }
            *got.entry((channel.to_string(), m.recipient.clone()))
                .or_default() += 1;
        }
    }
    account_digests(config, sim, tasks, report);
    if config.provider_outage.is_some() {
        // The `sms` channel's second provider: one SMS to a user, whichever sent it.
        for m in sim.ledger(providers::TENCENT.0) {
            *got.entry(("sms".to_string(), m.recipient.clone()))
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
            // In an outage run, Tencent (the `sms` channel's B) cannot prove
            // a message absent either: a task held there by a kill, mid-send
            // or before it (the host holds a re-claimed task it cannot
            // query, as it does FCM's), is settled only by its receipt.
            let held_at_b = config.provider_outage.is_some()
                && channel == "sms"
                && t["provider"] == providers::SMS_PROVIDERS[1]
                && cause.starts_with("kill ");
            if (channel != "app-push" || !explained.contains(&cause.as_str())) && !held_at_b {
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
        // Up to one message more per stopped attempt that may have sent
        // is no duplicate.
        let may = lenient.get(who).copied().unwrap_or(0);
        let got = if got > expected {
            expected.max(got.saturating_sub(may))
        } else {
            got
        };
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
                report.examples.extend(tasks_of(tasks, who));
            }
        }
    }
    for (who, n) in &got {
        let n = n.saturating_sub(lenient.get(who).copied().unwrap_or(0));
        if !units.contains_key(who) && n > 0 {
            report.duplicates += n;
            report.examples.push(format!("unexpected: {who:?} got {n}"));
        }
    }
    report.examples.truncate(40);
}
