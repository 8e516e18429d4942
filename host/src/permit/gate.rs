//! What may hold an accept back, checked inside the accept script together
//! with the permit: frequency caps (a capped channel takes no permit and
//! enqueues nothing) and quiet hours (the task is accepted, its first
//! attempt scheduled for the end of the quiet time). See `docs/caps.md`.

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
