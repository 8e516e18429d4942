//! The event record's texts as stored (layout 7): an event's JSON without
//! the business type and id, and what its channels share (`meta`) as plain
//! text. The record's name holds the business ids already
//! (`{ns:shard}:event:<biz_type>:<biz_id>`), so writing them again in every
//! event text cost an open message about a tenth of its bytes.
//! `Task::from_fields` puts them back, so everything past it sees the event
//! as the API took it (`event::event_json`).

use std::borrow::Cow;

/// Where the business ids sit in `event::event_json`'s text: between the
/// `attributes` object and `occurred_at` (its fields are in name order).
const AFTER_IDS: &str = ",\"occurred_at\":";

/// The business ids as `event::event_json` writes them, with their leading
/// comma: `,"biz_id":<id>,"biz_type":<type>`.
fn ids_text(biz_type: &str, biz_id: &str) -> String {
    let quoted = |s: &str| serde_json::to_string(s).expect("a string always serializes");
    format!(
        ",\"biz_id\":{},\"biz_type\":{}",
        quoted(biz_id),
        quoted(biz_type)
    )
}

/// Event text `full` as an event record stores it: without its business
/// ids when they are where `event::event_json` writes them; any other text
/// unchanged.
pub(crate) fn event_text<'a>(full: &'a str, biz_type: &str, biz_id: &str) -> Cow<'a, str> {
    let ids = ids_text(biz_type, biz_id);
    // The last `occurred_at`: an attribute of that name is inside the
    // `attributes` object, before it.
    match full.rfind(AFTER_IDS) {
        Some(end) if full[..end].ends_with(&ids) => {
            let start = end - ids.len();
            Cow::Owned(format!("{}{}", &full[..start], &full[end..]))
        }
        _ => Cow::Borrowed(full),
    }
}

/// The event text as the API took it from `stored` ([`event_text`]): the
/// business ids put back where they were taken from. A text stored whole
/// (layout 6 and before, or not the host's event form) is returned as is.
pub(crate) fn full_event(stored: String, biz_type: &str, biz_id: &str) -> String {
    match stored.rfind(AFTER_IDS) {
        // Stored without them: the `attributes` object ends right there.
        Some(end) if stored[..end].ends_with('}') => {
            let mut full = stored;
            full.insert_str(end, &ids_text(biz_type, biz_id));
            full
        }
        _ => stored,
    }
}

/// What the channels of one event share, as the record's `meta` stores it:
/// `<policy> <policy version>`, and ` <biz_type>` after them only when the
/// business type holds a `:` (else the record's name, `<biz_type>:<biz_id>`,
/// tells it: [`biz_type_of_ev`]). Policy names are `[a-z0-9-]` and versions
/// semver, so neither holds a space; the business type, last, may.
pub(crate) fn meta_text(policy: &str, policy_version: &str, biz_type: &str) -> String {
    if biz_type.contains(':') {
        format!("{policy} {policy_version} {biz_type}")
    } else {
        format!("{policy} {policy_version}")
    }
}

/// What [`meta_text`] wrote: (policy, policy version, the business type
/// when it wrote one).
pub(crate) fn parse_meta(meta: &str) -> Option<(&str, &str, Option<&str>)> {
    let mut parts = meta.splitn(3, ' ');
    Some((parts.next()?, parts.next()?, parts.next()))
}

/// The business type a task's `ev` (`<n>:<biz_type>:<biz_id>`) names when
/// it holds no `:` (the first segment of the record's name).
pub(crate) fn biz_type_of_ev(ev: &str) -> Option<&str> {
    ev.split(':').nth(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, event_json};

    fn event(attributes: &[(&str, &str)]) -> Event {
        Event {
            biz_type: "A:B \"x\"".into(),
            biz_id: "o-1".into(),
            user_id: "u-1".into(),
            occurred_at_ms: 1,
            attributes: attributes
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn an_event_is_stored_without_its_ids_and_read_back_whole() {
        let e = event(&[
            ("biz_id", "o-1"),
            ("biz_type", "A:B \"x\""),
            ("occurred_at", "2"),
        ]);
        let full = event_json(&e);
        let stored = event_text(&full, &e.biz_type, &e.biz_id);
        assert_eq!(
            stored,
            r#"{"attributes":{"biz_id":"o-1","biz_type":"A:B \"x\"","occurred_at":"2"},"occurred_at":1,"user_id":"u-1"}"#
        );
        assert_eq!(
            full_event(stored.into_owned(), &e.biz_type, &e.biz_id),
            full
        );
    }

    #[test]
    fn other_texts_are_kept_whole() {
        let full = event_json(&event(&[]));
        // Other business ids than the record's: stored whole, read as is.
        assert_eq!(event_text(&full, "T", "o-1"), full);
        assert_eq!(full_event(full.clone(), "T", "o-1"), full);
        assert_eq!(event_text("{}", "T", "b"), "{}");
        assert_eq!(full_event("{}".into(), "T", "b"), "{}");
    }

    #[test]
    fn meta_names_the_business_type_only_when_the_record_name_cannot() {
        let m = meta_text("per-event", "1.0.0-rc.1+b", "ORDER SHIPPED");
        assert_eq!(m, "per-event 1.0.0-rc.1+b");
        assert_eq!(parse_meta(&m), Some(("per-event", "1.0.0-rc.1+b", None)));
        assert_eq!(biz_type_of_ev("2:ORDER SHIPPED:o:1"), Some("ORDER SHIPPED"));
        let m = meta_text("per-event", "1.0.0", "A:B C");
        assert_eq!(parse_meta(&m), Some(("per-event", "1.0.0", Some("A:B C"))));
        assert_eq!(parse_meta("per-event"), None);
    }
}
