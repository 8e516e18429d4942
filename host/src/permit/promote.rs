//! Promote (`promote.lua`): due retries, and first attempts quiet hours
//! held back, move from a shard's delayed set to its ready stream.

use std::sync::LazyLock;

use redis::Script;

use super::scripts::{Call, Transition, script};
use super::{PermitError, Permits};

/// Move due retries to the ready stream (`promote.lua`).
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("promote.lua")));

/// `promote.lua`'s `KEYS` and `ARGV`.
struct PromoteArgs {
    /// KEYS[1]: the shard's delayed set.
    delayed: String,
    /// KEYS[2]: the shard's ready stream.
    ready: String,
    /// ARGV[1]: most entries to move.
    limit: usize,
    /// ARGV[2]: the shard's task key prefix.
    task_prefix: String,
}

impl Transition for PromoteArgs {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default()
            .key(&*self.delayed)
            .key(&*self.ready)
            .num(self.limit as u64)
            .arg(&*self.task_prefix)
    }
}

impl Permits {
    /// Moves up to `limit` due retries of `shard` from its delayed set to its
    /// ready stream; returns how many were taken off the delayed set.
    pub async fn promote_due(&self, shard: u16, limit: usize) -> Result<usize, PermitError> {
        self.run(&PromoteArgs {
            delayed: self.layout.delayed(shard),
            ready: self.layout.ready(shard),
            limit: limit.max(1),
            task_prefix: self.layout.task_prefix(shard),
        })
        .await
    }
}
