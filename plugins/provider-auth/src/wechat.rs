//! WeChat official account: the server-URL signature, safe mode's body
//! signature and decryption, the event XML, the errcode table and the
//! `client_msg_id` derived from a key.
//!
//! Signature: "接入概述 / 验证消息的确来自微信服务器"
//! (<https://developers.weixin.qq.com/doc/offiaccount/Basic_Information/Access_Overview.html>):
//! `signature = hex(sha1(sort([token, timestamp, nonce]).join("")))`.
//! Safe (security) mode: "消息加解密说明"
//! (<https://developers.weixin.qq.com/doc/subscription/guide/dev/push/encryption.html>):
//! the query adds `encrypt_type=aes` and `msg_signature` =
//! `hex(sha1(sort([token, timestamp, nonce, Encrypt]).join("")))`, which
//! covers the body's `Encrypt`; AESKey = base64-decode(EncodingAESKey + "="),
//! 32 bytes; `Encrypt` is base64 of AES-256-CBC with IV = the key's first
//! 16 bytes and PKCS#7 padding to a multiple of 32 bytes ("K 为秘钥字节数
//! （采用 32）"); the plaintext is random(16 bytes) + msg_len (4 bytes,
//! network order) + msg + appid, and the receiver "需验证此Appid是否与自身公众号相符".
//! Errcodes: "全局返回码" (<https://developers.weixin.qq.com/doc/offiaccount/Getting_Started/Global_Return_Code.html>)
//! and the template message page (<https://developers.weixin.qq.com/doc/offiaccount/Message_Management/Template_Message_Interface.html>).

use sha1::{Digest, Sha1};

use crate::{AuthError, Class, Refusal, constant_time_eq, hex};

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

/// Safe mode's body signature: sha1 of the sorted, joined `token`,
/// `timestamp`, `nonce` and the body's `Encrypt`, in lower-case hex.
pub fn msg_signature(token: &str, timestamp: &str, nonce: &str, encrypt: &str) -> String {
    let mut parts = [token, timestamp, nonce, encrypt];
    parts.sort_unstable();
    hex(&Sha1::digest(parts.concat().as_bytes()))
}

/// True when `given` is the `msg_signature` of `encrypt` with `timestamp` and
/// `nonce` under `token` (compared in constant time).
pub fn verify_msg_signature(
    token: &str,
    timestamp: &str,
    nonce: &str,
    encrypt: &str,
    given: &str,
) -> bool {
    constant_time_eq(
        msg_signature(token, timestamp, nonce, encrypt).as_bytes(),
        given.to_ascii_lowercase().as_bytes(),
    )
}

/// Safe mode's block: PKCS#7 pads to a multiple of 32 bytes, not AES's 16.
pub const PAD_BLOCK: usize = 32;

/// Base64 as WeChat's sample code reads the `EncodingAESKey`: standard
/// alphabet, trailing bits allowed (a key of 43 random letters and digits
/// rarely ends in a character whose last two bits are zero).
const KEY_BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

/// The AES-256 key of a configured `EncodingAESKey`: 43 characters of the
/// base64 alphabet ("长度固定为43个字符"), decoded with one `=` appended to
/// 32 bytes. Err names what is wrong, never the key.
pub fn aes_key(encoding_aes_key: &str) -> Result<[u8; 32], AuthError> {
    use base64::Engine;
    let bad = |why| AuthError::BadSecret {
        what: "the EncodingAESKey (setting `encoding_aes_key`)",
        why,
    };
    let k = encoding_aes_key.trim();
    if k.chars().count() != 43 {
        return Err(bad(
            "it must be the 43 characters the official account's console shows \
             (消息加解密密钥), with no `=` at the end",
        ));
    }
    if !k
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
    {
        return Err(bad(
            "it may hold only the letters, digits, `+` and `/` of base64",
        ));
    }
    let bytes = KEY_BASE64
        .decode(format!("{k}="))
        .map_err(|_| bad("it is not base64"))?;
    bytes
        .try_into()
        .map_err(|_| bad("it does not decode to 32 bytes"))
}

