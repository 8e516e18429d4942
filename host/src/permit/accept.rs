//! Accept (`accept.lua`): take the permit of an idempotency key and enqueue
//! its task in one script, after the caps had room; quiet hours schedule
//! the first attempt instead; in Bloom mode the key's filter bits stand in
//! for the permit.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::scripts::{Arg, Call, Transition, script};
use super::{
    Gate, Layout, PermitConfig, PermitError, Permits, QuietCheck, RetryPolicy, TaskStatus, array,
    millis, text, unexpected,
};
use crate::store::Batch;

/// Take the permit and enqueue the task (`accept.lua`).
pub static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("accept.lua")));

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

/// `accept.lua`'s `KEYS` and `ARGV`, named (see the script's header).
struct AcceptArgs<'a> {
    /// KEYS[1]: the permit.
    permit: String,
    /// KEYS[2]: the task hash.
    task: String,
    /// KEYS[3]: the shard's ready stream.
    ready: String,
    /// KEYS[4]: the shard's delayed set (quiet hours).
    delayed: String,
    /// KEYS[5 ..]: each cap's sorted set, in the order of `caps`.
    cap_keys: Vec<String>,
    /// Then the event index, when on and the event has a business type.
    event_index: Option<String>,
    /// Last, in Bloom mode: the filters of even and odd window periods.
    filters: Option<[String; 2]>,
    /// ARGV[1]: the new task's id; empty for a dry run.
    task_id: &'a str,
    /// ARGV[2]: the window, ms.
    window_ms: u64,
    /// ARGV[3]: how long an ended task is kept, ms.
    retention_ms: u64,
    /// ARGV[5]: quiet hours (`QuietCheck::arg`).
    quiet: String,
    /// ARGV[6], ARGV[7], ARGV[8 ..]: Bloom mode's hash count, filter bytes
    /// and the key's bit positions (permit mode: 0, 0, none).
    bloom: Option<(u32, u64, Vec<u64>)>,
    /// Per cap: name, kind, max, parameter (ARGV[4] is their number).
    caps: Vec<[String; 4]>,
    /// The task's fields: its idempotency key.
    key: &'a str,
    /// `retry_max_attempts`.
    max_attempts: u32,
    /// `spec`: the fields no script reads, as one JSON object ([`spec_json`]).
    spec: String,
    /// `event`: the event as JSON text (borrowed, not copied).
    event: &'a str,
    /// `payload`: what the channel sends, as JSON text (borrowed).
    payload: &'a str,
}

impl<'a> AcceptArgs<'a> {
    /// The arguments of accepting `req` under `task_id` in `shard`.
    fn new(
        layout: &Layout,
        config: &PermitConfig,
        req: &'a AcceptRequest,
        shard: u16,
        task_id: &'a str,
    ) -> AcceptArgs<'a> {
        let window_ms = millis(req.window).max(1);
        let Gate { caps, quiet, bloom } = &req.gate;
        let sizing = bloom.as_ref().map(|b| b.sizing(layout.shards()));
        AcceptArgs {
            permit: layout.permit_in(shard, &req.key),
            task: format!("{}{}", layout.task_prefix(shard), task_id),
            ready: layout.ready(shard),
            delayed: layout.delayed(shard),
            cap_keys: caps
                .iter()
                .map(|cap| {
                    // The planner always names the recipient of a capped message; a
                    // request without one counts under the subject's own shard.
                    let user = req.recipient.as_deref().unwrap_or(&cap.subject);
                    layout.cap(&cap.name, &cap.subject, user)
                })
                .collect(),
            event_index: (config.event_index && !req.biz_type.is_empty())
                .then(|| layout.event_index(shard, &req.biz_type, &req.biz_id)),
            filters: bloom
                .as_ref()
                .zip(sizing.as_ref())
                .map(|(bloom, sizing)| layout.bloom(shard, &bloom.filter, window_ms, sizing)),
            task_id,
            window_ms,
            retention_ms: millis(config.retention),
            quiet: QuietCheck::arg(quiet.as_ref()),
            bloom: sizing.map(|s| (s.hashes, s.bytes(), s.positions(&req.key).collect())),
            caps: caps.iter().map(|cap| cap.args()).collect(),
            key: &req.key,
            max_attempts: req.retry.max_attempts,
            // The fields no script reads travel packed in one JSON field (`spec`):
            // fewer hash fields make the accept script cheaper inside Redis.
            spec: spec_json(req),
            event: &req.event_json,
            payload: &req.payload,
        }
    }
}

