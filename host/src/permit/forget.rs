//! Forget (`forget.lua`): a task that ended leaves Redis once the delivery
//! ledger holds its outcome; its permit stays for the window.

use std::sync::LazyLock;

use redis::{Script, Value};

use super::scripts::{Call, Transition, script};
use super::{PermitError, Permits, Task, array, text};

/// Let a task that ended leave Redis once the ledger holds its outcome (`forget.lua`).
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("forget.lua")));

/// `forget.lua`'s `KEYS` and `ARGV`.
struct ForgetArgs<'a> {
    /// KEYS[1]: the task hash.
    task: String,
    /// KEYS[2]: the shard's failed-and-dead index.
    dead: String,
    /// KEYS[3]: the shard's awaiting index (the held index is named after it).
    awaiting: String,
    /// ARGV[1]: the task id.
    task_id: &'a str,
    /// ARGV[2]: the status the ledger holds (the fence).
    status: &'a str,
    /// ARGV[3]: ms to keep the task, 0: it leaves now.
    keep_ms: u64,
}

impl Transition for ForgetArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default()
            .key(&*self.task)
            .key(&*self.dead)
            .key(&*self.awaiting)
            .arg(self.task_id)
            .arg(self.status)
            .num(self.keep_ms)
    }
}

impl Permits {
    /// Lets `task`, which ended `status` (`delivered`, `failed` or `cancelled`) by a
    /// receipt, a reconciler check or an operator, or stays `sent` with no
    /// more checks to come (the reconciler untracked it), leave Redis once the
    /// delivery ledger holds that outcome (call it only then): its hash, its
    /// event-index entry and its provider-id index entries go, its permit
    /// stays for the window. With `keep_ended` it expires after that instead.
    /// Fenced by `status`: true when it left (or was given its expiry).
    pub async fn forget(&self, task: &Task, status: &str) -> Result<bool, PermitError> {
        let shard = self.shard_of(&task.id)?;
        let answer: Value = self
            .run(&ForgetArgs {
                task: self.task_key(&task.id)?,
                dead: self.layout.dead(shard),
                awaiting: self.layout.awaiting(shard),
                task_id: &task.id,
                status,
                keep_ms: self.ended_keep_ms(),
            })
            .await?;
        let items = array(answer, "forget")?;
        let done = text(items.first());
        if done == "left" {
            let ids = [
                task.provider_message_id.as_deref(),
                task.reference.as_deref(),
            ];
            let under = task.sent_through();
            for id in ids.into_iter().flatten().filter(|id| !id.is_empty()) {
                let _: () = redis::cmd("DEL")
                    .arg(self.provider_id_key(under, id))
                    .query_async(&mut self.conn.clone())
                    .await?;
            }
        }
        Ok(done == "left" || done == "kept")
    }
}
