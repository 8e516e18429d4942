//! Permits and tasks in Redis: every Lua script of pushonce lives here.
//!
//! A *permit* is the key `{ns:shard}:permit:<idempotency key>` whose value is
//! the id of the task that owns it. [`Permits::accept`] takes the permit and
//! enqueues its task in one script; every later change of the task
//! ([`Permits::begin_attempt`], [`Permits::extend_lease`], [`Permits::record`],
//! [`Permits::record_receipt`], [`Permits::promote_due`]) is a script that
//! checks the expected status and, for a worker, its lease token (fencing),
//! and touches the permit only while the task owns it. See `docs/redis.md`.

pub mod awaiting;
pub mod bloom;
pub mod gate;
pub mod held;
pub mod keys;
pub mod scripts;
pub mod task;

use std::collections::HashMap;
use std::time::Duration;

use redis::Value;

use crate::store::{Batch, RedisConn};

pub(crate) use awaiting::Claimed;
pub use awaiting::{CheckAction, CheckNote};
pub use bloom::{BloomCheck, BloomSizing};
pub use gate::{CapCheck, CapPeriod, Gate, QuietCheck};
pub use held::{HeldCause, RecordContext};
pub(crate) use held::{OperatorNote, OperatorStep, ReconcileStep, parse_operator_log};
pub use keys::{Layout, shard_of_task};
pub use task::{RetryPolicy, Task, TaskStatus};

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
    /// A script answered something this code does not understand (a bug, or scripts from another version).
    #[error("unexpected answer from {script}: {answer}")]
    Unexpected {
        /// Which script answered.
        script: &'static str,
        /// What it answered, as debug text.
        answer: String,
    },
}

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
    /// Whether each accept adds its task to the event's index (default
    /// true); without it [`Permits::tasks_of_event`] finds nothing and event
    /// look-ups come from the delivery ledger.
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

/// What to accept: one idempotency key on one channel, with its task's contents.
#[derive(Debug, Clone)]
pub struct AcceptRequest {
    /// The derived idempotency key (≤ ~300 bytes, no whitespace needed).
    pub key: String,
    /// Channel name.
    pub channel: String,
    /// Dedup window: the permit lasts at least this long from accept.
    pub window: Duration,
    /// Business type of the event (for the event index; empty: no index).
    pub biz_type: String,
    /// Business id of the event.
    pub biz_id: String,
    /// The event as JSON text.
    pub event_json: String,
    /// What the channel sends, as JSON text.
    pub payload: String,
    /// Name of the key policy that derived the key.
    pub policy_name: String,
    /// Version of that key policy.
    pub policy_version: String,
    /// The retry schedule, snapshotted into the task.
    pub retry: RetryPolicy,
    /// Frequency caps and quiet hours checked with the permit (none by default).
    pub gate: Gate,
    /// The user the message goes to (the event's `user_id`), if known. When
    /// the key names it ([`keys::names_recipient`]) the accept lands in the
    /// recipient's shard, with every other channel of the event for that
    /// user and the user's caps; otherwise in the shard of the key.
    pub recipient: Option<String>,
}

/// The answer to an accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acceptance {
    /// The permit was free: a new task was created and enqueued.
    Accepted {
        /// The new task's id (the permit's value).
        task_id: String,
    },
    /// The permit is held: no task was created.
    Duplicate {
        /// The id of the task that owns the permit.
        task_id: String,
        /// Its status; `None` if its record already expired (retention shorter than the window).
        status: Option<TaskStatus>,
    },
    /// Accepted inside quiet hours: the task's first attempt waits until
    /// `scheduled_for_ms` (it sits in the shard's delayed set, not the stream).
    Deferred {
        /// The new task's id (the permit's value).
        task_id: String,
        /// When its first attempt is due (ms since the epoch, Redis clock).
        scheduled_for_ms: u64,
    },
    /// A frequency cap has no room: no permit was taken, no task created.
    Capped {
        /// The cap's name.
        cap: String,
        /// When the next message would be allowed (ms since the epoch, Redis clock).
        next_allowed_ms: u64,
    },
}

impl Acceptance {
    /// The task id named by the answer (empty for `Capped`: no task).
    pub fn task_id(&self) -> &str {
        match self {
            Acceptance::Accepted { task_id }
            | Acceptance::Deferred { task_id, .. }
            | Acceptance::Duplicate { task_id, .. } => task_id,
            Acceptance::Capped { .. } => "",
        }
    }
}

/// An attempt a worker has begun: it holds the lease until `lease_until_ms`.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The task id.
    pub task_id: String,
    /// The fencing token of this lease; every later change must present it.
    pub token: String,
    /// Attempt number, 1 for the first.
    pub number: u32,
    /// End of the lease, Redis clock (ms since the epoch).
    pub lease_until_ms: u64,
    /// True when the lease was taken over from a worker that died mid-attempt.
    pub reclaimed: bool,
    /// The task as it was when the lease was taken.
    pub task: Task,
}

/// The answer to [`Permits::begin_attempt`].
#[derive(Debug, Clone)]
pub enum Begin {
    /// The lease is ours: send.
    Begun(Box<Attempt>),
    /// Another worker holds a live lease until this time (Redis clock, ms).
    Busy {
        /// End of that lease.
        lease_until_ms: u64,
    },
    /// Nothing to send: the task is in this status.
    Settled(TaskStatus),
    /// The permit belongs to a newer task with the same key; this one is now `superseded`.
    Superseded {
        /// The owner of the permit.
        by: String,
    },
    /// The task record does not exist (expired or never written).
    Missing,
}

