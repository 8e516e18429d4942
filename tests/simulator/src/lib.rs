//! The provider simulator: real TLS servers on 127.0.0.1 that imitate the
//! providers pushonce sends through, each speaking its documented protocol
//! (see `PROTOCOLS.md`), so tests count duplicates and misses where a user
//! would — at the receiving end.
//!
//! - [`aliyun`] `aliyun-sms`: dysmsapi 2017-05-25, RPC style, signature V3
//!   `ACS3-HMAC-SHA256` (and V2 HMAC-SHA1) verified from the request as
//!   received; `SendSms` is NOT idempotent (the same `OutId` twice is two
//!   SMS); `QuerySendDetails` shows a message only after a lag; receipts are
//!   the SmsReport JSON array.
//! - [`tencent`] `tencent-sms`: Tencent Cloud SMS 2021-01-11, signature v3
//!   `TC3-HMAC-SHA256` verified from the request as received; `SendSms` is
//!   NOT idempotent; each number's result inside the HTTP 200;
//!   `PullSmsSendStatusByPhoneNumber` lists delivery receipts only; receipts
//!   are the unsigned status push (a JSON array).
//! - [`wechat`] `wechat`: `stable_token` (does not rotate), `/cgi-bin/token`
//!   (rotates, 5-minute overlap), a daily cap; template send with errcodes;
//!   `client_msg_id` deduplicated for the documented 10 minutes; a template
//!   the account does not have (errcode 40037) or data lacking one of its
//!   keywords (47003) refused ([`WechatTemplates`]); receipts are
//!   signed `TEMPLATESENDJOBFINISH` XML events.
//! - [`fcm`] `fcm`: the OAuth token endpoint verifies the RS256 JWT assertion
//!   against the service account's public key; `messages:send` needs a valid,
//!   unexpired Bearer token; no client reference: a resend is a second push.
//! - [`apns`] `apns`: HTTP/2 only (by SNI `api.push.apple.com` the TLS
//!   handshake offers only `h2`; by IP an HTTP/1.1 request gets 505); ES256
//!   provider token verified with the team's key, `ExpiredProviderToken` an
//!   hour after its `iat`, `TooManyProviderTokenUpdates` per connection; no
//!   dedupe.
//! - [`webhook`] `webhook`: a Standard Webhooks receiver that verifies
//!   `webhook-signature`, refuses timestamps more than 5 minutes off and
//!   dedupes by `webhook-id` for 5 minutes, the specification's example
//!   ("save the IDs in redis for 5 minutes"), not for ever.
//! - [`inbox`] `inbox`: the business's own service, `Idempotency-Key` honoured;
//!   a replay while the first request with the key is in flight gets 409.
//! - [`ses`] `ses-email`: Amazon SES API v2 `SendEmail`, SigV4 verified from
//!   the request as received ([`sigv4`]); no idempotency token; the mailbox
//!   simulator's addresses; Delivery, Bounce and Complaint notifications
//!   ([`ses_notify`]) published through a simulated SNS topic ([`sns`]):
//!   its own key and certificate, messages signed as SNS signs them, a
//!   subscription confirmed by its `SubscribeURL`; stored templates with
//!   their variables ([`SimState::ses_template`], `POST
//!   /_sim/ses/templates`): data lacking one is answered a `MessageId`,
//!   never sent, and a `Rendering Failure` event published when the send
//!   named a configuration set.
//!
//! TLS ([`tls`]): a CA generated at start ([`SimState::ca_pem`]) signs the
//! server certificate (SANs `127.0.0.1`, `localhost` and the real provider
//! host names); HTTP/1.1 and HTTP/2 by ALPN. The control API (`/_sim/*`) is
//! served on the TLS listener too, and — for clients without TLS — on a
//! separate plain-HTTP loopback listener ([`run_control`]).
//!
//! Faults per provider (`POST /_sim/faults`, [`SimState::set_faults`]), the
//! ledger of what each provider accepted (`GET /_sim/ledger`: one entry per
//! message a user would receive), stats, token expiry and receipts with
//! retries ([`receipts`]) are shared by all providers.
//!
//! Where a provider's documentation is silent, a fault imitates the unsafe
//! reading, never a kinder one: a 5xx after the message was taken
//! (`error_after_accept`), an answer cut off after it (`drop_after_accept`),
//! an answer later than the client waits after it (`slow_after_accept_ms`:
//! a timeout that means "sent"; `slow_ms` is the delay before taking it),
//! and for WeChat a bare HTTP 200 `{}` (`empty_200_next`) or any errcode
//! answering a deduplicated resend (`replay_errcode`). See [`Faults`].

