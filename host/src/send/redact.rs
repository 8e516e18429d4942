//! Host-side redaction of a channel's secrets from what its plugin says.
//!
//! Whatever text a plugin returns (a send or query error, a receipt field,
//! its stderr in a trap message) may quote a secret it was given — a
//! provider echoing the `AccessKeySecret`, a URL with a token in its query.
//! The host replaces every configured secret value of the channel (the
//! values of `secrets_from_env`, the callback token), and its URL-encoded
//! form, by `[redacted]` before the text is stored (`last_error`), logged or
//! answered: a guarantee that does not depend on the plugin's care.

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
    pub fn new<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Redactor {
        let mut forms: Vec<String> = Vec::new();
        for secret in secrets.into_iter().filter(|s| !s.is_empty()) {
            forms.push(secret.to_string());
            // Every byte but RFC 3986's unreserved ones encoded, and the
            // form encoding's `+` for a space.
            let encoded = percent_encoding::utf8_percent_encode(secret, QUERY).to_string();
            forms.push(encoded.replace("%20", "+"));
            forms.push(encoded);
        }
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
}
