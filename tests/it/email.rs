//! The email channel (issue 35 item 3) through a real `pushonce serve`
//! process, real Redis, the real `ses-email` plugin and the provider
//! simulator imitating Amazon SES and its SNS notifications: an email
//! carries `List-Unsubscribe` and `List-Unsubscribe-Post` (RFC 8058), and
//! its link's one-click POST opts the user out of that category while a
//! forged or expired link is refused; the SNS subscription is confirmed by
//! the plugin; an email to the mailbox simulator's `bounce@` gets a signed
//! Bounce notification that opts the address's user out of email (history
//! route `email_bounce`) and settles the task failed; a Delivery settles it
//! delivered; a forged or altered notification is refused 403 and opts
//! nobody out; an email whose template data lacks a variable of its SES
//! template is answered a `MessageId` but never sent, and the `Rendering
//! Failure` event SES publishes through the channel's configuration set
//! settles the task failed, with nobody opted out; a bounce after the send
//! takes the email's fallback (an inbox message). Conditions with
//! deadlines, no sleeps.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use provider_sim::sns::Tamper;
use pushonce_tests::providers::{self, Sim};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::stack::{ServeConfig, ServeProcess};
use pushonce_tests::wait_until;
use serde_json::{Value, json};

const API_TOKEN: &str = "email-test-api-token";
const ADMIN_TOKEN: &str = "email-test-admin-token";
/// The secret that signs the host's one-click unsubscribe links.
const UNSUBSCRIBE_SECRET: &str = "email-test-unsubscribe-secret-of-40-bytes";
/// The URL the host's unsubscribe links are written under.
const LINK_BASE: &str = "https://push.example.com";
/// How long a condition may take.
const DEADLINE: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);

/// A newsletter (marketing) and a receipt (transactional), both by email.
const POLICIES: &[(&str, &str)] = &[
    (
        "newsletter.toml",
        r#"
biz_type = "NEWSLETTER"
key_policy = "per-event@^1"
channels = ["email"]
window = "1h"
category = "marketing"
"#,
    ),
    (
        "receipt.toml",
        r#"
biz_type = "RECEIPT"
key_policy = "per-event@^1"
channels = ["email"]
window = "1h"
category = "transactional"
"#,
    ),
    (
        "welcome.toml",
        r#"
biz_type = "WELCOME"
key_policy = "per-event@^1"
channels = ["email"]
window = "1h"
category = "transactional"
"#,
    ),
    (
        "alert.toml",
        r#"
biz_type = "ALERT"
key_policy = "per-event@^1"
channels = ["email"]
window = "1h"
category = "transactional"

[fallback]
email = "inbox"
"#,
    ),
    (
        "login-code.toml",
        r#"
biz_type = "LOGIN_CODE"
key_policy = "per-event@^1"
channels = ["email"]
window = "1h"
category = "security"
"#,
    ),
];

/// A host on `redis` (its ledger beside it) with the six channels and the
/// email channel on the simulated SES.
async fn serve(redis: &RedisServer, sim: &Sim, dir: &Path) -> ServeProcess {
    serve_with(redis, sim, dir, &[]).await
}

/// [`serve`], the email channel's settings changed: each named one set
/// to its value, or removed (`None`).
async fn serve_with(
    redis: &RedisServer,
    sim: &Sim,
    dir: &Path,
    settings: &[(&str, Option<&str>)],
) -> ServeProcess {
    let (config, policies) = config_with(redis, sim, dir, settings);
    ServeProcess::start(&config, dir, &policies).await.unwrap()
}

/// [`serve_with`]'s configuration and policy directory, not started.
fn config_with(
    redis: &RedisServer,
    sim: &Sim,
    dir: &Path,
    settings: &[(&str, Option<&str>)],
) -> (ServeConfig, std::path::PathBuf) {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    for (file, text) in POLICIES {
        std::fs::write(policies.join(file), text).unwrap();
    }
    let mut config = ServeConfig::new(&redis.url(), sim);
    let mut channel = sim.email_channel();
    for (name, value) in settings {
        match value {
            Some(v) => channel.settings.insert(name.to_string(), v.to_string()),
            None => channel.settings.remove(*name),
        };
    }
    let email = [(providers::EMAIL.0.to_string(), channel)];
    config
        .channels
        .push_str(&Sim::toml_of(email.into_iter().collect()));
    config.ledger_url = Some(redis.ledger_url());
    config.extra = format!(
        r#"
[auth]
api_token_env = "EMAIL_API_TOKEN"
admin_token_env = "EMAIL_ADMIN_TOKEN"

[preferences]
mandatory = ["security"]

[unsubscribe]
secret_env = "EMAIL_UNSUBSCRIBE_SECRET"
base_url = "{LINK_BASE}"
"#
    );
    for (k, v) in [
        ("EMAIL_API_TOKEN", API_TOKEN),
        ("EMAIL_ADMIN_TOKEN", ADMIN_TOKEN),
        ("EMAIL_UNSUBSCRIBE_SECRET", UNSUBSCRIBE_SECRET),
    ] {
        config.env.push((k.into(), v.into()));
    }
    (config, policies)
}