/// The outcome of an attempt, to record.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The provider accepted the message.
    Sent {
        /// The provider's id for it.
        provider_message_id: String,
        /// The client reference the plugin gave the provider, if its receipt named one.
        reference: Option<String>,
    },
    /// Failed retryably: try again after `delay`.
    Retry {
        /// Backoff before the next attempt.
        delay: Duration,
        /// Why it failed.
        reason: String,
    },
    /// Sent with no answer, and a resend with the same key is safe: try again
    /// after `delay`, like `Retry`, but remember the provider may have it
    /// (`maybe_sent`, so a later failure keeps the permit for the window).
    Resend {
        /// Backoff before the next attempt.
        delay: Duration,
        /// What happened.
        reason: String,
    },
    /// Sent with no answer: hold for reconciliation.
    Unknown {
        /// What happened.
        reason: String,
    },
    /// Refused for good: `failed`.
    Failed {
        /// The provider's reason.
        reason: String,
    },
    /// Attempts exhausted: `dead`.
    Dead {
        /// The last failure.
        reason: String,
    },
    /// The ledger names another task as the owner of this key: Redis lost
    /// that task's permit (a failover) and this task must never send. Ends
    /// `duplicate_prevented`; the permit, if this task holds it, is kept for
    /// the window so later re-posts are answered `duplicate`.
    DuplicatePrevented {
        /// The owner of the key in the ledger.
        owner: String,
    },
    /// Nothing was sent and the attempt is given back (the ledger could not
    /// be reached before shutdown): the task returns to `queued` with its
    /// attempt uncounted, its stream entry left pending to be re-claimed.
    Release,
}

/// What became of the permit when an outcome was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermitFate {
    /// Still held (for the window, a retry, or while unknown).
    Kept,
    /// Released (deleted owner-checked): the task ended with nothing sent.
    Released,
    /// It had lapsed and was taken back for the window (the task was sent).
    Retaken,
    /// Another task owns it; left alone.
    NotOwner,
}

/// The answer to [`Permits::record`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// The outcome was written.
    Done(PermitFate),
    /// The lease was lost (another worker took over, or the task moved on): nothing was written.
    Fenced {
        /// The task's status at that moment (`None` if it is gone).
        status: Option<TaskStatus>,
    },
}

