//! How the lifecycle's Lua scripts are built and called.
//!
//! Each transition is one `.rs` file beside its `.lua` file (`accept.rs`
//! loads `accept.lua`, …): the file holds the script, a typed argument
//! struct whose one method ([`Transition::call`]) orders the script's
//! `KEYS` and `ARGV`, and the parsing of its answer. This module holds
//! what they share: `lib.lua`, prepended to every script, and [`Call`].
//! The only other Redis script is the channels' shared cache
//! (`plugin/shared_cache.lua`).
//!
//! A [`redis::Script`] is called by SHA (`EVALSHA`) and loaded again by the
//! client when Redis answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::borrow::Cow;

use redis::{Script, ScriptInvocation};

const LIB: &str = include_str!("lib.lua");

/// A script: `lib.lua` (shared helpers) followed by `body`.
pub(crate) fn script(body: &str) -> Script {
    Script::new(&format!("{LIB}\n{body}"))
}

/// Every script, for loading them all up front.
pub fn all() -> [&'static Script; 13] {
    [
        &super::accept::SCRIPT,
        &super::begin::SCRIPT,
        &super::extend::SCRIPT,
        &super::record::SCRIPT,
        &super::promote::SCRIPT,
        &super::receipt::SCRIPT,
        &super::requeue::SCRIPT,
        &super::settle::SCRIPT,
        &super::claim::SCRIPT,
        &super::reconcile::SCRIPT,
        &super::bloom::SCRIPT,
        &super::forget::SCRIPT,
        &super::duplicate::SCRIPT,
    ]
}

/// The `KEYS` and `ARGV` of one script call, in the script's order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Call<'a> {
    /// `KEYS`.
    pub keys: Vec<String>,
    /// `ARGV`; long texts (an event, a payload) are borrowed, not copied.
    pub args: Vec<Cow<'a, str>>,
}

impl<'a> Call<'a> {
    /// Appends a key.
    pub(crate) fn key(&mut self, key: impl Into<String>) -> &mut Self {
        self.keys.push(key.into());
        self
    }

    /// Appends an argument.
    pub(crate) fn arg(&mut self, arg: impl Into<Cow<'a, str>>) -> &mut Self {
        self.args.push(arg.into());
        self
    }

    /// Appends a number as its decimal text (what `redis` sends for it).
    pub(crate) fn num(&mut self, n: impl ToString) -> &mut Self {
        self.args.push(Cow::Owned(n.to_string()));
        self
    }

    /// Appends `1` for true, `0` for false.
    pub(crate) fn flag(&mut self, on: bool) -> &mut Self {
        self.args.push(Cow::Borrowed(if on { "1" } else { "0" }));
        self
    }

    /// The call as an invocation of `script` (`EVALSHA`, loading on `NOSCRIPT`).
    pub(crate) fn invocation(&self, script: &'static Script) -> ScriptInvocation<'static> {
        let mut inv = script.prepare_invoke();
        for key in &self.keys {
            inv.key(key);
        }
        for arg in &self.args {
            inv.arg(arg.as_ref());
        }
        inv
    }

    /// The call as an `EVALSHA` command of `script`, for a pipeline.
    pub(crate) fn evalsha(&self, script: &Script) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash())
            .arg(self.keys.len())
            .arg(&self.keys);
        for arg in &self.args {
            cmd.arg(arg.as_ref());
        }
        cmd
    }
}

/// A transition's typed arguments: the one place that orders its script's
/// `KEYS` and `ARGV`.
pub(crate) trait Transition {
    /// The transition's script.
    fn script() -> &'static Script;
    /// Its `KEYS` and `ARGV`, in the script's order.
    fn call(&self) -> Call<'_>;
}
