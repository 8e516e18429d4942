//! Scheduled sends through a real `pushonce serve` process, real Redis, the
//! real plugins and the provider simulator: an event with `send_at` a few
//! seconds ahead reaches the provider once, not before `send_at`, and a
//! re-post stays `duplicate`; quiet hours and frequency caps are judged at
//! `send_at`, not at accept; a `send_at` outside the configured bounds, or
//! not a time, is refused naming `send_at` and the bound. Times come from
//! the current clock (offsets chosen so the recipient's quiet hours fall
//! where the test needs them): no sleeps, conditions with deadlines.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pushonce::caps::DAY_MS;
use pushonce_tests::providers::{self, Sim};
use pushonce_tests::redis::RedisServer;
use pushonce_tests::stack::{ServeConfig, ServeProcess};
use pushonce_tests::wait_until;
use serde_json::{Value, json};

const HOUR: i64 = 3_600_000;
const MINUTE: i64 = 60_000;

const REMINDER: &str = r#"
biz_type = "REMINDER"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
"#;

const DIGEST: &str = r#"
biz_type = "DIGEST"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
tz_attribute = "tz"
quiet = { from = "22:00", to = "08:00" }
"#;

const DAILY: &str = r#"
biz_type = "DAILY_TIP"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
tz = "UTC"

[caps.daily]
max = 1
per_day = true
"#;

const HOURLY: &str = r#"
biz_type = "HOURLY_TIP"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"

[caps.hourly]
max = 1
window = "1h"
"#;

const NIGHT_TIP: &str = r#"
biz_type = "NIGHT_TIP"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
tz_attribute = "tz"
quiet = { from = "22:00", to = "08:00" }

[caps.six-hourly]
max = 1
window = "6h"
"#;

const BROADCAST: &str = r#"
biz_type = "BROADCAST"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
dedup = "bloom"

[bloom]
items = 1000
false_positive = 0.001
"#;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `ms` since the epoch as RFC 3339 text with milliseconds.
fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms as u64)).to_string()
}

/// A host on `redis` sending through `sim`, with this test's policies and
/// `extra` configuration.
async fn serve(redis: &RedisServer, sim: &Sim, dir: &Path, extra: &str) -> ServeProcess {
    let policies = dir.join("policies");
    std::fs::create_dir_all(&policies).unwrap();
    for (name, text) in [
        ("reminder.toml", REMINDER),
        ("digest.toml", DIGEST),
        ("daily.toml", DAILY),
        ("hourly.toml", HOURLY),
        ("broadcast.toml", BROADCAST),
        ("night-tip.toml", NIGHT_TIP),
    ] {
        std::fs::write(policies.join(name), text).unwrap();
    }
    let mut config = ServeConfig::new(&redis.url(), sim);
    config.extra = extra.to_string();
    ServeProcess::start(&config, dir, &policies).await.unwrap()
}

/// An event of `biz_type` for user `u-7`, with `more` fields merged in.
fn event(biz_type: &str, biz_id: &str, more: Value) -> Value {
    let mut e = json!({
        "biz_type": biz_type, "biz_id": biz_id, "user_id": "u-7",
        "occurred_at": "2026-11-30T15:59:59Z",
    });
    for (k, v) in more.as_object().unwrap() {
        e[k] = v.clone();
    }
    e
}

/// An event of `biz_type` for user `u-7` with `send_at` at `ms`.
fn event_at(biz_type: &str, biz_id: &str, ms: i64) -> Value {
    event(biz_type, biz_id, json!({"send_at": rfc3339(ms)}))
}

/// A fixed UTC offset, whole minutes in -12h..+12h, as `±HH:MM`, that puts
/// the local time of `at` at `local` (ms after midnight) or up to a minute later;
/// with the offset in ms.
fn zone_putting(at: i64, local: i64) -> (String, i64) {
    let mut offset = (local - at.rem_euclid(DAY_MS)).div_euclid(MINUTE) * MINUTE;
    offset = (offset + 12 * HOUR).rem_euclid(DAY_MS) - 12 * HOUR;
    let tz = format!(
        "{}{:02}:{:02}",
        if offset < 0 { '-' } else { '+' },
        offset.abs() / HOUR,
        offset.abs() % HOUR / MINUTE
    );
    (tz, offset)
}