/// A stream entry a worker is processing; the record script acks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Shard of the stream.
    pub shard: u16,
    /// Stream entry id.
    pub id: String,
    /// The task the entry names.
    pub task_id: String,
    /// The task's idempotency key (carried by the entry so the permit is named without a read).
    pub key: String,
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

    /// Loads every script (`SCRIPT LOAD`) and creates each shard's consumer
    /// group (`XGROUP CREATE … MKSTREAM`, an existing group is fine).
    pub async fn prepare(&self) -> Result<(), PermitError> {
        let mut conn = self.conn.clone();
        for script in scripts::all() {
            script.load_async(&mut conn).await?;
        }
        self.ensure_groups().await
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

    /// Takes the permit of `req.key` and enqueues a new task, or names the
    /// task that holds it. One script, one round trip.
    pub async fn accept(&self, req: &AcceptRequest) -> Result<Acceptance, PermitError> {
        let shard = self.shard_of_request(req);
        let task_id = self.layout.new_task_id(shard);
        let mut inv = scripts::ACCEPT.prepare_invoke();
        self.accept_invocation(&mut inv, req, &task_id);
        let answer: Value = inv.invoke_async(&mut self.conn.clone()).await?;
        parse_acceptance(answer)
    }

    /// What [`Permits::accept`] would answer for `req` now, without taking
    /// the permit, counting in a cap or creating a task (a task id of an
    /// answer that would create one is empty).
    pub async fn would_accept(&self, req: &AcceptRequest) -> Result<Acceptance, PermitError> {
        let mut inv = scripts::ACCEPT.prepare_invoke();
        self.accept_invocation(&mut inv, req, "");
        let answer: Value = inv.invoke_async(&mut self.conn.clone()).await?;
        parse_acceptance(answer)
    }

    /// Accepts many requests in one pipeline (one round trip, one script call each).
    /// Answers come in the order of `reqs`. Safe to retry: a request whose first
    /// answer was lost is answered `Accepted` with the same task id again.
    pub async fn accept_batch(
        &self,
        reqs: &[AcceptRequest],
    ) -> Result<Vec<Acceptance>, PermitError> {
        self.accept_batch_with(reqs, &[]).await
    }

    /// [`Permits::accept_batch`] with `extra` commands appended to the same
    /// batch (their answers are ignored; each one's first argument is its
    /// key), e.g. the API's sample of recent events. The accepts do not
    /// depend on them. One pipeline on a single Redis; on a cluster one per
    /// hash slot, sent concurrently ([`Batch`]).
    pub async fn accept_batch_with<'r>(
        &self,
        reqs: impl IntoIterator<Item = &'r AcceptRequest>,
        extra: &[redis::Cmd],
    ) -> Result<Vec<Acceptance>, PermitError> {
        let mut batch = Batch::new();
        let mut n = 0;
        let mut shards = Vec::new();
        for req in reqs {
            let shard = self.shard_of_request(req);
            shards.push(shard);
            let task_id = self.layout.new_task_id(shard);
            let keys = self.accept_keys(req, &task_id);
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(scripts::ACCEPT.get_hash())
                .arg(keys.len())
                .arg(&keys);
            // Written straight into the command: no copy of the event and
            // payload texts in between.
            self.for_each_accept_arg(req, &task_id, |a| {
                cmd.arg(a);
            });
            batch.add(&keys[0], cmd);
            n += 1;
        }
        for cmd in extra {
            batch.add_keyed(cmd.clone());
        }
        let waits = self.add_waits(&mut batch, shards);
        let mut answers = batch
            .query(&mut self.conn.clone(), Some(&scripts::ACCEPT))
            .await?;
        let confirmations = answers.split_off(answers.len() - waits);
        self.check_replicated(&confirmations)?;
        answers.truncate(n);
        answers.into_iter().map(parse_acceptance).collect()
    }

    /// Adds `WAIT wait_replicas timeout` after the accepts of `shards` when
    /// `wait_replicas` asks for it: once on one Redis (the pipeline's
    /// connection did every write), once per shard's hash slot on a cluster
    /// (each slot's pipeline goes to its own master). Returns how many.
    fn add_waits(&self, batch: &mut Batch, mut shards: Vec<u16>) -> usize {
        if self.config.wait_replicas == 0 || shards.is_empty() {
            return 0;
        }
        if !self.conn.is_cluster() {
            shards.truncate(1);
        }
        shards.sort_unstable();
        shards.dedup();
        let timeout = millis(self.config.wait_replicas_timeout).max(1);
        for shard in &shards {
            let mut wait = redis::cmd("WAIT");
            wait.arg(self.config.wait_replicas).arg(timeout);
            batch.add(&self.layout.ready(*shard), wait);
        }
        shards.len()
    }

    /// Fails with [`PermitError::NotReplicated`] when a `WAIT` answered fewer
    /// replicas than `wait_replicas`.
    fn check_replicated(&self, confirmations: &[Value]) -> Result<(), PermitError> {
        let acked = confirmations
            .iter()
            .map(|v| match v {
                Value::Int(n) => Ok(*n),
                other => Err(PermitError::Unexpected {
                    script: "WAIT",
                    answer: format!("{other:?}"),
                }),
            })
            .collect::<Result<Vec<i64>, _>>()?;
        match acked.into_iter().min() {
            Some(fewest) if fewest < i64::from(self.config.wait_replicas) => {
                Err(PermitError::NotReplicated {
                    acked: fewest,
                    wanted: self.config.wait_replicas,
                    timeout_ms: millis(self.config.wait_replicas_timeout),
                })
            }
            _ => Ok(()),
        }
    }

    fn accept_invocation(
        &self,
        inv: &mut redis::ScriptInvocation<'_>,
        req: &AcceptRequest,
        task_id: &str,
    ) {
        for key in self.accept_keys(req, task_id) {
            inv.key(key);
        }
        self.for_each_accept_arg(req, task_id, |a| {
            inv.arg(a);
        });
    }

    /// The `KEYS` and `ARGV` of the accept script for `req` under `task_id`
    /// (for tools that call the script themselves, such as the benchmark's floor).
    pub fn accept_keys_and_args(
        &self,
        req: &AcceptRequest,
        task_id: &str,
    ) -> (Vec<String>, Vec<String>) {
        let mut args = Vec::with_capacity(13);
        self.for_each_accept_arg(req, task_id, |a| args.push(a.to_string()));
        (self.accept_keys(req, task_id), args)
    }

    /// The shard `req` is accepted in ([`Layout::shard_for`]).
    fn shard_of_request(&self, req: &AcceptRequest) -> u16 {
        self.layout.shard_for(&req.key, req.recipient.as_deref())
    }

    /// The accept script's `KEYS` for `req` under `task_id`.
    fn accept_keys(&self, req: &AcceptRequest, task_id: &str) -> Vec<String> {
        let shard = self.shard_of_request(req);
        let mut keys = vec![
            self.layout.permit_in(shard, &req.key),
            format!("{}{}", self.layout.task_prefix(shard), task_id),
            self.layout.ready(shard),
            self.layout.delayed(shard),
        ];
        for cap in &req.gate.caps {
            // The planner always names the recipient of a capped message; a
            // request without one counts under the subject's own shard.
            let user = req.recipient.as_deref().unwrap_or(&cap.subject);
            keys.push(self.layout.cap(&cap.name, &cap.subject, user));
        }
        if self.config.event_index && !req.biz_type.is_empty() {
            keys.push(self.layout.event_index(shard, &req.biz_type, &req.biz_id));
        }
        if let Some(bloom) = &req.gate.bloom {
            let sizing = bloom.sizing(self.layout.shards());
            let window = millis(req.window).max(1);
            keys.extend(self.layout.bloom(shard, &bloom.filter, window, &sizing));
        }
        keys
    }

    /// Calls `f` with each of the accept script's `ARGV` for `req`, in order.
    fn for_each_accept_arg(&self, req: &AcceptRequest, task_id: &str, mut f: impl FnMut(&str)) {
        let window = millis(req.window).max(1).to_string();
        let retention = millis(self.config.retention).to_string();
        let attempts = req.retry.max_attempts.to_string();
        // The fields no script reads travel packed in one JSON field (`spec`):
        // fewer hash fields make the accept script cheaper inside Redis.
        let spec = spec_json(req);
        let caps = req.gate.caps.len().to_string();
        let quiet = QuietCheck::arg(req.gate.quiet.as_ref());
        for arg in [task_id, &window, &retention, &caps, &quiet] {
            f(arg);
        }
        match &req.gate.bloom {
            Some(bloom) => {
                let sizing = bloom.sizing(self.layout.shards());
                f(&sizing.hashes.to_string());
                f(&sizing.bytes().to_string());
                for bit in sizing.positions(&req.key) {
                    f(&bit.to_string());
                }
            }
            None => {
                f("0");
                f("0");
            }
        }
        for cap in &req.gate.caps {
            for a in cap.args() {
                f(&a);
            }
        }
        for arg in [
            "key",
            &req.key,
            "retry_max_attempts",
            &attempts,
            "spec",
            &spec,
            "event",
            &req.event_json,
            "payload",
            &req.payload,
        ] {
            f(arg);
        }
    }

    /// How long a delivered task is kept.
    /// `ARGV` for what an ended task whose outcome the ledger holds keeps:
    /// ms, 0 when it leaves Redis.
    fn ended_keep_ms(&self) -> u64 {
        self.config.keep_ended.map_or(0, |d| millis(d).max(1))
    }

    fn task_key(&self, task_id: &str) -> Result<String, PermitError> {
        self.layout
            .task(task_id)
            .ok_or_else(|| PermitError::BadTaskId(task_id.to_string()))
    }

    /// The permit of `key` owned by task `task_id`: in the shard the task id
    /// names (where the accept took it).
    fn task_permit(&self, task_id: &str, key: &str) -> Result<String, PermitError> {
        let shard =
            shard_of_task(task_id).ok_or_else(|| PermitError::BadTaskId(task_id.to_string()))?;
        Ok(self.layout.permit_in(shard, key))
    }

    /// Reads a task; `None` if it does not exist (or expired).
    pub async fn task(&self, task_id: &str) -> Result<Option<Task>, PermitError> {
        let key = self.task_key(task_id)?;
        let fields: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(Task::from_fields(task_id, fields))
    }

    /// The task id holding the permit of `key`, if any. The key alone does
    /// not say whom it was accepted for, so this reads every shard it can
    /// live in ([`Layout::candidate_shards`]: the key's, and one per
    /// segment of its body) in one [`Batch`] of `GET`s.
    pub async fn permit_owner(&self, key: &str) -> Result<Option<String>, PermitError> {
        Ok(self.find_permit(key).await?.map(|(_, owner)| owner))
    }

    /// The shard and the owner of the permit of `key`, looked up in every
    /// shard it can live in (see [`Permits::permit_owner`]).
    pub async fn find_permit(&self, key: &str) -> Result<Option<(u16, String)>, PermitError> {
        let shards = self.layout.candidate_shards(key);
        let mut batch = Batch::new();
        for &shard in &shards {
            let mut get = redis::cmd("GET");
            get.arg(self.layout.permit_in(shard, key));
            batch.add_keyed(get);
        }
        let answers = batch.query(&mut self.conn.clone(), None).await?;
        let owners: Vec<Option<String>> =
            redis::from_redis_value(Value::Array(answers)).map_err(redis::RedisError::from)?;
        Ok(shards
            .into_iter()
            .zip(owners)
            .find_map(|(shard, owner)| Some((shard, owner?))))
    }

    /// Milliseconds the permit of `key` still lives: `None` if absent, `Some(None)` if held without expiry.
    pub async fn permit_ttl(&self, key: &str) -> Result<Option<Option<u64>>, PermitError> {
        let Some((shard, _)) = self.find_permit(key).await? else {
            return Ok(None);
        };
        let ttl: i64 = redis::cmd("PTTL")
            .arg(self.layout.permit_in(shard, key))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(match ttl {
            -2 => None,
            -1 => Some(None),
            t => Some(Some(t as u64)),
        })
    }

    /// Ids of the tasks of one event, across every shard (one pipelined
    /// `SMEMBERS` per shard); none when the event index is off.
    pub async fn tasks_of_event(
        &self,
        biz_type: &str,
        biz_id: &str,
    ) -> Result<Vec<String>, PermitError> {
        if !self.config.event_index {
            return Ok(Vec::new());
        }
        let sets: Vec<Vec<String>> = self
            .per_shard(|shard| {
                let mut cmd = redis::cmd("SMEMBERS");
                cmd.arg(self.layout.event_index(shard, biz_type, biz_id));
                cmd
            })
            .await?;
        Ok(sets.into_iter().flatten().collect())
    }

    /// Claims a lease of `lease` on the task for one attempt, if it is
    /// `queued`, `retry_wait`, or `sending` under a lease that ran out. The
    /// permit is extended past the lease end by the grace.
    /// `key` is the task's idempotency key (stream entries carry it), which
    /// names the permit without a read.
    pub async fn begin_attempt(
        &self,
        task_id: &str,
        key: &str,
        lease: Duration,
    ) -> Result<Begin, PermitError> {
        let task_key = self.task_key(task_id)?;
        let token = format!("{:016x}", rand::random::<u64>());
        let answer: Value = scripts::BEGIN
            .key(&task_key)
            .key(self.task_permit(task_id, key)?)
            .arg(task_id)
            .arg(&token)
            .arg(millis(lease).max(1))
            .arg(millis(self.config.grace))
            .arg(millis(self.config.retention).max(1))
            .invoke_async(&mut self.conn.clone())
            .await?;
        let items = array(answer, "begin")?;
        let tag = text(items.first());
        match tag.as_str() {
            "begun" => {
                let number = text(items.get(1)).parse().unwrap_or(0);
                let lease_until_ms = text(items.get(2)).parse().unwrap_or(0);
                let reclaimed = text(items.get(3)) == "1";
                let fields = match items.get(4) {
                    Some(Value::Array(kv)) => kv
                        .chunks(2)
                        .map(|p| (text(p.first()), text(p.get(1))))
                        .collect(),
                    _ => HashMap::new(),
                };
                let task = Task::from_fields(task_id, fields).ok_or(PermitError::Unexpected {
                    script: "begin",
                    answer: "task without status".into(),
                })?;
                Ok(Begin::Begun(Box::new(Attempt {
                    task_id: task_id.to_string(),
                    token,
                    number,
                    lease_until_ms,
                    reclaimed,
                    task,
                })))
            }
            "busy" => Ok(Begin::Busy {
                lease_until_ms: text(items.get(1)).parse().unwrap_or(0),
            }),
            "settled" => TaskStatus::parse(&text(items.get(1)))
                .map(Begin::Settled)
                .ok_or_else(|| unexpected("begin", &items)),
            "superseded" => Ok(Begin::Superseded {
                by: text(items.get(1)),
            }),
            "missing" => Ok(Begin::Missing),
            _ => Err(unexpected("begin", &items)),
        }
    }

    /// The idempotency key stored in a task (the begin script needs its permit's name).
    async fn task_idempotency_key(&self, task_key: &str) -> Result<Option<String>, PermitError> {
        Ok(redis::cmd("HGET")
            .arg(task_key)
            .arg("key")
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// Extends the lease of an attempt in flight by `lease` from now (Redis
    /// clock). Returns the new lease end, or `None` if the lease was lost.
    pub async fn extend_lease(
        &self,
        attempt: &Attempt,
        lease: Duration,
    ) -> Result<Option<u64>, PermitError> {
        self.extend(attempt, lease, false).await
    }

    /// Extends the lease like [`Permits::extend_lease`] and marks that the
    /// worker is about to hand the message to its channel
    /// (`request_started_at`): a worker that vanishes after this may have
    /// sent it, one that vanishes before did not. `None` if the lease was lost.
    pub async fn mark_request_started(
        &self,
        attempt: &Attempt,
        lease: Duration,
    ) -> Result<Option<u64>, PermitError> {
        self.extend(attempt, lease, true).await
    }

    async fn extend(
        &self,
        attempt: &Attempt,
        lease: Duration,
        starting: bool,
    ) -> Result<Option<u64>, PermitError> {
        let answer: Value = scripts::EXTEND
            .key(self.task_key(&attempt.task_id)?)
            .key(self.task_permit(&attempt.task_id, &attempt.task.key)?)
            .arg(&attempt.task_id)
            .arg(&attempt.token)
            .arg(millis(lease).max(1))
            .arg(millis(self.config.grace))
            .arg(if starting { "1" } else { "0" })
            .invoke_async(&mut self.conn.clone())
            .await?;
        let items = array(answer, "extend")?;
        match text(items.first()).as_str() {
            "extended" => Ok(text(items.get(1)).parse().ok()),
            "lost" => Ok(None),
            _ => Err(unexpected("extend", &items)),
        }
    }

    /// Records the outcome of an attempt, fenced by its lease token, and acks
    /// its stream entry (when given) in the same script.
    pub async fn record(
        &self,
        attempt: &Attempt,
        outcome: &Outcome,
        entry: Option<&Entry>,
    ) -> Result<Recorded, PermitError> {
        self.record_with(attempt, outcome, entry, RecordContext::default())
            .await
    }

    /// Records an outcome like [`Permits::record`], with what the worker
    /// knows beside it: whether a `sent` message can be checked later
    /// (else it is not awaited), and why an `unknown` or `dead` one is held
    /// (else derived from the outcome: `unknown` is
    /// [`HeldCause::CutOffAfterWrite`], `dead` [`HeldCause::RetriesExhausted`]).
    pub async fn record_with(
        &self,
        attempt: &Attempt,
        outcome: &Outcome,
        entry: Option<&Entry>,
        context: RecordContext,
    ) -> Result<Recorded, PermitError> {
        let shard = shard_of_task(&attempt.task_id)
            .ok_or_else(|| PermitError::BadTaskId(attempt.task_id.clone()))?;
        let args = OutcomeArgs::of(outcome);
        let (cause, provider_answer) = held_of(outcome, context.held);
        let sent_after = if context.checkable {
            millis(self.config.check_sent_after).to_string()
        } else {
            "-1".to_string()
        };
        let answer: Value = scripts::RECORD
            .key(self.task_key(&attempt.task_id)?)
            .key(self.layout.permit_in(shard, &attempt.task.key))
            .key(self.layout.ready(shard))
            .key(self.layout.delayed(shard))
            .key(self.layout.awaiting(shard))
            .arg(&attempt.task_id)
            .arg(&attempt.token)
            .arg(args.name)
            .arg(entry.map(|e| e.id.as_str()).unwrap_or(""))
            .arg(&self.config.group)
            .arg(millis(self.config.retention).max(1))
            .arg(millis(self.config.grace))
            .arg(args.delay)
            .arg(args.provider_id)
            .arg(args.reason)
            .arg(sent_after)
            .arg(millis(self.config.check_unknown_after))
            .arg(args.reference)
            .arg(cause)
            .arg(provider_answer)
            .arg(if context.ledger_holds_outcome {
                self.ended_keep_ms().to_string()
            } else {
                String::new()
            })
            .invoke_async(&mut self.conn.clone())
            .await?;
        recorded(array(answer, "record")?)
    }

    /// Settles a `sent` or `unknown` task from a receipt: `delivered` or
    /// `failed` (delivery failed after the provider accepted it). Returns false
    /// if the task was in another status (nothing written).
    pub async fn record_receipt(
        &self,
        task_id: &str,
        delivered: bool,
        provider_message_id: Option<&str>,
    ) -> Result<bool, PermitError> {
        let task_key = self.task_key(task_id)?;
        let Some(key) = self.task_idempotency_key(&task_key).await? else {
            return Ok(false);
        };
        let shard =
            shard_of_task(task_id).ok_or_else(|| PermitError::BadTaskId(task_id.to_string()))?;
        let answer: Value = scripts::RECEIPT
            .key(&task_key)
            .key(self.layout.permit_in(shard, &key))
            .key(self.layout.awaiting(shard))
            .arg(task_id)
            .arg(if delivered { "delivered" } else { "failed" })
            .arg(millis(self.config.retention).max(1))
            .arg(provider_message_id.unwrap_or(""))
            .invoke_async(&mut self.conn.clone())
            .await?;
        let items = array(answer, "receipt")?;
        Ok(text(items.first()) == "recorded")
    }

    /// Lets `task`, which ended `status` (`delivered` or `failed`) by a
    /// receipt, a reconciler check or an operator, leave Redis once the
    /// delivery ledger holds that outcome (call it only then): its hash, its
    /// event-index entry and its provider-id index entries go, its permit
    /// stays for the window. With `keep_ended` it expires after that instead.
    /// Fenced by `status`: true when it left (or was given its expiry).
    pub async fn forget(&self, task: &Task, status: &str) -> Result<bool, PermitError> {
        let shard =
            shard_of_task(&task.id).ok_or_else(|| PermitError::BadTaskId(task.id.clone()))?;
        let answer: Value = scripts::FORGET
            .key(self.task_key(&task.id)?)
            .key(self.layout.dead(shard))
            .key(self.layout.awaiting(shard))
            .arg(&task.id)
            .arg(status)
            .arg(self.ended_keep_ms())
            .invoke_async(&mut self.conn.clone())
            .await?;
        let items = array(answer, "forget")?;
        let done = text(items.first());
        if done == "left" {
            let ids = [
                task.provider_message_id.as_deref(),
                task.reference.as_deref(),
            ];
            for id in ids.into_iter().flatten().filter(|id| !id.is_empty()) {
                let _: () = redis::cmd("DEL")
                    .arg(self.provider_id_key(&task.channel, id))
                    .query_async(&mut self.conn.clone())
                    .await?;
            }
        }
        Ok(done == "left" || done == "kept")
    }

    /// The key of the provider-id index entry of `channel`'s message `provider_id`.
    fn provider_id_key(&self, channel: &str, provider_id: &str) -> String {
        let name = format!("{channel}:{provider_id}");
        let shard = self.layout.shard_of(&name);
        format!(
            "{}pmid:{name}",
            self.layout.task_prefix(shard).trim_end_matches("task:")
        )
    }

    /// Remembers that `channel`'s message `provider_id` is task `task_id`, for
    /// receipts that name only the provider's id, for `keep` (the retention
    /// while its task awaits a receipt: [`Permits::forget`] deletes it when
    /// the task leaves; the key's window for a task that already left, so a
    /// late receipt still reaches its ledger row). Written after the send is
    /// recorded (best effort: a receipt that finds nothing is reported unmatched).
    pub(crate) async fn index_provider_id(
        &self,
        channel: &str,
        provider_id: &str,
        task_id: &str,
        keep: Duration,
    ) -> Result<(), PermitError> {
        let _: () = redis::cmd("SET")
            .arg(self.provider_id_key(channel, provider_id))
            .arg(task_id)
            .arg("PX")
            .arg(millis(keep).max(1))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The task of `channel`'s message `provider_id`, if indexed.
    pub(crate) async fn task_by_provider_id(
        &self,
        channel: &str,
        provider_id: &str,
    ) -> Result<Option<String>, PermitError> {
        Ok(redis::cmd("GET")
            .arg(self.provider_id_key(channel, provider_id))
            .query_async(&mut self.conn.clone())
            .await?)
    }

    /// The key remembering when a receipt first named `channel`'s message
    /// `id` without matching a task.
    fn unmatched_key(&self, channel: &str, id: &str) -> String {
        let name = format!("{channel}:{id}");
        let shard = self.layout.shard_of(&name);
        format!(
            "{}unmatched:{name}",
            self.layout.task_prefix(shard).trim_end_matches("task:")
        )
    }

    /// Forgets that a receipt once named `channel`'s message `id` before its
    /// send was recorded: it matched its task since (the entry would
    /// otherwise outlive the message by a day).
    pub(crate) async fn matched(&self, channel: &str, id: &str) -> Result<(), PermitError> {
        let _: () = redis::cmd("DEL")
            .arg(self.unmatched_key(channel, id))
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// How long ago (ms) a receipt first named `channel`'s message `id`
    /// that matched no task: the first call records now (kept for `keep`)
    /// and answers 0. Bounds how long such a receipt is answered 503.
    pub(crate) async fn unmatched_age(
        &self,
        channel: &str,
        id: &str,
        keep: Duration,
    ) -> Result<u64, PermitError> {
        let key = self.unmatched_key(channel, id);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let (first,): (u64,) = redis::pipe()
            .cmd("SET")
            .arg(&key)
            .arg(now)
            .arg("NX")
            .arg("PX")
            .arg(millis(keep).max(1))
            .ignore()
            .cmd("GET")
            .arg(&key)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(now.saturating_sub(first))
    }

    /// Moves up to `limit` due retries of `shard` from its delayed set to its
    /// ready stream; returns how many were taken off the delayed set.
    pub async fn promote_due(&self, shard: u16, limit: usize) -> Result<usize, PermitError> {
        let n: usize = scripts::PROMOTE
            .key(self.layout.delayed(shard))
            .key(self.layout.ready(shard))
            .arg(limit.max(1))
            .arg(self.layout.task_prefix(shard))
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(n)
    }
}

/// The answer to [`Permits::requeue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requeue {
    /// The task is queued again under its key; it may make attempts up to `max_attempts`.
    Requeued {
        /// Attempts made before the requeue.
        attempts: u32,
        /// The task's new attempt limit (attempts made + its original budget).
        max_attempts: u32,
    },
    /// Another task owns the permit of this key now: nothing changed.
    Refused {
        /// The owner.
        owner: String,
    },
    /// The task is not `failed` or `dead`: nothing changed.
    NotRequeueable(TaskStatus),
    /// The task's message may be at the provider (an attempt's outcome was
    /// unknown and nothing settled it): requeued only with `force`.
    MaybeSent,
    /// No such task (never existed, or expired).
    Missing,
}

/// How an operator settles a task without a send ([`Permits::settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// The message arrived (the operator confirmed it): `delivered`.
    Delivered,
    /// Nobody will send it: `failed`, off the operators' lists.
    GivenUp,
}

impl Settle {
    /// Its name in `settle.lua` and `operator_log`.
    pub fn as_str(self) -> &'static str {
        match self {
            Settle::Delivered => "delivered",
            Settle::GivenUp => "given_up",
        }
    }
}