pub mod aliyun;
pub mod apns;
mod control;
pub mod fcm;
pub mod inbox;
mod jwt;
mod ledger;
pub mod receipts;
pub mod ses;
pub mod ses_notify;
pub mod sigv4;
pub mod sns;
pub mod tencent;
pub mod tls;
pub mod webhook;
pub mod wechat;

use axum::Router;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ledger::Sim;
pub use ledger::{Accepted, Delivery};
pub use wechat::WechatTemplates;

/// The providers the simulator imitates, named like the channel plugins.
pub const PROVIDERS: [&str; 8] = [
    "aliyun-sms",
    "tencent-sms",
    "wechat",
    "fcm",
    "apns",
    "webhook",
    "inbox",
    "ses-email",
];

/// Faults injected into one provider's send endpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Share (0..=1) of sends answered with a server error (accepted first
    /// for the share `error_after_accept` of them).
    pub fail_5xx: f64,
    /// Share (0..=1) of the server errors (`fail_5xx`, `fail_next`) given
    /// *after* the provider accepted the message, as a gateway or a failing
    /// backend answers after the message was stored: the client sees the
    /// provider's usual 5xx (WeChat `-1`, Aliyun `ServiceUnavailable`,
    /// Tencent `InternalError.Timeout`) and the user gets the message. 0 by default; the chaos runs turn it on.
    pub error_after_accept: f64,
    /// Share of sends answered "rate limited", not accepted.
    pub fail_429: f64,
    /// Share of sends accepted, whose answer is then cut off mid-response.
    pub drop_after_accept: f64,
    /// Share of sends cut off *without* being accepted: the client sees the
    /// same broken answer as `drop_after_accept` (an unknown outcome), but
    /// the provider never got the message (no ledger entry).
    pub drop_before_accept: f64,
    /// Status queries (Aliyun `QuerySendDetails`, Tencent
    /// `PullSmsSendStatusByPhoneNumber`, inbox `GET`) answer a server error
    /// while true.
    pub fail_queries: bool,
    /// The next N status queries answer a server error.
    pub fail_queries_next: u32,
    /// The next N sends get a server error, whatever the rates say.
    pub fail_next: u32,
    /// The next N sends (after `fail_next`) are accepted and their answer
    /// then cut off, whatever the rates say.
    pub drop_next: u32,
    /// Delay before answering any send, in milliseconds, spent *before*
    /// the provider takes the message: a client that gives up during it
    /// (its response timeout) leaves nothing sent.
    pub slow_ms: u64,
    /// Delay spent *after* the provider took the message (recorded in the
    /// ledger, receipts scheduled) and before its answer, in milliseconds:
    /// a client whose response timeout is shorter sees a timeout although
    /// the user gets the message, the unsafe reading of a timeout. The
    /// message is recorded before any wait: a layer over the provider routes
    /// (`ledger::answer_late`) waits after the handler returned, so a client
    /// that drops the request cannot undo the record; the delay is read when
    /// the message is taken, so clearing the fault afterwards does not
    /// shorten that answer. Applies to every answer of an accepted send (a
    /// deduplicated resend too).
    pub slow_after_accept_ms: u64,
    /// WeChat: the next N sends are taken (recorded, or deduplicated as a
    /// resend of their `client_msg_id`) and answered HTTP 200 with the body
    /// `{}`, without `errcode`, as a proxy or a gateway in between might.
    pub empty_200_next: u32,
    /// WeChat: a resend of a `client_msg_id` inside its window (no second
    /// message: deduplicated) is answered with this errcode instead of the
    /// first message's `msgid`. What WeChat answers there is undocumented
    /// (docs/providers.md, "WeChat"); any code may come.
    pub replay_errcode: Option<i64>,
    /// Seconds sent in `Retry-After` with 429 and 503 answers (default 1).
    pub retry_after_secs: Option<u64>,
    /// Tencent: server errors are the API gateway's HTTP 502 (no
    /// `Response`), as in a cloud-API outage, instead of `InternalError.Timeout`.
    pub gateway_errors: bool,
    /// Recipients refused for good, with the provider's error code for each
    /// (`isv.AMOUNT_NOT_ENOUGH` for Aliyun arrears,
    /// `UnauthorizedOperation.SerivceSuspendDueToArrears` for Tencent, `43004` for WeChat
    /// unsubscribed, `UNREGISTERED` for FCM, `Unregistered` for APNs, an HTTP
    /// status such as `410` for webhooks, any text for the inbox).
    pub permanent: BTreeMap<String, String>,
}