/// An answer: status and JSON body (a string when not JSON).
async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let answer = pushonce_tests::host::Answer::of(req).await.unwrap();
    (answer.status.as_u16(), answer.body)
}

/// An event `biz_type` / `biz_id` for `user` by email to `address`.
fn event(biz_type: &str, biz_id: &str, user: &str, address: &str) -> Value {
    json!({
        "biz_type": biz_type, "biz_id": biz_id, "user_id": user,
        "occurred_at": "2026-12-04T10:00:00Z",
        "params": {"name": user},
        "recipients": {"email": address},
    })
}

/// Posts an event: the email channel's result and its task id.
async fn post(host: &ServeProcess, event: &Value) -> (String, Option<String>) {
    let req = reqwest::Client::new()
        .post(host.url("/v1/events"))
        .bearer_auth(API_TOKEN)
        .json(event);
    let (status, answer) = send(req).await;
    assert_eq!(status, 202, "{answer}");
    let result = &answer["results"][0];
    assert_eq!(result["channel"], "email", "{answer}");
    (
        result["result"].as_str().unwrap().to_string(),
        result["task_id"].as_str().map(str::to_string),
    )
}

/// Posts an event the email channel accepts: its task id.
async fn accepted(host: &ServeProcess, event: &Value) -> String {
    let (result, task) = post(host, event).await;
    assert_eq!(result, "accepted");
    task.expect("a task id")
}

/// A task's status (`sent`, `delivered`, `failed`...).
async fn task_status(host: &ServeProcess, task: &str) -> String {
    let req = reqwest::Client::new()
        .get(host.url(&format!("/v1/tasks/{task}")))
        .bearer_auth(API_TOKEN);
    let (_, view) = send(req).await;
    view["status"].as_str().unwrap_or_default().to_string()
}

/// `user`'s preferences view (`GET`, admin token).
/// Waits until `task` is `status` (the task API), else fails saying `what`
/// with the simulator's counts and the host's log.
async fn settles(host: &ServeProcess, sim: &Sim, task: &str, status: &str, what: &str) {
    wait_until(DEADLINE, || async {
        task_status(host, task).await == status
    })
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}; {:?}; log:\n{}", sim.state.stats(), host.log()));
}

async fn preferences(host: &ServeProcess, user: &str) -> Value {
    host.preferences(user, ADMIN_TOKEN).await
}

/// The changes in `view`'s history made by a bounce or complaint.
fn bounces(view: &Value) -> Vec<Value> {
    pushonce_tests::stack::history_by_route(view, "email_bounce")
}

/// The emails SES accepted for `address`, per the simulator's ledger.
fn emails_to(sim: &Sim, address: &str) -> Vec<provider_sim::Accepted> {
    sim.ledger("email")
        .into_iter()
        .filter(|m| m.recipient == address)
        .collect()
}

/// The value of header `name` of an accepted email.
fn header(email: &provider_sim::Accepted, name: &str) -> Option<String> {
    email.params["Headers"]
        .as_array()?
        .iter()
        .find(|h| h["Name"] == name)
        .and_then(|h| h["Value"].as_str())
        .map(str::to_string)
}

/// Waits until SNS gave up posting its subscription's confirmation: it
/// posts again after each refusal, then counts `sns_failed`.
async fn refused_to_the_end(sim: &Sim, host: &ServeProcess) {
    sns_until(sim, host, "SNS gave up the confirmation", |sim| {
        sim.state.stats().get("ses-email.sns_failed").copied() >= Some(1)
    })
    .await;
}

/// The host's log says `what` (a refusal names its reason there).
fn assert_logged(host: &ServeProcess, what: &str) {
    let log = host.log();
    assert!(log.contains(what), "the log does not say {what:?}:\n{log}");
}

/// Waits until the plugin confirmed the SNS subscription (fetched its
/// `SubscribeURL`).
async fn confirmed(sim: &Sim, host: &ServeProcess) {
    sns_until(sim, host, "the SNS subscription is confirmed", |sim| {
        !sim.state.sns_confirmations().is_empty()
    })
    .await;
}