/// The first 08:00 local (UTC + `offset`) after `at`.
fn next_eight(at: i64, offset: i64) -> i64 {
    let local = at + offset;
    let mut eight = local.div_euclid(DAY_MS) * DAY_MS + 8 * HOUR;
    if eight <= local {
        eight += DAY_MS;
    }
    eight - offset
}

/// An event with `send_at` four seconds ahead is accepted with
/// `scheduled_for` = `send_at` (the task view shows it, `queued`); the
/// provider gets nothing before `send_at` and exactly one message after
/// it; a re-post, before and after the send, stays `duplicate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_with_send_at_is_sent_once_and_not_before() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path(), "").await;
    let send_at = now_ms() + 4000;
    let body = event_at("REMINDER", "r-1", send_at);
    let r = host.post_event(&body).await;
    assert_eq!(r["result"], "accepted", "{r}");
    assert_eq!(r["scheduled_for"].as_i64(), Some(send_at), "{r}");
    let id = r["task_id"].as_str().unwrap().to_string();
    let view = host.get(&format!("/v1/tasks/{id}")).await.unwrap();
    assert_eq!(view.body["status"], "queued", "{}", view.body);
    assert_eq!(
        view.body["scheduled_for"].as_i64(),
        Some(send_at),
        "{}",
        view.body
    );
    let again = host.post_event(&body).await;
    assert_eq!(again["result"], "duplicate", "{again}");
    assert_eq!(again["task_id"], id.as_str());

    // Watched every 20 ms: the first time the provider holds the message
    // is after send_at.
    let mut first_seen = None;
    wait_until(Duration::from_secs(20), || {
        let seen = !sim.ledger("inbox").is_empty();
        if seen && first_seen.is_none() {
            first_seen = Some(now_ms());
        }
        async move { seen }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: not sent; host log:\n{}", host.log()));
    let seen = first_seen.unwrap();
    assert!(
        seen >= send_at,
        "the provider had the message at {} ms before send_at",
        send_at - seen
    );
    let sent = sim.ledger("inbox");
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(sent[0].accepted_at_ms as i64 >= send_at, "{sent:?}");
    assert_eq!(sent[0].recipient, "u-7");
    wait_until(Duration::from_secs(10), || async {
        let v = host.get(&format!("/v1/tasks/{id}")).await.unwrap();
        v.body["status"] == "sent" || v.body["status"] == "delivered"
    })
    .await
    .expect("the task is recorded sent");
    let after = host.post_event(&body).await;
    assert_eq!(after["result"], "duplicate", "{after}");
    let sent = sim.ledger("inbox");
    assert_eq!(
        (sent.len(), sent[0].replays),
        (1, 0),
        "one message, never resent: {sent:?}"
    );
}

/// A scheduled send cancelled before its `send_at` never reaches the
/// provider: an event for another user scheduled for the same time
/// arrives, the cancelled one does not, and its task says `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_send_cancelled_before_send_at_is_never_sent() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path(), "").await;
    let at = json!({"send_at": rfc3339(now_ms() + 3000)});
    let cancelled = host
        .post_event(&event("REMINDER", "r-cancel", at.clone()))
        .await;
    assert_eq!(cancelled["result"], "accepted", "{cancelled}");
    let mut control = event("REMINDER", "r-control", at);
    control["user_id"] = json!("u-8");
    let kept = host.post_event(&control).await;
    assert_eq!(kept["result"], "accepted", "{kept}");

    host.cancel_event("REMINDER", "r-cancel", &json!({})).await;

    wait_until(Duration::from_secs(20), || async {
        !sim.ledger("inbox").is_empty()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: the control was not sent; host log:\n{}", host.log()));
    let id = cancelled["task_id"].as_str().unwrap();
    let view = host.get(&format!("/v1/tasks/{id}")).await.unwrap();
    assert_eq!(view.body["status"], "cancelled", "{}", view.body);
    let recipients: Vec<String> = sim
        .ledger("inbox")
        .iter()
        .map(|m| m.recipient.clone())
        .collect();
    assert_eq!(recipients, ["u-8"], "only the event not cancelled was sent");
}

/// A cancelled send is never sent, so it takes no room in a cap: with a
/// cap of 1 a day, an event scheduled for tomorrow noon and cancelled with
/// `release_permit` is accepted when posted again; that one cancelled
/// keeping its permit stays a duplicate, and another event for tomorrow is
/// accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_send_gives_its_room_in_a_cap_back() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path(), "").await;
    let tomorrow = now_ms().div_euclid(DAY_MS) * DAY_MS + DAY_MS;
    let noon = tomorrow + 12 * HOUR;
    let first = host.post_event(&event_at("DAILY_TIP", "c-1", noon)).await;
    assert_eq!(first["result"], "accepted", "{first}");
    let released = host
        .cancel_event("DAILY_TIP", "c-1", &json!({"release_permit": true}))
        .await;
    assert_eq!(released["channels"][0]["permit"], "released", "{released}");

    let again = host.post_event(&event_at("DAILY_TIP", "c-1", noon)).await;
    assert_eq!(again["result"], "accepted", "{again}");
    assert_ne!(again["task_id"], first["task_id"], "{again}");
    host.cancel_event("DAILY_TIP", "c-1", &json!({})).await;
    let repost = host.post_event(&event_at("DAILY_TIP", "c-1", noon)).await;
    assert_eq!(repost["result"], "duplicate", "its permit kept: {repost}");
    let other = host.post_event(&event_at("DAILY_TIP", "c-2", noon)).await;
    assert_eq!(other["result"], "accepted", "{other}");
    let capped = host
        .post_event(&event_at("DAILY_TIP", "c-3", tomorrow + 13 * HOUR))
        .await;
    assert_eq!(capped["result"], "capped", "c-2 takes tomorrow: {capped}");
}

/// Quiet hours 22:00–08:00 are judged at `send_at`: a `send_at` at 23:00
/// local (accepted at 20:00, outside them) is scheduled for the next 08:00;
/// one at 09:00 local, accepted at 07:00 inside them, is scheduled for the
/// `send_at` itself, while the same event without `send_at` waits for 08:00.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_hours_are_judged_at_send_at() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path(), "").await;

    let send_at = now_ms() + 3 * HOUR;
    let (tz, offset) = zone_putting(send_at, 23 * HOUR);
    let now_local = host
        .post_event(&event("DIGEST", "q-0", json!({"attributes": {"tz": tz}})))
        .await;
    assert_eq!(now_local["result"], "accepted", "{now_local}");
    assert!(
        now_local.get("scheduled_for").is_none(),
        "20:00 local is outside the quiet hours: {now_local}"
    );
    let night = host
        .post_event(&event(
            "DIGEST",
            "q-1",
            json!({"attributes": {"tz": tz}, "send_at": rfc3339(send_at)}),
        ))
        .await;
    assert_eq!(night["result"], "accepted", "{night}");
    assert_eq!(
        night["scheduled_for"].as_i64(),
        Some(next_eight(send_at, offset)),
        "tz {tz}, send_at {}: {night}",
        rfc3339(send_at)
    );
    let view = host
        .get(&format!("/v1/tasks/{}", night["task_id"].as_str().unwrap()))
        .await
        .unwrap();
    assert_eq!(
        view.body["scheduled_for"].as_i64(),
        Some(next_eight(send_at, offset))
    );

    let now = now_ms();
    let (tz, offset) = zone_putting(now, 7 * HOUR);
    let send_at = now + 2 * HOUR;
    let morning = host
        .post_event(&event(
            "DIGEST",
            "q-2",
            json!({"attributes": {"tz": tz}, "send_at": rfc3339(send_at)}),
        ))
        .await;
    assert_eq!(
        morning["scheduled_for"].as_i64(),
        Some(send_at),
        "09:00 local is after the quiet hours: {morning}"
    );
    let unscheduled = host
        .post_event(&event("DIGEST", "q-3", json!({"attributes": {"tz": tz}})))
        .await;
    assert_eq!(
        unscheduled["scheduled_for"].as_i64(),
        Some(next_eight(now_ms(), offset)),
        "07:00 local is inside them: {unscheduled}"
    );
    // q-0 (20:00 local) goes out now; the three deferred ones wait.
    wait_until(Duration::from_secs(20), || async {
        !sim.ledger("inbox").is_empty()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: q-0 was not sent; host log:\n{}", host.log()));
    assert_eq!(sim.ledger("inbox").len(), 1, "{:?}", sim.ledger("inbox"));
    for r in [&night, &morning, &unscheduled] {
        let id = r["task_id"].as_str().unwrap();
        let view = host.get(&format!("/v1/tasks/{id}")).await.unwrap();
        assert_eq!(view.body["status"], "queued", "not due yet: {}", view.body);
    }
}

/// Caps are judged at `send_at`. A cap of 1 a day: one event now and one
/// with `send_at` tomorrow are both accepted; a second one tomorrow is
/// capped until the day after, and so is another one today (today and
/// tomorrow are both used). A rolling cap of 1 an hour counts every hour
/// holding the send time: with one message now and one in 2 h, one in
/// 2 h 30 min is capped until an hour after the 2 h one, one in 30 min
/// until an hour after now's, and one in 1 h 30 min (whose hour ends after
/// the 2 h one) too. A re-post of an accepted scheduled event is `duplicate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_are_judged_at_send_at() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path(), "").await;

    let now = now_ms();
    let tomorrow = now.div_euclid(DAY_MS) * DAY_MS + DAY_MS;
    let today = host.post_event(&event("DAILY_TIP", "d-1", json!({}))).await;
    assert_eq!(today["result"], "accepted", "{today}");
    let noon = json!({"send_at": rfc3339(tomorrow + 12 * HOUR)});
    let first = host
        .post_event(&event("DAILY_TIP", "d-2", noon.clone()))
        .await;
    assert_eq!(first["result"], "accepted", "{first}");
    assert_eq!(first["scheduled_for"].as_i64(), Some(tomorrow + 12 * HOUR));
    let second = host
        .post_event(&event_at("DAILY_TIP", "d-3", tomorrow + 13 * HOUR))
        .await;
    assert_eq!(second["result"], "capped", "{second}");
    assert_eq!(second["cap"], "DAILY_TIP/daily");
    assert_eq!(second["next_allowed_at"].as_i64(), Some(tomorrow + DAY_MS));
    let again_today = host.post_event(&event("DAILY_TIP", "d-4", json!({}))).await;
    assert_eq!(again_today["result"], "capped", "{again_today}");
    assert_eq!(
        again_today["next_allowed_at"].as_i64(),
        Some(tomorrow + DAY_MS),
        "tomorrow is taken by the scheduled one: {again_today}"
    );
    let repost = host.post_event(&event("DAILY_TIP", "d-2", noon)).await;
    assert_eq!(repost["result"], "duplicate", "{repost}");
    assert_eq!(repost["task_id"], first["task_id"]);

    let now_one = host
        .post_event(&event("HOURLY_TIP", "h-1", json!({})))
        .await;
    assert_eq!(now_one["result"], "accepted", "{now_one}");
    let view = host
        .get(&format!(
            "/v1/tasks/{}",
            now_one["task_id"].as_str().unwrap()
        ))
        .await
        .unwrap();
    let now_at = view.body["accepted_at"].as_i64().unwrap();
    let in_two = now_at + 2 * HOUR;
    let later = host
        .post_event(&event_at("HOURLY_TIP", "h-2", in_two))
        .await;
    assert_eq!(later["result"], "accepted", "{later}");
    for (biz_id, at, until) in [
        ("h-3", in_two + 30 * MINUTE, in_two + HOUR),
        ("h-4", now_at + 30 * MINUTE, now_at + HOUR),
        ("h-5", now_at + 90 * MINUTE, in_two + HOUR),
    ] {
        let r = host.post_event(&event_at("HOURLY_TIP", biz_id, at)).await;
        assert_eq!(r["result"], "capped", "{biz_id}: {r}");
        assert_eq!(r["cap"], "HOURLY_TIP/hourly");
        assert_eq!(r["next_allowed_at"].as_i64(), Some(until), "{biz_id}: {r}");
    }
    let after = host
        .post_event(&event_at("HOURLY_TIP", "h-6", in_two + HOUR))
        .await;
    assert_eq!(after["result"], "accepted", "{after}");
}

/// A cap counts a message when it is sent, and quiet hours send at their
/// end: with 1 per 6 h and quiet hours 22:00–08:00, an event at 23:00
/// local waits for 08:00; another one for 07:00 local (`send_at`, inside
/// the quiet hours too) would go out at 08:00 with it, so it is capped
/// until 14:00; one for 14:00 is accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_count_a_message_held_by_quiet_hours_at_their_end() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path(), "").await;

    let now = now_ms();
    let (tz, offset) = zone_putting(now, 23 * HOUR);
    let eight = next_eight(now, offset);
    let night = host
        .post_event(&event(
            "NIGHT_TIP",
            "n-1",
            json!({"attributes": {"tz": tz}}),
        ))
        .await;
    assert_eq!(night["result"], "accepted", "{night}");
    assert_eq!(
        night["scheduled_for"].as_i64(),
        Some(eight),
        "tz {tz}: {night}"
    );
    let morning = host
        .post_event(&event(
            "NIGHT_TIP",
            "n-2",
            json!({"attributes": {"tz": tz}, "send_at": rfc3339(eight - HOUR)}),
        ))
        .await;
    assert_eq!(morning["result"], "capped", "tz {tz}: {morning}");
    assert_eq!(morning["cap"], "NIGHT_TIP/six-hourly");
    assert_eq!(
        morning["next_allowed_at"].as_i64(),
        Some(eight + 6 * HOUR),
        "{morning}"
    );
    let afternoon = host
        .post_event(&event(
            "NIGHT_TIP",
            "n-3",
            json!({"attributes": {"tz": tz}, "send_at": rfc3339(eight + 6 * HOUR)}),
        ))
        .await;
    assert_eq!(afternoon["result"], "accepted", "{afternoon}");
    assert_eq!(afternoon["scheduled_for"].as_i64(), Some(eight + 6 * HOUR));
}

