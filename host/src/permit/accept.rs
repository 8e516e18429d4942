//! Accept (`accept.lua`): for every channel of one event that lands in one
//! shard, in one script, take the permit of its idempotency key and enqueue
//! its task, after the caps had room; quiet hours schedule the first
//! attempt instead; in Bloom mode the key's filter bits stand in for the
//! permit. The event is stored once, in an event record; each task keeps
//! only its own small state (see `docs/redis.md`, "Event records").

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::{Script, Value};

use super::scripts::{Arg, Call, Transition, script};
use super::stored;
use super::{
    DigestCheck, Gate, Layout, PermitConfig, PermitError, Permits, QuietCheck, RetryPolicy,
    TaskStatus, array, millis, text, unexpected,
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
    /// The event as JSON text, shared by the requests of its channels
    /// (requests with the same text and business ids are one event: stored once).
    pub event_json: Arc<str>,
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
    /// When the event asked to be sent (ms since the epoch; the event's
    /// `send_at`), `None`: now. A later time schedules the first attempt
    /// then, and the caps and quiet hours are judged at it; the permit lasts
    /// at least until it plus the window. The same for every channel of one event.
    pub send_at_ms: Option<u64>,
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
    /// Accepted with a later `send_at`, or inside quiet hours: the task's
    /// first attempt waits until `scheduled_for_ms` (it sits in the shard's
    /// delayed set, not the stream): the request's `send_at_ms`, or the end
    /// of the quiet hours that time falls in.
    Deferred {
        /// The new task's id (the permit's value).
        task_id: String,
        /// When its first attempt is due (ms since the epoch, Redis clock).
        scheduled_for_ms: u64,
    },
    /// Added to the open digest under its key (the policy's `[digest]`): no
    /// task of its own; the digest task sends it with the others.
    Digested {
        /// The digest task's id.
        task_id: String,
        /// When the digest is due (ms since the epoch, Redis clock).
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
            | Acceptance::Digested { task_id, .. }
            | Acceptance::Duplicate { task_id, .. } => task_id,
            Acceptance::Capped { .. } => "",
        }
    }
}

/// One channel's block of `accept.lua`'s `KEYS` and `ARGV` (see the script's header).
struct ChannelArgs<'a> {
    /// Its permit.
    permit: String,
    /// Its task hash.
    task: String,
    /// Each cap's sorted set, in the order of `caps`.
    cap_keys: Vec<String>,
    /// In Bloom mode: the filters of even and odd window periods.
    filters: Option<[String; 2]>,
    /// With a digest: the key's digest head and this event's item mark.
    digest_keys: Option<[String; 2]>,
    /// The new task's id; empty for a dry run.
    task_id: String,
    /// The window, ms.
    window_ms: u64,
    /// Quiet hours (`QuietCheck::arg`).
    quiet: String,
    /// Bloom mode's hash count, filter bytes and the key's bit positions
    /// (permit mode: 0, 0, none).
    bloom: Option<(u32, u64, Vec<u64>)>,
    /// Per cap: name, kind, max, parameter.
    caps: Vec<[String; 4]>,
    /// The idempotency key.
    key: &'a str,
    /// `retry_max_attempts`.
    max_attempts: u32,
    /// The channel.
    channel: &'a str,
    /// The rest of the retry schedule, packed ([`retry_arg`]).
    retry: String,
    /// What the channel sends, as JSON text (borrowed, not copied).
    payload: &'a str,
    /// The digest ([`DigestCheck::arg`]), empty without one.
    digest: String,
    /// With a digest: the event's item id and the item (JSON).
    item: Option<(&'a str, &'a str)>,
}