/// Waits until `done` holds of the simulator; else fails saying `what`
/// did not happen, with the simulator's counts and the host's log.
async fn sns_until(sim: &Sim, host: &ServeProcess, what: &str, done: impl Fn(&Sim) -> bool) {
    wait_until(DEADLINE, || async { done(sim) })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "not so: {what}: {e}; {:?}; log:\n{}",
                sim.state.stats(),
                host.log()
            )
        });
}

/// A host on a Redis of its own and the simulator, its email channel's SNS
/// subscription (signature version `version`) confirmed; `set` names the
/// channel's configuration set. Fields drop in order: the host first.
struct Subscribed {
    host: ServeProcess,
    sim: Sim,
    _dir: tempfile::TempDir,
    redis: RedisServer,
}

async fn subscribed(sim: Sim, set: Option<&str>, version: u8) -> Subscribed {
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let host = serve_with(&redis, &sim, dir.path(), &[("configuration_set", set)]).await;
    sim.subscribe_email_notifications(host.base(), version);
    confirmed(&sim, &host).await;
    Subscribed {
        host,
        sim,
        _dir: dir,
        redis,
    }
}

/// A mail system's one-click POST of `token` (RFC 8058: no login, no cookie).
async fn one_click(host: &ServeProcess, token: &str) -> (u16, Value) {
    send(
        reqwest::Client::new()
            .post(host.url(&format!("/v1/unsubscribe/{token}")))
            .header("content-type", "application/x-www-form-urlencoded")
            .body("List-Unsubscribe=One-Click"),
    )
    .await
}

/// The expiry a link's token carries (`<user>.<kind>.<name>.<expires>.<mac>`),
/// seconds since the epoch.
fn link_expiry(token: &str) -> u64 {
    token
        .split('.')
        .nth(3)
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no expiry in {token}"))
}

/// An email scheduled ahead carries a link good for `link_ttl` from its
/// send, not from its accept: a message sent weeks after it was posted does
/// not arrive with a link about to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_emails_link_is_good_for_its_whole_ttl_from_the_send() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path()).await;
    let address = "later@example.com";
    let send_at = SystemTime::now() + Duration::from_secs(4);
    let mut scheduled = event("NEWSLETTER", "n-later", "u-later", address);
    scheduled["send_at"] = humantime::format_rfc3339_millis(send_at).to_string().into();
    assert_eq!(post(&host, &scheduled).await.0, "accepted");
    wait_until(DEADLINE, || async { emails_to(&sim, address).len() == 1 })
        .await
        .unwrap_or_else(|e| panic!("the email reaches SES: {e}; log:\n{}", host.log()));
    let link = header(&emails_to(&sim, address)[0], "List-Unsubscribe").expect("a link");
    let token = link
        .trim_end_matches('>')
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    let send_secs = send_at.duration_since(UNIX_EPOCH).unwrap().as_secs();
    assert!(
        link_expiry(&token) >= send_secs + (60 * DAY).as_secs(),
        "expires {} < send {send_secs} + 60 days",
        link_expiry(&token)
    );
}

/// The API token's look-ups of event `biz_type` / `biz_id` and of its
/// tasks show no unsubscribe link: it would let the token's holder opt the
/// user out, which `api_token_writes = false` forbids.
async fn no_link_to_the_api_token(host: &ServeProcess, biz_type: &str, biz_id: &str) {
    let look_up = |path: String| async move {
        let req = reqwest::Client::new()
            .get(host.url(&path))
            .bearer_auth(API_TOKEN);
        pushonce_tests::host::Answer::of(req).await.unwrap()
    };
    let event = look_up(format!("/v1/events/{biz_type}/{biz_id}")).await;
    assert_eq!(event.status, 200, "{}", event.body);
    let mut bodies = vec![event.body.to_string()];
    for task in event.body["tasks"].as_array().unwrap() {
        let id = task["id"].as_str().unwrap();
        let view = look_up(format!("/v1/tasks/{id}")).await;
        assert_eq!(view.status, 200, "{}", view.body);
        bodies.push(view.body.to_string());
    }
    for body in bodies {
        assert!(
            !body.contains("/v1/unsubscribe/"),
            "a link shown to the API token: {body}"
        );
    }
}

