//! Host-side redaction of a channel's secrets from what its plugin says.
//!
//! Whatever text a plugin returns (a send or query error, a receipt field,
//! its stderr in a trap message) may quote a secret it was given — a
//! provider echoing the `AccessKeySecret`, a URL with a token in its query.
//! The host replaces every configured secret value of the channel (the
//! values of `secrets_from_env`, the callback token) by `[redacted]` before
//! the text is stored (`last_error`), logged or answered: a guarantee that
//! does not depend on the plugin's care. Replaced in every form a provider
//! or an HTTP library is likely to quote it in: raw; percent-encoded (the
//! query set or every byte, upper- or lower-case hex, `+` for a space);
//! base64 (standard and URL-safe, padded or not, and the run that encodes
//! the secret inside a longer value, e.g. `Basic base64(id:secret)`, at
//! each of the three byte alignments); JSON-escaped (`\"`, `\\`, `\/`,
//! `\uXXXX` for control and non-ASCII characters).

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};

/// What a query component encodes: all but `-._~` and alphanumerics.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// What replaces a secret.
pub(crate) const REDACTED: &str = "[redacted]";

/// The secret values of one channel instance, as they may appear in text.
#[derive(Clone, Default)]
pub(crate) struct Redactor {
    /// Every form to replace (raw, URL-encoded), longest first, so a secret
    /// that contains another is replaced whole.
    forms: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} forms)", self.forms.len())
    }
}

impl Redactor {
    /// A redactor for `secrets` (empty values are ignored).
    pub(crate) fn new<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Redactor {
        let mut forms: Vec<String> = Vec::new();
        for secret in secrets.into_iter().filter(|s| !s.is_empty()) {
            forms.push(secret.to_string());
            // Every byte but RFC 3986's unreserved ones encoded (and the form
            // encoding's `+` for a space), or every byte; either hex case.
            let query = percent_encoding::utf8_percent_encode(secret, QUERY).to_string();
            let every: String = secret.bytes().map(|b| format!("%{b:02X}")).collect();
            for encoded in [query.replace("%20", "+"), query, every] {
                forms.push(lower_hex(&encoded));
                forms.push(encoded);
            }
            forms.extend(base64_forms(secret.as_bytes()));
            forms.extend(json_forms(secret));
        }
        forms.retain(|f| !f.is_empty());
        forms.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        forms.dedup();
        Redactor { forms }
    }

    /// `text` with every secret form replaced by [`REDACTED`].
    pub(crate) fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for form in &self.forms {
            if out.contains(form.as_str()) {
                out = out.replace(form.as_str(), REDACTED);
            }
        }
        out
    }
}

/// Shortest run of base64 characters replaced when a secret is encoded
/// inside a longer value (a shorter one would redact unrelated text).
const MIN_BASE64_RUN: usize = 8;

