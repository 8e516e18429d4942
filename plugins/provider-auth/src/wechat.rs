//! WeChat official account: the server-URL signature, the event XML, the
//! errcode table and the `client_msg_id` derived from a key.
//!
//! Signature: "接入概述 / 验证消息的确来自微信服务器"
//! (<https://developers.weixin.qq.com/doc/offiaccount/Basic_Information/Access_Overview.html>):
//! `signature = hex(sha1(sort([token, timestamp, nonce]).join("")))`.
//! Errcodes: "全局返回码" (<https://developers.weixin.qq.com/doc/offiaccount/Getting_Started/Global_Return_Code.html>)
//! and the template message page (<https://developers.weixin.qq.com/doc/offiaccount/Message_Management/Template_Message_Interface.html>).

use sha1::{Digest, Sha1};

use crate::{Class, Refusal, constant_time_eq, hex};

/// The server-URL signature of `timestamp` and `nonce` under the configured token.
pub fn signature(token: &str, timestamp: &str, nonce: &str) -> String {
    let mut parts = [token, timestamp, nonce];
    parts.sort_unstable();
    hex(&Sha1::digest(parts.concat().as_bytes()))
}

/// True when `given` is the signature of `timestamp` and `nonce` under `token`.
pub fn verify(token: &str, timestamp: &str, nonce: &str, given: &str) -> bool {
    constant_time_eq(
        signature(token, timestamp, nonce).as_bytes(),
        given.to_ascii_lowercase().as_bytes(),
    )
}

/// The `client_msg_id` of a message: 20 hex digits of the key's SHA-256
/// (short: WeChat bounds these ids, 64 bytes for mass sends, and refuses
/// some shorter ones as too long).
pub fn client_msg_id(idempotency_key: &str) -> String {
    crate::key_digest(idempotency_key, 20)
}

/// The text of the first element `<name>` of a flat WeChat XML message
/// (`<xml><Name><![CDATA[v]]></Name>...</xml>`), CDATA unwrapped and the five
/// XML entities decoded. `None` when absent.
pub fn xml_field(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = xml.find(&open)? + open.len();
    let len = xml[start..].find(&close)?;
    let raw = xml[start..start + len].trim();
    Some(match raw.strip_prefix("<![CDATA[") {
        Some(rest) => rest.strip_suffix("]]>")?.to_string(),
        None => unescape(raw),
    })
}

/// Decodes `&lt; &gt; &amp; &quot; &apos;`.
fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

/// How far a callback's `timestamp` may be from now, in seconds (either way).
pub const WINDOW_SECS: u64 = 300;

/// How much longer than the window a nonce is remembered, in seconds: room
/// for the clocks of several host processes to differ.
pub const SKEW_SECS: u64 = 60;

/// How long the nonce of a callback signed with `timestamp` (seconds since
/// the epoch, as the query gives it) must be remembered, in ms, seen at
/// `now_ms`: until the timestamp leaves the window, plus [`SKEW_SECS`].
/// Err (the reason) when the timestamp is not a number or is outside
/// ±[`WINDOW_SECS`] of now: a replay of an old request, or a clock far off.
pub fn freshness(timestamp: &str, now_ms: u64) -> Result<u64, String> {
    let ts: u64 = timestamp
        .trim()
        .parse()
        .map_err(|_| format!("the timestamp {timestamp:?} is not a number of seconds"))?;
    let now = now_ms / 1000;
    let off = now.abs_diff(ts);
    if off > WINDOW_SECS {
        let when = if ts < now { "old" } else { "ahead" };
        return Err(format!(
            "the timestamp is {off} s {when}, outside the window of ±{WINDOW_SECS} s \
             (a replayed request, or a clock that is off)"
        ));
    }
    Ok((ts + WINDOW_SECS + SKEW_SECS)
        .saturating_mul(1000)
        .saturating_sub(now_ms))
}

/// The record of a verified callback kept under its timestamp and nonce:
/// 32 hex digits of the SHA-256 of its method, query and body. The same
/// request again (WeChat's own retry) finds the same record; another body
/// under the same signature is a forgery.
pub fn request_digest(method: &str, query: &str, body: &[u8]) -> String {
    use sha2::Sha256;
    let mut h = Sha256::new();
    h.update(method.as_bytes());
    h.update(b"\n");
    h.update(query.as_bytes());
    h.update(b"\n");
    h.update(body);
    let mut d = hex(&h.finalize());
    d.truncate(32);
    d
}

/// What a `TEMPLATESENDJOBFINISH` event's `Status` says became of the message.
pub fn delivered(status: &str) -> bool {
    status == "success"
}

