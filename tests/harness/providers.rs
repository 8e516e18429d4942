//! The real provider plugins pointed at the provider simulator over TLS: the
//! one place that knows each channel's plugin, settings, secrets and callback
//! token, for the in-process tests (`channels.rs`, `reconcile.rs`) and the
//! generated `pushonce serve` configurations (`stack.rs`, `chaos.rs`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use provider_sim::{Config, ReceiptConfig, SimState, WechatMode};
use pushonce::config::ChannelConfig;

/// Channel name, the simulator's provider name, the plugin requirement.
pub const CHANNELS: [(&str, &str, &str); 6] = [
    ("inbox", "inbox", "inbox@^2"),
    ("sms", "aliyun-sms", "aliyun-sms@^2"),
    ("wechat", "wechat", "wechat@^2"),
    ("app-push", "fcm", "fcm@^2"),
    ("apns", "apns", "apns@^2"),
    ("webhook", "webhook", "webhook@^2"),
];

/// Channels whose provider posts delivery callbacks.
pub const WITH_CALLBACKS: [&str; 3] = ["inbox", "sms", "wechat"];

/// The Tencent Cloud SMS channel: channel name, the simulator's provider
/// name, the plugin requirement. Not among [`CHANNELS`] (the stacks and
/// chaos runs configure those six); tests add it with [`Sim::tencent_channel`].
pub const TENCENT: (&str, &str, &str) = ("tencent", "tencent-sms", "tencent-sms@^1");

/// The email channel on Amazon SES: channel name, the simulator's provider
/// name, the plugin requirement. Not among [`CHANNELS`]; tests add it with
/// [`Sim::email_channel`] and subscribe its callback URL to the simulated
/// SNS topic with [`Sim::subscribe_email_notifications`].
pub const EMAIL: (&str, &str, &str) = ("email", "ses-email", "ses-email@^1");

/// The provider instances of the `sms` channel when it fails over
/// ([`Sim::toml_with_sms_providers`]): Aliyun first, then Tencent.
pub const SMS_PROVIDERS: [&str; 2] = ["sms-aliyun", "sms-tencent"];

/// The simulator's provider name of `channel`.
pub fn provider_of(channel: &str) -> &'static str {
    CHANNELS
        .iter()
        .chain([&TENCENT, &EMAIL])
        .find(|(c, _, _)| *c == channel)
        .map(|(_, p, _)| *p)
        .unwrap_or_else(|| panic!("no provider for channel {channel}"))
}

/// The webhook endpoint name every test sends to.
pub const WEBHOOK_ENDPOINT: &str = "orders";

/// The simulator, served over TLS (providers) and plain HTTP (control) on
/// free loopback ports until dropped, with its CA written to a file.
pub struct Sim {
    /// Its state: faults, ledger, stats, credentials.
    pub state: SimState,
    /// The TLS listener of the providers.
    pub addr: SocketAddr,
    /// The plain-HTTP listener of the control API (`/_sim/*`).
    pub control: SocketAddr,
    /// Holds the CA file.
    dir: tempfile::TempDir,
    /// Stops both listeners when dropped.
    _stop: tokio::sync::watch::Sender<bool>,
}

