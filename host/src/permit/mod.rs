//! The task lifecycle in Redis: permits, tasks and every Lua script that
//! changes them.
//!
//! A *permit* is the key `{ns:shard}:permit:<idempotency key>` whose value is
//! the id of the task that owns it. One file per transition holds its
//! script (the `.lua` beside it), the typed arguments that order the
//! script's `KEYS` and `ARGV` ([`scripts::Transition`]) and its answer:
//! `accept` takes the permit and enqueues the task in one script; `begin`,
//! `extend`, `record` (an attempt), `receipt`, `claim` and `reconcile`
//! (the reconciler), `requeue` and `settle` (an operator), `cancel` (the
//! business, before the first attempt), `forget` and
//! `promote` are scripts that check the expected status and, for a
//! worker, its lease token (fencing), and touch the permit only while the
//! task owns it; `duplicate` marks a task a possible duplicate. `listing`
//! holds the read-only look-ups; `history` what the delivery ledger is
//! told of a transition, and the task leaving Redis once the ledger holds
//! how it ended; `fallback` the fallback a failure for good triggers;
//! `payload` what a task's channel sends; `stored` the event record's texts
//! as stored (the event without the business ids its name holds).
//! See `docs/redis.md`.
//!
//! The module keeps the name `permit` (the permit is what the lifecycle
//! guards): the name is imported across the host, the tests and the bench.

pub mod accept;
mod ack;
mod begin;
pub mod bloom;
mod cancel;
mod claim;
mod duplicate;
mod extend;
mod fallback;
mod forget;
pub mod gate;
pub mod held;
mod history;
pub mod keys;
mod listing;
mod opted_out;
mod payload;
mod pieces;
mod promote;
mod receipt;
mod reconcile;
mod record;
mod requeue;
pub mod scripts;
mod settle;
mod stored;
pub mod task;

use std::time::Duration;

use redis::Value;

use crate::store::RedisConn;

pub use accept::{AcceptRequest, Acceptance};
pub use begin::{Attempt, Begin};
pub use bloom::{BloomCheck, BloomSizing};
pub use cancel::Cancel;
pub use claim::ClaimPass;
pub(crate) use claim::Claimed;
pub use duplicate::POSSIBLE_DUPLICATE;
pub use fallback::{OptOutPolicy, OptOuts, OptOutsError, ProviderSettled};
pub use gate::{CapCheck, CapPeriod, DigestCheck, DigestDue, Gate, QuietCheck};
pub use held::{HeldCause, RecordContext};
pub(crate) use held::{OperatorNote, OperatorStep, ReconcileStep, parse_operator_log};
pub use history::SettledByProvider;
pub(crate) use history::{Noted, Settlement, note_outcome, operator_log};
pub use keys::{Layout, shard_of_task};
pub use payload::{DIGEST_COUNT, DIGEST_ITEMS, Fallback, InvalidPayload, Payload, UnsubscribeLink};
pub use reconcile::{CheckAction, CheckNote};
pub use record::{Entry, Outcome, PermitFate, Recorded, ToRecord};
pub use requeue::Requeue;
pub use settle::{Settle, Settled};
pub use task::{RetryPolicy, Task, TaskStatus};

use scripts::Transition;

