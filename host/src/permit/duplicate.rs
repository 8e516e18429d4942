//! Possible duplicate (`duplicate.lua`): mark a task whose resend the
//! provider cannot dedupe, shown as `possible_duplicate` by the task view.
//! Deciding the resend is the worker's or the reconciler's
//! (`dispatch/duplicates.rs` counts it); writing it to the task is here.

use std::sync::LazyLock;

use redis::Script;

use super::scripts::{Call, Transition, script};
use super::{PermitError, Permits};

/// Mark a task a possible duplicate (`duplicate.lua`).
pub(crate) static SCRIPT: LazyLock<Script> =
    LazyLock::new(|| script(include_str!("duplicate.lua")));

/// The task hash's field that marks a possible duplicate (`1`).
pub const POSSIBLE_DUPLICATE: &str = "possible_duplicate";

/// `duplicate.lua`'s `KEYS`.
struct DuplicateArgs {
    /// KEYS[1]: the task hash.
    task: String,
}

impl Transition for DuplicateArgs {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        Call::default().key(&*self.task)
    }
}

impl Permits {
    /// Marks `task_id` a possible duplicate; false when the task already
    /// left Redis (it is not re-created).
    pub(crate) async fn mark_possible_duplicate(&self, task_id: &str) -> Result<bool, PermitError> {
        let marked: i64 = self
            .run(&DuplicateArgs {
                task: self.task_key(task_id)?,
            })
            .await?;
        Ok(marked == 1)
    }
}