/// The answer to [`Permits::settle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Settled: the task's status now.
    Settled(TaskStatus),
    /// Another task owns the permit of this key now: nothing changed.
    Refused {
        /// The owner.
        owner: String,
    },
    /// The task is not held, failed or dead (nor `sent`, to deliver): nothing changed.
    NotSettleable(TaskStatus),
    /// No such task (never existed, or expired).
    Missing,
}

impl Permits {
    /// Sends a `failed`, `dead` or held (`unknown`) task again under the same
    /// key and task id: re-takes the permit if it is free or still this
    /// task's, refuses if another task owns it (`requeue.lua`).
    /// `force` requeues a task whose message may already be at the provider,
    /// an `unknown` one always ([`Requeue::MaybeSent`] without it).
    pub async fn requeue(&self, task_id: &str, force: bool) -> Result<Requeue, PermitError> {
        self.requeue_by(task_id, force, &OperatorNote::default())
            .await
    }

    /// [`Permits::requeue`], recorded in the task's `operator_log` with who and why.
    pub(crate) async fn requeue_by(
        &self,
        task_id: &str,
        force: bool,
        note: &OperatorNote,
    ) -> Result<Requeue, PermitError> {
        let task_key = self.task_key(task_id)?;
        let shard =
            shard_of_task(task_id).ok_or_else(|| PermitError::BadTaskId(task_id.to_string()))?;
        let Some(key) = self.task_idempotency_key(&task_key).await? else {
            return Ok(Requeue::Missing);
        };
        let answer: Value = scripts::REQUEUE
            .key(&task_key)
            .key(self.layout.permit_in(shard, &key))
            .key(self.layout.ready(shard))
            .key(self.layout.dead(shard))
            .key(self.layout.awaiting(shard))
            .arg(task_id)
            .arg(millis(self.config.retention).max(1))
            .arg(if force { "1" } else { "0" })
            .arg(&note.by)
            .arg(&note.why)
            .invoke_async(&mut self.conn.clone())
            .await?;
        let items = array(answer, "requeue")?;
        match text(items.first()).as_str() {
            "requeued" => Ok(Requeue::Requeued {
                attempts: text(items.get(1)).parse().unwrap_or(0),
                max_attempts: text(items.get(2)).parse().unwrap_or(0),
            }),
            "refused" => Ok(Requeue::Refused {
                owner: text(items.get(1)),
            }),
            "not_requeueable" => TaskStatus::parse(&text(items.get(1)))
                .map(Requeue::NotRequeueable)
                .ok_or_else(|| unexpected("requeue", &items)),
            "maybe_sent" => Ok(Requeue::MaybeSent),
            "missing" => Ok(Requeue::Missing),
            _ => Err(unexpected("requeue", &items)),
        }
    }