/// `accept.lua`'s `KEYS` and `ARGV`: the channels of one event that land in
/// one shard, named (see the script's header).
struct AcceptArgs<'a> {
    /// KEYS[1]: the shard's ready stream.
    ready: String,
    /// KEYS[2]: the shard's delayed set (quiet hours).
    delayed: String,
    /// KEYS[3]: the event's record in this shard.
    record: String,
    /// ARGV[1]: the record's name after `event:`; empty for a dry run.
    record_name: String,
    /// ARGV[2]: how long an ended task is kept, ms.
    retention_ms: u64,
    /// ARGV[3]: the event as JSON text, once for every channel, without the
    /// business ids the record's name holds ([`stored::event_text`]).
    event: Cow<'a, str>,
    /// ARGV[4]: what the channels share ([`stored::meta_text`]).
    meta: String,
    /// ARGV[6]: the event's send_at (ms), `None`: now.
    send_at_ms: Option<u64>,
    /// ARGV[7]: the length of the record's value pieces (`pieces.rs`).
    piece: u64,
    /// The channels, in the order of their answers.
    channels: Vec<ChannelArgs<'a>>,
}

impl<'a> ChannelArgs<'a> {
    /// Channel `req`'s block, accepted under `task_id` in `shard`.
    fn new(layout: &Layout, req: &'a AcceptRequest, shard: u16, task_id: String) -> Self {
        let window_ms = millis(req.window).max(1);
        let Gate {
            caps,
            quiet,
            bloom,
            digest,
        } = &req.gate;
        let sizing = bloom.as_ref().map(|b| b.sizing(layout.shards()));
        ChannelArgs {
            permit: layout.permit_in(shard, &req.key),
            task: format!("{}{}", layout.task_prefix(shard), task_id),
            cap_keys: caps
                .iter()
                .map(|cap| {
                    // The planner always names the recipient of a capped message; a
                    // request without one counts under the subject's own shard.
                    let user = req.recipient.as_deref().unwrap_or(&cap.subject);
                    layout.cap(&cap.name, &cap.subject, user)
                })
                .collect(),
            filters: bloom
                .as_ref()
                .zip(sizing.as_ref())
                .map(|(bloom, sizing)| layout.bloom(shard, &bloom.filter, window_ms, sizing)),
            digest_keys: digest.as_ref().map(|d| {
                [
                    layout.digest_head(shard, &req.key),
                    layout.digest_item(shard, &req.key, &d.item_id),
                ]
            }),
            task_id,
            window_ms,
            quiet: QuietCheck::arg(quiet.as_ref()),
            bloom: sizing.map(|s| (s.hashes, s.bytes(), s.positions(&req.key).collect())),
            caps: caps.iter().map(|cap| cap.args()).collect(),
            key: &req.key,
            max_attempts: req.retry.max_attempts,
            channel: &req.channel,
            retry: retry_arg(&req.retry),
            payload: &req.payload,
            digest: DigestCheck::arg(digest.as_ref()),
            item: digest.as_ref().map(|d| (&*d.item_id, &*d.item)),
        }
    }
}

impl<'a> AcceptArgs<'a> {
    /// The arguments of accepting `reqs` (one event's channels, all landing
    /// in `shard`); a dry run when `dry`.
    fn new(
        layout: &Layout,
        config: &PermitConfig,
        reqs: &[&'a AcceptRequest],
        shard: u16,
        dry: bool,
        piece: u64,
    ) -> AcceptArgs<'a> {
        let first = reqs[0];
        let new_id = || {
            if dry {
                String::new()
            } else {
                layout.new_task_id(shard)
            }
        };
        AcceptArgs {
            ready: layout.ready(shard),
            delayed: layout.delayed(shard),
            record: layout.event_record(shard, &first.biz_type, &first.biz_id),
            record_name: if dry {
                String::new()
            } else {
                super::keys::record_name(&first.biz_type, &first.biz_id)
            },
            retention_ms: millis(config.retention),
            event: stored::event_text(&first.event_json, &first.biz_type, &first.biz_id),
            meta: stored::meta_text(&first.policy_name, &first.policy_version, &first.biz_type),
            send_at_ms: first.send_at_ms,
            piece,
            channels: reqs
                .iter()
                .map(|req| ChannelArgs::new(layout, req, shard, new_id()))
                .collect(),
        }
    }
}