/// The SMS providers whose accounts approve templates and sign names
/// ([`SmsApprovals`]).
pub const SMS_PROVIDERS: [&str; 2] = ["aliyun-sms", "tencent-sms"];

/// What one simulated SMS account (Aliyun or Tencent) has approved in its
/// console: a send naming any other template or sign name is refused, as the
/// providers refuse it, and nothing is sent. Aliyun answers
/// `isv.SMS_TEMPLATE_ILLEGAL` / `isv.SMS_SIGNATURE_ILLEGAL` in an HTTP 200;
/// Tencent `FailedOperation.TemplateIncorrectOrUnapproved` /
/// `FailedOperation.SignatureIncorrectOrUnapproved` as each number's
/// `SendStatusSet` code (docs/providers.md). Set at start
/// ([`Config::sms_approvals`]) or through `POST /_sim/sms-approvals`
/// ([`SimState::set_sms_approvals`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SmsApprovals {
    /// Approved template codes (Aliyun `TemplateCode`, Tencent `TemplateId`).
    pub templates: BTreeSet<String>,
    /// Approved sign names (`SignName`).
    pub sign_names: BTreeSet<String>,
}

/// What an SMS account refuses a send for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unapproved {
    /// The sign name is not approved on the account.
    SignName,
    /// The template is not approved on the account.
    Template,
}

/// The sign name the repository's channel configurations use.
pub const TEST_SIGN_NAME: &str = "pushonce";

/// The templates the repository's tests, chaos run, benchmarks, policies and
/// dev configuration send to an SMS channel, as if approved in the
/// simulated console: a template sent as it is when a channel does not map
/// it (`template.<name>`) is approved under that name.
pub const TEST_TEMPLATES: &[&str] = &[
    "SMS_1",
    "SMS_1001",
    "SMS_465910001",
    "1110",
    "2084672",
    "order_shipped",
    "order-shipped",
    "SHIPPED_V1",
    "shipped",
    "shipped-sms",
    "profile_liked",
    "profile_liked_digest",
    "resume_viewed",
    "RESUME_VIEWED_DIGEST",
    "interview_reminder",
    "order.paid",
    "order.returned",
    "cancel_test",
    "token",
    "BENCH_T",
    "TPL",
    "TPL-SHIPPED",
    "t",
    "Your order shipped",
];

/// The event types the repository's tests, chaos run, benchmarks and
/// policies send, as if approved templates: an event without a `template`
/// is rendered by the template named like its `biz_type`.
pub const TEST_BIZ_TYPES: &[&str] = &[
    "A",
    "ALERT",
    "BENCH",
    "BROADCAST",
    "BROKEN",
    "CANCEL_QUIET",
    "CANCEL_RACE",
    "CANCEL_TEST",
    "DAILY_TIP",
    "DIGEST",
    "HOURLY_TIP",
    "INTERVIEW_REMINDER",
    "JOB_RECOMMENDATION",
    "LOGIN_CODE",
    "LONG",
    "NEWSLETTER",
    "NOPE",
    "NOTICE",
    "NO_SUCH_TYPE",
    "OLD",
    "ORDER",
    "ORDER_PAID",
    "ORDER_RETURNED",
    "ORDER_SHIPPED",
    "PASSWORD_CHANGED",
    "PROBE",
    "PROFILE_LIKED",
    "PROMO",
    "PROMO_A",
    "PROMO_B",
    "RECEIPT",
    "REMINDER",
    "RESUME_VIEWED",
    "SYSTEM_BROADCAST",
    "T",
    "UNNAMED",
    "WEEKLY_DIGEST",
    "WELCOME",
    "X",
];

impl Default for SmsApprovals {
    /// [`TEST_TEMPLATES`], [`TEST_BIZ_TYPES`] and [`TEST_SIGN_NAME`].
    fn default() -> Self {
        SmsApprovals {
            templates: TEST_TEMPLATES
                .iter()
                .chain(TEST_BIZ_TYPES)
                .map(|t| t.to_string())
                .collect(),
            sign_names: BTreeSet::from([TEST_SIGN_NAME.to_string()]),
        }
    }
}