/// Starts the simulator with `config` on two free loopback ports.
pub async fn start(config: Config) -> Sim {
    let state = SimState::new(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let control = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, control_addr) = (
        listener.local_addr().unwrap(),
        control.local_addr().unwrap(),
    );
    let (stop, rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    tokio::spawn(provider_sim::run(
        listener,
        state.clone(),
        stopped(rx.clone()),
    ));
    tokio::spawn(provider_sim::run_control(
        control,
        state.clone(),
        stopped(rx),
    ));
    let dir = tempfile::tempdir().unwrap();
    state.write_ca(&dir.path().join("ca.pem")).unwrap();
    Sim {
        state,
        addr,
        control: control_addr,
        dir,
        _stop: stop,
    }
}

/// Starts the simulator with Aliyun's and Tencent's times scaled down
/// (tests wait past them): a short query lag, reports known a little later,
/// and a re-push minute of 100 ms.
pub async fn sim() -> Sim {
    start(Config {
        query_lag: Duration::from_millis(500),
        aliyun_report_after: Duration::from_millis(1000),
        tencent_report_after: Duration::from_millis(1000),
        aliyun_repush_minute: Duration::from_millis(100),
        sns_retry_delay: Duration::from_millis(200),
        ..Config::default()
    })
    .await
}

impl Sim {
    /// `https://127.0.0.1:<port>`: every provider's endpoint.
    pub fn base(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The CA certificate file: every channel's `ca_file`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The callback path token of `channel` (unguessable in production;
    /// fixed per channel here).
    pub fn callback_token(channel: &str) -> String {
        format!("cb-{channel}-0123456789abcdef")
    }

    /// The environment variables the channel configs name, with their values:
    /// provider credentials and callback tokens.
    pub fn env(&self) -> Vec<(String, String)> {
        let c = self.state.credentials();
        let mut env = vec![
            (
                "TEST_ALIYUN_SECRET".into(),
                c.aliyun_access_key_secret.clone(),
            ),
            ("TEST_WECHAT_SECRET".into(), c.wechat_secret.clone()),
            ("TEST_WECHAT_TOKEN".into(), c.wechat_callback_token.clone()),
            (WECHAT_AES_KEY_ENV.into(), c.wechat_encoding_aes_key.clone()),
            (
                "TEST_FCM_SERVICE_ACCOUNT".into(),
                self.state.service_account_json(&self.base()),
            ),
            ("TEST_APNS_KEY".into(), c.apns_private_key_pem.clone()),
            ("TEST_WEBHOOK_SECRET".into(), c.webhook_secret.clone()),
            ("TEST_TENCENT_SECRET".into(), c.tencent_secret_key.clone()),
            ("TEST_AWS_SECRET".into(), c.aws_secret_access_key.clone()),
        ];
        for channel in WITH_CALLBACKS.iter().chain([&TENCENT.0, &EMAIL.0]) {
            env.push((token_env(channel), Sim::callback_token(channel)));
        }
        env
    }

    /// The value of environment variable `var` of [`Sim::env`].
    pub fn env_var(&self, var: &str) -> Option<String> {
        self.env()
            .into_iter()
            .find(|(k, _)| k == var)
            .map(|(_, v)| v)
    }

    /// The six channel instances, pointing at the simulator over TLS.
    pub fn channels(&self) -> BTreeMap<String, ChannelConfig> {
        CHANNELS
            .iter()
            .map(|(channel, _, plugin)| (channel.to_string(), self.channel(channel, plugin)))
            .collect()
    }

    /// The Tencent Cloud SMS channel instance ([`TENCENT`]), pointing at the
    /// simulator over TLS, its callbacks behind their path token.
    pub fn tencent_channel(&self) -> ChannelConfig {
        let mut c = self.channel(TENCENT.0, TENCENT.2);
        c.callback_token_env = Some(token_env(TENCENT.0));
        c
    }

    /// The email channel instance ([`EMAIL`]) on the simulated SES, its SNS
    /// endpoint the simulator's (`<base>/sns`), its callbacks behind their
    /// path token.
    pub fn email_channel(&self) -> ChannelConfig {
        let mut c = self.channel(EMAIL.0, EMAIL.2);
        c.callback_token_env = Some(token_env(EMAIL.0));
        c
    }

    /// Subscribes the email channel's callback URL on the host at
    /// `host_base` to the simulated SNS topic of SES notifications, signed
    /// with `signature_version` (1 or 2): SNS posts its
    /// `SubscriptionConfirmation` at once, and notifications once the
    /// plugin fetched its `SubscribeURL` ([`SimState::sns_confirmations`]).
    pub fn subscribe_email_notifications(&self, host_base: &str, signature_version: u8) -> String {
        self.subscribe_email_topic(host_base, signature_version, None)
    }

    /// [`Sim::subscribe_email_notifications`] from topic `topic_arn`
    /// (default: the one the email channel's `topic_arns` names).
    pub fn subscribe_email_topic(
        &self,
        host_base: &str,
        signature_version: u8,
        topic_arn: Option<String>,
    ) -> String {
        self.state.sns_subscribe(provider_sim::sns::SnsConfig {
            url: self.callback_url(host_base, EMAIL.0),
            signature_version,
            topic_arn,
        })
    }

    /// One channel instance of `plugin` named `channel`.
    fn channel(&self, channel: &str, plugin: &str) -> ChannelConfig {
        let mut c = ChannelConfig::new(plugin);
        let (settings, secrets) = self.settings(channel);
        c.settings = settings;
        c.secrets_from_env = secrets;
        c.allowed_hosts = vec![self.addr.to_string()];
        c.ca_file = Some(self.ca_file());
        c.call_timeout = Duration::from_secs(10);
        if WITH_CALLBACKS.contains(&channel) {
            c.callback_token_env = Some(token_env(channel));
        }
        c
    }

    /// Settings and secrets (setting → env var) of `channel`.
    fn settings(&self, channel: &str) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let c = self.state.credentials();
        let base = self.base();
        let s = |pairs: &[(&str, String)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect()
        };
        match channel {
            "inbox" => (s(&[("endpoint", base)]), s(&[])),
            "sms" => (
                s(&[
                    ("endpoint", base),
                    ("access_key_id", c.aliyun_access_key_id.clone()),
                    ("sign_name", "pushonce".into()),
                    ("query_lag", "1".into()),
                ]),
                s(&[("access_key_secret", "TEST_ALIYUN_SECRET".into())]),
            ),
            "tencent" => (
                s(&[
                    ("endpoint", base),
                    ("secret_id", c.tencent_secret_id.clone()),
                    ("sdk_app_id", c.tencent_sdk_app_id.clone()),
                    ("sign_name", "pushonce".into()),
                ]),
                s(&[("secret_key", "TEST_TENCENT_SECRET".into())]),
            ),
            "wechat" => (
                s(&[("endpoint", base), ("app_id", c.wechat_appid.clone())]),
                s(&[
                    ("app_secret", "TEST_WECHAT_SECRET".into()),
                    ("callback_token", "TEST_WECHAT_TOKEN".into()),
                ]),
            ),
            "app-push" => (
                s(&[
                    ("endpoint", base.clone()),
                    ("token_endpoint", format!("{base}/token")),
                ]),
                s(&[("service_account", "TEST_FCM_SERVICE_ACCOUNT".into())]),
            ),
            "apns" => (
                s(&[
                    ("endpoint", base),
                    ("team_id", c.apns_team_id.clone()),
                    ("key_id", c.apns_key_id.clone()),
                    ("topic", "com.example.pushonce".into()),
                ]),
                s(&[("private_key", "TEST_APNS_KEY".into())]),
            ),
            // The simulated receiver keeps ids 5 minutes, as the spec's
            // example; the operator's declaration says so.
            "webhook" => (
                s(&[
                    (
                        &format!("endpoint.{WEBHOOK_ENDPOINT}"),
                        format!("{base}/webhook/{WEBHOOK_ENDPOINT}"),
                    ),
                    ("dedupe_window", "240".into()),
                ]),
                s(&[("secret", "TEST_WEBHOOK_SECRET".into())]),
            ),
            "email" => (
                s(&[
                    ("endpoint", base.clone()),
                    ("sns_endpoint", format!("{base}/sns")),
                    ("region", "us-east-1".into()),
                    (
                        "topic_arns",
                        provider_sim::sns::default_topic_arn("us-east-1"),
                    ),
                    ("access_key_id", c.aws_access_key_id.clone()),
                    (
                        "from",
                        format!("noreply@{}", provider_sim::ses::SES_IDENTITY),
                    ),
                ]),
                s(&[("secret_access_key", "TEST_AWS_SECRET".into())]),
            ),
            other => panic!("no settings for channel {other}"),
        }
    }

    /// The `[channels.*]` tables of a `pushonce.toml` for the six channels.
    pub fn toml(&self) -> String {
        Sim::toml_of(self.channels())
    }

    /// The `[channels.*]` tables of a `pushonce.toml` for `channels` (e.g.
    /// [`Sim::channels`] with the `wechat` one in [`wechat_safe_mode`]).
    pub fn toml_of(channels: BTreeMap<String, ChannelConfig>) -> String {
        channels
            .into_iter()
            .map(|(channel, config)| table_toml(&channel, config))
            .collect()
    }

    /// The `[channels.*]` tables of the six channels, except that `sms`
    /// fails over between two provider instances, [`SMS_PROVIDERS`]: Aliyun
    /// (the `sms` settings and callback token) then Tencent; its circuits
    /// open after `circuit_failures` and stay open `circuit_open` (humantime).
    pub fn toml_with_sms_providers(&self, circuit_failures: u32, circuit_open: &str) -> String {
        let mut out = String::new();
        for (channel, config) in self.channels() {
            if channel != "sms" {
                out.push_str(&table_toml(&channel, config));
                continue;
            }
            out.push_str(&table_toml(SMS_PROVIDERS[0], config));
            out.push_str(&table_toml(SMS_PROVIDERS[1], self.tencent_channel()));
            out.push_str(&format!(
                "[channels.sms]\nproviders = [\"{}\", \"{}\"]\ncircuit_failures = {circuit_failures}\ncircuit_open = \"{circuit_open}\"\n\n",
                SMS_PROVIDERS[0], SMS_PROVIDERS[1]
            ));
        }
        out
    }

    /// With [`Sim::toml_with_sms_providers`]: Aliyun and Tencent post their
    /// receipts to their provider instance's callback route on the host at
    /// `host_base`, after `delay_ms`; the inbox and WeChat to theirs.
    pub fn send_sms_provider_receipts_to(&self, host_base: &str, delay_ms: u64) {
        let routes = [
            ("inbox", "inbox", "inbox"),
            ("wechat", "wechat", "wechat"),
            ("aliyun-sms", SMS_PROVIDERS[0], "sms"),
            ("tencent-sms", SMS_PROVIDERS[1], TENCENT.0),
        ];
        for (provider, route, token_of) in routes {
            let config = ReceiptConfig {
                url: format!(
                    "{host_base}/v1/receipts/{route}/{}",
                    Sim::callback_token(token_of)
                ),
                delay_ms,
                secret: None,
                fail_after_accept: Default::default(),
                wechat_mode: WechatMode::Plain,
            };
            assert!(self.state.set_receipts(provider, Some(config)));
        }
    }

    /// The callback URL of `channel` on the host at `host_base`
    /// (`http://127.0.0.1:PORT`), with its path token.
    pub fn callback_url(&self, host_base: &str, channel: &str) -> String {
        format!(
            "{host_base}/v1/receipts/{channel}/{}",
            Sim::callback_token(channel)
        )
    }

    /// Makes every provider that sends callbacks post them to the host at
    /// `host_base` after `delay_ms`; messages to `fail_after_accept` fail.
    pub fn send_receipts_to(&self, host_base: &str, delay_ms: u64, fail: &[&str]) {
        for channel in WITH_CALLBACKS {
            let config = ReceiptConfig {
                url: self.callback_url(host_base, channel),
                delay_ms,
                secret: None,
                fail_after_accept: fail.iter().map(|r| r.to_string()).collect(),
                wechat_mode: WechatMode::Plain,
            };
            assert!(self.state.set_receipts(provider_of(channel), Some(config)));
        }
    }

    /// Injects `faults` into the provider of `channel`.
    pub fn set_faults(&self, channel: &str, faults: provider_sim::Faults) {
        assert!(self.state.set_faults(provider_of(channel), faults));
    }

    /// How many messages the provider of `channel` accepted for `recipient`.
    pub fn sent_to(&self, channel: &str, recipient: &str) -> usize {
        self.ledger(channel)
            .iter()
            .filter(|m| m.recipient == recipient)
            .count()
    }

    /// What the provider of `channel` accepted, per the simulator's ledger.
    pub fn ledger(&self, channel: &str) -> Vec<provider_sim::Accepted> {
        self.state
            .ledger()
            .remove(provider_of(channel))
            .unwrap_or_default()
    }
}

/// The environment variable holding the simulator's WeChat EncodingAESKey
/// ([`provider_sim::Credentials::wechat_encoding_aes_key`]).
pub const WECHAT_AES_KEY_ENV: &str = "TEST_WECHAT_AES_KEY";

/// Puts a `wechat` channel instance in safe mode: its secret
/// `encoding_aes_key` from [`WECHAT_AES_KEY_ENV`] (the simulator then has to
/// push with [`provider_sim::WechatMode::Safe`], as WeChat's console would).
pub fn wechat_safe_mode(config: &mut ChannelConfig) {
    config
        .secrets_from_env
        .insert("encoding_aes_key".into(), WECHAT_AES_KEY_ENV.into());
}

/// The `[channels.<name>]` table of `config`.
fn table_toml(name: &str, config: ChannelConfig) -> String {
    let mut table = toml::Table::new();
    table.insert("plugin".into(), config.plugin.into());
    table.insert("settings".into(), to_toml(&config.settings));
    table.insert("secrets_from_env".into(), to_toml(&config.secrets_from_env));
    table.insert("allowed_hosts".into(), config.allowed_hosts.into());
    let ca = config.ca_file.expect("ca_file");
    table.insert("ca_file".into(), ca.display().to_string().into());
    if let Some(env) = config.callback_token_env {
        table.insert("callback_token_env".into(), env.into());
    }
    let mut doc = toml::Table::new();
    let mut channels = toml::Table::new();
    channels.insert(name.to_string(), table.into());
    doc.insert("channels".into(), channels.into());
    let mut out = toml::to_string(&doc).expect("channel TOML");
    out.push('\n');
    out
}

/// The environment variable holding `channel`'s callback path token.
fn token_env(channel: &str) -> String {
    format!("TEST_CALLBACK_{}", channel.replace('-', "_").to_uppercase())
}

/// A string map as a TOML table.
fn to_toml(map: &BTreeMap<String, String>) -> toml::Value {
    toml::Value::Table(
        map.iter()
            .map(|(k, v)| (k.clone(), toml::Value::String(v.clone())))
            .collect(),
    )
}
