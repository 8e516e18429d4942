//! Channel plugin `wechat`: WeChat official-account template messages.
//!
//! Token: `POST /cgi-bin/stable_token` `{"grant_type":"client_credential",
//! "appid","secret","force_refresh":false}` ("获取稳定版接口调用凭据",
//! <https://developers.weixin.qq.com/doc/offiaccount/Basic_Information/getStableAccessToken.html>):
//! unlike `/cgi-bin/token` it does not rotate in normal mode, so one token kept
//! in the shared cache (until 5 minutes before `expires_in`) serves every
//! instance. Errcode 40001 / 40014 / 42001 on a send → a new token and one
//! more try.
//!
//! Send: `POST /cgi-bin/message/template/send?access_token=` with
//! `{"touser","template_id","client_msg_id","data":{k:{"value":v}}}`
//! ("发送模板消息", <https://developers.weixin.qq.com/doc/offiaccount/Message_Management/Template_Message_Interface.html>);
//! `template_id` is the message's template, or the setting `template.<it>`
//! when set (2.1.0);
//! errcode 0 sent (provider id = `msgid`); the errcode table is
//! `provider_auth::wechat::classify` (that page and "全局返回码"); `-1`
//! ("系统繁忙"), 45066 and a 5xx unknown (nothing says the message was not
//! taken: resent under `client_msg_id` inside its window, else
//! `on_unknown`); a cut-off answer unknown (docs/providers.md, "WeChat").
//! 45065 ("clientmsgid exist") and 45066 are documented for mass sends, not
//! template sends: neither is relied on, both are unknown.
//! 40037 (a template the account does not have) and 47003 (data that does
//! not fit the template, its errmsg kept in the error as it names the
//! keyword) are permanent with a cause an operator can act on (2.3.0).
//! An errcode not in the table is unknown too (2.2.0): what WeChat answers
//! to a resend of a `client_msg_id` it already took is not documented, so a
//! permanent class would send the fallback while the first message may
//! have arrived. And a 200 without `errcode` (`{}` from a proxy) is unknown,
//! not sent: only `errcode` 0 says WeChat took the message. The token API's
//! unlisted codes stay permanent (`classify_token`: no message was carried).
//!
//! Capability `honours_reference`, `reference_window_secs = 540`: the send
//! API's `client_msg_id` parameter is documented as "防重入id。对于同一个openid +
//! client_msg_id, 只发送一条消息,10分钟有效,超过10分钟不保证效果" (one message per
//! openid + client_msg_id, valid for 10 minutes, not guaranteed beyond). The
//! current official page (<https://developers.weixin.qq.com/doc/service/api/notify/template/api_sendtemplatemessage.html>)
//! could not be read in full here; the sentence is quoted verbatim from the
//! official documentation by silenceper/wechat (`officialaccount/message/template.go`,
//! PR #651) and binarywang/WxJava (`WxMpTemplateMessage.clientMsgId`). The
//! window declared is 9 minutes: WeChat's 10 start when it first sees the
//! id, which is after our first attempt began; one minute is left for
//! transit. The id is 20 hex digits of the key's SHA-256 (WeChat refuses
//! over-long ids). What WeChat answers to the duplicate inside the window is
//! not documented (assumed: success or 45065).
//!
//! Capability `callbacks`: the `TEMPLATESENDJOBFINISH` event ("模板消息 / 事件推送")
//! POSTed as XML to the server URL. Plain mode: the query's `signature` =
//! sha1 of the sorted `[token, timestamp, nonce]` ("接入概述", <https://developers.weixin.qq.com/doc/offiaccount/Basic_Information/Access_Overview.html>),
//! token = setting `callback_token`. GET with `echostr` is the URL check
//! (echoed when the signature verifies). That signature covers no body, so a
//! request is also refused when its `timestamp` is more than 5 minutes from
//! now, or when its timestamp and nonce already signed another request
//! (remembered in Redis through the shared cache's `remember`, until the
//! timestamp leaves the window; see `not_replayed`).
//!
//! Safe mode (安全模式, WeChat's recommended setting; "消息加解密说明",
//! <https://developers.weixin.qq.com/doc/subscription/guide/dev/push/encryption.html>):
//! when the channel has the account's 43-character EncodingAESKey (secret
//! `encoding_aes_key`), every POST must carry `encrypt_type=aes` and
//! `msg_signature` in the query and `<Encrypt>` in the XML body;
//! `msg_signature` = sha1 of the sorted `[token, timestamp, nonce, Encrypt]`
//! (so it covers the body) is checked in constant time, `Encrypt` is
//! decrypted (AES-256-CBC, `provider_auth::wechat::open`) and its AppID must
//! be the channel's `app_id`; the decrypted XML is then handled as in plain
//! mode. Compatibility mode (plain fields beside `Encrypt`) is read from
//! `Encrypt` only. A request without them is refused (403: no downgrade to
//! plain mode), and so is one whose `Encrypt` does not open. The window and
//! the nonce records apply in both modes (the record's digest covers the
//! body, so `Encrypt`). Without the key, `encrypt_type=aes` is refused
//! (400), naming the setting to add.
//! Replies stay the plain text `success`: the same page says "如无特定要求，
//! 回复空串或者success（无需加密）即可" (an empty string or success, not
//! encrypted, when the event asks for nothing else; template events do not).
//! Every verified POST is answered `success`. Events settle by `MsgID` (= the send's `msgid`): `Status`
//! `success` delivered, `failed:user block` / `failed: system failed` failed.
//! A community report says `MsgID` is 0 in this event when `client_msg_id`
//! was set: a `MsgID` of 0 (or a send's `msgid` of 0) is no message's id, so
//! such an event settles nothing (answered `success`) rather than the wrong
//! task; its task stays `sent`.
//! No status query exists.

