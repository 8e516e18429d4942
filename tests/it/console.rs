//! The operator console in a real headless Chromium (chromedriver's
//! WebDriver API) against a real `pushonce serve` process, real Redis and
//! the provider simulator: sign in, the overview, held WeChat tasks made by
//! real cut-off answers, a requeue through its explicit confirmation that
//! reaches the provider once, a task marked delivered with no send, the
//! audit on each task, a task given up, look-up by business id, the key
//! explorer (a pasted event's keys; bad JSON named), a pasted policy
//! refused with its reason or diffed over the sampled events and applied
//! (the reload puts it in force), a refused reload in words.
//! The session cookie and the CSRF and origin checks are asserted with
//! plain HTTP. A provider's circuit (issue 37) seen open under its 5xx and
//! closed again after it recovers, in `/admin/providers` and on the
//! Providers page. Screenshots of the overview, the held list, the policies page and the key
//! explorer go to `docs/console/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use provider_sim::Faults;
use pushonce_tests::browser::Browser;
use pushonce_tests::providers::{self, Sim};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::stack::{ServeConfig, ServeProcess};
use pushonce_tests::wait_until;
use reqwest::StatusCode;
use serde_json::{Value, json};

const ADMIN_TOKEN: &str = "console-test-admin-token";

const POLICY: &str = r#"
biz_type = "ORDER_SHIPPED"
key_policy = "per-event@^1"
channels = ["wechat"]
window = "1h"

[retry]
max_attempts = 3
backoff = { initial = "50ms", factor = 2.0, max = "200ms", jitter = false }
"#;

/// Quick reconciler: a held WeChat task (no status query) is checked
/// twice, then `dead`, in well under a second.
const RECONCILE: &str = r#"
[auth]
admin_token_env = "CONSOLE_ADMIN_TOKEN"

[reconcile]
every = "50ms"
unknown_age = "50ms"
max_checks = 2
backoff = { initial = "50ms", factor = 1.0, max = "50ms" }
"#;

fn docs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/console")
}

async fn serve(redis: &RedisServer, dir: &Path, sim: &Sim) -> ServeProcess {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("order-shipped.toml"), POLICY).unwrap();
    let mut config = ServeConfig::new(&redis.url(), sim);
    config.extra = RECONCILE.into();
    config
        .env
        .push(("CONSOLE_ADMIN_TOKEN".into(), ADMIN_TOKEN.into()));
    ServeProcess::start(&config, dir, &policies).await.unwrap()
}

/// Posts one ORDER_SHIPPED event for WeChat recipient `openid`; its task id.
async fn post_event(host: &ServeProcess, biz_id: &str, openid: &str) -> String {
    post_to(host, biz_id, "wechat", openid).await
}

