//! The key layout: which shard an idempotency key lands in, the names of the
//! Redis keys of that shard, and task ids that carry their shard.
//!
//! Every key of one permit, its task and the queue entries that name it share
//! the hash tag `{<ns>:<shard>}`, so each script touches one cluster slot.

use sha2::{Digest, Sha256};

/// The key layout of one namespace: the prefix and the number of shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Prefix inside every hash tag (`po` by default); lets several
    /// deployments or a benchmark share one Redis without meeting.
    namespace: String,
    /// How many shards the keys are spread over (at least 1).
    shards: u16,
}

impl Layout {
    /// A layout with `shards` shards (0 is taken as 1) under `namespace`.
    pub fn new(namespace: impl Into<String>, shards: u16) -> Layout {
        Layout {
            namespace: namespace.into(),
            shards: shards.max(1),
        }
    }

    /// Number of shards.
    pub fn shards(&self) -> u16 {
        self.shards
    }

    /// The namespace inside every hash tag.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The shard of an idempotency key: the first four bytes of its SHA-256, modulo the shard count.
    /// Stable across processes, versions and platforms.
    pub fn shard_of(&self, key: &str) -> u16 {
        let digest = Sha256::digest(key.as_bytes());
        let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
        (n % u32::from(self.shards)) as u16
    }

    /// The hash tag of a shard, braces included: `{po:3}`.
    pub fn tag(&self, shard: u16) -> String {
        format!("{{{}:{}}}", self.namespace, shard)
    }

    /// The permit of an idempotency key: `{po:3}:permit:<key>`.
    pub fn permit(&self, key: &str) -> String {
        format!("{}:permit:{}", self.tag(self.shard_of(key)), key)
    }

    /// Prefix of every task key of a shard: `{po:3}:task:`.
    pub(crate) fn task_prefix(&self, shard: u16) -> String {
        format!("{}:task:", self.tag(shard))
    }

    /// The task record: `{po:3}:task:<task-id>`; the shard is read from the id.
    pub fn task(&self, task_id: &str) -> Option<String> {
        let shard = shard_of_task(task_id)?;
        Some(format!("{}{}", self.task_prefix(shard), task_id))
    }

    /// The ready stream of a shard: `{po:3}:ready`.
    pub fn ready(&self, shard: u16) -> String {
        format!("{}:ready", self.tag(shard))
    }

    /// The delayed set of a shard (retries scored by due time): `{po:3}:delayed`.
    pub fn delayed(&self, shard: u16) -> String {
        format!("{}:delayed", self.tag(shard))
    }

    /// The index of a shard's failed and dead tasks (scored by when they
    /// ended), for operators: `{po:3}:dead`. Written by `record.lua`,
    /// trimmed to the retention there, emptied by `requeue.lua`.
    pub fn dead(&self, shard: u16) -> String {
        format!("{}:dead", self.tag(shard))
    }

    /// The index of a shard's held (`unknown`) tasks, scored by when they
    /// were held, for operators: `{po:3}:held`. Written by `record.lua`; an
    /// entry leaves it when its task moves on (`receipt.lua`,
    /// `reconcile.lua`, or a later outcome in `record.lua`). The scripts
    /// name it after the awaiting index (same hash tag).
    pub fn held(&self, shard: u16) -> String {
        format!("{}:held", self.tag(shard))
    }

    /// The index of a shard's tasks awaiting confirmation (`sent` without a
    /// receipt, or `unknown`), scored by when the reconciler's next check of
    /// each is due (Redis clock, ms): `{po:3}:awaiting`. Written by
    /// `record.lua`, `claim.lua` and `reconcile.lua`; an entry leaves it when
    /// its task moves on (`receipt.lua`, `requeue.lua`, `reconcile.lua`).
    pub fn awaiting(&self, shard: u16) -> String {
        format!("{}:awaiting", self.tag(shard))
    }

    /// The event index of a shard: `{po:3}:event:<biz_type>:<biz_id>`, the set of
    /// task ids of that event whose keys landed in this shard. An event's
    /// channels land in different shards, so finding all its tasks reads this
    /// set in every shard (see `docs/redis.md`).
    pub(crate) fn event_index(&self, shard: u16, biz_type: &str, biz_id: &str) -> String {
        format!("{}:event:{}:{}", self.tag(shard), biz_type, biz_id)
    }

    /// A fresh task id in `shard`: `<shard>-<ms since epoch>-<64 random bits in hex>`.
    pub(crate) fn new_task_id(&self, shard: u16) -> String {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        format!("{shard}-{ms}-{:016x}", rand::random::<u64>())
    }
}

/// The shard a task id names (its prefix up to the first `-`), if it is well formed.
pub fn shard_of_task(task_id: &str) -> Option<u16> {
    task_id.split_once('-')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_permit_share_a_tag() {
        let layout = Layout::new("po", 16);
        let key = "push:per-event@1:sms:ORDER_SHIPPED:o-1:u-42";
        let shard = layout.shard_of(key);
        let id = layout.new_task_id(shard);
        let tag = layout.tag(shard);
        assert!(layout.permit(key).starts_with(&tag));
        assert!(layout.task(&id).unwrap().starts_with(&tag));
        assert!(layout.ready(shard).starts_with(&tag));
        assert!(layout.delayed(shard).starts_with(&tag));
        assert!(layout.awaiting(shard).starts_with(&tag));
        assert_eq!(shard_of_task(&id), Some(shard));
    }

    #[test]
    fn shards_are_stable_and_spread() {
        let layout = Layout::new("po", 16);
        assert_eq!(layout.shard_of("a"), layout.shard_of("a"));
        let used: std::collections::HashSet<u16> = (0..200)
            .map(|i| layout.shard_of(&format!("k{i}")))
            .collect();
        assert_eq!(used.len(), 16);
    }
}
