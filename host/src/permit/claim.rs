//! Claim (`claim.lua`): the reconciler of one host takes due entries of
//! one shard's index of tasks awaiting confirmation (`{ns:shard}:awaiting`),
//! so no other host checks them at the same time.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::scripts::{Call, Transition, script};
use super::{PermitError, Permits, TaskStatus, array, millis, text, unexpected};

/// Take due entries of a shard's awaiting index for the reconciler (`claim.lua`).
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("claim.lua")));

/// One task a reconciler claimed for a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The task id.
    pub task_id: String,
    /// Its status when claimed (`sent` or `unknown`); the check's outcome is fenced by it.
    pub status: TaskStatus,
    /// This check's number since the task entered the index: the checks
    /// completed before it (recorded by `reconcile.lua`; a check lost to a
    /// crash or a Redis restart does not count) plus one.
    pub checks: u32,
    /// Times the reconciler re-queued it already (the provider never got it).
    pub requeues: u32,
}

/// What one claim on one shard found and took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimPass {
    /// Redis clock at the claim, ms since the epoch.
    pub now_ms: u64,
    /// When the oldest entry of the index was (or is) due, before the claim; `None` if empty.
    pub oldest_due_ms: Option<u64>,
    /// Entries in the index after the claim (claimed ones included).
    pub awaiting: u64,
    /// The entries taken, held for this reconciler until `now_ms + hold`.
    pub claimed: Vec<Claimed>,
}

impl ClaimPass {
    /// How late the oldest due entry was (0 when none was due).
    pub fn lag(&self) -> Duration {
        let late = self
            .oldest_due_ms
            .map_or(0, |due| self.now_ms.saturating_sub(due));
        Duration::from_millis(late)
    }
}

/// `claim.lua`'s `KEYS` and `ARGV`.
struct ClaimArgs<'a> {
    /// KEYS[1]: the shard's awaiting index.
    awaiting: String,
    /// ARGV[1]: most entries to take.
    limit: usize,
    /// ARGV[2]: how long a taken entry is held, ms.
    hold_ms: u64,
    /// ARGV[3]: this claim's token.
    token: &'a str,
    /// ARGV[4]: the shard's task key prefix.
    task_prefix: String,
}

impl Transition for ClaimArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default()
            .key(&*self.awaiting)
            .num(self.limit as u64)
            .num(self.hold_ms)
            .arg(self.token)
            .arg(&*self.task_prefix)
    }
}

impl Permits {
    /// Takes up to `limit` due entries of `shard`'s awaiting index: each is
    /// re-scored to now + `hold` (no other reconciler takes it meanwhile),
    /// its task gets the claim's `token` (checks are counted when recorded).
    pub async fn claim_checks(
        &self,
        shard: u16,
        limit: usize,
        hold: Duration,
        token: &str,
    ) -> Result<ClaimPass, PermitError> {
        let answer: Value = self
            .run(&ClaimArgs {
                awaiting: self.layout.awaiting(shard),
                limit: limit.max(1),
                hold_ms: millis(hold).max(1),
                token,
                task_prefix: self.layout.task_prefix(shard),
            })
            .await?;
        let items = array(answer, "claim")?;
        let claimed = match items.get(3) {
            Some(Value::Array(list)) => list
                .iter()
                .map(|entry| {
                    let Value::Array(e) = entry else {
                        return Err(unexpected("claim", &items));
                    };
                    Ok(Claimed {
                        task_id: text(e.first()),
                        status: TaskStatus::parse(&text(e.get(1)))
                            .ok_or_else(|| unexpected("claim", &items))?,
                        checks: text(e.get(2)).parse::<u32>().unwrap_or(0) + 1,
                        requeues: text(e.get(3)).parse().unwrap_or(0),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
            _ => return Err(unexpected("claim", &items)),
        };
        Ok(ClaimPass {
            now_ms: text(items.first()).parse().unwrap_or(0),
            oldest_due_ms: text(items.get(1)).parse::<f64>().ok().map(|f| f as u64),
            awaiting: text(items.get(2)).parse().unwrap_or(0),
            claimed,
        })
    }

    /// Entries of `shard`'s awaiting index (`ZCARD`, one shard).
    pub async fn awaiting_count(&self, shard: u16) -> Result<u64, PermitError> {
        Ok(redis::cmd("ZCARD")
            .arg(self.layout.awaiting(shard))
            .query_async(&mut self.conn.clone())
            .await?)
    }
}