/// `encoded` with the hex digits of its `%XX` escapes in lower case.
fn lower_hex(encoded: &str) -> String {
    let mut out = String::with_capacity(encoded.len());
    let mut hex_left = 0;
    for c in encoded.chars() {
        if c == '%' {
            hex_left = 2;
            out.push(c);
        } else if hex_left > 0 {
            hex_left -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// The base64 forms of `secret`: whole (standard and URL-safe, padded or
/// not), and the characters that encode only its bits when it follows 0, 1
/// or 2 other bytes inside a longer value.
fn base64_forms(secret: &[u8]) -> Vec<String> {
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let mut forms = Vec::new();
    for engine in [&STANDARD, &URL_SAFE] {
        forms.push(engine.encode(secret));
    }
    for (i, engine) in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD].into_iter().enumerate() {
        for before in 0..3usize {
            let mut bytes = vec![0u8; before];
            bytes.extend_from_slice(secret);
            let encoded = engine.encode(&bytes);
            // Characters whose 6 bits all come from the secret's bytes.
            let start = (8 * before).div_ceil(6);
            let end = 8 * (before + secret.len()) / 6;
            if end > start && end - start >= MIN_BASE64_RUN {
                forms.push(encoded[start..end].to_string());
            }
            if before == 0 && i == 0 {
                forms.push(encoded.clone());
            }
            if before == 0 && i == 1 {
                forms.push(encoded);
            }
        }
    }
    forms
}

/// The JSON-escaped forms of `secret` (inside a JSON string, quotes
/// excluded): as serde writes it, with `/` escaped too, and with every
/// non-ASCII character as `\uXXXX` (UTF-16, as `ensure_ascii` encoders do).
fn json_forms(secret: &str) -> Vec<String> {
    let quoted = serde_json::to_string(secret).unwrap_or_default();
    let plain = quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or_default()
        .to_string();
    let mut ascii = String::new();
    for c in plain.chars() {
        if c.is_ascii() {
            ascii.push(c);
        } else {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                ascii.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    let mut forms = vec![plain.replace('/', "\\/"), ascii.replace('/', "\\/")];
    // Upper-case hex in `\u` escapes too.
    forms.push(upper_json_hex(&ascii));
    forms.push(ascii);
    forms.push(plain);
    forms
}

/// `escaped` with the hex digits of its `\uXXXX` escapes in upper case.
fn upper_json_hex(escaped: &str) -> String {
    let mut out = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(i) = rest.find("\\u") {
        out.push_str(&rest[..i + 2]);
        let hex: String = rest[i + 2..].chars().take(4).collect();
        out.push_str(&hex.to_ascii_uppercase());
        rest = &rest[i + 2 + hex.len()..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_and_url_encoded_forms_are_replaced() {
        let r = Redactor::new(["s3cr3t/+=", "", "tok"]);
        assert_eq!(r.redact("key=s3cr3t/+= here"), "key=[redacted] here");
        assert_eq!(
            r.redact("?k=s3cr3t%2F%2B%3D&t=tok"),
            "?k=[redacted]&t=[redacted]"
        );
        assert_eq!(r.redact("nothing secret"), "nothing secret");
    }

    #[test]
    fn lower_case_percent_encoded_forms_are_replaced() {
        let r = Redactor::new(["s3cr3t/+= x"]);
        assert_eq!(r.redact("k=s3cr3t%2f%2b%3d+x&"), "k=[redacted]&");
        assert_eq!(r.redact("k=s3cr3t%2f%2b%3d%20x&"), "k=[redacted]&");
        let every: String = "s3cr3t/+= x".bytes().map(|b| format!("%{b:02x}")).collect();
        assert_eq!(r.redact(&format!("<{every}>")), "<[redacted]>");
        assert_eq!(
            r.redact(&format!("<{}>", every.to_uppercase())),
            "<[redacted]>"
        );
    }

    #[test]
    fn base64_forms_are_replaced_alone_and_inside_a_longer_value() {
        use base64::Engine;
        use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
        let secret = "app-secret-0123456789?>";
        let r = Redactor::new([secret]);
        let alone = STANDARD.encode(secret);
        assert_eq!(r.redact(&format!("x {alone} y")), "x [redacted] y");
        let url_safe = URL_SAFE_NO_PAD.encode(secret);
        assert_eq!(r.redact(&format!("x {url_safe} y")), "x [redacted] y");
        // `Basic base64(id:secret)`, at each alignment of the secret.
        for id in ["a", "ab", "abc"] {
            let basic = STANDARD.encode(format!("{id}:{secret}"));
            let redacted = r.redact(&format!("Authorization: Basic {basic}"));
            assert!(redacted.contains("[redacted]"), "{id}: {redacted}");
            // What is left cannot be decoded back to the secret.
            assert!(!redacted.contains(&basic[basic.len() / 2..]), "{redacted}");
        }
    }

    #[test]
    fn json_escaped_forms_are_replaced() {
        let secret = "p\"a/s\\s\u{7}é😀";
        let r = Redactor::new([secret]);
        let json = serde_json::json!({ "secret": secret }).to_string();
        assert_eq!(r.redact(&json), r#"{"secret":"[redacted]"}"#);
        assert_eq!(
            r.redact(r#"{"s":"p\"a\/s\\s\u0007\u00e9\ud83d\ude00"}"#),
            r#"{"s":"[redacted]"}"#
        );
        assert_eq!(
            r.redact(r#"{"s":"p\"a/s\\s\u0007\u00E9\uD83D\uDE00"}"#),
            r#"{"s":"[redacted]"}"#
        );
    }
}