/// Errors of the permit layer.
#[derive(Debug, thiserror::Error)]
pub enum PermitError {
    /// A Redis command or script failed (connection lost, timeout, server error).
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// A task id that does not name its shard.
    #[error("malformed task id {0:?}")]
    BadTaskId(String),
    /// The accepts were written on the primary, but fewer replicas than
    /// `wait_replicas` confirmed them in time: a failover now could lose them.
    #[error(
        "accepted on the Redis primary, but only {acked} of the {wanted} replica(s) \
         `wait_replicas` asks for confirmed it within {timeout_ms} ms"
    )]
    NotReplicated {
        /// Replicas that confirmed (the fewest, on a cluster).
        acked: i64,
        /// `wait_replicas`.
        wanted: u32,
        /// `wait_replicas_timeout` in ms.
        timeout_ms: u64,
    },
    /// The namespace's layout marker names another key layout version: two
    /// versions must never share a namespace (docs/redis.md, "Key layout").
    #[error(
        "Redis namespace `{namespace}` holds key layout version {found} (its marker `{marker}`); \
         this host writes version {LAYOUT_VERSION} and must not share a namespace with another \
         version: drain it (stop every instance of the other version) and then `DEL {marker}`, \
         or set another `namespace` (docs/redis.md, \"Key layout\")"
    )]
    OtherLayout {
        /// The namespace.
        namespace: String,
        /// The marker's key.
        marker: String,
        /// The version it names.
        found: String,
    },
    /// The recipient's preferences could not be read before a fallback's
    /// accept: nothing is accepted (the caller tries again).
    #[error("the recipient's preferences cannot be read: {0}")]
    Preferences(#[source] OptOutsError),
    /// A script answered something this code does not understand (a bug, or scripts from another version).
    #[error("unexpected answer from {script}: {answer}")]
    Unexpected {
        /// Which script answered.
        script: &'static str,
        /// What it answered, as debug text.
        answer: String,
    },
}

/// The key layout version this host writes and reads (docs/redis.md, "Key
/// layout"); recorded in each namespace's marker ([`Layout::marker`]).
pub const LAYOUT_VERSION: u32 = 7;

/// Settings of the permit layer.
#[derive(Debug, Clone)]
pub struct PermitConfig {
    /// Prefix inside every hash tag (default `po`).
    pub namespace: String,
    /// Number of shards (default 16). Changing it re-maps keys: do it only on an empty Redis.
    pub shards: u16,
    /// How long a task that ended is kept before it expires when Redis is
    /// its only record (default 7 days): the ledger is off, holds no row for
    /// it (`superseded`, `duplicate_prevented`) or did not confirm its
    /// outcome in time; and for `dead` tasks, failed ones without a
    /// fallback, and `sent` ones awaiting a receipt (in flight).
    pub retention: Duration,
    /// What a task that ended for good keeps once the delivery ledger holds
    /// its outcome (delivered, sent with nothing to await, failed with its
    /// fallback taken, settled by an operator): `None` (the default), it
    /// leaves Redis then — only its permit stays, for the window; `Some(d)`
    /// (`keep_ended_tasks`, an opt-in), it stays `d` before it expires.
    pub keep_ended: Option<Duration>,
    /// Whether look-ups by event read Redis (default true): the event's
    /// record in each shard lists its open tasks (layout 5: the index costs
    /// no key of its own); without it [`Permits::tasks_of_event`] finds
    /// nothing and event look-ups come from the delivery ledger.
    pub event_index: bool,
    /// How far past a lease end or a retry's due time the permit is kept, so a
    /// late worker or retry scheduler still finds it (default 5 minutes).
    pub grace: Duration,
    /// Consumer group of the ready streams (default `pushonce`).
    pub group: String,
    /// How long after it was recorded `sent` a task without a receipt is
    /// first checked by the reconciler (`[reconcile] sent_age`, default 10 minutes).
    pub check_sent_after: Duration,
    /// How long after it was recorded `unknown` a task is first checked by
    /// the reconciler (`[reconcile] unknown_age`, default 30 s).
    pub check_unknown_after: Duration,
    /// Replicas that must confirm the writes of [`Permits::accept_batch_with`]
    /// (`WAIT`) before it answers; 0: none (the default).
    pub wait_replicas: u32,
    /// How long those accepts wait for the confirmations.
    pub wait_replicas_timeout: Duration,
}

impl Default for PermitConfig {
    fn default() -> Self {
        PermitConfig {
            namespace: "po".into(),
            shards: 16,
            retention: Duration::from_secs(7 * 24 * 3600),
            keep_ended: None,
            event_index: true,
            grace: Duration::from_secs(300),
            group: "pushonce".into(),
            check_sent_after: Duration::from_secs(600),
            check_unknown_after: Duration::from_secs(30),
            wait_replicas: 0,
            wait_replicas_timeout: Duration::from_millis(100),
        }
    }
}

