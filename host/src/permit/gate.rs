//! What may hold an accept back, checked inside the accept script together
//! with the permit: frequency caps (a capped channel takes no permit and
//! enqueues nothing) and quiet hours (the task is accepted, its first
//! attempt scheduled for the end of the quiet time), and a digest (the
//! event joins the open digest under its key). See `docs/caps.md` and
//! `docs/digest.md`.

use std::time::Duration;

use super::keys::Layout;

/// The caps and quiet hours of one accept; the default holds nothing back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Gate {
    /// Frequency caps this message counts against; all must have room.
    pub caps: Vec<CapCheck>,
    /// Quiet hours in the recipient's time zone, if they apply (not urgent).
    pub quiet: Option<QuietCheck>,
    /// Bloom mode (`dedup = "bloom"`): a Bloom filter instead of a permit
    /// per key; `None` is the permit mode (the default).
    pub bloom: Option<super::bloom::BloomCheck>,
    /// A digest (`[digest]` of the policy): the event is added to the open
    /// digest under its key, or opens one; `None`: a message of its own.
    pub digest: Option<DigestCheck>,
}

/// One frequency cap as the accept script checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapCheck {
    /// The cap's name (answered with `capped`, part of its key).
    pub name: String,
    /// Whose count: the user id, or `<user id>:<channel>` for a per-channel cap.
    pub subject: String,
    /// Most messages per period.
    pub max: u32,
    /// The period.
    pub period: CapPeriod,
}

/// Over what a cap counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapPeriod {
    /// Any span this long (a sliding window).
    Rolling(Duration),
    /// The recipient's calendar day: local time is UTC plus this many ms.
    Day {
        /// The recipient's offset from UTC in ms.
        offset_ms: i64,
    },
}

/// Quiet hours as the accept script checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuietCheck {
    /// The recipient's offset from UTC in ms.
    pub offset_ms: i64,
    /// Start, ms after local midnight.
    pub from_ms: i64,
    /// End, ms after local midnight (before `from_ms`: the next day).
    pub to_ms: i64,
}

/// A digest as the accept script checks it: when a digest this event opens
/// is due, and this event as one of its items.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestCheck {
    /// When a digest opened by this event is sent.
    pub due: DigestDue,
    /// How many items' parameters the message carries.
    pub max_items: u32,
    /// `true`: once the digest has begun, a new event is a duplicate of it;
    /// `false`: it opens the next digest.
    pub duplicate_after_begin: bool,
    /// The event's identity within the digest: its business id (an event
    /// posted again is the same item).
    pub item_id: String,
    /// The item as the message carries it (JSON: `biz_id`, `params`).
    pub item: String,
}

/// When a digest is sent, counted from the event that opens it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestDue {
    /// This long after it.
    After(Duration),
    /// At the first local time of day `time_ms` (ms after midnight) after
    /// it, the recipient's offset from UTC being `offset_ms`.
    At {
        /// The recipient's offset from UTC in ms.
        offset_ms: i64,
        /// The time of day, ms after local midnight.
        time_ms: i64,
    },
}

impl DigestCheck {
    /// The accept script's digest argument: `w,<ms>,<max>,<n|d>` or
    /// `a,<offset ms>,<time ms>,<max>,<n|d>`; empty without a digest.
    pub(crate) fn arg(digest: Option<&DigestCheck>) -> String {
        let Some(d) = digest else {
            return String::new();
        };
        let after = if d.duplicate_after_begin { "d" } else { "n" };
        match d.due {
            DigestDue::After(w) => format!("w,{},{},{after}", super::millis(w).max(1), d.max_items),
            DigestDue::At { offset_ms, time_ms } => {
                format!("a,{offset_ms},{time_ms},{},{after}", d.max_items)
            }
        }
    }
}

impl Layout {
    /// The sorted set of a cap's recorded messages for one subject of
    /// recipient `user`: `{po:<shard of the recipient>}:cap:<name>:<subject>`,
    /// scored by accept time (ms). The recipient's shard is where the
    /// accepts of keys naming it land, so the cap and the permits it guards
    /// share one hash tag.
    pub fn cap(&self, name: &str, subject: &str, user: &str) -> String {
        let shard = self.recipient_shard(user);
        format!("{}:cap:{name}:{subject}", self.tag(shard))
    }

    /// The digest head of idempotency key `key` in `shard`: a hash naming the
    /// open (or last) digest task under the key and its generation.
    pub(crate) fn digest_head(&self, shard: u16, key: &str) -> String {
        format!("{}:digest:{key}", self.tag(shard))
    }

    /// The mark of item `item_id` of the digests under `key` in `shard`: the
    /// digest task it went into, kept as long as that digest's permit.
    pub(crate) fn digest_item(&self, shard: u16, key: &str, item_id: &str) -> String {
        format!("{}:digested:{key}:{item_id}", self.tag(shard))
    }
}

impl CapCheck {
    /// The accept script's four arguments of this cap: name, kind (`r`
    /// rolling, `d` day), max, and the window or the offset in ms.
    pub(crate) fn args(&self) -> [String; 4] {
        let (kind, param) = match self.period {
            CapPeriod::Rolling(w) => ("r", super::millis(w).max(1) as i64),
            CapPeriod::Day { offset_ms } => ("d", offset_ms),
        };
        [
            self.name.clone(),
            kind.to_string(),
            self.max.to_string(),
            param.to_string(),
        ]
    }
}

impl QuietCheck {
    /// The accept script's quiet argument: `offset,from,to` in ms.
    pub(crate) fn arg(quiet: Option<&QuietCheck>) -> String {
        quiet
            .map(|q| format!("{},{},{}", q.offset_ms, q.from_ms, q.to_ms))
            .unwrap_or_default()
    }
}