/// The issue's done-when: an email is sent with both headers, a one-click
/// POST to its link opts its user out of the category (the next newsletter
/// by email is answered `opted_out`, a receipt still sends), and a forged
/// or expired link is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_email_carries_both_headers_and_its_one_click_link_opts_out_its_category() {
    use pushonce::unsubscribe::{Target, UnsubscribeLinks};
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path()).await;
    let address = "reader@example.com";

    assert_eq!(
        post(&host, &event("NEWSLETTER", "n-1", "u-mail", address))
            .await
            .0,
        "accepted"
    );
    wait_until(DEADLINE, || async { emails_to(&sim, address).len() == 1 })
        .await
        .unwrap_or_else(|e| panic!("the email reaches SES: {e}; log:\n{}", host.log()));
    let email = &emails_to(&sim, address)[0];
    assert_eq!(email.template, "NEWSLETTER");
    // A newsletter for tomorrow waits in Redis with its link in its payload.
    let tomorrow = humantime::format_rfc3339_millis(SystemTime::now() + DAY).to_string();
    let mut later = event("NEWSLETTER", "n-later", "u-mail", address);
    later["send_at"] = json!(tomorrow);
    assert_eq!(post(&host, &later).await.0, "accepted");
    no_link_to_the_api_token(&host, "NEWSLETTER", "n-later").await;
    assert_eq!(email.params["TemplateData"], json!({"name": "u-mail"}));
    let unsubscribe = header(email, "List-Unsubscribe")
        .unwrap_or_else(|| panic!("no List-Unsubscribe header: {}", email.params));
    assert_eq!(
        header(email, "List-Unsubscribe-Post").as_deref(),
        Some("List-Unsubscribe=One-Click"),
        "{}",
        email.params
    );
    let prefix = format!("<{LINK_BASE}/v1/unsubscribe/");
    let token = unsubscribe
        .strip_prefix(&prefix)
        .and_then(|t| t.strip_suffix('>'))
        .unwrap_or_else(|| panic!("not a link of the host: {unsubscribe}"))
        .to_string();

    // A link with one character changed, and one written 61 days ago.
    let (payload, mac) = token.rsplit_once('.').expect("payload.mac");
    let flipped = if mac.starts_with('A') { "B" } else { "A" };
    let forged = format!("{payload}.{flipped}{}", &mac[1..]);
    let links = UnsubscribeLinks::new(UNSUBSCRIBE_SECRET.as_bytes(), LINK_BASE, 60 * DAY);
    let old = links.link(
        "u-mail",
        &Target::Category("marketing".into()),
        SystemTime::now() - 61 * DAY,
    );
    let expired = old
        .strip_prefix(&format!("{LINK_BASE}/v1/unsubscribe/"))
        .unwrap()
        .to_string();
    for (token, status) in [(&forged, 403), (&expired, 410)] {
        let (got, problem) = one_click(&host, token).await;
        assert_eq!(got, status, "{token}: {problem}");
    }
    let untouched = preferences(&host, "u-mail").await;
    assert_eq!(untouched["categories_off"], json!([]), "{untouched}");
    assert_eq!(untouched["history"], json!([]), "{untouched}");

    // The mail system's one-click POST of the email's own link.
    let (status, answer) = one_click(&host, &token).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"user_id": "u-mail", "kind": "category", "name": "marketing"})
    );
    assert_eq!(
        post(&host, &event("NEWSLETTER", "n-2", "u-mail", address))
            .await
            .0,
        "opted_out"
    );
    assert_eq!(
        post(&host, &event("RECEIPT", "r-1", "u-mail", address))
            .await
            .0,
        "accepted",
        "a transactional email still goes"
    );
    wait_until(DEADLINE, || async { emails_to(&sim, address).len() == 2 })
        .await
        .expect("the receipt reaches SES");
    let view = preferences(&host, "u-mail").await;
    assert_eq!(view["categories_off"], json!(["marketing"]), "{view}");
    assert_eq!(view["history"][0]["route"], "unsubscribe_link", "{view}");

    // A mandatory category's email carries no link: no preference can stop it.
    assert_eq!(
        post(&host, &event("LOGIN_CODE", "c-1", "u-mail", address))
            .await
            .0,
        "accepted"
    );
    wait_until(DEADLINE, || async { emails_to(&sim, address).len() == 3 })
        .await
        .expect("the login code reaches SES");
    let code = emails_to(&sim, address)
        .into_iter()
        .find(|e| e.template == "LOGIN_CODE")
        .expect("the login code's email");
    assert_eq!(header(&code, "List-Unsubscribe"), None, "{}", code.params);
    assert_eq!(
        header(&code, "List-Unsubscribe-Post"),
        None,
        "{}",
        code.params
    );
}