impl Transition for AcceptArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        let mut call = Call::default()
            .key(&*self.ready)
            .key(&*self.delayed)
            .key(&*self.record)
            .arg(&*self.record_name)
            .num(self.retention_ms)
            .arg(&*self.event)
            .arg(&*self.meta)
            .num(self.channels.len() as u64)
            .arg(self.send_at_ms.map(|ms| ms.to_string()).unwrap_or_default())
            .num(self.piece);
        for c in &self.channels {
            let (hashes, bytes, positions) = match &c.bloom {
                Some((hashes, bytes, positions)) => (*hashes, *bytes, positions.as_slice()),
                None => (0, 0, &[][..]),
            };
            call = call
                .key(&*c.permit)
                .key(&*c.task)
                .keys(&c.cap_keys)
                .keys(c.filters.iter().flatten())
                .keys(c.digest_keys.iter().flatten())
                .arg(&*c.task_id)
                .num(c.window_ms)
                .num(c.caps.len() as u64)
                .arg(&*c.quiet)
                .num(hashes)
                .num(bytes)
                .nums(positions.iter().copied())
                .args(c.caps.iter().flatten())
                .arg(c.key)
                .num(c.max_attempts)
                .arg(c.channel)
                .arg(&*c.retry)
                .arg(c.payload)
                .arg(&*c.digest)
                .arg(c.item.map_or("", |(id, _)| id))
                .arg(c.item.map_or("", |(_, item)| item));
        }
        call
    }
}