use channel_sdk::callback::{self, answer};
use channel_sdk::provider::auth::{Class, Refusal, wechat};
use channel_sdk::provider::{
    Attempt, post_json, provider_template, refused_by, setting_or, token_answer, with_token,
};
use channel_sdk::serde_json::{Map, Value, json};
use channel_sdk::{
    CallbackAnswer, CallbackError, CallbackRequest, Channel, DeliveryStatus, Message,
    ProviderCapabilities, Receipt, SendError, Settlement, http, require, setting,
};

/// The real endpoint; setting `endpoint` overrides it.
const ENDPOINT: &str = "https://api.weixin.qq.com";
/// Shared-cache key of the stable access token.
const TOKEN_KEY: &str = "stable_token";

/// The plugin.
struct Wechat;

impl Channel for Wechat {
    fn capabilities() -> ProviderCapabilities {
        ProviderCapabilities {
            honours_reference: true,
            reference_window_secs: Some(540),
            callbacks: true,
            ..ProviderCapabilities::NONE
        }
    }

    fn send(msg: Message) -> Result<Receipt, SendError> {
        let endpoint = endpoint();
        let client_msg_id = wechat::client_msg_id(&msg.idempotency_key);
        let data: Map<String, Value> = msg
            .params
            .iter()
            .map(|(k, v)| (k.clone(), json!({ "value": v })))
            .collect();
        let body = json!({
            "touser": msg.recipient,
            "template_id": provider_template(&msg.template),
            "client_msg_id": client_msg_id,
            "data": data,
        });
        with_token(
            "WeChat",
            TOKEN_KEY,
            || mint(&endpoint),
            |token| {
                let url = format!("{endpoint}/cgi-bin/message/template/send?access_token={token}");
                match post_json(&url, &[], &body) {
                    Ok(resp) => sent(&resp, &client_msg_id),
                    Err(e) => Attempt::Done(Err(e.into())),
                }
            },
        )
    }

    fn handle_callback(req: CallbackRequest) -> Result<CallbackAnswer, CallbackError> {
        let safe = safe_mode()?;
        let token = callback_token()?;
        if req.method == "GET" {
            // The URL check is signed as in plain mode in every mode.
            verify_plain(&req, &token)?;
            let echo = req
                .query_param("echostr")
                .ok_or_else(|| CallbackError::Malformed("a URL check without `echostr`".into()))?;
            return Ok(answer(vec![], callback::text(echo)));
        }
        let xml = match safe {
            Some(safe) => verify_safe(&req, &token, &safe)?,
            None => {
                verify_plain(&req, &token)?;
                String::from_utf8_lossy(&req.body).into_owned()
            }
        };
        let settled = match wechat::xml_field(&xml, "Event").as_deref() {
            Some("TEMPLATESENDJOBFINISH") => job_finished(&xml)?.into_iter().collect(),
            _ => vec![],
        };
        Ok(answer(settled, callback::text("success")))
    }
}

/// The endpoint without a trailing `/`.
fn endpoint() -> String {
    setting_or("endpoint", ENDPOINT)
        .trim_end_matches('/')
        .to_string()
}