/// Sorts a non-zero errcode of the template send (or token) API.
pub fn classify(errcode: i64) -> Refusal {
    use Class::{Permanent, Refresh, Retryable, Unknown};
    let r = |class| Refusal::new(class, errcode.to_string());
    match errcode {
        // The access token is invalid, malformed or expired.
        40001 | 40014 | 42001 => r(Refresh),
        // API call quota reached: refused before the message was taken.
        45009 => r(Retryable),
        // System busy ("系统繁忙"): nothing says the message was not taken.
        // The same client_msg_id exists (45065, "相同 clientmsgid 已存在") or
        // was retried too fast (45066, "请间隔1分钟重试"): documented for mass
        // sends only, so not relied on for template sends. All ambiguous.
        -1 | 45065 | 45066 => r(Unknown),
        43004 | 40003 | 40037 | 47003 => r(Permanent),
        40164 => r(Permanent)
            .because("the host's IP address is not on the official account's IP whitelist"),
        40013 | 40125 => r(Permanent).because("`app_id` or `app_secret` is wrong"),
        _ => r(Permanent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// sha1("1409304348" + "abc" + "token") sorted byte-wise: the three
    /// strings sort as "1409304348" < "abc" < "token".
    #[test]
    fn signature_sorts_then_sha1() {
        let expected = hex(&Sha1::digest(b"1409304348abctoken"));
        assert_eq!(signature("token", "1409304348", "abc"), expected);
        assert_eq!(signature("token", "abc", "1409304348"), expected);
        assert!(verify(
            "token",
            "1409304348",
            "abc",
            &expected.to_ascii_uppercase()
        ));
        assert!(!verify("other", "1409304348", "abc", &expected));
    }

    /// A known value: sha1("123") (token "1", timestamp "2", nonce "3").
    #[test]
    fn signature_known_value() {
        assert_eq!(
            signature("3", "1", "2"),
            "40bd001563085fc35165329ea1ff5c5ecbdbbeef"
        );
    }

    #[test]
    fn event_xml() {
        let xml = "<xml><ToUserName><![CDATA[gh_7f083739789a]]></ToUserName><FromUserName><![CDATA[oia2TjuEGTNoeX76QEjQNrcURxG8]]></FromUserName><CreateTime>1395658920</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[TEMPLATESENDJOBFINISH]]></Event><MsgID>200163836</MsgID><Status><![CDATA[failed:user block]]></Status></xml>";
        assert_eq!(
            xml_field(xml, "Event").as_deref(),
            Some("TEMPLATESENDJOBFINISH")
        );
        assert_eq!(xml_field(xml, "MsgID").as_deref(), Some("200163836"));
        assert_eq!(
            xml_field(xml, "Status").as_deref(),
            Some("failed:user block")
        );
        assert_eq!(xml_field(xml, "Nope"), None);
        assert_eq!(
            xml_field("<xml><A>x &amp; y</A></xml>", "A").as_deref(),
            Some("x & y")
        );
        assert!(!delivered("failed: system failed"));
        assert!(delivered("success"));
    }

    #[test]
    fn a_timestamp_outside_five_minutes_is_refused() {
        let now_ms = 1_700_000_000_500;
        // Now: remembered until the window closes, plus the skew.
        assert_eq!(freshness("1700000000", now_ms), Ok(359_500));
        // At the edges of the window, either way.
        assert_eq!(freshness("1699999700", now_ms), Ok(59_500));
        assert!(freshness("1700000300", now_ms).is_ok());
        let old = freshness("1699999699", now_ms).unwrap_err();
        assert!(old.contains("301 s old"), "{old}");
        let ahead = freshness("1700000301", now_ms).unwrap_err();
        assert!(ahead.contains("301 s ahead"), "{ahead}");
        assert!(
            freshness("17e8", now_ms)
                .unwrap_err()
                .contains("not a number")
        );
        assert!(freshness("", now_ms).is_err());
    }

    #[test]
    fn the_digest_names_the_whole_request() {
        let d = request_digest("POST", "signature=s&timestamp=1&nonce=2", b"<xml/>");
        assert_eq!(d.len(), 32);
        assert_eq!(
            d,
            request_digest("POST", "signature=s&timestamp=1&nonce=2", b"<xml/>")
        );
        assert_ne!(
            d,
            request_digest("POST", "signature=s&timestamp=1&nonce=2", b"<xml>")
        );
        assert_ne!(
            d,
            request_digest("GET", "signature=s&timestamp=1&nonce=2", b"<xml/>")
        );
    }

    /// The errcode table: code → class.
    #[test]
    fn error_table() {
        use Class::*;
        let table = [
            (40001, Refresh),
            (40014, Refresh),
            (42001, Refresh),
            (-1, Unknown),
            (45009, Retryable),
            (45065, Unknown),
            (45066, Unknown),
            (43004, Permanent),
            (40003, Permanent),
            (40037, Permanent),
            (47003, Permanent),
            (40164, Permanent),
            (40013, Permanent),
            (99999, Permanent),
        ];
        for (code, class) in table {
            assert_eq!(classify(code).class, class, "{code}");
        }
        assert!(classify(40164).cause.unwrap().contains("whitelist"));
        assert_eq!(client_msg_id("k").len(), 20);
    }
}