impl Permits {
    /// The arguments of accepting `reqs` (one event's channels, all landing
    /// in `shard`) with this layer's layout, settings and piece length; a
    /// dry run when `dry`.
    fn accept_args<'a>(&self, reqs: &[&'a AcceptRequest], shard: u16, dry: bool) -> AcceptArgs<'a> {
        AcceptArgs::new(
            &self.layout,
            &self.config,
            reqs,
            shard,
            dry,
            self.piece.get(),
        )
    }

    /// Takes the permit of `req.key` and enqueues a new task, or names the
    /// task that holds it. One script, one round trip.
    pub async fn accept(&self, req: &AcceptRequest) -> Result<Acceptance, PermitError> {
        let mut answers = self.accept_batch_with([req], &[]).await?;
        answers.pop().ok_or_else(|| unexpected("accept", &[]))
    }

    /// What [`Permits::accept`] would answer for `req` now, without taking
    /// the permit, counting in a cap or creating a task (a task id of an
    /// answer that would create one is empty).
    pub async fn would_accept(&self, req: &AcceptRequest) -> Result<Acceptance, PermitError> {
        let shard = self.shard_of_request(req);
        let args = self.accept_args(&[req], shard, true);
        let mut answers = parse_answers(self.run(&args).await?, 1)?;
        answers.pop().ok_or_else(|| unexpected("accept", &[]))
    }

    /// Accepts many requests in one pipeline (one round trip): the channels
    /// of one event (requests sharing its `event_json`) that land in one
    /// shard are one script call, which stores the event once.
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
        let groups = self.group_by_event(reqs);
        let mut batch = Batch::new();
        for (shard, members) in &groups {
            let reqs: Vec<&AcceptRequest> = members.iter().map(|(_, r)| *r).collect();
            let args = self.accept_args(&reqs, *shard, false);
            // The event and payload texts are borrowed into the command:
            // no copy of them in between.
            batch.add(&args.ready, args.call().evalsha(&SCRIPT));
        }
        let n = groups.len();
        for cmd in extra {
            batch.add_keyed(cmd.clone());
        }
        let waits = self.add_waits(&mut batch, groups.iter().map(|(s, _)| *s).collect());
        let mut answers = batch.query(&mut self.conn.clone(), Some(&SCRIPT)).await?;
        let confirmations = answers.split_off(answers.len() - waits);
        self.check_replicated(&confirmations)?;
        answers.truncate(n);
        let total = groups.iter().map(|(_, m)| m.len()).sum();
        let mut out: Vec<Option<Acceptance>> = vec![None; total];
        for ((_, members), answer) in groups.iter().zip(answers) {
            for ((i, _), acceptance) in members.iter().zip(parse_answers(answer, members.len())?) {
                out[*i] = Some(acceptance);
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// `reqs` grouped into script calls: the channels of one event (the same
    /// `event_json` text, shared or equal, business ids and `send_at_ms`)
    /// that land in one shard, each with its position in `reqs`; groups in
    /// order of first appearance.
    fn group_by_event<'r>(
        &self,
        reqs: impl IntoIterator<Item = &'r AcceptRequest>,
    ) -> Vec<(u16, Vec<(usize, &'r AcceptRequest)>)> {
        let mut groups: Vec<(u16, Vec<(usize, &'r AcceptRequest)>)> = Vec::new();
        type EventOf<'r> = (u16, &'r str, &'r str, &'r str, Option<u64>);
        let mut by_event: HashMap<EventOf<'r>, usize> = HashMap::new();
        for (i, req) in reqs.into_iter().enumerate() {
            let shard = self.shard_of_request(req);
            let event = (
                shard,
                &*req.event_json,
                &*req.biz_type,
                &*req.biz_id,
                req.send_at_ms,
            );
            match by_event.get(&event) {
                Some(&g) => groups[g].1.push((i, req)),
                None => {
                    by_event.insert(event, groups.len());
                    groups.push((shard, vec![(i, req)]));
                }
            }
        }
        groups
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

    /// The `KEYS` and `ARGV` of the accept script for `reqs` (one event's
    /// channels, in the shard of the first) under `task_ids`, one per
    /// request (for tools that call the script themselves, such as the
    /// benchmark's floor).
    pub fn accept_keys_and_args(
        &self,
        reqs: &[&AcceptRequest],
        task_ids: &[String],
    ) -> (Vec<String>, Vec<String>) {
        let shard = reqs.first().map_or(0, |req| self.shard_of_request(req));
        let mut args = self.accept_args(reqs, shard, false);
        for (c, task_id) in args.channels.iter_mut().zip(task_ids) {
            c.task = format!("{}{}", self.layout.task_prefix(shard), task_id);
            c.task_id = task_id.clone();
        }
        let call = args.call();
        (call.keys, call.args.iter().map(Arg::to_text).collect())
    }

    /// The shard `req` is accepted in ([`Layout::shard_for`]).
    fn shard_of_request(&self, req: &AcceptRequest) -> u16 {
        self.layout.shard_for(&req.key, req.recipient.as_deref())
    }
}

/// A task's `retry` field: the retry schedule but `retry_max_attempts` (which
/// scripts read), packed as `<initial ms>,<factor>,<max delay ms>,<jitter 0|1>`
/// so the task hash keeps only short values (Redis then stores it compactly).
pub(crate) fn retry_arg(r: &RetryPolicy) -> String {
    format!(
        "{},{},{},{}",
        millis(r.initial),
        r.factor,
        millis(r.max_delay),
        u8::from(r.jitter)
    )
}

/// The answers of one accept call: one per channel, `n` expected.
fn parse_answers(answer: Value, n: usize) -> Result<Vec<Acceptance>, PermitError> {
    let items = array(answer, "accept")?;
    if items.len() != n {
        return Err(unexpected("accept", &items));
    }
    items.into_iter().map(parse_acceptance).collect()
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
        "digested" => Ok(Acceptance::Digested {
            task_id: text(items.get(1)),
            scheduled_for_ms: text(items.get(2)).parse().unwrap_or(0),
        }),
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
mod retry_arg_tests {
    use super::*;

    #[test]
    fn retry_arg_packs_what_task_reads_back() {
        let retry = RetryPolicy {
            max_attempts: 5,
            initial: Duration::from_millis(1500),
            factor: 2.5,
            max_delay: Duration::from_secs(60),
            jitter: true,
        };
        assert_eq!(retry_arg(&retry), "1500,2.5,60000,1");
        let fields = [
            ("status", "queued"),
            ("max", "5"),
            ("retry", "1500,2.5,60000,1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            super::super::Task::from_fields("1-1-x", fields)
                .unwrap()
                .retry,
            retry
        );
    }
}