/// What a template-send answer comes to.
fn sent(resp: &http::Response, client_msg_id: &str) -> Attempt<Receipt> {
    if resp.status != 200 {
        let refusal = Refusal::of_status(resp.status);
        return Attempt::Done(Err(refused_by("WeChat", &refusal, resp)));
    }
    let body = resp.json();
    // WeChat's success is `{"errcode":0,"errmsg":"ok","msgid":…}`. A 200
    // without an errcode (`{}`, an HTML page, a proxy's answer) is not that:
    // whether WeChat took the message is unknown, so it is resent under the
    // same `client_msg_id` (deduplicated) inside the window, else held.
    let Some(errcode) = body.get("errcode").and_then(Value::as_i64) else {
        let refusal = Refusal::new(Class::Unknown, "status 200 without errcode");
        return Attempt::Done(Err(refused_by("WeChat", &refusal, resp)));
    };
    let msgid = body
        .get("msgid")
        .or_else(|| body.get("msg_id"))
        .and_then(|v| {
            v.as_u64()
                .map(|n| n.to_string())
                .or_else(|| v.as_str().map(str::to_string))
        })
        .filter(|id| is_message_id(id));
    if errcode == 0 {
        return Attempt::Done(Ok(Receipt {
            // Without an id of its own, the client reference names it.
            provider_message_id: msgid.unwrap_or_else(|| client_msg_id.to_string()),
            reference: Some(client_msg_id.to_string()),
        }));
    }
    let mut refusal = wechat::classify(errcode);
    if errcode == 47003 {
        // Its errmsg names the keyword at fault ("argument invalid!
        // data.thing1.value is empty"): the operator's clue.
        let errmsg = body.get("errmsg").and_then(Value::as_str).unwrap_or("");
        refusal.code = wechat::with_errmsg(errcode, errmsg);
    }
    match refusal.class {
        Class::Refresh => Attempt::TokenRefused(refusal),
        _ => Attempt::Done(Err(refused_by("WeChat", &refusal, resp))),
    }
}

/// A new stable access token and how long to keep it (ms).
fn mint(endpoint: &str) -> Result<(String, u64), SendError> {
    let body = json!({
        "grant_type": "client_credential",
        "appid": require("app_id")?,
        "secret": require("app_secret")?,
        "force_refresh": false,
    });
    let resp = post_json(&format!("{endpoint}/cgi-bin/stable_token"), &[], &body)
        .map_err(|e| SendError::retryable(format!("stable_token: {e}")))?;
    if let Some(token) = token_answer(&resp, 7200) {
        return Ok(token);
    }
    let errcode = resp
        .json()
        .get("errcode")
        .and_then(Value::as_i64)
        .unwrap_or(-1);
    Err(refused_by(
        "WeChat stable_token",
        &wechat::classify_token(errcode),
        &resp,
    ))
}

/// The configured `callback_token` (WeChat's "Token").
fn callback_token() -> Result<String, CallbackError> {
    setting("callback_token")
        .filter(|t| !t.is_empty())
        .ok_or_else(|| {
            CallbackError::Forbidden("channel setting `callback_token` is not configured".into())
        })
}

/// What safe mode needs: the AES key and the AppID the messages must name.
struct SafeMode {
    key: [u8; 32],
    app_id: String,
}

/// Safe mode's settings when secret `encoding_aes_key` is configured; `None`
/// (plain mode) when it is not. A malformed key, or no `app_id`, refuses
/// every callback with the reason (the key itself is never shown).
fn safe_mode() -> Result<Option<SafeMode>, CallbackError> {
    let Some(k) = setting("encoding_aes_key").filter(|k| !k.trim().is_empty()) else {
        return Ok(None);
    };
    let key = wechat::aes_key(&k).map_err(|e| {
        CallbackError::Forbidden(format!("channel setting `encoding_aes_key`: {e}"))
    })?;
    let app_id = setting("app_id").filter(|a| !a.is_empty()).ok_or_else(|| {
        CallbackError::Forbidden(
            "channel setting `app_id` is not configured: safe mode checks the AppID \
             inside each message against it"
                .into(),
        )
    })?;
    Ok(Some(SafeMode { key, app_id }))
}

/// Checks the query's plain-mode `signature` against `token`, then the
/// timestamp window and the nonce record. Without a configured key, a
/// safe-mode request is refused naming the setting.
fn verify_plain(req: &CallbackRequest, token: &str) -> Result<(), CallbackError> {
    if req.method != "GET" && req.query_param("encrypt_type").is_some_and(|t| t == "aes") {
        return Err(CallbackError::Malformed(
            "the request is in safe (encrypted) mode, but the channel has no EncodingAESKey: \
             set secret `encoding_aes_key` to the official account's EncodingAESKey \
             (docs/providers.md, \"WeChat\")"
                .into(),
        ));
    }
    let param = |n: &str| req.query_param(n).unwrap_or_default();
    let (timestamp, nonce) = (param("timestamp"), param("nonce"));
    if !wechat::verify(token, &timestamp, &nonce, &param("signature")) {
        return Err(CallbackError::Forbidden(
            "the signature does not verify".into(),
        ));
    }
    not_replayed(req, &timestamp, &nonce)
}