/// Posts one ORDER_SHIPPED event for `recipient` on `channel` alone (the
/// policy must name that channel only); its task id.
async fn post_to(host: &ServeProcess, biz_id: &str, channel: &str, recipient: &str) -> String {
    let event = json!({
        "biz_type": "ORDER_SHIPPED", "biz_id": biz_id, "user_id": format!("u-{biz_id}"),
        "occurred_at": "2026-11-30T08:00:00Z", "template": "order_shipped",
        "params": {"order": biz_id}, "recipients": {channel: recipient}
    });
    let answer: Value = reqwest::Client::new()
        .post(host.url("/v1/events"))
        .json(&event)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["results"][0]["result"], "accepted", "{answer}");
    answer["results"][0]["task_id"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn task(host: &ServeProcess, id: &str) -> Value {
    let url = host.url(&format!("/v1/tasks/{id}"));
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

async fn wait_status(host: &ServeProcess, id: &str, status: &str) {
    let result = wait_until(Duration::from_secs(30), || async move {
        task(host, id).await["status"] == status
    })
    .await;
    assert!(
        result.is_ok(),
        "task {id} never {status}: {}",
        task(host, id).await
    );
}

/// Messages the WeChat provider accepted for `openid`.
fn at_provider(sim: &Sim, openid: &str) -> usize {
    sim.ledger("wechat")
        .iter()
        .filter(|m| m.recipient == openid)
        .count()
}

/// Makes a held (then `dead`) WeChat task whose answer was cut off:
/// before the provider took the message (`taken` false) or after.
async fn held_task(
    host: &ServeProcess,
    sim: &Sim,
    biz_id: &str,
    openid: &str,
    taken: bool,
) -> String {
    let faults = if taken {
        Faults {
            drop_after_accept: 1.0,
            ..Faults::default()
        }
    } else {
        Faults {
            drop_before_accept: 1.0,
            ..Faults::default()
        }
    };
    sim.set_faults("wechat", faults);
    let id = post_event(host, biz_id, openid).await;
    wait_status(host, &id, "dead").await;
    sim.set_faults("wechat", Faults::default());
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_settles_held_tasks_in_the_browser() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let mut host = serve(&redis, dir.path(), &sim).await;
    let never_got = held_task(&host, &sim, "o-never", "openid-never", false).await;
    let has_it = held_task(&host, &sim, "o-has", "openid-has", true).await;
    let to_give_up = held_task(&host, &sim, "o-give", "openid-give", false).await;
    dead_counted(&host).await;
    assert_eq!(
        (
            at_provider(&sim, "openid-never"),
            at_provider(&sim, "openid-has")
        ),
        (0, 1)
    );

    let browser = Browser::start().await.unwrap();
    sign_in(&browser, &host).await;
    held_list(&browser, &host, &[&never_got, &has_it]).await;
    requeue_with_confirmation(&browser, &host, &never_got).await;
    wait_until(Duration::from_secs(30), || async {
        at_provider(&sim, "openid-never") == 1
    })
    .await
    .expect("the requeued message reaches the provider");
    let attempts = task(&host, &has_it).await["attempts"].as_u64();
    mark_delivered(&browser, &host, &has_it).await;
    assert_eq!(
        at_provider(&sim, "openid-has"),
        1,
        "marking delivered sends nothing"
    );
    let settled = task(&host, &has_it).await;
    assert_eq!(
        (settled["status"].as_str(), settled["attempts"].as_u64()),
        (Some("delivered"), attempts),
        "no attempt: {settled}"
    );
    give_up(&browser, &host, &to_give_up).await;
    look_up(&browser, &host, &never_got).await;
    wait_status(&host, &never_got, "sent").await;
    assert_eq!(
        at_provider(&sim, "openid-never"),
        1,
        "sent once: {:?}",
        sim.ledger("wechat")
    );
    key_explorer(&browser, &host).await;
    pasted_policies(&browser, &host, dir.path()).await;
    refused_reload_in_words(&browser, &host, dir.path()).await;
    readable_on_a_phone(&browser, &host).await;
    session_checks(&browser, &host, &has_it).await;
    browser.stop().await;
    host.terminate(Duration::from_secs(10)).await.unwrap();
}

/// No cookie: the sign-in page; a wrong token refused; the right one: the
/// overview, with an HttpOnly, SameSite=Strict session cookie.
async fn sign_in(browser: &Browser, host: &ServeProcess) {
    browser.goto(&host.url("/console/overview")).await.unwrap();
    assert!(browser.url().await.unwrap().ends_with("/console/login"));
    browser.fill("#name", "ana").await.unwrap();
    browser.fill("#token", "not-the-token").await.unwrap();
    browser.click("button[type=submit]").await.unwrap();
    let text = browser.text().await.unwrap();
    assert!(text.contains("Wrong admin token"), "{text}");
    browser.fill("#name", "ana").await.unwrap();
    browser.fill("#token", ADMIN_TOKEN).await.unwrap();
    browser.click("button[type=submit]").await.unwrap();
    assert!(browser.url().await.unwrap().ends_with("/console/overview"));
    let text = browser.text().await.unwrap();
    assert!(text.contains("Signed in as ana"), "{text}");
    assert!(
        text.contains("wechat"),
        "the overview lists the channel: {text}"
    );
    assert!(
        text.contains("Per channel over the last")
            && text.contains("Per channel since this host started"),
        "both spans, labelled: {text}"
    );
    let cookies = browser.cookies().await.unwrap();
    let cookie = cookies
        .iter()
        .find(|c| c["name"] == "pushonce_console")
        .unwrap_or_else(|| panic!("{cookies:?}"));
    assert_eq!(cookie["httpOnly"], true, "{cookie}");
    assert_eq!(cookie["sameSite"], "Strict", "{cookie}");
    assert_eq!(cookie["path"], "/console", "{cookie}");
    assert!(!cookie["value"].as_str().unwrap().contains(ADMIN_TOKEN));
}

/// Both held tasks listed with their cause and the provider's answer,
/// filterable by channel and cause.
async fn held_list(browser: &Browser, host: &ServeProcess, ids: &[&str]) {
    browser
        .goto(&host.url("/console/held?channel=wechat&cause=cut_off_after_write"))
        .await
        .unwrap();
    let text = browser.text().await.unwrap();
    for id in ids {
        assert!(text.contains(id), "{id} listed: {text}");
    }
    assert!(text.contains("cut_off_after_write"), "{text}");
    assert!(
        text.contains("the message may already be at the provider"),
        "{text}"
    );
    browser
        .screenshot(&docs_dir().join("held.png"))
        .await
        .unwrap();
    browser
        .goto(&host.url("/console/held?cause=retries_exhausted"))
        .await
        .unwrap();
    let text = browser.text().await.unwrap();
    assert!(
        ids.iter().all(|id| !text.contains(id)),
        "filtered out: {text}"
    );
}

/// Requeue asks first ("may already be at the provider"), then sends; the
/// task shows the action with who and why.
async fn requeue_with_confirmation(browser: &Browser, host: &ServeProcess, id: &str) {
    browser
        .goto(&host.url(&format!("/console/tasks/{id}")))
        .await
        .unwrap();
    browser
        .fill(
            &format!("#why-requeue-{id}"),
            "provider support: never received",
        )
        .await
        .unwrap();
    browser.click("button.requeue").await.unwrap();
    let text = browser.text().await.unwrap();
    assert!(
        text.contains("The message may already be at the provider — send anyway?"),
        "{text}"
    );
    assert_eq!(
        task(host, id).await["status"],
        "dead",
        "nothing done before the confirmation"
    );
    browser.click("#send-anyway").await.unwrap();
    assert!(browser.url().await.unwrap().contains("done=requeued"));
    let audit = browser.text_at("table.audit").await.unwrap();
    assert!(audit.contains("ana"), "{audit}");
    assert!(audit.contains("requeue (forced)"), "{audit}");
    assert!(
        audit.contains("provider support: never received"),
        "{audit}"
    );
}

/// Mark delivered: settled without a send, audited.
async fn mark_delivered(browser: &Browser, host: &ServeProcess, id: &str) {
    browser
        .goto(&host.url(&format!("/console/tasks/{id}")))
        .await
        .unwrap();
    browser
        .fill(
            &format!("#why-mark-delivered-{id}"),
            "the user has the message",
        )
        .await
        .unwrap();
    browser.click("button.mark-delivered").await.unwrap();
    assert!(browser.url().await.unwrap().contains("done=delivered"));
    let status = browser.text_at("dd.status").await.unwrap();
    assert_eq!(status, "delivered");
    let audit = browser.text_at("table.audit").await.unwrap();
    assert!(
        audit.contains("ana") && audit.contains("delivered"),
        "{audit}"
    );
    assert!(audit.contains("the user has the message"), "{audit}");
}

/// Look-up by business type and id finds the event's task.
async fn look_up(browser: &Browser, host: &ServeProcess, id: &str) {
    browser.goto(&host.url("/console/lookup")).await.unwrap();
    browser.fill("#biz_type", "ORDER_SHIPPED").await.unwrap();
    browser.fill("#biz_id", "o-never").await.unwrap();
    browser.click("#find").await.unwrap();
    let text = browser.text().await.unwrap();
    assert!(text.contains(id), "{text}");
    assert!(
        text.contains("requeue (forced)"),
        "the audit shows in the look-up: {text}"
    );
    // The user's latest tasks, by user id alone.
    browser.goto(&host.url("/console/lookup")).await.unwrap();
    browser.fill("#user_id", "u-o-never").await.unwrap();
    browser.click("#find").await.unwrap();
    let text = browser.text().await.unwrap();
    assert!(text.contains(id), "by user id: {text}");
    assert!(!text.contains("o-has"), "only this user's tasks: {text}");
}

/// A policy file that does not parse: the reload is refused and the
/// overview says why, in words.
async fn refused_reload_in_words(browser: &Browser, host: &ServeProcess, dir: &Path) {
    std::fs::write(
        dir.join("policies/broken.toml"),
        "biz_type = \"BROKEN\"\nchannels = [",
    )
    .unwrap();
    let answer = reqwest::Client::new()
        .post(host.url("/admin/reload"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::UNPROCESSABLE_ENTITY);
    browser.goto(&host.url("/console/overview")).await.unwrap();
    let text = browser.text().await.unwrap();
    assert!(text.contains("refused at"), "{text}");
    assert!(
        text.contains("broken.toml"),
        "the reason names the file: {text}"
    );
    browser
        .screenshot(&docs_dir().join("overview.png"))
        .await
        .unwrap();
}

/// Plain HTTP: no cookie, a redirect to sign-in; a POST without the CSRF
/// token or from another origin is refused (403) and changes nothing; with
/// both right, the same session's POST goes through.
async fn session_checks(browser: &Browser, host: &ServeProcess, id: &str) {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let anonymous = http.get(host.url("/console/held")).send().await.unwrap();
    assert_eq!(anonymous.status(), StatusCode::SEE_OTHER);
    assert_eq!(anonymous.headers()["location"], "/console/login");
    let cookies = browser.cookies().await.unwrap();
    let value = cookies
        .iter()
        .find(|c| c["name"] == "pushonce_console")
        .unwrap()["value"]
        .as_str()
        .unwrap()
        .to_string();
    let cookie = format!("pushonce_console={value}");
    let page = http
        .get(host.url(&format!("/console/tasks/{id}")))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF field")
        .to_string();
    let give_up = host.url(&format!("/console/tasks/{id}/give-up"));
    let without = http
        .post(&give_up)
        .header("cookie", &cookie)
        .form(&[("why", "no token")])
        .send()
        .await
        .unwrap();
    assert_eq!(without.status(), StatusCode::FORBIDDEN);
    let cross_site = http
        .post(&give_up)
        .header("cookie", &cookie)
        .header("origin", "http://evil.example")
        .form(&[("why", "cross site"), ("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(cross_site.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        task(host, id).await["status"],
        "delivered",
        "nothing changed"
    );
    let logout = http
        .post(host.url("/console/logout"))
        .header("cookie", &cookie)
        .header("origin", host.base())
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(logout.status(), StatusCode::SEE_OTHER);
    let cleared = logout.headers()["set-cookie"].to_str().unwrap();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
}

/// The overview counts the three held WeChat tasks the reconciler made
/// `dead` in its Dead column, since start and over the last minutes.
async fn dead_counted(host: &ServeProcess) {
    let overview = || async {
        let answer = reqwest::Client::new()
            .get(host.url("/admin/overview"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        answer.json::<Value>().await.unwrap()
    };
    let wechat = |counts: &Value, what: &str| {
        counts
            .as_array()
            .and_then(|a| a.iter().find(|c| c["channel"] == "wechat"))
            .and_then(|c| c[what].as_u64())
    };
    // The reconciler counts its give-up right after the task turns `dead`.
    let counted = wait_until(Duration::from_secs(10), || async {
        wechat(&overview().await["channels"], "dead") == Some(3)
    })
    .await;
    let view = overview().await;
    assert!(counted.is_ok(), "three dead: {view}");
    assert_eq!(wechat(&view["channels"], "held"), Some(3), "{view}");
    assert_eq!(
        wechat(&view["recent"]["channels"], "dead"),
        Some(3),
        "the host is younger than the window: {view}"
    );
}

/// Give up: the task becomes `failed`, leaves the held list, audited.
async fn give_up(browser: &Browser, host: &ServeProcess, id: &str) {
    browser
        .goto(&host.url(&format!("/console/tasks/{id}")))
        .await
        .unwrap();
    browser
        .fill(&format!("#why-give-up-{id}"), "the order was cancelled")
        .await
        .unwrap();
    browser.click("button.give-up").await.unwrap();
    assert!(browser.url().await.unwrap().contains("done=given_up"));
    let status = browser.text_at("dd.status").await.unwrap();
    assert_eq!(status, "failed");
    let audit = browser.text_at("table.audit").await.unwrap();
    assert!(
        audit.contains("ana")
            && audit.contains("given_up")
            && audit.contains("the order was cancelled"),
        "{audit}"
    );
    assert_eq!(task(host, id).await["status"], "failed");
    browser.goto(&host.url("/console/held")).await.unwrap();
    let text = browser.text().await.unwrap();
    assert!(!text.contains(id), "off the held list: {text}");
}

/// The key explorer: a pasted event's key on WeChat under the policy in
/// force, with its window; JSON that is not an event is named.
async fn key_explorer(browser: &Browser, host: &ServeProcess) {
    browser.goto(&host.url("/console/keys")).await.unwrap();
    let event = r#"{"biz_type": "ORDER_SHIPPED", "biz_id": "o-keys", "user_id": "u-keys", "occurred_at": "2026-11-30T08:00:00Z"}"#;
    browser.fill("#event", event).await.unwrap();
    browser.click("#derive").await.unwrap();
    browser.wait_for("code.key").await.unwrap();
    let text = browser.text().await.unwrap();
    assert!(
        text.contains("push:per-event@1:wechat:ORDER_SHIPPED:o-keys:u-keys"),
        "{text}"
    );
    assert!(
        text.contains("routes this event") && text.contains("1h"),
        "{text}"
    );
    browser
        .screenshot(&docs_dir().join("keys.png"))
        .await
        .unwrap();
    browser.goto(&host.url("/console/keys")).await.unwrap();
    browser
        .fill(
            "#event",
            r#"{"biz_type": "ORDER_SHIPPED", "user_id": "u-1"}"#,
        )
        .await
        .unwrap();
    browser.click("#derive").await.unwrap();
    let error = browser
        .text_of(&browser.wait_for("#event-error").await.unwrap())
        .await
        .unwrap();
    assert!(error.contains("missing field `biz_id`"), "{error}");
}

/// A pasted policy naming a key policy that is not loaded: refused with
/// the reason, nothing to apply. A good one (another key policy): checked,
/// its key changes over the three sampled events shown; applied, the reload
/// puts it in force and the page lists its version.
async fn pasted_policies(browser: &Browser, host: &ServeProcess, dir: &Path) {
    browser.goto(&host.url("/console/policies")).await.unwrap();
    let text = browser.text().await.unwrap();
    assert!(text.contains("per-event@^1 → 1."), "{text}");
    assert!(
        text.contains("per-user-per-day@1."),
        "the plugin list: {text}"
    );
    let bad = POLICY.replace("per-event@^1", "per-week@^1");
    browser.fill("#policy", &bad).await.unwrap();
    browser.click("#check-policy").await.unwrap();
    browser.wait_for("#refused-title").await.unwrap();
    let text = browser.text().await.unwrap();
    assert!(text.contains("The policy does not check"), "{text}");
    assert!(
        text.contains("key_policy") && text.contains("per-week"),
        "{text}"
    );
    assert!(
        browser.find("#apply-policy").await.is_err(),
        "nothing to apply"
    );

    browser.goto(&host.url("/console/policies")).await.unwrap();
    let good = POLICY.replace("per-event@^1", "per-user-per-day@^1");
    browser.fill("#policy", &good).await.unwrap();
    browser.click("#check-policy").await.unwrap();
    let summary = browser
        .text_of(&browser.wait_for(".diff-summary").await.unwrap())
        .await
        .unwrap();
    assert!(
        summary.starts_with("3 events, 3 keys compared: 3 changed"),
        "{summary}"
    );
    let diff = browser.text_at("table.diff").await.unwrap();
    assert!(
        diff.contains("push:per-user-per-day@1:wechat:u-o-never:2026-11-30"),
        "{diff}"
    );
    browser
        .screenshot(&docs_dir().join("policies.png"))
        .await
        .unwrap();
    let file = dir.join("policies/order-shipped.toml");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        POLICY,
        "nothing written yet"
    );
    browser.click("#apply-policy").await.unwrap();
    let text = browser
        .text_of(&browser.wait_for("p[role=status]").await.unwrap())
        .await
        .unwrap();
    assert!(
        text.contains("Applied: the reload put generation"),
        "{text}"
    );
    assert!(browser.url().await.unwrap().contains("applied="));
    let text = browser.text().await.unwrap();
    assert!(
        text.contains("Applied: the reload put generation"),
        "{text}"
    );
    assert!(
        text.contains("per-user-per-day@^1 → 1."),
        "in force: {text}"
    );
    assert!(
        std::fs::read_to_string(&file)
            .unwrap()
            .contains("per-user-per-day@^1")
    );
}

/// At a phone's width (390 CSS pixels) no page is wider than the screen:
/// wide tables scroll inside their own box, long keys wrap.
async fn readable_on_a_phone(browser: &Browser, host: &ServeProcess) {
    browser.resize(390, 844).await.unwrap();
    let width = "return [document.documentElement.scrollWidth, window.innerWidth]";
    for page in [
        "overview",
        "held",
        "providers",
        "lookup",
        "policies",
        "keys",
    ] {
        browser
            .goto(&host.url(&format!("/console/{page}")))
            .await
            .unwrap();
        let sizes = browser.script(width).await.unwrap();
        assert!(
            sizes[0].as_u64() <= sizes[1].as_u64(),
            "/console/{page} is wider than a phone: {sizes}"
        );
        if page == "overview" {
            browser
                .screenshot(&docs_dir().join("phone-overview.png"))
                .await
                .unwrap();
        }
    }
    browser.resize(1200, 900).await.unwrap();
}

/// Only SMS, on a channel that fails over from Aliyun to Tencent.
const SMS_POLICY: &str = r#"
biz_type = "ORDER_SHIPPED"
key_policy = "per-event@^1"
channels = ["sms"]
window = "1h"

[retry]
max_attempts = 1
backoff = { initial = "50ms", factor = 2.0, max = "200ms", jitter = false }
"#;

/// How long the SMS channel's circuits stay open in [`providers_host`].
const CIRCUIT_OPEN_SECS: u64 = 6;

/// A `pushonce serve` whose `sms` channel names Aliyun then Tencent, its
/// circuits opening after two infrastructure failures in a row.
async fn providers_host(redis: &RedisServer, dir: &Path, sim: &Sim) -> ServeProcess {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    std::fs::write(policies.join("order-shipped.toml"), SMS_POLICY).unwrap();
    let mut config = ServeConfig::new(&redis.url(), sim);
    config.channels = sim.toml_with_sms_providers(2, &format!("{CIRCUIT_OPEN_SECS}s"));
    config.extra = "[auth]\nadmin_token_env = \"CONSOLE_ADMIN_TOKEN\"\n".into();
    config
        .env
        .push(("CONSOLE_ADMIN_TOKEN".into(), ADMIN_TOKEN.into()));
    ServeProcess::start(&config, dir, &policies).await.unwrap()
}

/// `GET /admin/providers` with the admin token.
async fn admin_providers(host: &ServeProcess) -> Value {
    let answer = reqwest::Client::new()
        .get(host.url("/admin/providers"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    answer.json().await.unwrap()
}

/// The `sms` channel's provider `name` in an `/admin/providers` answer.
fn provider<'a>(view: &'a Value, name: &str) -> &'a Value {
    let channel = view["channels"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["channel"] == "sms"))
        .unwrap_or_else(|| panic!("no sms channel: {view}"));
    channel["providers"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["provider"] == name))
        .unwrap_or_else(|| panic!("no provider {name}: {view}"))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The Providers page's row of `name`: its circuit cell and its whole text.
async fn page_row(browser: &Browser, host: &ServeProcess, name: &str) -> (String, String) {
    browser.goto(&host.url("/console/providers")).await.unwrap();
    let state = browser
        .find(&format!("tr[data-provider=\"{name}\"] td.state"))
        .await
        .unwrap();
    let row = browser
        .find(&format!("tr[data-provider=\"{name}\"]"))
        .await
        .unwrap();
    (
        browser.text_of(&state).await.unwrap(),
        browser.text_of(&row).await.unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_a_providers_circuit_open_under_5xx_and_close_after_it_recovers() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let mut host = providers_host(&redis, dir.path(), &sim).await;
    let browser = Browser::start().await.unwrap();
    browser.goto(&host.url("/console/login")).await.unwrap();
    browser.fill("#name", "ana").await.unwrap();
    browser.fill("#token", ADMIN_TOKEN).await.unwrap();
    browser.click("button[type=submit]").await.unwrap();

    // Both providers closed, in order, before any send.
    let view = admin_providers(&host).await;
    assert_eq!(view["pid"].as_u64(), host.pid().map(u64::from), "{view}");
    let order: Vec<&str> = view["channels"][0]["providers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["provider"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["sms-aliyun", "sms-tencent"], "{view}");
    assert_eq!(view["channels"][0]["circuit_failures"], 2, "{view}");
    for p in order {
        assert_eq!(provider(&view, p)["state"], "closed", "{view}");
        assert!(provider(&view, p).get("last_failure").is_none(), "{view}");
    }

    // Aliyun's gateway answers 503 to everything: two SMS held unknown at
    // Aliyun open its circuit.
    sim.set_faults(
        "sms",
        Faults {
            fail_5xx: 1.0,
            ..Faults::default()
        },
    );
    let before = now_ms();
    for (biz, phone) in [("c-1", "+8613900000001"), ("c-2", "+8613900000002")] {
        let id = post_to(&host, biz, "sms", phone).await;
        wait_status(&host, &id, "unknown").await;
    }
    let view = admin_providers(&host).await;
    let aliyun = provider(&view, "sms-aliyun");
    assert_eq!(aliyun["state"], "open", "{view}");
    assert_eq!(aliyun["failures_in_a_row"], 2, "{view}");
    let since = aliyun["since_ms"].as_u64().unwrap();
    assert!(before <= since && since <= now_ms(), "{view}");
    let reason = aliyun["last_failure"]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(reason.contains("ServiceUnavailable"), "{view}");
    assert_eq!(provider(&view, "sms-tencent")["state"], "closed", "{view}");
    // The same on the console's Providers page, while it is open.
    let (state, row) = page_row(&browser, &host, "sms-aliyun").await;
    assert_eq!(state, "open", "{row}");
    assert!(row.contains("ServiceUnavailable"), "{row}");
    let (state, _) = page_row(&browser, &host, "sms-tencent").await;
    assert_eq!(state, "closed");
    let still_open = admin_providers(&host).await;
    assert_eq!(
        provider(&still_open, "sms-aliyun")["state"],
        "open",
        "the page was read while the circuit was open: {still_open}"
    );

    // Aliyun recovers; past the open time one real SMS tries it and closes it.
    sim.set_faults("sms", Faults::default());
    let recovered = now_ms();
    wait_until(Duration::from_secs(CIRCUIT_OPEN_SECS + 20), || async {
        provider(&admin_providers(&host).await, "sms-aliyun")["state"] == "half-open"
    })
    .await
    .expect("the circuit turns half-open");
    let probe = post_to(&host, "c-3", "sms", "+8613900000003").await;
    wait_status(&host, &probe, "sent").await;
    assert_eq!(
        task(&host, &probe).await["provider_log"],
        json!(["1:sms-aliyun"]),
        "the half-open try went to Aliyun"
    );
    let view = admin_providers(&host).await;
    let aliyun = provider(&view, "sms-aliyun");
    assert_eq!(aliyun["state"], "closed", "{view}");
    assert_eq!(aliyun["failures_in_a_row"], 0, "{view}");
    assert!(aliyun["since_ms"].as_u64().unwrap() >= recovered, "{view}");
    assert!(
        aliyun["last_failure"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("ServiceUnavailable")),
        "the last failure stays on record: {view}"
    );
    let (state, row) = page_row(&browser, &host, "sms-aliyun").await;
    assert_eq!(state, "closed", "{row}");
    assert!(
        sim.ledger("sms")
            .iter()
            .any(|m| m.recipient == "+8613900000003"),
        "Aliyun took the half-open try"
    );
    assert!(
        sim.ledger(providers::TENCENT.0).is_empty(),
        "Tencent sent nothing: {:?}",
        sim.ledger(providers::TENCENT.0)
    );
    browser.stop().await;
    host.terminate(Duration::from_secs(10)).await.unwrap();
}