    /// Settles a held, failed or dead task without a send (`settle.lua`):
    /// [`Settle::Delivered`] (also from `sent`) or [`Settle::GivenUp`]
    /// (`failed`); owner-checked, the permit kept for the window, recorded
    /// in the task's `operator_log` with who and why.
    pub async fn settle(
        &self,
        task_id: &str,
        how: Settle,
        note: &OperatorNote,
    ) -> Result<Settled, PermitError> {
        let task_key = self.task_key(task_id)?;
        let shard =
            shard_of_task(task_id).ok_or_else(|| PermitError::BadTaskId(task_id.to_string()))?;
        let Some(key) = self.task_idempotency_key(&task_key).await? else {
            return Ok(Settled::Missing);
        };
        let answer: Value = scripts::SETTLE
            .key(&task_key)
            .key(self.layout.permit_in(shard, &key))
            .key(self.layout.dead(shard))
            .key(self.layout.awaiting(shard))
            .arg(task_id)
            .arg(how.as_str())
            .arg(millis(self.config.retention).max(1))
            .arg(&note.by)
            .arg(&note.why)
            .invoke_async(&mut self.conn.clone())
            .await?;
        let items = array(answer, "settle")?;
        let status = || TaskStatus::parse(&text(items.get(1)));
        match text(items.first()).as_str() {
            "settled" => status()
                .map(Settled::Settled)
                .ok_or_else(|| unexpected("settle", &items)),
            "refused" => Ok(Settled::Refused {
                owner: text(items.get(1)),
            }),
            "not_settleable" => status()
                .map(Settled::NotSettleable)
                .ok_or_else(|| unexpected("settle", &items)),
            "missing" => Ok(Settled::Missing),
            _ => Err(unexpected("settle", &items)),
        }
    }