/// Why a safe-mode `Encrypt` could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// `Encrypt` is not base64, or not whole 32-byte blocks.
    #[error("`Encrypt` is not base64 of whole 32-byte blocks")]
    NotCiphertext,
    /// Decrypted, the padding or the length field is wrong: another key
    /// encrypted it (a changed EncodingAESKey), or it was altered.
    #[error(
        "`Encrypt` does not decrypt under the configured EncodingAESKey \
         (bad padding or length): was the key changed in the console?"
    )]
    WrongKey,
    /// The message is not UTF-8 text.
    #[error("the decrypted message is not UTF-8 text")]
    NotText,
    /// The AppID at the end is another account's.
    #[error("the decrypted message is for AppID {found:?}, not this channel's `app_id`")]
    OtherAppId {
        /// The AppID the message names.
        found: String,
    },
}

/// Safe mode's IV: the AES key's first 16 bytes.
fn iv_of(key: &[u8; 32]) -> [u8; 16] {
    let mut iv = [0u8; 16];
    iv.copy_from_slice(&key[..16]);
    iv
}

/// Decrypts a safe-mode `Encrypt` (base64) under `key` and returns the
/// message, once its trailing AppID is `app_id`. Padding is PKCS#7 to
/// [`PAD_BLOCK`]: a last byte of 1 to 32, repeated that many times.
pub fn open(key: &[u8; 32], encrypt: &str, app_id: &str) -> Result<String, OpenError> {
    use aes::cipher::{BlockModeDecrypt, KeyIvInit};
    use base64::Engine;
    let mut buf = base64::engine::general_purpose::STANDARD
        .decode(encrypt.trim())
        .map_err(|_| OpenError::NotCiphertext)?;
    if buf.is_empty() || buf.len() % PAD_BLOCK != 0 {
        return Err(OpenError::NotCiphertext);
    }
    let mut dec = cbc::Decryptor::<aes::Aes256>::new(key.into(), (&iv_of(key)).into());
    for chunk in buf.chunks_exact_mut(16) {
        let block = chunk.try_into().map_err(|_| OpenError::NotCiphertext)?;
        dec.decrypt_block(block);
    }
    let pad = usize::from(*buf.last().ok_or(OpenError::NotCiphertext)?);
    if !(1..=PAD_BLOCK).contains(&pad)
        || !buf[buf.len() - pad..]
            .iter()
            .all(|b| usize::from(*b) == pad)
    {
        return Err(OpenError::WrongKey);
    }
    buf.truncate(buf.len() - pad);
    // random(16) + msg_len(4, big-endian) + msg + appid.
    let len_field: [u8; 4] = buf
        .get(16..20)
        .and_then(|b| b.try_into().ok())
        .ok_or(OpenError::WrongKey)?;
    let msg_len =
        usize::try_from(u32::from_be_bytes(len_field)).map_err(|_| OpenError::WrongKey)?;
    let msg_end = 20usize
        .checked_add(msg_len)
        .filter(|end| *end <= buf.len())
        .ok_or(OpenError::WrongKey)?;
    let found = String::from_utf8_lossy(&buf[msg_end..]).into_owned();
    if found != app_id {
        return Err(OpenError::OtherAppId { found });
    }
    String::from_utf8(buf[20..msg_end].to_vec()).map_err(|_| OpenError::NotText)
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

/// Sorts a non-zero errcode of the template send API. A code not in the
/// table is unknown: what WeChat answers to a resend of a `client_msg_id`
/// it already took (inside its 10 minutes) is not documented, and such an
/// answer could be any code; a permanent class would send the fallback
/// while the first message may have reached the user (docs/providers.md,
/// "WeChat"). Unknown, the host resends under the same `client_msg_id`
/// (deduplicated) inside the window, else follows `on_unknown`.
pub fn classify(errcode: i64) -> Refusal {
    known(errcode).unwrap_or_else(|| Refusal::new(Class::Unknown, errcode.to_string()))
}

/// `errcode` with WeChat's `errmsg` beside it, quoted (control characters
/// dropped, at most 160 characters), for a refusal whose errmsg says more
/// than its code: 47003's names the keyword at fault (`47003 "argument
/// invalid! data.thing1.value is empty"`). The code stays the first word.
pub fn with_errmsg(errcode: i64, errmsg: &str) -> String {
    let msg: String = errmsg
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .map(|c| if c == '"' { '\'' } else { c })
        .take(160)
        .collect();
    if msg.is_empty() {
        errcode.to_string()
    } else {
        format!("{errcode} \"{msg}\"")
    }
}

/// Sorts a non-zero errcode of the token API (`stable_token`). A token
/// request carries no message, so a code not in the table is permanent:
/// nothing was sent, and a fallback cannot duplicate anything.
pub fn classify_token(errcode: i64) -> Refusal {
    known(errcode).unwrap_or_else(|| Refusal::new(Class::Permanent, errcode.to_string()))
}

/// The errcodes whose meaning is documented (docs/providers.md, "WeChat").
fn known(errcode: i64) -> Option<Refusal> {
    use Class::{Permanent, Refresh, Retryable, Unknown};
    let r = |class| Refusal::new(class, errcode.to_string());
    Some(match errcode {
        // The access token is invalid, malformed or expired.
        40001 | 40014 | 42001 => r(Refresh),
        // API call quota reached: refused before the message was taken.
        45009 => r(Retryable),
        // System busy ("系统繁忙"): nothing says the message was not taken.
        // The same client_msg_id exists (45065, "相同 clientmsgid 已存在") or
        // was retried too fast (45066, "请间隔1分钟重试"): documented for mass
        // sends only, so not relied on for template sends. All ambiguous.
        -1 | 45065 | 45066 => r(Unknown),
        43004 | 40003 => r(Permanent),
        // Refused before anything was sent (docs/providers.md, "WeChat").
        40037 => r(Permanent).because(
            "the template_id is not a template of this official account: add the template \
             in the account's template library, or map the message's template to one it has \
             with the channel setting `template.<name>`",
        ),
        47003 => r(Permanent).because(
            "the data does not fit the template: a keyword of the template (WeChat's errmsg \
             names it) is missing or empty in the message's params, or breaks its keyword's \
             rules; give the event that param",
        ),
        40164 => r(Permanent)
            .because("the host's IP address is not on the official account's IP whitelist"),
        40013 | 40125 => r(Permanent).because("`app_id` or `app_secret` is wrong"),
        _ => return None,
    })
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

    /// WeChat's worked example of a safe-mode push, "消息加解密说明 / 接入指引 /
    /// 消息解密方式为安全模式"
    /// (<https://developers.weixin.qq.com/doc/subscription/guide/dev/push/encryption.html>):
    /// Token "AAAAA", EncodingAESKey 43 × "A", AppID "wxba5fad812f8e6fb9";
    /// its `msg_signature`, and `Encrypt` (224 bytes; 205 once decrypted, so
    /// 19 bytes of padding: only a 32-byte block pads that much) opening to
    /// the 167-byte message.
    const DOC_ENCRYPT: &str = "+qdx1OKCy+5JPCBFWw70tm0fJGb2Jmeia4FCB7kao+/Q5c/ohsOzQHi8khUOb05JCpj0JB4RvQMkUyus8TPxLKJGQqcvZqzDpVzazhZv6JsXUnnR8XGT740XgXZUXQ7vJVnAG+tE8NUd4yFyjPy7GgiaviNrlCTj+l5kdfMuFUPpRSrfMZuMcp3Fn2Pede2IuQrKEYwKSqFIZoNqJ4M8EajAsjLY2km32IIjdf8YL/P50F7mStwntrA2cPDrM1kb6mOcfBgRtWygb3VIYnSeOBrebufAlr7F9mFUPAJGj04=";
    const DOC_APPID: &str = "wxba5fad812f8e6fb9";

    #[test]
    fn safe_mode_opens_wechats_published_example() {
        assert_eq!(
            msg_signature("AAAAA", "1714112445", "415670741", DOC_ENCRYPT),
            "046e02f8204d34f8ba5fa3b1db94908f3df2e9b3"
        );
        assert!(verify_msg_signature(
            "AAAAA",
            "1714112445",
            "415670741",
            DOC_ENCRYPT,
            "046E02F8204D34F8BA5FA3B1DB94908F3DF2E9B3"
        ));
        assert!(!verify_msg_signature(
            "AAAAA",
            "1714112446",
            "415670741",
            DOC_ENCRYPT,
            "046e02f8204d34f8ba5fa3b1db94908f3df2e9b3"
        ));
        let key = aes_key(&"A".repeat(43)).unwrap();
        assert_eq!(key, [0u8; 32]);
        let msg = open(&key, DOC_ENCRYPT, DOC_APPID).unwrap();
        assert_eq!(
            msg,
            r#"{"ToUserName":"gh_97417a04a28d","FromUserName":"o9AgO5Kd5ggOC-bXrbNODIiE3bGY","CreateTime":1714112445,"MsgType":"event","Event":"debug_demo","debug_str":"hello world"}"#
        );
        assert_eq!(msg.len(), 167);
        // Another account's AppID at the end: refused, naming it.
        assert_eq!(
            open(&key, DOC_ENCRYPT, "wx0000000000000000"),
            Err(OpenError::OtherAppId {
                found: DOC_APPID.into()
            })
        );
        // Another key: the padding does not come out.
        let other = aes_key(&"B".repeat(43)).unwrap();
        assert_eq!(
            open(&other, DOC_ENCRYPT, DOC_APPID),
            Err(OpenError::WrongKey)
        );
    }

    /// Encrypts as WeChat documents (test-only: the plugin never encrypts).
    fn seal(key: &[u8; 32], random: &[u8; 16], msg: &str, app_id: &str) -> String {
        use aes::cipher::{BlockModeEncrypt, KeyIvInit};
        use base64::Engine;
        let mut buf = random.to_vec();
        buf.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
        buf.extend_from_slice(msg.as_bytes());
        buf.extend_from_slice(app_id.as_bytes());
        let pad = PAD_BLOCK - buf.len() % PAD_BLOCK;
        buf.extend(std::iter::repeat_n(u8::try_from(pad).unwrap(), pad));
        let mut enc = cbc::Encryptor::<aes::Aes256>::new(key.into(), (&iv_of(key)).into());
        for chunk in buf.chunks_exact_mut(16) {
            enc.encrypt_block(chunk.try_into().unwrap());
        }
        base64::engine::general_purpose::STANDARD.encode(buf)
    }

    /// The same page's encrypted reply: random "707722b803182950", message
    /// `{"demo_resp":"good luck"}` → its `Encrypt` and `MsgSignature`
    /// (TimeStamp 1713424427, Nonce 415670741); and it opens again.
    #[test]
    fn safe_mode_seals_wechats_published_reply() {
        let key = [0u8; 32];
        let msg = r#"{"demo_resp":"good luck"}"#;
        let encrypt = seal(&key, b"707722b803182950", msg, DOC_APPID);
        assert_eq!(
            encrypt,
            "ELGduP2YcVatjqIS+eZbp80MNLoAUWvzzyJxgGzxZO/5sAvd070Bs6qrLARC9nVHm48Y4hyRbtzve1L32tmxSQ=="
        );
        assert_eq!(
            msg_signature("AAAAA", "1713424427", "415670741", &encrypt),
            "1b9339964ed2e271e7c7b6ff2b0ef902fc94dea1"
        );
        assert_eq!(open(&key, &encrypt, DOC_APPID).as_deref(), Ok(msg));
    }

    /// WeChat's sample code (cryptoDemo.zip, Java `WXBizMsgCryptTest`, as
    /// copied in public repositories): EncodingAESKey
    /// "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG" (its last character
    /// carries non-zero trailing bits), random "aaaabbbbccccdddd", AppID
    /// "wxb11529c136998cb6", message "我是中文abcd123".
    #[test]
    fn safe_mode_opens_wechats_sample_code_vector() {
        let key = aes_key("abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG").unwrap();
        let encrypt = "jn1L23DB+6ELqJ+6bruv21Y6MD7KeIfP82D6gU39rmkgczbWwt5+3bnyg5K55bgVtVzd832WzZGMhkP72vVOfg==";
        assert_eq!(
            open(&key, encrypt, "wxb11529c136998cb6").as_deref(),
            Ok("我是中文abcd123")
        );
        assert_eq!(
            seal(
                &key,
                b"aaaabbbbccccdddd",
                "我是中文abcd123",
                "wxb11529c136998cb6"
            ),
            encrypt
        );
    }

    #[test]
    fn a_malformed_encoding_aes_key_is_refused_naming_the_problem() {
        let ok = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG";
        // Whitespace around it (a variable written with a newline) is not the key's.
        assert!(aes_key(&format!(" {ok}\n")).is_ok());
        for (bad, says) in [
            (&ok[..42], "43 characters"),
            (&format!("{ok}="), "43 characters"),
            (&format!("{}-", &ok[..42]), "only the letters, digits"),
            ("", "43 characters"),
        ] {
            let e = aes_key(bad).unwrap_err().to_string();
            assert!(e.contains("EncodingAESKey"), "{e}");
            assert!(e.contains("encoding_aes_key"), "{e}");
            assert!(e.contains(says), "{bad:?}: {e}");
            assert!(!e.contains(&ok[..20]), "the key is never shown: {e}");
        }
    }

    #[test]
    fn what_is_not_a_whole_ciphertext_is_refused() {
        let key = [0u8; 32];
        assert_eq!(
            open(&key, "not base64!", DOC_APPID),
            Err(OpenError::NotCiphertext)
        );
        assert_eq!(open(&key, "", DOC_APPID), Err(OpenError::NotCiphertext));
        // 16 bytes: an AES block, but not a whole 32-byte block.
        assert_eq!(
            open(&key, "AAAAAAAAAAAAAAAAAAAAAA==", DOC_APPID),
            Err(OpenError::NotCiphertext)
        );
        // Altered: one byte of the last block flipped ruins the padding or
        // the AppID; nothing opens.
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut raw = b64.decode(DOC_ENCRYPT).unwrap();
        let n = raw.len();
        raw[n - 1] ^= 1;
        assert!(open(&key, &b64.encode(&raw), DOC_APPID).is_err());
        let mut raw = b64.decode(DOC_ENCRYPT).unwrap();
        raw[n - 20] ^= 0x80;
        assert!(open(&key, &b64.encode(&raw), DOC_APPID).is_err());
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
            (40125, Permanent),
            // Not in the table: perhaps WeChat's answer to a replay of a
            // message it took.
            (99999, Unknown),
            (48001, Unknown),
        ];
        for (code, class) in table {
            assert_eq!(classify(code).class, class, "{code}");
        }
        // The token API carries no message: its unlisted codes are permanent.
        assert_eq!(classify_token(99999).class, Permanent);
        assert_eq!(classify_token(-1).class, Unknown);
        assert_eq!(classify_token(40013).class, Permanent);
        assert!(classify(40164).cause.unwrap().contains("whitelist"));
        assert!(classify(40037).cause.unwrap().contains("template library"));
        assert!(classify(47003).cause.unwrap().contains("params"));
        assert_eq!(
            with_errmsg(47003, " argument invalid! data.time2.value is empty\n"),
            "47003 \"argument invalid! data.time2.value is empty\""
        );
        assert_eq!(with_errmsg(47003, ""), "47003");
        assert_eq!(with_errmsg(47003, &"x".repeat(500)).len(), 6 + 160 + 2);
        assert_eq!(client_msg_id("k").len(), 20);
    }
}
