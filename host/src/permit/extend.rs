//! Extend (`extend.lua`): push the lease of an attempt in flight, and its
//! permit with it; optionally mark that the send is about to start.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::begin::Lease;
use super::scripts::{Call, Transition, script};
use super::{Attempt, PermitError, Permits, array, millis, text, unexpected};

/// Extend a lease in flight (`extend.lua`).
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(|| script(include_str!("extend.lua")));

/// `extend.lua`'s `KEYS` and `ARGV`.
struct ExtendArgs<'a> {
    /// KEYS[1..2], ARGV[1..4]: the lease, pushed from now.
    lease: Lease<'a>,
    /// ARGV[5]: the worker is about to hand the message to its channel.
    starting: bool,
    /// ARGV[6]: the provider instance it goes to (empty: none).
    provider: &'a str,
}

impl Transition for ExtendArgs<'_> {
    const SCRIPT: &'static LazyLock<Script> = &SCRIPT;

    fn call(&self) -> Call<'_> {
        self.lease.call().flag(self.starting).arg(self.provider)
    }
}

impl Permits {
    /// Extends the lease of an attempt in flight by `lease` from now (Redis
    /// clock). Returns the new lease end, or `None` if the lease was lost.
    pub async fn extend_lease(
        &self,
        attempt: &Attempt,
        lease: Duration,
    ) -> Result<Option<u64>, PermitError> {
        self.extend_one(attempt, lease, false, "").await
    }

    /// Extends the lease like [`Permits::extend_lease`] and marks that the
    /// worker is about to hand the message to its channel
    /// (`request_started_at`): a worker that vanishes after this may have
    /// sent it, one that vanishes before did not. `None` if the lease was lost.
    pub async fn mark_request_started(
        &self,
        attempt: &Attempt,
        lease: Duration,
    ) -> Result<Option<u64>, PermitError> {
        self.extend_one(attempt, lease, true, "").await
    }

    /// [`Permits::mark_request_started`] on a channel with providers: also
    /// records that the request goes to `provider` (the task's `provider`,
    /// appended to its `provider_log`), before it goes, so an unknown outcome
    /// — even one whose worker vanished — is settled at that provider.
    pub async fn mark_request_started_at(
        &self,
        attempt: &Attempt,
        lease: Duration,
        provider: &str,
    ) -> Result<Option<u64>, PermitError> {
        self.extend_one(attempt, lease, true, provider).await
    }

    /// [`Permits::mark_request_started_at`] for several attempts of one
    /// shard's tasks in one script call (each fenced by its own token), each
    /// with the provider instance its request goes to (empty: none): each
    /// attempt's new lease end, or `None` where its lease was lost.
    pub async fn mark_requests_started(
        &self,
        attempts: &[(&Attempt, &str)],
        lease: Duration,
    ) -> Result<Vec<Option<u64>>, PermitError> {
        self.extend_all(attempts, lease, true).await
    }

    /// [`Permits::extend_lease`] for several attempts of one shard's tasks
    /// in one script call.
    pub async fn extend_leases(
        &self,
        attempts: &[&Attempt],
        lease: Duration,
    ) -> Result<Vec<Option<u64>>, PermitError> {
        let attempts: Vec<(&Attempt, &str)> = attempts.iter().map(|a| (*a, "")).collect();
        self.extend_all(&attempts, lease, false).await
    }

    async fn extend_one(
        &self,
        attempt: &Attempt,
        lease: Duration,
        starting: bool,
        provider: &str,
    ) -> Result<Option<u64>, PermitError> {
        Ok(self
            .extend_all(&[(attempt, provider)], lease, starting)
            .await?
            .pop()
            .flatten())
    }

    async fn extend_all(
        &self,
        attempts: &[(&Attempt, &str)],
        lease: Duration,
        starting: bool,
    ) -> Result<Vec<Option<u64>>, PermitError> {
        if attempts.is_empty() {
            return Ok(Vec::new());
        }
        let args = attempts
            .iter()
            .map(|(attempt, provider)| {
                Ok(ExtendArgs {
                    lease: Lease {
                        task: self.task_key(&attempt.task_id)?,
                        permit: self.task_permit(&attempt.task_id, &attempt.task.key)?,
                        task_id: &attempt.task_id,
                        token: &attempt.token,
                        lease_ms: millis(lease).max(1),
                        grace_ms: millis(self.config.grace),
                    },
                    starting,
                    provider,
                })
            })
            .collect::<Result<Vec<_>, PermitError>>()?;
        self.run_batch(&args, "extend")
            .await?
            .into_iter()
            .map(|answer| {
                let items = array(answer, "extend")?;
                match text(items.first()).as_str() {
                    "extended" => Ok(text(items.get(1)).parse().ok()),
                    "lost" => Ok(None),
                    _ => Err(unexpected("extend", &items)),
                }
            })
            .collect()
    }
}