/// A channel that fails over between two provider instances of
/// `ses-email` (`providers = [...]`, no `plugin` of its own): its message
/// carries the one-click link as a channel with the plugin does; the
/// payload an operator sees holds it, and the request SES gets carries
/// both headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_email_channel_with_providers_carries_the_unsubscribe_headers() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut config, policies) = config_with(&redis, &sim, dir.path(), &[]);
    let instances = ["ses-a", "ses-b"].map(|name| (name.to_string(), sim.email_channel()));
    config
        .channels
        .push_str(&Sim::toml_of(instances.into_iter().collect()));
    config
        .channels
        .push_str("[channels.mail]\nproviders = [\"ses-a\", \"ses-b\"]\n");
    let bulletin = "biz_type = \"BULLETIN\"\nkey_policy = \"per-event@^1\"\nchannels = [\"mail\"]\nwindow = \"1h\"\ncategory = \"marketing\"\n";
    std::fs::write(policies.join("bulletin.toml"), bulletin).unwrap();
    let host = ServeProcess::start(&config, dir.path(), &policies)
        .await
        .unwrap();
    let address = "chain@example.com";

    let req = reqwest::Client::new()
        .post(host.url("/v1/events"))
        .bearer_auth(API_TOKEN)
        .json(&json!({
            "biz_type": "BULLETIN", "biz_id": "b-1", "user_id": "u-chain",
            "occurred_at": "2026-12-04T10:00:00Z",
            "recipients": {"mail": address},
        }));
    let (status, answer) = send(req).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["results"][0]["result"], "accepted", "{answer}");
    let key = answer["results"][0]["key"].as_str().unwrap();
    let req = reqwest::Client::new()
        .get(host.url("/admin/tasks"))
        .query(&[("key", key)])
        .bearer_auth(ADMIN_TOKEN);
    let (status, found) = send(req).await;
    assert_eq!(status, 200, "{found}");
    let link = found["task"]["payload"]["unsubscribe"]["url"]
        .as_str()
        .unwrap_or_else(|| panic!("no unsubscribe link in the payload: {found}"));
    assert!(
        link.starts_with(&format!("{LINK_BASE}/v1/unsubscribe/")),
        "{link}"
    );

    wait_until(DEADLINE, || async { emails_to(&sim, address).len() == 1 })
        .await
        .unwrap_or_else(|e| panic!("the email reaches SES: {e}; log:\n{}", host.log()));
    let email = &emails_to(&sim, address)[0];
    assert_eq!(
        header(email, "List-Unsubscribe"),
        Some(format!("<{link}>")),
        "{}",
        email.params
    );
    assert_eq!(
        header(email, "List-Unsubscribe-Post").as_deref(),
        Some("List-Unsubscribe=One-Click"),
        "{}",
        email.params
    );
}

/// An email to the mailbox simulator's `bounce@` address: SES answers it
/// sent, then SNS posts a signed (SignatureVersion 1) Bounce, Permanent;
/// the plugin verifies it, the task is settled failed and the address's
/// user has email switched off, by the route `email_bounce`; the next
/// email to them is answered `opted_out`. Another user is untouched. A
/// complaint (`complaint@`) opts its user out and leaves the task delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounce_notification_opts_the_address_out_of_email() {
    let s = subscribed(providers::sim().await, None, 1).await;
    let (sim, host) = (&s.sim, &s.host);
    let bounce = "bounce@simulator.amazonses.com";

    let task = accepted(host, &event("RECEIPT", "r-b1", "u-bounce", bounce)).await;
    settles(
        host,
        sim,
        &task,
        "failed",
        "the bounce settles the task failed",
    )
    .await;
    wait_until(DEADLINE, || async {
        preferences(host, "u-bounce").await["channels_off"] == json!(["email"])
    })
    .await
    .unwrap_or_else(|e| panic!("the bounce opts u-bounce out: {e}; log:\n{}", host.log()));
    let view = preferences(host, "u-bounce").await;
    let changes = bounces(&view);
    assert_eq!(changes.len(), 1, "{view}");
    assert_eq!(changes[0]["action"], "switch_off", "{view}");

    assert_eq!(
        post(host, &event("RECEIPT", "r-b2", "u-bounce", bounce))
            .await
            .0,
        "opted_out"
    );
    assert_eq!(emails_to(sim, bounce).len(), 1, "nothing more reaches SES");
    let other = preferences(host, "u-other").await;
    assert_eq!(other["channels_off"], json!([]), "{other}");

    // The address posted with a space after it: SES is sent it trimmed,
    // and its bounce finds the user all the same.
    let spaced = format!("{bounce} ");
    let task = accepted(host, &event("RECEIPT", "r-s1", "u-spaced", &spaced)).await;
    settles(host, sim, &task, "failed", "the bounce settles it failed").await;
    wait_until(DEADLINE, || async {
        preferences(host, "u-spaced").await["channels_off"] == json!(["email"])
    })
    .await
    .unwrap_or_else(|e| panic!("the bounce opts u-spaced out: {e}; log:\n{}", host.log()));

    // `complaint@`: delivered, then reported as spam: the task stays
    // delivered and the complaining address's user is opted out too.
    let complaint = "complaint@simulator.amazonses.com";
    let task = accepted(host, &event("RECEIPT", "r-c1", "u-spam", complaint)).await;
    wait_until(DEADLINE, || async {
        preferences(host, "u-spam").await["channels_off"] == json!(["email"])
    })
    .await
    .unwrap_or_else(|e| panic!("the complaint opts u-spam out: {e}; log:\n{}", host.log()));
    assert_eq!(bounces(&preferences(host, "u-spam").await).len(), 1);
    wait_until(DEADLINE, || async {
        task_status(host, &task).await == "delivered"
    })
    .await
    .expect("the complained-of email was delivered");
}

