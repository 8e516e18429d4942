//! Reading a provider's callback request and building the answer it expects.

use crate::{CallbackAnswer, CallbackReply, CallbackRequest, Settlement};

impl CallbackRequest {
    /// The first value of header `name` (compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The first value of query parameter `name`, percent-decoded.
    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query.split('&').find_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k) == name).then(|| percent_decode(v))
        })
    }
}

/// Decodes `%XX` escapes and `+` (as a space) of a query component; invalid
/// escapes are kept as written.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The value of one hex digit.
fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// A reply with `status`, a content type and a body.
pub fn reply(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> CallbackReply {
    CallbackReply {
        status,
        headers: vec![("content-type".into(), content_type.into())],
        body: body.into(),
    }
}

/// A 200 reply of plain text (WeChat wants `success`, or the `echostr`).
pub fn text(body: impl Into<String>) -> CallbackReply {
    reply(200, "text/plain; charset=utf-8", body.into().into_bytes())
}

/// A 200 reply of JSON (Aliyun wants `{"code":0,"msg":"成功"}`).
pub fn json(body: &serde_json::Value) -> CallbackReply {
    reply(200, "application/json", body.to_string().into_bytes())
}

/// An answer settling `settlements` with `reply`.
pub fn answer(settlements: Vec<Settlement>, reply: CallbackReply) -> CallbackAnswer {
    CallbackAnswer { settlements, reply }
}

/// A delivery status word: `delivered`, `failed`, `accepted`/`pending` (not
/// yet known); anything else unknown.
pub fn status_of(s: Option<&str>) -> crate::DeliveryStatus {
    use crate::DeliveryStatus;
    match s {
        Some("delivered") => DeliveryStatus::Delivered,
        Some("failed") => DeliveryStatus::Failed,
        Some("accepted") | Some("pending") => DeliveryStatus::Pending,
        _ => DeliveryStatus::Unknown,
    }
}

/// Settlements of the receipt shape pushonce defines for services of the
/// business's own (the inbox): `{"receipts":[{"<by>": "...", "status": "delivered"|"failed"|...}]}`,
/// matched by the `by` field of each receipt.
pub fn pushonce_receipts(body: &[u8], by: &str) -> Result<Vec<Settlement>, crate::CallbackError> {
    use crate::CallbackError::Malformed;
    let json: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| Malformed(format!("not JSON: {e}")))?;
    let list = json
        .get("receipts")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| Malformed("no `receipts` array".into()))?;
    list.iter()
        .map(|r| {
            let id = r
                .get(by)
                .and_then(serde_json::Value::as_str)
                .ok_or_else(|| Malformed(format!("a receipt without `{by}`")))?;
            Ok(Settlement {
                id: id.to_string(),
                status: status_of(r.get("status").and_then(serde_json::Value::as_str)),
                detail: None,
            })
        })
        .collect()
}