/// With `send_at = { grace = "1m", horizon = "2d" }`: a `send_at` two
/// minutes back or three days ahead is 422 naming `send_at` and the bound;
/// text that is not an RFC 3339 time and a number are 422 naming
/// `send_at`; one 30 s back is sent at once; the batch endpoint takes
/// `send_at` per event and refuses a bad one alone; a Bloom-mode channel
/// refuses a `send_at` more than its window ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_at_outside_its_bounds_or_not_a_time_is_refused_naming_it() {
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = "send_at = { grace = \"1m\", horizon = \"2d\" }\n";
    let host = serve(&redis, &sim, dir.path(), extra).await;
    let now = now_ms();
    for (send_at, says) in [
        (
            json!(rfc3339(now - 2 * MINUTE)),
            "in the past; at most 1m (`send_at.grace`",
        ),
        (
            json!(rfc3339(now + 3 * DAY_MS)),
            "ahead; at most 2days (`send_at.horizon`",
        ),
        (json!("tomorrow at nine"), "is not an RFC 3339 time"),
        (json!("2026-12-01 09:00"), "is not an RFC 3339 time"),
        (json!(now + 60_000), ""),
    ] {
        let a = host
            .post(
                "/v1/events",
                &event("REMINDER", "b-1", json!({"send_at": send_at})),
            )
            .await
            .unwrap();
        assert_eq!(a.status, 422, "{send_at}: {}", a.body);
        assert_eq!(a.body["field"], "send_at", "{send_at}: {}", a.body);
        let detail = a.body["detail"].as_str().unwrap();
        assert!(detail.contains(says), "{send_at}: {detail}");
    }
    let late = host
        .post_event(&event_at("REMINDER", "b-2", now - 30_000))
        .await;
    assert_eq!(late["result"], "accepted", "{late}");
    assert!(late.get("scheduled_for").is_none(), "sent at once: {late}");
    wait_until(Duration::from_secs(20), || async {
        !sim.ledger("inbox").is_empty()
    })
    .await
    .expect("a send_at within the grace is sent at once");

    let at = now_ms() + HOUR;
    let batch = json!({"events": [
        event_at("REMINDER", "b-3", at),
        event("REMINDER", "b-4", json!({"send_at": "soon"})),
        event("REMINDER", "b-5", json!({})),
    ]});
    let a = host.post("/v1/events:batch", &batch).await.unwrap();
    assert_eq!(a.status, 200, "{}", a.body);
    let items = &a.body["results"];
    assert_eq!(items[0]["status"], 202, "{}", a.body);
    assert_eq!(
        items[0]["accepted"]["results"][0]["scheduled_for"].as_i64(),
        Some(at),
        "{}",
        a.body
    );
    assert_eq!(items[1]["status"], 422, "{}", a.body);
    assert_eq!(items[1]["problem"]["field"], "send_at", "{}", a.body);
    assert_eq!(items[2]["status"], 202, "{}", a.body);
    assert!(
        items[2]["accepted"]["results"][0]
            .get("scheduled_for")
            .is_none()
    );

    let far = host
        .post(
            "/v1/events",
            &event_at("BROADCAST", "b-6", now_ms() + 2 * HOUR),
        )
        .await
        .unwrap();
    assert_eq!(far.status, 422, "{}", far.body);
    assert_eq!(far.body["field"], "send_at", "{}", far.body);
    assert!(
        far.body["detail"]
            .as_str()
            .unwrap()
            .contains("Bloom filter"),
        "{}",
        far.body
    );
    let near = host
        .post_event(&event_at("BROADCAST", "b-7", now_ms() + 30 * MINUTE))
        .await;
    assert_eq!(near["result"], "accepted", "{near}");
}

