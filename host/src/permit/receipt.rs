//! Receipt (`receipt.lua`): settle a `sent` or `unknown` task from a
//! delivery receipt or a status query; and the indexes a receipt is
//! matched through (provider message ids, ids that matched nothing yet).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::scripts::{Call, Transition, script};
use super::{PermitError, Permits, array, millis, text};

/// Settle a sent task from a receipt (`receipt.lua`).
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("receipt.lua")));

/// `receipt.lua`'s `KEYS` and `ARGV`.
struct ReceiptArgs<'a> {
    /// KEYS[1]: the task hash.
    task: String,
    /// KEYS[2]: its permit.
    permit: String,
    /// KEYS[3]: the shard's awaiting index.
    awaiting: String,
    /// ARGV[1]: the task id.
    task_id: &'a str,
    /// ARGV[2]: `delivered`, else `failed`.
    delivered: bool,
    /// ARGV[3]: how long the ended task is kept, ms.
    retention_ms: u64,
    /// ARGV[4]: the provider's message id, or empty.
    provider_message_id: &'a str,
    /// ARGV[5]: the task's error to write, or empty (none).
    error: &'a str,
}

impl Transition for ReceiptArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        let status = if self.delivered {
            "delivered"
        } else {
            "failed"
        };
        Call::default()
            .key(&*self.task)
            .key(&*self.permit)
            .key(&*self.awaiting)
            .arg(self.task_id)
            .arg(status)
            .num(self.retention_ms)
            .arg(self.provider_message_id)
            .arg(self.error)
    }
}

impl Permits {
    /// Settles a `sent` or `unknown` task from a receipt: `delivered` or
    /// `failed` (delivery failed after the provider accepted it). Returns false
    /// if the task was in another status (nothing written).
    pub async fn record_receipt(
        &self,
        task_id: &str,
        delivered: bool,
        provider_message_id: Option<&str>,
    ) -> Result<bool, PermitError> {
        self.record_receipt_noting(task_id, delivered, provider_message_id, None)
            .await
    }

    /// [`Permits::record_receipt`], writing `error` as the task's last
    /// error when given (why its fallback was not taken).
    pub(crate) async fn record_receipt_noting(
        &self,
        task_id: &str,
        delivered: bool,
        provider_message_id: Option<&str>,
        error: Option<&str>,
    ) -> Result<bool, PermitError> {
        let task_key = self.task_key(task_id)?;
        let Some(key) = self.task_idempotency_key(&task_key).await? else {
            return Ok(false);
        };
        let shard = self.shard_of(task_id)?;
        let answer: Value = self
            .run(&ReceiptArgs {
                task: task_key,
                permit: self.layout.permit_in(shard, &key),
                awaiting: self.layout.awaiting(shard),
                task_id,
                delivered,
                retention_ms: millis(self.config.retention).max(1),
                provider_message_id: provider_message_id.unwrap_or(""),
                error: error.unwrap_or(""),
            })
            .await?;
        let items = array(answer, "receipt")?;
        Ok(text(items.first()) == "recorded")
    }

    /// The key of the provider-id index entry of `channel`'s message `provider_id`.
    pub(super) fn provider_id_key(&self, channel: &str, provider_id: &str) -> String {
        let name = format!("{channel}:{provider_id}");
        let shard = self.layout.shard_of(&name);
        format!(
            "{}pmid:{name}",
            self.layout.task_prefix(shard).trim_end_matches("task:")
        )
    }

    /// Remembers that a channel's message (by the provider's id) is a task, for
    /// receipts that name only the provider's id, for `keep` (the retention
    /// while its task awaits a receipt: [`Permits::forget`] deletes it when
    /// the task leaves; the key's window for a task that already left, so a
    /// late receipt still reaches its ledger row). Written just before the
    /// send is recorded (best effort: a receipt that finds nothing is
    /// reported unmatched). Several sent messages at once, in one round trip
    /// (one pipeline per slot on a cluster): each of `ids` is (channel,
    /// provider id, task id, `keep`).
    pub(crate) async fn index_provider_ids(
        &self,
        ids: &[(&str, &str, &str, Duration)],
    ) -> Result<(), PermitError> {
        let mut batch = crate::store::Batch::new();
        for (channel, provider_id, task_id, keep) in ids {
            let mut cmd = redis::cmd("SET");
            cmd.arg(self.provider_id_key(channel, provider_id))
                .arg(*task_id)
                .arg("PX")
                .arg(millis(*keep).max(1));
            batch.add_keyed(cmd);
        }
        batch.query(&mut self.conn.clone(), None).await?;
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
}
