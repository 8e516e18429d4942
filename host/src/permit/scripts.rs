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
use std::sync::LazyLock;

use redis::{Script, ScriptInvocation};

const LIB: &str = include_str!("lib.lua");

/// A script: `lib.lua` (shared helpers) followed by `body`.
pub(crate) fn script(body: &str) -> Script {
    Script::new(&format!("{LIB}\n{body}"))
}

/// The `KEYS` and `ARGV` of one script call, in the script's order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Call<'a> {
    /// `KEYS`.
    pub keys: Vec<String>,
    /// `ARGV`; long texts (an event, a payload) are borrowed, not copied.
    pub args: Vec<Arg<'a>>,
}

/// One `ARGV` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg<'a> {
    /// A text, borrowed when it can be.
    Text(Cow<'a, str>),
    /// A number, sent as its decimal text (written straight into the
    /// command: no text of its own in between).
    Num(u64),
}

impl Arg<'_> {
    /// The argument as the text Redis receives.
    pub fn to_text(&self) -> String {
        match self {
            Arg::Text(t) => t.to_string(),
            Arg::Num(n) => n.to_string(),
        }
    }
}

impl redis::ToRedisArgs for Arg<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            Arg::Text(t) => t.as_ref().write_redis_args(out),
            Arg::Num(n) => n.write_redis_args(out),
        }
    }
}

impl<'a> Call<'a> {
    /// Appends a key.
    pub(crate) fn key(mut self, key: impl Into<String>) -> Self {
        self.keys.push(key.into());
        self
    }

    /// Appends an argument.
    pub(crate) fn arg(mut self, arg: impl Into<Cow<'a, str>>) -> Self {
        self.args.push(Arg::Text(arg.into()));
        self
    }

    /// Appends a number.
    pub(crate) fn num(mut self, n: impl Into<u64>) -> Self {
        self.args.push(Arg::Num(n.into()));
        self
    }

    /// Appends keys.
    pub(crate) fn keys(mut self, keys: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.keys.extend(keys.into_iter().map(Into::into));
        self
    }

    /// Appends arguments.
    pub(crate) fn args(mut self, args: impl IntoIterator<Item = impl Into<Cow<'a, str>>>) -> Self {
        self.args
            .extend(args.into_iter().map(|a| Arg::Text(a.into())));
        self
    }

    /// Appends numbers.
    pub(crate) fn nums(mut self, nums: impl IntoIterator<Item = u64>) -> Self {
        self.args.extend(nums.into_iter().map(Arg::Num));
        self
    }

    /// Appends a number, or `none` without one.
    pub(crate) fn num_or(self, n: Option<u64>, none: &'static str) -> Self {
        match n {
            Some(n) => self.num(n),
            None => self.arg(none),
        }
    }

    /// Appends `1` for true, `0` for false.
    pub(crate) fn flag(mut self, on: bool) -> Self {
        self.args
            .push(Arg::Text(Cow::Borrowed(if on { "1" } else { "0" })));
        self
    }

    /// The call as an invocation of `script` (`EVALSHA`, loading on `NOSCRIPT`).
    pub(crate) fn invocation(&self, script: &'static Script) -> ScriptInvocation<'static> {
        let mut inv = script.prepare_invoke();
        for key in &self.keys {
            inv.key(key);
        }
        for arg in &self.args {
            inv.arg(arg);
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
            cmd.arg(arg);
        }
        cmd
    }
}

/// A transition's typed arguments: the one place that orders its script's
/// `KEYS` and `ARGV`.
pub(crate) trait Transition {
    /// The transition's script.
    const SCRIPT: &'static LazyLock<Script>;
    /// Its `KEYS` and `ARGV`, in the script's order.
    fn call(&self) -> Call<'_>;
}