/// What an accept over HTTP leaves in Redis for an open message, on a Redis
/// whose `hash-max-listpack-value` holds a payload whole (1024, as the
/// embedded Redis runs): the event's record stores every value whole and
/// stays a listpack (the API's own permit layer used to write 64-byte
/// pieces, never having read the setting); its event text leaves out the
/// business ids the record's name holds, and a look-up shows the event
/// whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_messages_event_record_keeps_its_values_whole() {
    let redis = RedisServer::start().await.unwrap();
    let mut conn = redis.manager().await.unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("hash-max-listpack-value")
        .arg("1024")
        .query_async::<()>(&mut conn)
        .await
        .unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve(&redis, &sim, dir.path(), "").await;
    let note = "a note longer than a 64-byte piece ".repeat(3);
    let body = event(
        "REMINDER",
        "r-whole",
        json!({"send_at": rfc3339(now_ms() + HOUR), "params": {"note": note},
               "attributes": {"note": note}}),
    );
    let r = host.post_event(&body).await;
    assert_eq!(r["result"], "accepted", "{r}");
    let records = redis
        .keys_matching("*:event:REMINDER:r-whole")
        .await
        .unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&records[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        fields.iter().all(|f| !f.starts_with('+')),
        "values in pieces: {fields:?}"
    );
    let encoding: String = redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(&records[0])
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(encoding, "listpack");
    let text: String = redis::cmd("HGET")
        .arg(&records[0])
        .arg("e1")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        !text.contains("r-whole") && !text.contains("REMINDER"),
        "{text}"
    );
    let id = r["task_id"].as_str().unwrap();
    let view = host.get(&format!("/v1/tasks/{id}")).await.unwrap();
    let shown = &view.body["event"];
    assert_eq!(shown["biz_type"], "REMINDER", "{}", view.body);
    assert_eq!(shown["biz_id"], "r-whole", "{}", view.body);
    assert_eq!(shown["user_id"], "u-7", "{}", view.body);
    assert_eq!(shown["attributes"]["note"], note.as_str(), "{}", view.body);
}