/// A bounce naming a message the host has not recorded (yet) is answered
/// 503 so SNS posts it again, but its address is opted out at once: SNS may
/// stop re-posting before the host's wait for the send is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounce_the_host_must_wait_for_still_opts_its_address_out() {
    let s = subscribed(providers::sim().await, None, 1).await;
    let (sim, host) = (&s.sim, &s.host);
    let address = "success@simulator.amazonses.com";
    let task = accepted(host, &event("RECEIPT", "r-w1", "u-wait", address)).await;
    settles(
        host,
        sim,
        &task,
        "delivered",
        "the first email is delivered",
    )
    .await;
    let notice = provider_sim::ses_notify::bounce(
        "0000-a-message-this-host-has-not-recorded",
        "noreply@mail.pushonce.test",
        address,
        "Permanent",
        "General",
    );
    let status = sim.state.sns_push(None, &notice, 1, Tamper::None).await;
    assert_eq!(status, Ok(503), "the unknown message is waited for");
    let view = preferences(host, "u-wait").await;
    assert_eq!(view["channels_off"], json!(["email"]), "{view}");
}

/// A bounce that comes after SES answered the send: `ses-email` cannot
/// query, so a `sent` email is final unless a receipt says otherwise; with
/// a fallback in its payload the task stays in Redis (it would otherwise
/// leave once the ledger holds it, its payload and fallback with it), and
/// the Bounce settles it failed and takes the fallback: the inbox provider
/// takes the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounce_after_the_send_takes_the_emails_fallback() {
    let s = subscribed(providers::sim().await, None, 1).await;
    let (sim, host) = (&s.sim, &s.host);
    let task = accepted(host, &alert("a-1", "u-alert")).await;
    email_bounced(host, sim, &task).await;
    let reached = wait_until(DEADLINE, || async {
        inbox_now(host)
            .await
            .is_some_and(|t| t["status"] == "sent" || t["status"] == "delivered")
    })
    .await;
    if let Err(e) = reached {
        panic!(
            "the fallback reaches the inbox: {e}; inbox task {:?}; {:?}; log:\n{}",
            inbox_now(host).await,
            sim.state.stats(),
            host.log()
        );
    }
}

/// The issue's scenario of an opt-out between the accept and the failure:
/// an alert by email (its fallback the inbox) is accepted for a few seconds
/// ahead; its user then switches the inbox off; the email bounces. The
/// bounce fails the email and takes no fallback (the recipient's
/// preferences are read again when the fallback would be accepted), and
/// the email's task says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_switched_off_after_the_accept_is_not_taken() {
    let s = subscribed(providers::sim().await, None, 1).await;
    let (sim, host) = (&s.sim, &s.host);
    let send_at = SystemTime::now() + Duration::from_secs(4);
    let mut alert = alert("a-2", "u-late");
    alert["send_at"] = json!(humantime::format_rfc3339_millis(send_at).to_string());
    let task = accepted(host, &alert).await;
    let prefs = json!({"channels_off": ["inbox"]});
    host.set_preferences("u-late", ADMIN_TOKEN, &prefs).await;
    assert_eq!(
        task_status(host, &task).await,
        "queued",
        "switched off before the send"
    );

    email_bounced(host, sim, &task).await;
    let req = reqwest::Client::new()
        .get(host.url("/v1/events/ALERT/a-2"))
        .bearer_auth(API_TOKEN);
    let (_, event) = send(req).await;
    let channels: Vec<&Value> = event["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| &t["channel"])
        .collect();
    assert_eq!(channels, [&json!("email")], "no inbox task: {event}");
    let req = reqwest::Client::new()
        .get(host.url(&format!("/v1/tasks/{task}")))
        .bearer_auth(API_TOKEN);
    let (_, view) = send(req).await;
    let why = view["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("fallback to inbox not taken") && why.contains("switched inbox off"),
        "{view}"
    );
    assert!(
        sim.ledger("inbox").iter().all(|m| m.recipient != "u-late"),
        "nothing reached the inbox"
    );

    // Once the task left Redis (its retention, here cut short), the
    // look-up answers from the ledger, and still says why.
    let mut conn = s.redis.manager().await.unwrap();
    let record = pushonce::permit::Layout::new("po", 4).task(&task).unwrap();
    redis::cmd("DEL")
        .arg(record)
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let path = format!("/v1/tasks/{task}");
    let look_up = || {
        reqwest::Client::new()
            .get(host.url(&path))
            .bearer_auth(API_TOKEN)
    };
    wait_until(Duration::from_secs(10), || {
        let req = look_up();
        async move { send(req).await.1["from_ledger"] == true }
    })
    .await
    .unwrap();
    let (_, from_ledger) = send(look_up()).await;
    let why = from_ledger["last_error"].as_str().unwrap_or_default();
    assert!(
        from_ledger["status"] == "failed"
            && why.contains("fallback to inbox not taken")
            && why.contains("switched inbox off"),
        "{from_ledger}"
    );
}