impl SmsApprovals {
    /// Why the account refuses a send of `template` signed `sign` (`None`:
    /// no sign given, which Tencent allows outside mainland China), the sign
    /// checked first; `None` if both are approved.
    pub fn refusal(&self, template: &str, sign: Option<&str>) -> Option<Unapproved> {
        if sign.is_some_and(|s| !self.sign_names.contains(s)) {
            Some(Unapproved::SignName)
        } else if !self.templates.contains(template) {
            Some(Unapproved::Template)
        } else {
            None
        }
    }
}

/// Delivery receipts of one provider, set through `POST /_sim/receipts`.
/// Only `aliyun-sms`, `tencent-sms`, `wechat` and `inbox` send receipts (FCM and APNs have
/// no delivery callbacks; the webhook receiver is the end of the line).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReceiptConfig {
    /// Where receipts are posted, e.g. `http://127.0.0.1:PORT/v1/receipts/aliyun-sms`
    /// (HTTPS is trusted when the server's certificate chains to the simulator's CA).
    pub url: String,
    /// Delay between accepting a message and posting its receipt, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// Inbox: sent as `Authorization: Bearer <secret>`. WeChat: the callback
    /// token the event is signed with (default: [`Credentials::wechat_callback_token`]).
    /// Aliyun's push carries no credential. Never echoed back.
    #[serde(default, skip_serializing)]
    pub secret: Option<String>,
    /// Recipients whose messages are accepted, then fail (receipt and queries
    /// say failed).
    #[serde(default)]
    pub fail_after_accept: BTreeSet<String>,
    /// WeChat: the console's message encryption mode (消息加解密方式); the
    /// encrypted modes use [`Credentials::wechat_encoding_aes_key`]. Plain by
    /// default, as WeChat's console is.
    #[serde(default)]
    pub wechat_mode: WechatMode,
}

/// How WeChat pushes events to the server URL: the official account's
/// 消息加解密方式 ("消息加解密说明",
/// <https://developers.weixin.qq.com/doc/subscription/guide/dev/push/encryption.html>).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum WechatMode {
    /// 明文模式: the XML message as is, the query signed with `signature`
    /// (the console's default).
    #[default]
    Plain,
    /// 兼容模式: the message's fields and `Encrypt` in one XML body; the
    /// query adds `encrypt_type=aes` and `msg_signature`.
    Compatible,
    /// 安全模式 (WeChat's recommendation): only `ToUserName` and `Encrypt`;
    /// the query adds `encrypt_type=aes` and `msg_signature`.
    Safe,
}

/// Attempts at posting one receipt before giving up.
pub const RECEIPT_ATTEMPTS: u32 = 5;