    /// The most recently ended failed or dead tasks, newest first, across
    /// every shard: `(task id, ended at ms)`, at most `limit`.
    pub async fn dead_tasks(&self, limit: usize) -> Result<Vec<(String, u64)>, PermitError> {
        self.newest_of(|l, s| l.dead(s), limit).await
    }

    /// The tasks an operator must look at, newest first, across every
    /// shard: held (`unknown`, scored by when held) and failed or dead
    /// (scored by when they ended): `(task id, at ms)`, at most `limit`.
    pub async fn held_tasks(&self, limit: usize) -> Result<Vec<(String, u64)>, PermitError> {
        let mut all = self.newest_of(|l, s| l.held(s), limit).await?;
        all.extend(self.dead_tasks(limit).await?);
        sort_newest_first(&mut all, limit);
        Ok(all)
    }

    /// The newest `limit` entries of one index of every shard.
    async fn newest_of(
        &self,
        key: impl Fn(&Layout, u16) -> String,
        limit: usize,
    ) -> Result<Vec<(String, u64)>, PermitError> {
        let per_shard: Vec<Vec<(String, f64)>> = self
            .per_shard(|shard| {
                let mut cmd = redis::cmd("ZREVRANGE");
                cmd.arg(key(&self.layout, shard))
                    .arg(0)
                    .arg(limit.saturating_sub(1))
                    .arg("WITHSCORES");
                cmd
            })
            .await?;
        let mut all: Vec<(String, u64)> = per_shard
            .into_iter()
            .flatten()
            .map(|(id, at)| (id, at as u64))
            .collect();
        sort_newest_first(&mut all, limit);
        Ok(all)
    }

