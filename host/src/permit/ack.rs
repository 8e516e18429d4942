//! Ack (`ack.lua`): ready entries a worker is done with, acked once no task
//! they name needs them (an entry names every task of an event accepted
//! together in one shard).

use std::sync::LazyLock;

use redis::Script;

use super::scripts::{Call, Transition, script};
use super::{PermitError, Permits};

/// Ack ready entries no task needs any more (`ack.lua`).
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("ack.lua")));

/// `ack.lua`'s `KEYS` and `ARGV`.
struct AckArgs<'a> {
    /// KEYS[1]: the shard's ready stream.
    ready: String,
    /// ARGV[1]: the consumer group.
    group: &'a str,
    /// ARGV[2]: the shard's task key prefix.
    task_prefix: String,
    /// ARGV[3..]: the entry ids.
    entries: &'a [&'a str],
}

impl Transition for AckArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default()
            .key(&*self.ready)
            .arg(self.group)
            .arg(&*self.task_prefix)
            .args(self.entries.iter().copied())
    }
}

impl Permits {
    /// Acks and deletes the ready entries `entries` of `shard` whose tasks
    /// all need no entry any more (none `queued` or `sending`); returns how
    /// many were acked. An entry one of its tasks still needs stays pending,
    /// for the worker that records that task (or a reclaimer).
    pub async fn ack_entries(&self, shard: u16, entries: &[&str]) -> Result<usize, PermitError> {
        if entries.is_empty() {
            return Ok(0);
        }
        self.run(&AckArgs {
            ready: self.layout.ready(shard),
            group: &self.config.group,
            task_prefix: self.layout.task_prefix(shard),
            entries,
        })
        .await
    }
}
