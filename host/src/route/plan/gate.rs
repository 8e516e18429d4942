//! What an accept checks besides the permit, built per channel of a plan:
//! the caps, quiet hours, Bloom filter and digest of its [`Gate`], and the
//! `send_at` a Bloom-mode channel can honour.

use std::time::Duration;

use super::{ChannelPlanner, PlanError};
use crate::permit::{BloomCheck, CapCheck, CapPeriod, DigestCheck, DigestDue, Gate, QuietCheck};
use crate::route::policy::{AfterBegin, DedupMode};

impl ChannelPlanner<'_> {
    /// A `send_at` later than one window from now is refused on a Bloom-mode
    /// channel: its filter remembers a key for about one window from the
    /// accept, so a re-post between then and `send_at` would be accepted again.
    pub(super) fn check_send_at(
        &self,
        channel: &str,
        gate: &Gate,
        window: Duration,
    ) -> Result<(), PlanError> {
        let Some(at) = self.req.send_at_ms else {
            return Ok(());
        };
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        if gate.bloom.is_some() && at > self.req.now_ms.saturating_add(window_ms) {
            return Err(PlanError::invalid(
                "send_at",
                format!(
                    "channel `{channel}` of {} deduplicates with a Bloom filter, which \
                     remembers a key for one window ({}) from its accept: send_at may be \
                     at most that far ahead",
                    self.event.biz_type,
                    humantime::format_duration(window)
                ),
            ));
        }
        Ok(())
    }

    /// The caps this channel's message (under `key`) counts against and its
    /// quiet hours (none for an urgent event), in the recipient's time zone.
    pub(super) fn gate(&self, channel: &str, key: &str) -> Result<Gate, PlanError> {
        let spec = &self.policy.spec;
        let quiet = spec
            .overrides
            .get(channel)
            .and_then(|o| o.quiet.as_ref())
            .or(spec.quiet.as_ref());
        let bloom = self.bloom(channel);
        let digest = self.digest()?;
        if self.policy.caps.is_empty() && quiet.is_none() {
            return Ok(Gate {
                bloom,
                digest,
                ..Gate::default()
            });
        }
        if self.policy.caps_need_recipient_key
            && !crate::permit::keys::names_recipient(key, &self.event.user_id)
        {
            return Err(PlanError::invalid(
                "biz_type",
                format!(
                    "the policy {} has frequency caps, and on a Redis Cluster a capped \
                     message's key must name its recipient so the user's count and the \
                     permit share a hash slot; key policy {} derived `{key}`, which does \
                     not name user `{}` (use a key policy that keys by user, or one Redis; \
                     see docs/caps.md)",
                    self.policy.file.display(),
                    self.plugin.meta().name,
                    self.event.user_id,
                ),
            ));
        }
        let offset_ms = self.offset_ms()?;
        let caps = self
            .policy
            .caps
            .iter()
            .map(|cap| CapCheck {
                name: cap.name.clone(),
                subject: match cap.spec.scope {
                    crate::caps::CapScope::Channel => format!("{}:{channel}", self.event.user_id),
                    crate::caps::CapScope::User => self.event.user_id.clone(),
                },
                max: cap.spec.max,
                period: match cap.spec.window {
                    Some(w) => CapPeriod::Rolling(w),
                    None => CapPeriod::Day { offset_ms },
                },
            })
            .collect();
        let quiet = match quiet {
            Some(q) if !self.urgent() => {
                let hours = q
                    .parse()
                    .map_err(|(f, r)| PlanError::invalid(format!("quiet.{f}"), r))?;
                Some(QuietCheck {
                    offset_ms,
                    from_ms: hours.from_ms,
                    to_ms: hours.to_ms,
                })
            }
            _ => None,
        };
        Ok(Gate {
            caps,
            quiet,
            bloom,
            digest,
        })
    }

    /// The policy's digest (`[digest]`) for this event: when a digest it
    /// opens is due, and the event as an item (its business id and
    /// parameters); `None` without one.
    fn digest(&self) -> Result<Option<DigestCheck>, PlanError> {
        let Some(spec) = &self.policy.spec.digest else {
            return Ok(None);
        };
        let due = match (&spec.window, &spec.at) {
            (Some(w), _) => DigestDue::After(*w),
            (None, Some(at)) => DigestDue::At {
                offset_ms: self.offset_ms()?,
                time_ms: crate::caps::parse_clock(at)
                    .map_err(|r| PlanError::invalid("digest.at", r))?,
            },
            (None, None) => return Err(PlanError::invalid("digest", "has no window or at")),
        };
        let item = serde_json::json!({
            "biz_id": self.event.biz_id,
            "params": self.req.params,
        });
        Ok(Some(DigestCheck {
            due,
            max_items: spec.max_items,
            duplicate_after_begin: spec.after_begin == AfterBegin::Duplicate,
            item_id: self.event.biz_id.clone(),
            item: item.to_string(),
        }))
    }

    /// Bloom mode (`dedup = "bloom"`): the filter of this business type and
    /// channel, sized by the policy's `[bloom]`; `None` in permit mode.
    fn bloom(&self, channel: &str) -> Option<BloomCheck> {
        let spec = &self.policy.spec;
        match (spec.dedup, &spec.bloom) {
            (DedupMode::Bloom, Some(b)) => Some(BloomCheck {
                filter: format!("{}:{channel}", self.event.biz_type),
                items: b.items,
                false_positive: b.false_positive,
            }),
            _ => None,
        }
    }

    /// The value of the event's attribute `name` (the last one given).
    fn attribute(&self, name: &str) -> Option<&str> {
        self.event
            .attributes
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The recipient's UTC offset: the event's `tz_attribute`, else the
    /// policy's `tz`, else UTC. A malformed attribute is the client's error.
    fn offset_ms(&self) -> Result<i64, PlanError> {
        let spec = &self.policy.spec;
        if let Some(attr) = &spec.tz_attribute
            && let Some(value) = self.attribute(attr)
        {
            return crate::caps::parse_offset(value)
                .map_err(|r| PlanError::invalid(format!("attributes.{attr}"), r));
        }
        match &spec.tz {
            Some(tz) => crate::caps::parse_offset(tz).map_err(|r| PlanError::invalid("tz", r)),
            None => Ok(0),
        }
    }

    /// Whether the event is urgent (its `urgent_attribute` is `true` or `1`).
    fn urgent(&self) -> bool {
        let spec = &self.policy.spec;
        spec.urgent_attribute
            .as_deref()
            .and_then(|a| self.attribute(a))
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
    }
}