    /// Tasks waiting for a retry, summed over every shard's delayed set (`ZCARD`).
    pub async fn retry_queue_depth(&self) -> Result<u64, PermitError> {
        self.zcard_all(|l, s| l.delayed(s)).await
    }

    /// Entries of the failed-and-dead index, summed over every shard (`ZCARD`).
    pub async fn dead_count(&self) -> Result<u64, PermitError> {
        self.zcard_all(|l, s| l.dead(s)).await
    }

    /// Entries of the held (`unknown`) index, summed over every shard (`ZCARD`).
    pub(crate) async fn held_count(&self) -> Result<u64, PermitError> {
        self.zcard_all(|l, s| l.held(s)).await
    }

    async fn zcard_all(&self, key: impl Fn(&Layout, u16) -> String) -> Result<u64, PermitError> {
        let counts: Vec<u64> = self
            .per_shard(|shard| {
                let mut cmd = redis::cmd("ZCARD");
                cmd.arg(key(&self.layout, shard));
                cmd
            })
            .await?;
        Ok(counts.into_iter().sum())
    }

    /// Runs `cmd(shard)` (its first argument a key of that shard) for every
    /// shard as one [`Batch`], answers in shard order.
    async fn per_shard<T: redis::FromRedisValue>(
        &self,
        cmd: impl Fn(u16) -> redis::Cmd,
    ) -> Result<Vec<T>, PermitError> {
        let mut batch = Batch::new();
        for shard in 0..self.layout.shards() {
            batch.add_keyed(cmd(shard));
        }
        let answers = batch.query(&mut self.conn.clone(), None).await?;
        Ok(redis::from_redis_value(Value::Array(answers)).map_err(redis::RedisError::from)?)
    }
}

/// Sorts `(id, at)` entries newest first (ties by id) and keeps `limit`.
fn sort_newest_first(all: &mut Vec<(String, u64)>, limit: usize) {
    all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    all.truncate(limit);
}

/// The held cause (JSON, or '' when the outcome holds nothing) and the
/// provider's last answer recorded with `outcome`.
fn held_of(outcome: &Outcome, given: Option<HeldCause>) -> (String, &str) {
    let (derived, answer) = match outcome {
        Outcome::Unknown { reason } => (HeldCause::CutOffAfterWrite, reason.as_str()),
        Outcome::Dead { reason } => (HeldCause::RetriesExhausted, reason.as_str()),
        _ => return (String::new(), ""),
    };
    let cause = given.unwrap_or(derived);
    let answer = match cause {
        // No answer reached this worker: the reason is the host's own words.
        HeldCause::WorkerVanished { .. } | HeldCause::QueryCouldNotTell => "",
        HeldCause::CutOffAfterWrite | HeldCause::RetriesExhausted => answer,
    };
    (cause.to_json(), answer)
}