/// The permit layer over one Redis connection (cheap to clone).
#[derive(Clone)]
pub struct Permits {
    /// Shared multiplexed connection for script calls (one Redis or a cluster).
    conn: RedisConn,
    /// The key layout.
    layout: Layout,
    /// Settings.
    config: PermitConfig,
    /// How long an event record's value pieces are (read at [`Permits::prepare`]).
    piece: pieces::PieceLength,
    /// The recipients' preferences a fallback's accept reads again
    /// (`None`: every fallback is accepted).
    opt_outs: Option<std::sync::Arc<dyn OptOuts>>,
}

impl std::fmt::Debug for Permits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permits")
            .field("layout", &self.layout)
            .field("config", &self.config)
            .finish()
    }
}

impl Permits {
    /// A permit layer on `conn` (a `ConnectionManager` or a [`RedisConn`]) with `config`.
    pub fn new(conn: impl Into<RedisConn>, config: PermitConfig) -> Permits {
        Permits {
            conn: conn.into(),
            layout: Layout::new(config.namespace.clone(), config.shards),
            config,
            piece: pieces::PieceLength::default(),
            opt_outs: None,
        }
    }

    /// This layer on another connection to the same Redis, sharing what
    /// [`Permits::prepare`] read (the piece length of event records), so
    /// a clone on its own socket writes what the prepared layer would.
    pub fn on(&self, conn: impl Into<RedisConn>) -> Permits {
        Permits {
            conn: conn.into(),
            ..self.clone()
        }
    }

    /// The key layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The settings.
    pub fn config(&self) -> &PermitConfig {
        &self.config
    }

    /// A clone of the connection, for plain commands of other layers.
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// Checks the namespace's layout marker (written if missing), reads
    /// the piece length of event records (`hash-max-listpack-value`,
    /// `pieces.rs`), loads every script (`SCRIPT LOAD`) and creates each shard's consumer group
    /// (`XGROUP CREATE … MKSTREAM`, an existing group is fine).
    pub async fn prepare(&self) -> Result<(), PermitError> {
        self.check_layout().await?;
        self.piece.read(&self.conn).await?;
        tracing::info!(
            length = self.piece.get(),
            "event record values are stored in pieces of this length (Redis's hash-max-listpack-value)"
        );
        let mut conn = self.conn.clone();
        for script in all_scripts() {
            script.load_async(&mut conn).await?;
        }
        self.ensure_groups().await
    }

    /// Writes [`LAYOUT_VERSION`] into the namespace's marker if it has none
    /// (`SET NX`), and refuses a namespace whose marker names another.
    async fn check_layout(&self) -> Result<(), PermitError> {
        let marker = self.layout.marker();
        let mut conn = self.conn.clone();
        redis::cmd("SET")
            .arg(&marker)
            .arg(LAYOUT_VERSION)
            .arg("NX")
            .query_async::<()>(&mut conn)
            .await?;
        let found: Option<String> = redis::cmd("GET")
            .arg(&marker)
            .query_async(&mut conn)
            .await?;
        match found {
            Some(v) if v == LAYOUT_VERSION.to_string() => Ok(()),
            other => Err(PermitError::OtherLayout {
                namespace: self.layout.namespace().to_string(),
                marker,
                found: other.unwrap_or_else(|| "none".into()),
            }),
        }
    }

