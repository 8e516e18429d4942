//! The Lua scripts of pushonce, loaded from the `.lua` files beside this one.
//! This module holds every task and permit script; the only other Redis
//! script is the channels' shared cache (`plugin/shared_cache.lua`).
//!
//! Each script is `lib.lua` (shared helpers) followed by its body. A
//! [`redis::Script`] is called by SHA (`EVALSHA`) and loaded again by the
//! client when Redis answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;

use redis::Script;

const LIB: &str = include_str!("lua/lib.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{LIB}\n{body}"))
}

/// Take the permit and enqueue the task (`accept.lua`).
pub static ACCEPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/accept.lua")));
/// Claim a lease for an attempt (`begin.lua`).
pub(crate) static BEGIN: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/begin.lua")));
/// Extend a lease in flight (`extend.lua`).
pub(crate) static EXTEND: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("lua/extend.lua")));
/// Record an attempt's outcome (`record.lua`).
pub(crate) static RECORD: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("lua/record.lua")));
/// Move due retries to the ready stream (`promote.lua`).
pub(crate) static PROMOTE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("lua/promote.lua")));
/// Settle a sent task from a receipt (`receipt.lua`).
pub(crate) static RECEIPT: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("lua/receipt.lua")));

/// Send a failed or dead task again, owner-checked (`requeue.lua`).
pub(crate) static REQUEUE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("lua/requeue.lua")));

/// Settle a task without a send by an operator: delivered or given up (`settle.lua`).
pub(crate) static SETTLE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("lua/settle.lua")));

/// Let a task that ended leave Redis once the ledger holds its outcome (`forget.lua`).
pub(crate) static FORGET: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("lua/forget.lua")));

/// Take due entries of a shard's awaiting index for the reconciler (`claim.lua`).
pub(crate) static CLAIM: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/claim.lua")));

/// Apply what a reconciler check decided, fenced by its claim (`reconcile.lua`).
pub static RECONCILE: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("lua/reconcile.lua")));

/// Add or check many keys in one Bloom filter, without tasks (`bloom.lua`).
pub static BLOOM: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/bloom.lua")));

/// Every script, for loading them all up front.
pub fn all() -> [&'static Script; 12] {
    [
        &ACCEPT, &BEGIN, &EXTEND, &RECORD, &PROMOTE, &RECEIPT, &REQUEUE, &SETTLE, &CLAIM,
        &RECONCILE, &BLOOM, &FORGET,
    ]
}