/// Checks a safe-mode request: `encrypt_type=aes`, `msg_signature` over the
/// body's `Encrypt`, the timestamp window and the nonce record; returns the
/// decrypted XML message once its AppID is the channel's.
fn verify_safe(
    req: &CallbackRequest,
    token: &str,
    safe: &SafeMode,
) -> Result<String, CallbackError> {
    let body = String::from_utf8_lossy(&req.body);
    let given = req.query_param("msg_signature");
    let encrypt = wechat::xml_field(&body, "Encrypt");
    let aes = req.query_param("encrypt_type").is_some_and(|t| t == "aes");
    let (Some(given), Some(encrypt), true) = (given, encrypt, aes) else {
        return Err(CallbackError::Forbidden(
            "the channel is in safe mode (`encoding_aes_key` is set): a request without \
             `encrypt_type=aes`, `msg_signature` and an `Encrypt` body is refused \
             (no downgrade to plain mode)"
                .into(),
        ));
    };
    let param = |n: &str| req.query_param(n).unwrap_or_default();
    let (timestamp, nonce) = (param("timestamp"), param("nonce"));
    if !wechat::verify_msg_signature(token, &timestamp, &nonce, &encrypt, &given) {
        return Err(CallbackError::Forbidden(
            "the msg_signature does not verify over the body's Encrypt".into(),
        ));
    }
    not_replayed(req, &timestamp, &nonce)?;
    wechat::open(&safe.key, &encrypt, &safe.app_id)
        .map_err(|e| CallbackError::Forbidden(format!("safe mode: {e}")))
}

/// Refuses a signed request that is old, or whose timestamp and nonce
/// already signed another request. The signature covers only `token`,
/// `timestamp` and `nonce`, not the body: a request seen once could
/// otherwise be sent again later, or with another body. So the timestamp
/// must be within ±5 minutes of now, and each timestamp and nonce is
/// recorded (in Redis, seen by every host process) with a digest of its
/// request until the timestamp leaves that window. The same request again
/// (WeChat's own retry) is handled again, which changes nothing; another
/// request under the same signature is refused. When the record cannot be
/// checked the request is refused too: nothing proves it is not a replay.
fn not_replayed(req: &CallbackRequest, timestamp: &str, nonce: &str) -> Result<(), CallbackError> {
    let ttl_ms =
        wechat::freshness(timestamp, channel_sdk::now_ms()).map_err(CallbackError::Forbidden)?;
    let key = format!("{}:{nonce}", timestamp.trim());
    let digest = wechat::request_digest(&req.method, &req.query, &req.body);
    match channel_sdk::cache::remember(&key, &digest, ttl_ms) {
        Ok(None) => Ok(()),
        Ok(Some(earlier)) if earlier == digest => Ok(()),
        Ok(Some(_)) => Err(CallbackError::Forbidden(
            "a replay: this timestamp and nonce already signed another request".into(),
        )),
        Err(e) => Err(CallbackError::Forbidden(format!(
            "the nonce could not be checked against earlier requests ({e:?}): \
             refused, since it may be a replay"
        ))),
    }
}

/// Whether `id` can name a message: `0` (or empty) names none.
fn is_message_id(id: &str) -> bool {
    !id.trim().trim_start_matches('0').is_empty()
}

/// The settlement of a `TEMPLATESENDJOBFINISH` event; none when its `MsgID`
/// names no message (0).
fn job_finished(xml: &str) -> Result<Option<Settlement>, CallbackError> {
    let id = wechat::xml_field(xml, "MsgID")
        .ok_or_else(|| CallbackError::Malformed("TEMPLATESENDJOBFINISH without MsgID".into()))?;
    if !is_message_id(&id) {
        return Ok(None);
    }
    let status = wechat::xml_field(xml, "Status")
        .ok_or_else(|| CallbackError::Malformed("TEMPLATESENDJOBFINISH without Status".into()))?;
    Ok(Some(Settlement {
        id,
        status: if wechat::delivered(&status) {
            DeliveryStatus::Delivered
        } else {
            DeliveryStatus::Failed
        },
        detail: Some(status),
    }))
}

channel_sdk::export_channel!(Wechat);
