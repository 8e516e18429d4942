//! Look-ups and listings: read-only (a task with its event record, a
//! permit's owner and TTL, an event's tasks, the operators' lists, counts).

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::{Script, Value};

use super::scripts::{Call, Transition, script};
use super::{Layout, PermitError, Permits, Task, array};
use crate::store::Batch;

/// A task with what it takes from its event record (`listing.lua`).
pub(super) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("listing.lua")));

/// `listing.lua`'s `KEYS` and `ARGV`.
struct ReadArgs<'a> {
    /// KEYS[1]: the task hash.
    task: String,
    /// ARGV[1]: the task id.
    task_id: &'a str,
}

impl Transition for ReadArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default().key(&*self.task).arg(self.task_id)
    }
}

/// Field/value pairs of a script's answer, as a map.
pub(crate) fn pairs(value: Option<Value>) -> HashMap<String, String> {
    let Some(Value::Array(kv)) = value else {
        return HashMap::new();
    };
    let mut out = HashMap::with_capacity(kv.len() / 2);
    let mut kv = kv.into_iter();
    while let Some(k) = kv.next() {
        out.insert(
            super::into_text(k),
            kv.next().map(super::into_text).unwrap_or_default(),
        );
    }
    out
}

impl Permits {
    /// Reads a task, with what it takes from its event record (the event,
    /// its payload); `None` if it does not exist (or expired).
    pub async fn task(&self, task_id: &str) -> Result<Option<Task>, PermitError> {
        let answer = self
            .run(&ReadArgs {
                task: self.task_key(task_id)?,
                task_id,
            })
            .await?;
        let mut parts = array(answer, "listing")?.into_iter();
        let mut fields = pairs(parts.next());
        if fields.is_empty() {
            return Ok(None);
        }
        fields.extend(pairs(parts.next()));
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
    /// `HKEYS` of the event's record per shard: its `p:<task id>` fields
    /// are its tasks, its `x:<task id>` fields the digests it joined); none
    /// when the event index is off.
    pub async fn tasks_of_event(
        &self,
        biz_type: &str,
        biz_id: &str,
    ) -> Result<Vec<String>, PermitError> {
        if !self.config.event_index {
            return Ok(Vec::new());
        }
        let fields: Vec<Vec<String>> = self
            .per_shard(|shard| {
                let mut cmd = redis::cmd("HKEYS");
                cmd.arg(self.layout.event_record(shard, biz_type, biz_id));
                cmd
            })
            .await?;
        Ok(fields
            .into_iter()
            .flatten()
            .filter_map(|f| {
                f.strip_prefix("p:")
                    .or_else(|| f.strip_prefix("x:"))
                    .map(str::to_string)
            })
            .collect())
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