/// An alert `biz_id` for `user` by email to SES's `bounce@` address, its
/// fallback the user's inbox.
fn alert(biz_id: &str, user: &str) -> Value {
    json!({
        "biz_type": "ALERT", "biz_id": biz_id, "user_id": user,
        "occurred_at": "2026-12-04T10:00:00Z",
        "params": {"name": user},
        "recipients": {"email": "bounce@simulator.amazonses.com", "inbox": user},
    })
}

/// Waits until the bounce of email `task` settled it failed.
async fn email_bounced(host: &ServeProcess, sim: &Sim, task: &str) {
    settles(
        host,
        sim,
        task,
        "failed",
        "the bounce settles the email failed",
    )
    .await;
}

/// The inbox task of event `ALERT` / `a-1` as the API shows it now.
async fn inbox_now(host: &ServeProcess) -> Option<Value> {
    let req = reqwest::Client::new()
        .get(host.url("/v1/events/ALERT/a-1"))
        .bearer_auth(API_TOKEN);
    let (_, view) = send(req).await;
    view["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["channel"] == "inbox")
        .cloned()
}

/// A Delivery notification (SignatureVersion 2) settles the task
/// delivered; a notification whose signature or body was altered is
/// refused 403 by the plugin, and opts nobody out. So is one from a topic
/// the channel's `topic_arns` does not name, though SNS signed it (SNS
/// signs every topic's messages with the same certificates), and that
/// topic's subscription is never confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_settles_delivered_and_a_forged_notification_is_refused() {
    let s = subscribed(providers::sim().await, None, 2).await;
    let (sim, host) = (&s.sim, &s.host);
    let address = "success@simulator.amazonses.com";

    let task = accepted(host, &event("RECEIPT", "r-d1", "u-ok", address)).await;
    settles(
        host,
        sim,
        &task,
        "delivered",
        "the delivery settles the task",
    )
    .await;

    // A bounce of that address, as an attacker would post it: with a
    // signature they cannot make, or a genuine one over another body.
    let message_id = emails_to(sim, address)[0].id.clone();
    let notice = provider_sim::ses_notify::bounce(
        &message_id,
        "noreply@mail.pushonce.test",
        address,
        "Permanent",
        "General",
    );
    for tamper in [Tamper::Signature, Tamper::Body] {
        let status = sim.state.sns_push(None, &notice, 2, tamper).await.unwrap();
        assert_eq!(status, 403, "{tamper:?}");
    }
    // Another account's topic, subscribing the callback URL and posting
    // the same bounce signed as SNS signs it.
    let theirs = "arn:aws:sns:us-east-1:999999999999:not-ours".to_string();
    sim.subscribe_email_topic(host.base(), 2, Some(theirs));
    refused_to_the_end(sim, host).await;
    assert_eq!(
        sim.state.sns_confirmations().len(),
        1,
        "only the channel's own topic is confirmed"
    );
    assert_logged(host, "not in the channel's topic_arns");
    let status = sim.state.sns_push(None, &notice, 2, Tamper::None).await;
    assert_eq!(status, Ok(403), "a signed bounce from another topic");
    let view = preferences(host, "u-ok").await;
    assert_eq!(view["channels_off"], json!([]), "{view}");
    assert!(bounces(&view).is_empty(), "{view}");
    assert_eq!(task_status(host, &task).await, "delivered");
    assert_eq!(
        post(host, &event("RECEIPT", "r-d2", "u-ok", address))
            .await
            .0,
        "accepted",
        "email still goes to u-ok"
    );
}

