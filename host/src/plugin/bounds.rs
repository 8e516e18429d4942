//! Bounds on what a plugin returns.
//!
//! A plugin's memory cap is tens of MiB, and every string it returns would
//! otherwise travel on as is: into a problem's `detail`, a log line, a task
//! record, the ledger, or a Redis key's name. Text meant for people (errors,
//! reasons, details) is cut to [`MAX_TEXT`] bytes with a marker saying how
//! much was cut ([`cut`]): a key policy's refusal where its answer enters the
//! host (`key_policy.rs`); a channel plugin's texts where the sender redacts
//! them (`send::plugin`), after the redaction, so a cut never leaves half a
//! secret behind. An identifier the host indexes (a provider message id, a
//! reference, a settlement's id) cannot be cut without matching the wrong
//! message, so one over its bound makes the answer malformed where it enters
//! the host (`channel.rs`): one failed call.

use super::bindings::{CallbackOutcome, Receipt};

/// Longest text (error, reason, detail) kept from a plugin, in bytes.
pub const MAX_TEXT: usize = 4096;

/// Longest provider message id a channel plugin may return, in bytes (it
/// names a Redis key).
pub const MAX_PROVIDER_MESSAGE_ID: usize = 256;

/// Longest reference, or settlement id, a channel plugin may return, in
/// bytes: room for an idempotency key, which a settlement may name.
pub const MAX_REFERENCE: usize = 512;

/// Longest callback reply body a channel plugin may have the host answer
/// with, in bytes.
pub const MAX_REPLY_BODY: usize = 64 << 10;

/// `text` cut to [`MAX_TEXT`] bytes (at a character boundary), with a marker
/// saying how many bytes were cut.
pub(crate) fn cut(text: String) -> String {
    if text.len() <= MAX_TEXT {
        return text;
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} more bytes cut]", &text[..end], text.len() - end)
}

/// Why `receipt` cannot be kept, if it cannot.
pub(crate) fn receipt_fault(receipt: &Receipt) -> Option<String> {
    too_long(
        "provider_message_id",
        &receipt.provider_message_id,
        MAX_PROVIDER_MESSAGE_ID,
    )
    .or_else(|| {
        receipt
            .reference
            .as_deref()
            .and_then(|r| too_long("reference", r, MAX_REFERENCE))
    })
}

/// `outcome` with its settlements' details cut, or why it cannot be kept
/// (the opt-outs' details are redacted and cut by the sender).
pub(crate) fn callback_outcome(mut outcome: CallbackOutcome) -> Result<CallbackOutcome, String> {
    for s in &mut outcome.settlements {
        if let Some(fault) = too_long("a settlement's id", &s.id, MAX_REFERENCE) {
            return Err(fault);
        }
        s.detail = s.detail.take().map(cut);
    }
    if outcome.reply.body.len() > MAX_REPLY_BODY {
        return Err(format!(
            "the reply body is {} bytes (at most {MAX_REPLY_BODY})",
            outcome.reply.body.len()
        ));
    }
    Ok(outcome)
}

/// "`what` is N bytes (at most `max`)" when `value` is longer than `max`.
fn too_long(what: &str, value: &str, max: usize) -> Option<String> {
    (value.len() > max).then(|| format!("{what} is {} bytes (at most {max})", value.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_and_long_text_is_cut_with_a_marker() {
        assert_eq!(cut("fine".into()), "fine");
        let exact = "a".repeat(MAX_TEXT);
        assert_eq!(cut(exact.clone()), exact);
        let long = "é".repeat(MAX_TEXT); // 2 bytes each
        let c = cut(long);
        assert!(
            c.ends_with(&format!("… [{} more bytes cut]", MAX_TEXT)),
            "{}",
            &c[c.len() - 40..]
        );
        assert!(c.len() < MAX_TEXT + 40);
    }

    #[test]
    fn a_receipt_with_an_overlong_id_is_refused_naming_the_field() {
        let ok = Receipt {
            provider_message_id: "p".repeat(MAX_PROVIDER_MESSAGE_ID),
            reference: Some("r".repeat(MAX_REFERENCE)),
        };
        assert_eq!(receipt_fault(&ok), None);
        let long_id = Receipt {
            provider_message_id: "p".repeat(MAX_PROVIDER_MESSAGE_ID + 1),
            reference: None,
        };
        assert_eq!(
            receipt_fault(&long_id).unwrap(),
            "provider_message_id is 257 bytes (at most 256)"
        );
        let long_ref = Receipt {
            reference: Some("r".repeat(MAX_REFERENCE + 1)),
            ..ok
        };
        assert!(
            receipt_fault(&long_ref)
                .unwrap()
                .starts_with("reference is 513 bytes")
        );
    }
}
