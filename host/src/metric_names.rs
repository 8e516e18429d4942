//! The name of every metric the host emits, with what it counts: the one
//! place to look them up (the dashboard in `docs/ops/` and the alert rules
//! use these names). Counted through the `metrics` facade wherever the event
//! happens; rendered at `GET /metrics` by `api::metrics`.

/// Channels accepted (new task).
pub const ACCEPTED: &str = "pushonce_accepted_total";
/// Channels answered duplicate (permit held).
pub const DUPLICATES: &str = "pushonce_duplicates_total";
/// Accept answers by dedup mode (`mode`: `permit` or `bloom`) and
/// `answer` (`accepted` or `duplicate`), per channel: how much traffic the
/// Bloom filters answer, and how often they answer duplicate.
pub const DEDUP_ANSWERS: &str = "pushonce_dedup_answers_total";
/// Channels answered `capped` (a frequency cap had no room), by channel and cap.
pub const CAPPED: &str = "pushonce_capped_total";
/// Channels accepted inside quiet hours (first attempt scheduled for their end), by channel.
pub const QUIET_DEFERRED: &str = "pushonce_quiet_deferred_total";
/// Channels accepted with a later `send_at` (first attempt scheduled then),
/// or opening a digest (first attempt at its due time), by channel; one whose
/// `send_at` falls in quiet hours counts as quiet deferred.
pub const SCHEDULED: &str = "pushonce_scheduled_total";
/// Events added to an open digest (the policy's `[digest]`) instead of
/// getting a task of their own, by channel. The event that opens a digest
/// counts as accepted.
pub const DIGESTED: &str = "pushonce_digested_total";
/// Channels answered `opted_out` (the recipient switched the channel or the
/// policy's category off: nothing accepted), by channel.
pub const OPTED_OUT: &str = "pushonce_opted_out_total";
/// Messages not sent because their recipient switched the channel (or the
/// policy's category) off after the accept: their attempt found it
/// (`docs/preferences.md`) and the task ended `cancelled`, by channel.
pub const OPTED_OUT_AT_SEND: &str = "pushonce_opted_out_at_send_total";
/// Requests refused or failed, by HTTP status.
pub const REFUSED: &str = "pushonce_http_refused_total";
/// Seconds of one pipelined accept (all channels of a request).
pub const PERMIT_SECONDS: &str = "pushonce_permit_seconds";
/// Tasks waiting for a retry (ZCARD of every shard's delayed set).
pub const RETRY_QUEUE_DEPTH: &str = "pushonce_retry_queue_depth";
/// Failed and dead tasks in the operators' index.
pub const FAILED_OR_DEAD: &str = "pushonce_failed_or_dead_tasks";
/// Calls of a plugin since it was loaded.
pub const PLUGIN_CALLS: &str = "pushonce_plugin_calls_total";
/// Calls of a plugin that trapped or ran over a limit.
pub const PLUGIN_FAILURES: &str = "pushonce_plugin_failures_total";
/// Calls a plugin answered with its own error.
pub const PLUGIN_REFUSALS: &str = "pushonce_plugin_refusals_total";
/// Generation of the policies and plugins in force.
pub const POLICY_GENERATION: &str = "pushonce_policy_generation";

/// Counters labelled by `channel`, registered at zero for every configured
/// channel when a host starts (`api::metrics::register_channels`), so dashboards and
/// alert rules find every series from the first scrape (a `rate()` over a
/// series that appears only at its first increment misses that increment).
pub const PER_CHANNEL: &[&str] = &[
    ACCEPTED,
    DUPLICATES,
    QUIET_DEFERRED,
    SCHEDULED,
    DIGESTED,
    OPTED_OUT,
    OPTED_OUT_AT_SEND,
    SENT,
    DELIVERED,
    FAILED,
    RETRIED,
    RESENT,
    UNKNOWN,
    DEAD,
    FALLBACK,
    DUPLICATE_PREVENTED,
    POSSIBLE_DUPLICATES,
    CANCELLED,
];