/// Without `topic_arns` the plugin takes no topic's messages: the
/// subscription is never confirmed, and the host's log names the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_email_channel_without_topic_arns_confirms_no_subscription() {
    let sim = providers::sim().await;
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let host = serve_with(&redis, &sim, dir.path(), &[("topic_arns", None)]).await;
    sim.subscribe_email_notifications(host.base(), 2);
    refused_to_the_end(&sim, &host).await;
    assert!(sim.state.sns_confirmations().is_empty());
    assert_logged(&host, "channel setting `topic_arns` is not configured");
}

/// A template-data gap SES only reports as an event: the `WELCOME` SES
/// template uses `name` and `favoritecolor`; an event without
/// `favoritecolor` is answered a `MessageId` (the task is `sent`) and never
/// sent, and the `Rendering Failure` event published through the channel's
/// configuration set settles it `failed` — never `delivered` — and opts
/// nobody out. The same template with complete data is delivered.
///
/// No fallback here, so the `sent` email task leaves Redis once the
/// delivery ledger holds it (`ses-email` cannot query), and the later
/// event only rewrites the ledger row (`Ledger::settle_late`); with a
/// fallback it would stay (`a_bounce_after_the_send_takes_the_emails_fallback`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rendering_failure_settles_the_email_failed() {
    let sim = providers::sim().await;
    sim.state
        .ses_template("WELCOME", &["name", "favoritecolor"]);
    let s = subscribed(sim, Some("pushonce-events"), 1).await;
    let (sim, host) = (&s.sim, &s.host);
    let address = "success@simulator.amazonses.com";
    let welcome = |biz_id: &str, user: &str, params: Value| {
        json!({
            "biz_type": "WELCOME", "biz_id": biz_id, "user_id": user,
            "occurred_at": "2026-12-04T10:00:00Z",
            "params": params,
            "recipients": {"email": address},
        })
    };

    // Complete data: sent and delivered, no fallback.
    let task = accepted(
        host,
        &welcome(
            "w-ok",
            "u-ok",
            json!({"name": "Ada", "favoritecolor": "teal"}),
        ),
    )
    .await;
    settles(
        host,
        sim,
        &task,
        "delivered",
        "the complete email is delivered",
    )
    .await;
    assert_eq!(emails_to(sim, address).len(), 1);
    assert_eq!(
        emails_to(sim, address)[0].params["ConfigurationSetName"],
        "pushonce-events"
    );

    // `favoritecolor` missing: SES answers a MessageId, sends nothing, and
    // publishes a Rendering Failure event.
    let task = accepted(host, &welcome("w-gap", "u-gap", json!({"name": "Bo"}))).await;
    settles(
        host,
        sim,
        &task,
        "failed",
        "the rendering failure settles the task failed",
    )
    .await;
    let stats = sim.state.stats();
    assert_eq!(
        stats.get("ses-email.rendering_failure"),
        Some(&1),
        "{stats:?}"
    );
    assert_eq!(
        emails_to(sim, address).len(),
        1,
        "the failed email never reached the SES ledger"
    );
    // What the event's history shows: the email failed, though it had been
    // sent (SES gave it a MessageId).
    let req = reqwest::Client::new()
        .get(host.url("/v1/events/WELCOME/w-gap"))
        .bearer_auth(API_TOKEN);
    let (status, view) = send(req).await;
    assert_eq!(status, 200, "{view}");
    let tasks = view["tasks"].as_array().expect("tasks");
    let email = tasks
        .iter()
        .find(|t| t["channel"] == "email")
        .unwrap_or_else(|| panic!("{view}"));
    assert_eq!(email["status"], "failed", "{view}");
    assert!(
        email["provider_message_id"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{view}"
    );
    assert_eq!(tasks.len(), 1, "{view}");
    // Still failed, never delivered; and nobody is opted out of email.
    assert_eq!(task_status(host, &task).await, "failed");
    let prefs = preferences(host, "u-gap").await;
    assert_eq!(prefs["channels_off"], json!([]), "{prefs}");
    assert!(bounces(&prefs).is_empty(), "{prefs}");
    assert_eq!(
        post(
            host,
            &welcome(
                "w-next",
                "u-gap",
                json!({"name": "Bo", "favoritecolor": "red"})
            )
        )
        .await
        .0,
        "accepted",
        "email still goes to u-gap"
    );
}