    /// Creates the consumer group of every shard's ready stream if missing.
    pub(crate) async fn ensure_groups(&self) -> Result<(), PermitError> {
        let mut conn = self.conn.clone();
        for shard in 0..self.layout.shards() {
            let res: redis::RedisResult<()> = redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(self.layout.ready(shard))
                .arg(&self.config.group)
                .arg("0")
                .arg("MKSTREAM")
                .query_async(&mut conn)
                .await;
            match res {
                Ok(()) => {}
                Err(e) if e.code() == Some("BUSYGROUP") => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Runs one transition's script with its typed arguments.
    async fn run<A: Transition, T: redis::FromRedisValue>(
        &self,
        args: &A,
    ) -> Result<T, PermitError> {
        Ok(args
            .call()
            .invocation(A::SCRIPT)
            .invoke_async(&mut self.conn.clone())
            .await?)
    }

    /// Runs a transition's script once for several tasks of one shard (one
    /// hash tag): their calls one after the other, which the script takes
    /// task by task; one answer per task, in order.
    async fn run_batch<A: Transition>(
        &self,
        args: &[A],
        script: &'static str,
    ) -> Result<Vec<Value>, PermitError> {
        let mut all = scripts::Call::default();
        for a in args {
            let call = a.call();
            all.keys.extend(call.keys);
            all.args.extend(call.args);
        }
        let answer: Value = all
            .invocation(A::SCRIPT)
            .invoke_async(&mut self.conn.clone())
            .await?;
        let items = array(answer, script)?;
        if items.len() != args.len() {
            return Err(unexpected(script, &items));
        }
        Ok(items)
    }

    /// `ARGV` for what an ended task whose outcome the ledger holds keeps:
    /// ms, 0 when it leaves Redis.
    pub(crate) fn ended_keep_ms(&self) -> u64 {
        self.config.keep_ended.map_or(0, |d| millis(d).max(1))
    }

    pub(crate) fn task_key(&self, task_id: &str) -> Result<String, PermitError> {
        self.layout
            .task(task_id)
            .ok_or_else(|| PermitError::BadTaskId(task_id.to_string()))
    }

    /// The permit of `key` owned by task `task_id`: in the shard the task id
    /// names (where the accept took it).
    pub(crate) fn task_permit(&self, task_id: &str, key: &str) -> Result<String, PermitError> {
        let shard =
            shard_of_task(task_id).ok_or_else(|| PermitError::BadTaskId(task_id.to_string()))?;
        Ok(self.layout.permit_in(shard, key))
    }

    /// The idempotency key stored in a task (the begin script needs its permit's name).
    pub(crate) async fn task_idempotency_key(
        &self,
        task_key: &str,
    ) -> Result<Option<String>, PermitError> {
        Ok(redis::cmd("HGET")
            .arg(task_key)
            .arg("key")
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// The shard a task id names.
    pub(crate) fn shard_of(&self, task_id: &str) -> Result<u16, PermitError> {
        shard_of_task(task_id).ok_or_else(|| PermitError::BadTaskId(task_id.to_string()))
    }
}

/// A duration in whole milliseconds.
pub(crate) fn millis(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

pub(crate) fn array(v: Value, script: &'static str) -> Result<Vec<Value>, PermitError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(PermitError::Unexpected {
            script,
            answer: format!("{other:?}"),
        }),
    }
}

pub(crate) fn unexpected(script: &'static str, items: &[Value]) -> PermitError {
    PermitError::Unexpected {
        script,
        answer: format!("{items:?}"),
    }
}

/// A script's scalar answer as text (bulk or simple string, integer; anything else is empty).
pub(crate) fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        Some(Value::Int(i)) => i.to_string(),
        Some(Value::Okay) => "OK".into(),
        _ => String::new(),
    }
}

/// [`text`] of an answer taken by value: a bulk string's bytes become the
/// text without a copy (a hash read back is the hot path of every attempt).
pub(crate) fn into_text(v: Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8(b)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        Value::SimpleString(s) => s,
        other => text(Some(&other)),
    }
}

/// Every script, for loading them all up front.
fn all_scripts() -> [&'static redis::Script; 16] {
    [
        &accept::SCRIPT,
        &ack::SCRIPT,
        &begin::SCRIPT,
        &extend::SCRIPT,
        &record::SCRIPT,
        &promote::SCRIPT,
        &receipt::SCRIPT,
        &requeue::SCRIPT,
        &settle::SCRIPT,
        &claim::SCRIPT,
        &reconcile::SCRIPT,
        &bloom::SCRIPT,
        &forget::SCRIPT,
        &duplicate::SCRIPT,
        &listing::SCRIPT,
        &cancel::SCRIPT,
    ]
}