/// Reloads refused (counted by `route::live`).
pub const RELOAD_REFUSED: &str = "pushonce_policy_reload_refused_total";

/// Sent messages, per channel.
pub const SENT: &str = "pushonce_sent_total";
/// Messages confirmed delivered (receipts and reconciler answers), per channel.
pub const DELIVERED: &str = "pushonce_delivered_total";
/// Tasks failed for good, per channel.
pub const FAILED: &str = "pushonce_failed_total";
/// Messages the provider refused after accepting them (a receipt), per channel.
pub const FAILED_AFTER_ACCEPT: &str = "pushonce_failed_after_accept_total";
/// Attempts that will be retried, per channel.
pub const RETRIED: &str = "pushonce_retried_total";
/// Unknown outcomes resent under a reference the provider dedupes, per channel.
pub const RESENT: &str = "pushonce_resent_total";
/// Resends after an ambiguous answer (cut off, 5xx, a vanished worker) on a
/// channel that cannot dedupe them (no reference honoured, or its window
/// over): each may be a second message to the user, per channel. The task
/// is marked `possible_duplicate`.
pub const POSSIBLE_DUPLICATES: &str = "pushonce_possible_duplicates_total";
/// Tasks held `unknown` for an operator, per channel.
pub const UNKNOWN: &str = "pushonce_unknown_total";
/// Tasks that ran out of retries, per channel.
pub const DEAD: &str = "pushonce_dead_total";
/// Fallback tasks accepted, per (failed) channel.
pub const FALLBACK: &str = "pushonce_fallback_total";
/// Messages handed from one provider of a channel to the next after the
/// first refused them before accepting them (`channel`, `from`, `to`:
/// provider instances); `docs/channels.md`, "Providers within a channel".
pub const FAILOVERS: &str = "pushonce_failovers_total";
/// A provider's circuit in this process (`channel`, `provider`): 0 closed,
/// 1 open (new tasks start at the next provider), 2 half-open (one message
/// at a time tries it); set as it changes.
pub const PROVIDER_CIRCUIT: &str = "pushonce_provider_circuit_state";
/// Sends the delivery ledger stopped because Redis had lost a permit, per channel.
pub const DUPLICATE_PREVENTED: &str = "pushonce_duplicate_prevented_total";
/// Tasks cancelled before their first attempt (`POST /v1/events/{biz_type}/{biz_id}/cancel`), per channel.
pub const CANCELLED: &str = "pushonce_tasks_cancelled_total";
/// Seconds of one send through a channel plugin, per channel.
pub const SEND_SECONDS: &str = "pushonce_send_seconds";
/// Receipts that named no known task, per channel.
pub const RECEIPTS_UNMATCHED: &str = "pushonce_receipts_unmatched_total";
/// Opt-outs a channel's callbacks reported (an SMS answered "TD"), per
/// channel and result: `applied` (a user's preferences changed),
/// `unchanged` (already off), `unmatched` (no user was sent to at that
/// address), `refused` (a malformed user id or category).
pub const CALLBACK_OPT_OUTS: &str = "pushonce_callback_opt_outs_total";

/// Checks per channel and result (`delivered`, `pending`, `failed`, `absent`, `cannot_tell`).
pub const CHECKS_TOTAL: &str = "pushonce_reconcile_checks_total";
/// Tasks the reconciler gave up on after `max_checks`, per channel and status
/// (`sent`: no longer checked, stays sent; `unknown`: made `dead`).
pub const GAVE_UP_TOTAL: &str = "pushonce_reconcile_gave_up_total";
/// How late the oldest due entry of any shard's awaiting index was, at the last pass.
pub const LAG_SECONDS: &str = "pushonce_reconcile_lag_seconds";
/// Tasks in the awaiting indexes of every shard, at the last pass.
pub const AWAITING_TASKS: &str = "pushonce_awaiting_tasks";