impl Transition for AcceptArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        let (hashes, bytes, positions) = match &self.bloom {
            Some((hashes, bytes, positions)) => (*hashes, *bytes, positions.as_slice()),
            None => (0, 0, &[][..]),
        };
        Call::default()
            .key(&*self.permit)
            .key(&*self.task)
            .key(&*self.ready)
            .key(&*self.delayed)
            .keys(&self.cap_keys)
            .keys(&self.event_index)
            .keys(self.filters.iter().flatten())
            .arg(self.task_id)
            .num(self.window_ms)
            .num(self.retention_ms)
            .num(self.caps.len() as u64)
            .arg(&*self.quiet)
            .num(hashes)
            .num(bytes)
            .nums(positions.iter().copied())
            .args(self.caps.iter().flatten())
            .arg("key")
            .arg(self.key)
            .arg("retry_max_attempts")
            .num(self.max_attempts)
            .arg("spec")
            .arg(&*self.spec)
            .arg("event")
            .arg(self.event)
            .arg("payload")
            .arg(self.payload)
    }
}

impl Permits {
    /// Takes the permit of `req.key` and enqueues a new task, or names the
    /// task that holds it. One script, one round trip.
    pub async fn accept(&self, req: &AcceptRequest) -> Result<Acceptance, PermitError> {
        let shard = self.shard_of_request(req);
        let task_id = self.layout.new_task_id(shard);
        parse_acceptance(self.run(&self.accept_args(req, shard, &task_id)).await?)
    }

    /// What [`Permits::accept`] would answer for `req` now, without taking
    /// the permit, counting in a cap or creating a task (a task id of an
    /// answer that would create one is empty).
    pub async fn would_accept(&self, req: &AcceptRequest) -> Result<Acceptance, PermitError> {
        let shard = self.shard_of_request(req);
        parse_acceptance(self.run(&self.accept_args(req, shard, "")).await?)
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
            let args = self.accept_args(req, shard, &task_id);
            // The event and payload texts are borrowed into the command:
            // no copy of them in between.
            batch.add(&args.permit, args.call().evalsha(&SCRIPT));
            n += 1;
        }
        for cmd in extra {
            batch.add_keyed(cmd.clone());
        }
        let waits = self.add_waits(&mut batch, shards);
        let mut answers = batch.query(&mut self.conn.clone(), Some(&SCRIPT)).await?;
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

    /// The `KEYS` and `ARGV` of the accept script for `req` under `task_id`
    /// (for tools that call the script themselves, such as the benchmark's floor).
    pub fn accept_keys_and_args(
        &self,
        req: &AcceptRequest,
        task_id: &str,
    ) -> (Vec<String>, Vec<String>) {
        let shard = self.shard_of_request(req);
        let args = self.accept_args(req, shard, task_id);
        let call = args.call();
        (call.keys, call.args.iter().map(Arg::to_text).collect())
    }

    /// The shard `req` is accepted in ([`Layout::shard_for`]).
    fn shard_of_request(&self, req: &AcceptRequest) -> u16 {
        self.layout.shard_for(&req.key, req.recipient.as_deref())
    }

    fn accept_args<'a>(
        &self,
        req: &'a AcceptRequest,
        shard: u16,
        task_id: &'a str,
    ) -> AcceptArgs<'a> {
        AcceptArgs::new(&self.layout, &self.config, req, shard, task_id)
    }
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