/// Configuration of a simulator instance.
#[derive(Debug, Clone)]
pub struct Config {
    /// Seed of the fault dice.
    pub seed: u64,
    /// Lifetime of WeChat access tokens (`expires_in`, 7200 s).
    pub token_ttl: Duration,
    /// Lifetime of FCM OAuth access tokens (3599 s).
    pub fcm_token_ttl: Duration,
    /// How long after acceptance a message shows in Aliyun `QuerySendDetails`.
    pub query_lag: Duration,
    /// How long after acceptance an Aliyun message's delivery report is
    /// known: until then its `QuerySendDetails` row says `SendStatus` 1
    /// (waiting for the receipt), then 3 or 2, and its SmsReport is pushed.
    pub aliyun_report_after: Duration,
    /// The simulator's minute in Aliyun's SmsReport re-push schedule: a push
    /// not answered `{"code":0}` is pushed again 1, 5 and 10 minutes later
    /// (60 s as Aliyun has it; tests scale it down, keeping order and ratios).
    pub aliyun_repush_minute: Duration,
    /// How many WeChat token calls (`/cgi-bin/token` and `stable_token` each)
    /// are answered per day before errcode 45009.
    pub wechat_token_daily_cap: u32,
    /// How long a rotated-out `/cgi-bin/token` token stays valid (5 minutes).
    pub wechat_rotation_overlap: Duration,
    /// How long WeChat dedupes `client_msg_id` per openid (documented: 10 minutes).
    pub wechat_client_msg_id_window: Duration,
    /// How long a webhook receiver keeps a `webhook-id` to dedupe it (the
    /// Standard Webhooks example: 5 minutes).
    pub webhook_dedupe_window: Duration,
    /// Age (from its `iat`) after which APNs answers `ExpiredProviderToken` (1 hour).
    pub apns_token_max_age: Duration,
    /// Shortest interval between two new APNs provider tokens before
    /// `TooManyProviderTokenUpdates` (Apple: no more than once every 20 minutes).
    pub apns_min_token_interval: Duration,
    /// Clock skew Aliyun accepts in `x-acs-date` / `Timestamp` (15 minutes).
    pub aliyun_max_skew: Duration,
    /// How long after acceptance a Tencent message's delivery report is
    /// known: until then no API shows the message (the pull API lists
    /// receipts only), then it is pulled and pushed.
    pub tencent_report_after: Duration,
    /// Tencent echoes `SessionContext` in pull results and pushes (`ext`)
    /// only when its SMS support enabled it: off by default.
    pub tencent_echo_session_context: bool,
    /// Credentials to accept (e.g. kept from an earlier run's
    /// `credentials.json`); `None` generates fresh ones.
    pub credentials: Option<Credentials>,
    /// The region of the simulated SES and SNS (the SigV4 scope SES accepts).
    pub ses_region: String,
    /// SNS's pause between delivery attempts to an HTTP(S) endpoint (its
    /// default policy: 20 s; tests scale it down).
    pub sns_retry_delay: Duration,
    /// What each SMS account ([`SMS_PROVIDERS`]) has approved at start.
    pub sms_approvals: SmsApprovals,
    /// The templates the WeChat account has at start.
    pub wechat_templates: WechatTemplates,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 7,
            token_ttl: Duration::from_secs(7200),
            fcm_token_ttl: Duration::from_secs(3599),
            query_lag: Duration::from_secs(2),
            aliyun_report_after: Duration::from_secs(3),
            aliyun_repush_minute: Duration::from_secs(60),
            wechat_token_daily_cap: 2000,
            wechat_rotation_overlap: Duration::from_secs(300),
            wechat_client_msg_id_window: Duration::from_secs(600),
            webhook_dedupe_window: Duration::from_secs(300),
            apns_token_max_age: Duration::from_secs(3600),
            apns_min_token_interval: Duration::from_secs(20 * 60),
            aliyun_max_skew: Duration::from_secs(15 * 60),
            tencent_report_after: Duration::from_secs(3),
            tencent_echo_session_context: false,
            credentials: None,
            ses_region: "us-east-1".into(),
            sns_retry_delay: Duration::from_secs(20),
            sms_approvals: SmsApprovals::default(),
            wechat_templates: WechatTemplates::default(),
        }
    }
}

/// The credentials the simulated providers accept, generated at start (or
/// given in [`Config::credentials`]). Tests hand them to the host's channel
/// settings (e.g. through env vars). Its `Debug` shows ids only, never a secret.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    /// Aliyun AccessKey id.
    pub aliyun_access_key_id: String,
    /// Aliyun AccessKey secret.
    pub aliyun_access_key_secret: String,
    /// WeChat official account appid.
    pub wechat_appid: String,
    /// WeChat appsecret.
    pub wechat_secret: String,
    /// The WeChat "Token" receipts (event pushes) are signed with.
    pub wechat_callback_token: String,
    /// The WeChat EncodingAESKey (43 letters and digits) receipts are
    /// encrypted with in compatible and safe mode (absent from an older
    /// `credentials.json`: empty, and encrypted pushes are not made).
    #[serde(default)]
    pub wechat_encoding_aes_key: String,
    /// WeChat official account id (`ToUserName` of events).
    pub wechat_account: String,
    /// FCM project id.
    pub fcm_project_id: String,
    /// FCM service account e-mail.
    pub fcm_client_email: String,
    /// FCM service account key id (`kid`).
    pub fcm_private_key_id: String,
    /// FCM service account private key, PEM PKCS#8 RSA 2048.
    pub fcm_private_key_pem: String,
    /// APNs team id (`iss`).
    pub apns_team_id: String,
    /// APNs key id (`kid`).
    pub apns_key_id: String,
    /// APNs signing key, PEM PKCS#8 P-256.
    pub apns_private_key_pem: String,
    /// Standard Webhooks secret, `whsec_` + base64.
    pub webhook_secret: String,
    /// Tencent Cloud SecretId (absent from an older `credentials.json`: empty).
    #[serde(default)]
    pub tencent_secret_id: String,
    /// Tencent Cloud SecretKey.
    #[serde(default)]
    pub tencent_secret_key: String,
    /// Tencent Cloud SMS `SmsSdkAppId`.
    #[serde(default)]
    pub tencent_sdk_app_id: String,
    /// AWS access key id for SES (absent from an older `credentials.json`: empty).
    #[serde(default)]
    pub aws_access_key_id: String,
    /// AWS secret access key for SES.
    #[serde(default)]
    pub aws_secret_access_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("aliyun_access_key_id", &self.aliyun_access_key_id)
            .field("tencent_secret_id", &self.tencent_secret_id)
            .field("tencent_sdk_app_id", &self.tencent_sdk_app_id)
            .field("aws_access_key_id", &self.aws_access_key_id)
            .field("wechat_appid", &self.wechat_appid)
            .field("fcm_client_email", &self.fcm_client_email)
            .field("apns_team_id", &self.apns_team_id)
            .field("apns_key_id", &self.apns_key_id)
            .finish_non_exhaustive()
    }
}