/// The task's `spec` field: the fields no script reads, as one JSON object
/// (names sorted). Serialized straight from the request (no `Value` tree:
/// this runs for every accept).
fn spec_json(req: &AcceptRequest) -> String {
    let r = &req.retry;
    #[derive(serde::Serialize)]
    struct Spec<'a> {
        biz_id: &'a str,
        biz_type: &'a str,
        channel: &'a str,
        policy: &'a str,
        policy_version: &'a str,
        retry_factor: f64,
        retry_initial_ms: u64,
        retry_jitter: bool,
        retry_max_delay_ms: u64,
    }
    serde_json::to_string(&Spec {
        biz_id: &req.biz_id,
        biz_type: &req.biz_type,
        channel: &req.channel,
        policy: &req.policy_name,
        policy_version: &req.policy_version,
        retry_factor: r.factor,
        retry_initial_ms: millis(r.initial),
        retry_jitter: r.jitter,
        retry_max_delay_ms: millis(r.max_delay),
    })
    .expect("plain fields always serialize")
}

/// A duration in whole milliseconds.
pub(crate) fn millis(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

fn parse_acceptance(answer: Value) -> Result<Acceptance, PermitError> {
    let items = array(answer, "accept")?;
    match text(items.first()).as_str() {
        "accepted" => match text(items.get(2)).parse() {
            Ok(scheduled_for_ms) => Ok(Acceptance::Deferred {
                task_id: text(items.get(1)),
                scheduled_for_ms,
            }),
            Err(_) => Ok(Acceptance::Accepted {
                task_id: text(items.get(1)),
            }),
        },
        "duplicate" => Ok(Acceptance::Duplicate {
            task_id: text(items.get(1)),
            status: TaskStatus::parse(&text(items.get(2))),
        }),
        "capped" => Ok(Acceptance::Capped {
            cap: text(items.get(1)),
            next_allowed_ms: text(items.get(2))
                .parse()
                .map_err(|_| unexpected("accept", &items))?,
        }),
        _ => Err(unexpected("accept", &items)),
    }
}

fn array(v: Value, script: &'static str) -> Result<Vec<Value>, PermitError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(PermitError::Unexpected {
            script,
            answer: format!("{other:?}"),
        }),
    }
}

fn unexpected(script: &'static str, items: &[Value]) -> PermitError {
    PermitError::Unexpected {
        script,
        answer: format!("{items:?}"),
    }
}

/// A script's scalar answer as text (bulk or simple string, integer; anything else is empty).
fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::SimpleString(s)) => s.clone(),
        Some(Value::Int(i)) => i.to_string(),
        Some(Value::Okay) => "OK".into(),
        _ => String::new(),
    }
}

/// The arguments of `record.lua` that come from an attempt's outcome.
struct OutcomeArgs<'a> {
    /// The outcome's name in the script.
    name: &'static str,
    /// Delay before the next attempt, ms.
    delay: u64,
    /// The provider's message id (sent).
    provider_id: &'a str,
    /// Why (or, for a prevented duplicate, the owner).
    reason: &'a str,
    /// The client reference it was sent with (sent).
    reference: &'a str,
}

impl<'a> OutcomeArgs<'a> {
    fn of(outcome: &'a Outcome) -> OutcomeArgs<'a> {
        let args = |name, delay, provider_id, reason| OutcomeArgs {
            name,
            delay,
            provider_id,
            reason,
            reference: "",
        };
        match outcome {
            Outcome::Sent {
                provider_message_id,
                reference,
            } => OutcomeArgs {
                reference: reference.as_deref().unwrap_or(""),
                ..args("sent", 0, provider_message_id.as_str(), "")
            },
            Outcome::Retry { delay, reason } => args("retry", millis(*delay), "", reason.as_str()),
            Outcome::Resend { delay, reason } => {
                args("resend", millis(*delay), "", reason.as_str())
            }
            Outcome::Unknown { reason } => args("unknown", 0, "", reason.as_str()),
            Outcome::Failed { reason } => args("failed", 0, "", reason.as_str()),
            Outcome::Dead { reason } => args("dead", 0, "", reason.as_str()),
            Outcome::DuplicatePrevented { owner } => {
                args("duplicate_prevented", 0, "", owner.as_str())
            }
            Outcome::Release => args("release", 0, "", ""),
        }
    }
}

/// `record.lua`'s answer.
fn recorded(items: Vec<Value>) -> Result<Recorded, PermitError> {
    match text(items.first()).as_str() {
        "recorded" => Ok(Recorded::Done(match text(items.get(1)).as_str() {
            "kept" => PermitFate::Kept,
            "released" => PermitFate::Released,
            "retaken" => PermitFate::Retaken,
            _ => PermitFate::NotOwner,
        })),
        "fenced" => Ok(Recorded::Fenced {
            status: TaskStatus::parse(&text(items.get(1))),
        }),
        _ => Err(unexpected("record", &items)),
    }
}

#[cfg(test)]
mod spec_json_tests {
    use super::*;

    #[test]
    fn spec_json_is_the_value_form() {
        let req = AcceptRequest {
            key: "push:p@1:sms:k".into(),
            channel: "sms".into(),
            window: Duration::from_secs(60),
            biz_type: "ORDER".into(),
            biz_id: "o-\"1\"".into(),
            event_json: "{}".into(),
            payload: "{}".into(),
            policy_name: "per-event".into(),
            policy_version: "1.2.0".into(),
            retry: RetryPolicy {
                max_attempts: 5,
                initial: Duration::from_millis(1500),
                factor: 2.5,
                max_delay: Duration::from_secs(60),
                jitter: true,
            },
            gate: Default::default(),
            recipient: None,
        };
        let r = &req.retry;
        let reference = serde_json::json!({
            "channel": req.channel,
            "biz_type": req.biz_type,
            "biz_id": req.biz_id,
            "policy": req.policy_name,
            "policy_version": req.policy_version,
            "retry_initial_ms": millis(r.initial),
            "retry_factor": r.factor,
            "retry_max_delay_ms": millis(r.max_delay),
            "retry_jitter": r.jitter,
        })
        .to_string();
        assert_eq!(spec_json(&req), reference);
    }
}