/// Failures starting a simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Generating the CA, certificate or a key failed.
    #[error("generating test keys failed")]
    Keys(#[from] tls::KeyError),
    /// Writing a PEM or JSON file failed.
    #[error("writing {path} failed")]
    Write {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Shared handle to the simulator's state.
#[derive(Clone)]
pub struct SimState {
    /// Everything remembered.
    sim: Arc<Mutex<Sim>>,
    /// TLS material and the keys the providers verify with.
    keys: Arc<tls::Keys>,
    /// Posts receipts (HTTP, or HTTPS trusting the simulator's CA).
    http: reqwest::Client,
    /// Settings fixed at start.
    config: Arc<Config>,
    /// The simulated SNS: key, certificate, subscription.
    sns: Arc<sns::Sns>,
}

impl SimState {
    /// A fresh simulator with a new CA and new keys; panics only if key
    /// generation fails (see [`SimState::try_new`]).
    pub fn new(config: Config) -> Self {
        Self::try_new(config).expect("the simulator's keys generate")
    }

    /// A fresh simulator with a new CA and new keys.
    pub fn try_new(config: Config) -> Result<Self, SimError> {
        let keys = tls::Keys::generate(config.credentials.clone())?;
        let http = receipts::client(&keys.ca_pem);
        let mut sim = Sim::new(config.seed);
        for provider in SMS_PROVIDERS {
            sim.sms_approvals
                .insert(provider, config.sms_approvals.clone());
        }
        sim.wechat_templates = config.wechat_templates.clone();
        Ok(SimState {
            sim: Arc::new(Mutex::new(sim)),
            keys: Arc::new(keys),
            http,
            config: Arc::new(config),
            sns: Arc::new(sns::Sns::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sim> {
        self.sim.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The CA certificate (PEM) the servers' certificate chains to: the
    /// host's `ca_file`.
    pub fn ca_pem(&self) -> &str {
        &self.keys.ca_pem
    }

    /// Writes the CA certificate as PEM to `path`.
    pub fn write_ca(&self, path: &Path) -> Result<(), SimError> {
        write(path, self.ca_pem())
    }

    /// The credentials the providers accept.
    pub fn credentials(&self) -> &Credentials {
        &self.keys.credentials
    }

    /// The FCM service-account key JSON (`type`, `project_id`,
    /// `private_key_id`, `private_key`, `client_email`, `token_uri`), with
    /// `token_uri` = `{base_url}/token` (e.g. `https://127.0.0.1:PORT`).
    pub fn service_account_json(&self, base_url: &str) -> String {
        fcm::service_account(self.credentials(), base_url).to_string()
    }

    /// Sets (or, with `None`, stops) the receipts of `provider`; false if
    /// unknown or if the provider sends no receipts.
    pub fn set_receipts(&self, provider: &str, receipts: Option<ReceiptConfig>) -> bool {
        let Some(p) = receipts::provider(provider) else {
            return false;
        };
        let mut sim = self.lock();
        match receipts {
            Some(r) => sim.receipts.insert(p, r),
            None => sim.receipts.remove(p),
        };
        true
    }

    /// Sets the faults of `provider` (one of [`PROVIDERS`]); false if unknown.
    pub fn set_faults(&self, provider: &str, faults: Faults) -> bool {
        let Some(p) = provider_name(provider) else {
            return false;
        };
        self.lock().faults.insert(p, faults);
        true
    }

    /// Replaces what the account of SMS provider `provider` (one of
    /// [`SMS_PROVIDERS`]) has approved; false if it is not one.
    pub fn set_sms_approvals(&self, provider: &str, approvals: SmsApprovals) -> bool {
        let Some(p) = SMS_PROVIDERS.iter().find(|p| **p == provider) else {
            return false;
        };
        self.lock().sms_approvals.insert(p, approvals);
        true
    }

    /// What each SMS account has approved.
    pub fn sms_approvals(&self) -> BTreeMap<String, SmsApprovals> {
        self.lock()
            .sms_approvals
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    /// Replaces the WeChat account's templates.
    pub fn set_wechat_templates(&self, templates: WechatTemplates) {
        self.lock().wechat_templates = templates;
    }

    /// The WeChat account's templates.
    pub fn wechat_templates(&self) -> WechatTemplates {
        self.lock().wechat_templates.clone()
    }

    /// Expires every WeChat access token and every FCM OAuth token issued so
    /// far (as time passing would); returns how many.
    pub fn expire_tokens(&self) -> usize {
        self.lock().expire_tokens()
    }

    /// Requests seen per `provider.outcome`.
    pub fn stats(&self) -> BTreeMap<String, u64> {
        self.lock().stats.clone()
    }

    /// Registers SES stored template `name` as using `variables` (e.g.
    /// `{{name}}`, or `user.name` for a nested attribute): a `SendEmail`
    /// with it whose `TemplateData` lacks one is answered its `MessageId`
    /// but never sent — a `Rendering Failure` event published when the send
    /// named a configuration set ([`ses`]). Templates not registered render
    /// whatever their data. Registering again replaces the variables.
    pub fn ses_template(&self, name: &str, variables: &[&str]) {
        self.lock().ses_templates.insert(
            name.to_string(),
            variables.iter().map(|v| v.to_string()).collect(),
        );
    }

    /// Every `SubscribeURL` the simulated SNS saw fetched (its subscription
    /// confirmations).
    pub fn sns_confirmations(&self) -> Vec<String> {
        self.sns.confirmations()
    }

    /// Every message accepted, per provider.
    pub fn ledger(&self) -> BTreeMap<String, Vec<Accepted>> {
        self.lock()
            .ledger
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }
}

fn write(path: &Path, text: &str) -> Result<(), SimError> {
    std::fs::write(path, text).map_err(|source| SimError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// The static name of a known provider.
fn provider_name(name: &str) -> Option<&'static str> {
    PROVIDERS.iter().find(|p| **p == name).copied()
}

/// Every route: the providers' APIs and the control API.
pub fn app(state: SimState) -> Router {
    Router::new()
        .route("/", axum::routing::any(root))
        .merge(wechat::routes())
        .merge(fcm::routes())
        .merge(apns::routes())
        .merge(webhook::routes())
        .merge(inbox::routes())
        .merge(ses::routes())
        .layer(axum::middleware::from_fn(ledger::answer_late))
        .merge(control::routes())
        .with_state(state)
}

/// `/` is Aliyun's RPC endpoint and Tencent's API 3.0 endpoint (two hosts
/// in production, one address here): a request carrying Tencent's
/// `X-TC-Action` header is Tencent's.
async fn root(
    axum::extract::State(state): axum::extract::State<SimState>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    if headers.contains_key("x-tc-action") {
        tencent::handle(state, method, uri, headers, body).await
    } else {
        aliyun::handle(state, method, uri, headers, body).await
    }
}

/// Serves the providers (and the control API) over TLS with the simulator's
/// CA on `listener` until `shutdown` completes. HTTP/1.1 and HTTP/2 by ALPN.
/// The listener's address is SNS's base URL (its `SigningCertURL` and
/// `SubscribeURL`) from the call on, before the future is first polled.
pub fn run(
    listener: tokio::net::TcpListener,
    state: SimState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
    if let Ok(addr) = listener.local_addr() {
        state.sns.set_base(format!("https://{addr}"));
    }
    let config = state.keys.server_config.clone();
    tls::serve(listener, config, app(state), shutdown)
}

/// Serves only the control API (`/_sim/*`) over plain HTTP on `listener`
/// (a loopback address) until `shutdown` completes.
pub async fn run_control(
    listener: tokio::net::TcpListener,
    state: SimState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, control::routes().with_state(state))
        .with_graceful_shutdown(shutdown)
        .await
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn now_secs() -> i64 {
    (now_ms() / 1000) as i64
}
