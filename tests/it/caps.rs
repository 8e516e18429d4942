//! Frequency caps and quiet hours against a real redis-server: N+1 messages
//! in a window give N accepted and one capped with the time the next one is
//! allowed; the window slides; a thousand concurrent accepts from two
//! instances never pass the cap; a calendar cap starts again at the
//! recipient's midnight; quiet hours schedule the first attempt for their
//! end (and the dispatcher sends it then); over the HTTP API a cap group is
//! shared by two business types, a re-post stays `duplicate`, and urgent
//! events skip the quiet hours. Times come from the current clock (offsets
//! chosen so the recipient's midnight or quiet end is near): no sleeps.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pushonce::caps::DAY_MS;
use pushonce::permit::{
    AcceptRequest, Acceptance, CapCheck, CapPeriod, Gate, Permits, QuietCheck, TaskStatus,
};
use pushonce::send::Faults;
use pushonce_tests::dispatcher::RunningDispatcher;
use pushonce_tests::fixtures::{accept_request, permit_config};
use pushonce_tests::host::{Setup, TestHost};
use pushonce_tests::process::read_ledger;
use pushonce_tests::redis::RedisServer;
use pushonce_tests::wait_until;
use redis::AsyncCommands;
use serde_json::{Value, json};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn cap(name: &str, subject: &str, max: u32, period: CapPeriod) -> CapCheck {
    CapCheck {
        name: name.into(),
        subject: subject.into(),
        max,
        period,
    }
}

fn gated(key: &str, gate: Gate) -> AcceptRequest {
    AcceptRequest {
        gate,
        ..accept_request(key)
    }
}

fn capped_by(c: &CapCheck) -> Gate {
    Gate {
        caps: vec![c.clone()],
        quiet: None,
        bloom: None,
        digest: None,
    }
}

async fn accepted_at(permits: &Permits, task_id: &str) -> i64 {
    permits.task(task_id).await.unwrap().unwrap().accepted_at_ms as i64
}

fn accepted(a: &Acceptance) -> String {
    match a {
        Acceptance::Accepted { task_id } => task_id.clone(),
        other => panic!("expected accepted, got {other:?}"),
    }
}

fn next_allowed(a: &Acceptance, name: &str) -> i64 {
    match a {
        Acceptance::Capped {
            cap,
            next_allowed_ms,
        } => {
            assert_eq!(cap, name);
            *next_allowed_ms as i64
        }
        other => panic!("expected capped by {name}, got {other:?}"),
    }
}

/// Accepts `req` again and again until it is accepted (within 5 s); returns the answer.
async fn accept_when_allowed(permits: &Permits, req: &AcceptRequest) -> String {
    let last = std::sync::Arc::new(std::sync::Mutex::new(None));
    let got = wait_until(Duration::from_secs(5), || {
        let permits = permits.clone();
        let req = req.clone();
        let last = last.clone();
        async move {
            let a = permits.accept(&req).await.unwrap();
            let ok = matches!(a, Acceptance::Accepted { .. });
            *last.lock().unwrap() = Some(a);
            ok
        }
    })
    .await;
    let last = last.lock().unwrap().clone();
    got.unwrap_or_else(|e| panic!("{e}: last answer {last:?}"));
    accepted(last.as_ref().unwrap())
}

/// Three of four messages in a 2 s window pass (the first a second before
/// the others); the fourth is capped until
/// the first leaves the window, takes no permit and enqueues nothing; a
/// re-post of an accepted key stays `duplicate`; once the window slid past
/// the first message the fourth is accepted, and a fifth is capped until
/// the second leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_plus_one_in_the_window_gives_n_accepted_and_one_capped_then_the_window_slides() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    let window = 2000;
    let c = cap(
        "burst",
        "u-1:sms",
        3,
        CapPeriod::Rolling(Duration::from_millis(window)),
    );
    let mut ids = Vec::new();
    for i in 0..3 {
        let a = permits
            .accept(&gated(&format!("k-{i}"), capped_by(&c)))
            .await
            .unwrap();
        ids.push(accepted(&a));
        if i == 0 {
            // The second and third come a second later, so the window
            // slides past the first well before them.
            let first_at = accepted_at(&permits, &ids[0]).await;
            wait_until(Duration::from_secs(5), || async move {
                now_ms() >= first_at + 1000
            })
            .await
            .unwrap();
        }
    }
    let fourth = gated("k-3", capped_by(&c));
    let answer = permits.accept(&fourth).await.unwrap();
    let first_at = accepted_at(&permits, &ids[0]).await;
    assert_eq!(next_allowed(&answer, "burst"), first_at + window as i64);
    assert_eq!(permits.permit_owner("k-3").await.unwrap(), None);
    let shard = permits.layout().shard_of("k-3");
    let mut conn = server.manager().await.unwrap();
    let entries: Vec<i64> = {
        let mut v = Vec::new();
        for s in 0..permits.layout().shards() {
            v.push(conn.xlen(permits.layout().ready(s)).await.unwrap());
        }
        v
    };
    assert_eq!(
        entries.iter().sum::<i64>(),
        3,
        "one stream entry per accepted message"
    );
    let _ = shard;

    let again = permits.accept(&gated("k-0", capped_by(&c))).await.unwrap();
    assert!(
        matches!(&again, Acceptance::Duplicate { task_id, .. } if *task_id == ids[0]),
        "a re-post of an accepted key is a duplicate, not capped: {again:?}"
    );

    let fourth_id = accept_when_allowed(&permits, &fourth).await;
    assert!(accepted_at(&permits, &fourth_id).await >= first_at + window as i64);
    let fifth = permits.accept(&gated("k-4", capped_by(&c))).await.unwrap();
    let second_at = accepted_at(&permits, &ids[1]).await;
    assert_eq!(next_allowed(&fifth, "burst"), second_at + window as i64);
}

/// A thousand different messages to one user at once, half through each of
/// two instances (own connections), under a cap of three: exactly three
/// are accepted, three permits taken, three stream entries written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_accepts_from_two_instances_take_exactly_the_cap() {
    let server = RedisServer::start().await.unwrap();
    let a = server.permits(permit_config()).await.unwrap();
    let b = server.permits(permit_config()).await.unwrap();
    let c = cap(
        "marketing",
        "u-9",
        3,
        CapPeriod::Rolling(Duration::from_secs(3600)),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let permits = if i % 2 == 0 { a.clone() } else { b.clone() };
        let req = gated(&format!("m-{i}"), capped_by(&c));
        tasks.spawn(async move { permits.accept(&req).await.unwrap() });
    }
    let answers = tasks.join_all().await;
    let ok = answers
        .iter()
        .filter(|x| matches!(x, Acceptance::Accepted { .. }))
        .count();
    let capped = answers
        .iter()
        .filter(|x| matches!(x, Acceptance::Capped { cap, .. } if cap == "marketing"))
        .count();
    assert_eq!((ok, capped), (3, 997));
    let mut conn = server.manager().await.unwrap();
    let counted: i64 = conn
        .zcard(a.layout().cap("marketing", "u-9", "u-9"))
        .await
        .unwrap();
    assert_eq!(counted, 3);
    let mut entries = 0;
    for s in 0..a.layout().shards() {
        let n: i64 = conn.xlen(a.layout().ready(s)).await.unwrap();
        entries += n;
    }
    assert_eq!(entries, 3);
}

/// A per-day cap for a recipient whose local time is 1.5 s before
/// midnight: two pass, the third is capped until exactly their midnight,
/// and is accepted once it has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_cap_starts_again_at_the_recipients_midnight() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    let now = now_ms();
    // Local time = UTC + offset = 23:59:58.500.
    let offset_ms = (DAY_MS - 1500 - now.rem_euclid(DAY_MS)).rem_euclid(DAY_MS);
    let midnight = ((now + offset_ms).div_euclid(DAY_MS) + 1) * DAY_MS - offset_ms;
    let c = cap("daily", "u-7:sms", 2, CapPeriod::Day { offset_ms });
    for i in 0..2 {
        accepted(
            &permits
                .accept(&gated(&format!("d-{i}"), capped_by(&c)))
                .await
                .unwrap(),
        );
    }
    let third = gated("d-2", capped_by(&c));
    let answer = permits.accept(&third).await.unwrap();
    assert_eq!(next_allowed(&answer, "daily"), midnight);
    let id = accept_when_allowed(&permits, &third).await;
    assert!(accepted_at(&permits, &id).await >= midnight);
}

/// An event at 23:00 local under quiet hours 22:00–08:00 is accepted, not
/// enqueued, its first attempt due at 08:00 local (in the shard's delayed
/// set, `scheduled_for` in the task); one whose quiet time ends 1.5 s from
/// now is sent by the dispatcher then, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_hours_schedule_the_first_attempt_for_their_end() {
    let server = RedisServer::start().await.unwrap();
    let permits = server.permits(permit_config()).await.unwrap();
    let hour = 3_600_000;
    let now = now_ms();
    let offset_ms = (23 * hour - now.rem_euclid(DAY_MS)).rem_euclid(DAY_MS);
    let eight = ((now + offset_ms).div_euclid(DAY_MS) + 1) * DAY_MS + 8 * hour - offset_ms;
    let night = Gate {
        caps: Vec::new(),
        quiet: Some(QuietCheck {
            offset_ms,
            from_ms: 22 * hour,
            to_ms: 8 * hour,
        }),
        bloom: None,
        digest: None,
    };
    let answer = permits.accept(&gated("q-night", night)).await.unwrap();
    let Acceptance::Deferred {
        task_id,
        scheduled_for_ms,
    } = answer
    else {
        panic!("expected deferred, got {answer:?}");
    };
    assert_eq!(scheduled_for_ms as i64, eight);
    let task = permits.task(&task_id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Queued);
    assert_eq!(task.fields["scheduled_for"], eight.to_string());
    let shard = permits.layout().shard_of("q-night");
    let mut conn = server.manager().await.unwrap();
    let due: Option<f64> = conn
        .zscore(permits.layout().delayed(shard), &task_id)
        .await
        .unwrap();
    assert_eq!(due, Some(eight as f64));
    let entries: i64 = conn.xlen(permits.layout().ready(shard)).await.unwrap();
    assert_eq!(entries, 0, "a deferred task is not in the ready stream");

    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger.jsonl");
    let dispatcher = RunningDispatcher::start(
        server.client(),
        permits.clone(),
        &ledger,
        Faults::default(),
        2,
        Duration::from_secs(2),
    );
    let now = now_ms();
    let t = now.rem_euclid(DAY_MS);
    let soon = Gate {
        caps: Vec::new(),
        quiet: Some(QuietCheck {
            offset_ms: 0,
            from_ms: (t - 60_000).rem_euclid(DAY_MS),
            to_ms: (t + 1500).rem_euclid(DAY_MS),
        }),
        bloom: None,
        digest: None,
    };
    let answer = permits.accept(&gated("q-soon", soon)).await.unwrap();
    let Acceptance::Deferred {
        scheduled_for_ms, ..
    } = answer
    else {
        panic!("expected deferred, got {answer:?}");
    };
    wait_until(Duration::from_secs(10), || {
        let ledger = ledger.clone();
        async move { read_ledger(&ledger).iter().any(|l| l.key == "q-soon") }
    })
    .await
    .expect("the deferred task is sent when the quiet time ends");
    let lines = read_ledger(&ledger);
    let sent = lines.iter().find(|l| l.key == "q-soon").unwrap();
    assert!(
        sent.at_ms >= scheduled_for_ms,
        "sent at {} before the quiet time ended at {scheduled_for_ms}",
        sent.at_ms
    );
    assert!(
        lines.iter().all(|l| l.key != "q-night"),
        "the 08:00 task is not sent"
    );
    dispatcher.stop().await;
}

const CAPPED_A: &str = r#"
biz_type = "PROMO_A"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
cap_groups = ["marketing"]
"#;

const CAPPED_B: &str = r#"
biz_type = "PROMO_B"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
cap_groups = ["marketing"]

[caps.hourly]
max = 5
window = "1h"
"#;

const QUIET: &str = r#"
biz_type = "DIGEST"
key_policy = "per-event@^1"
channels = ["inbox"]
window = "1h"
tz = "+08:00"
tz_attribute = "tz"
urgent_attribute = "urgent"
quiet = { from = "22:00", to = "08:00" }
"#;

fn event(biz_type: &str, biz_id: &str, attributes: Value) -> Value {
    json!({
        "biz_type": biz_type,
        "biz_id": biz_id,
        "user_id": "u-5",
        "occurred_at": "2026-11-30T15:59:59Z",
        "attributes": attributes,
    })
}

async fn host_with_caps(redis: &RedisServer) -> TestHost {
    let setup = Setup {
        policies: Some(vec![
            ("promo-a.toml".into(), CAPPED_A.into()),
            ("promo-b.toml".into(), CAPPED_B.into()),
            ("digest.toml".into(), QUIET.into()),
        ]),
        configure: Some(Box::new(|c| {
            c.caps.insert(
                "marketing".into(),
                pushonce::caps::CapSpec {
                    max: 2,
                    window: Some(Duration::from_secs(3600)),
                    per_day: false,
                    scope: pushonce::caps::CapScope::User,
                },
            );
        })),
        ..Setup::default()
    };
    TestHost::start_with(redis, setup).await.unwrap()
}

/// The cap group `marketing` (2 per user per hour) counts both business
/// types: one of each passes, the third is answered `capped` naming the
/// group with when the next is allowed (an hour after the first); a
/// re-post of the first event stays `duplicate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_capped_with_the_cap_and_a_repost_stays_duplicate() {
    let redis = RedisServer::start().await.unwrap();
    let host = host_with_caps(&redis).await;
    let first = host
        .post("/v1/events", &event("PROMO_A", "p-1", json!({})), None)
        .await
        .unwrap();
    assert_eq!(first.status, 202, "{}", first.body);
    assert_eq!(first.body["results"][0]["result"], "accepted");
    let first_task = first.body["results"][0]["task_id"].as_str().unwrap();
    let second = host
        .post("/v1/events", &event("PROMO_B", "p-2", json!({})), None)
        .await
        .unwrap();
    assert_eq!(
        second.body["results"][0]["result"], "accepted",
        "{}",
        second.body
    );
    let third = host
        .post("/v1/events", &event("PROMO_A", "p-3", json!({})), None)
        .await
        .unwrap();
    let r = &third.body["results"][0];
    assert_eq!(r["result"], "capped", "{}", third.body);
    assert_eq!(r["cap"], "marketing");
    let view = host
        .get(&format!("/v1/tasks/{first_task}"), None)
        .await
        .unwrap();
    let first_at = view.body["accepted_at"].as_u64().unwrap();
    assert_eq!(r["next_allowed_at"].as_u64().unwrap(), first_at + 3_600_000);
    let again = host
        .post("/v1/events", &event("PROMO_A", "p-1", json!({})), None)
        .await
        .unwrap();
    assert_eq!(
        again.body["results"][0]["result"], "duplicate",
        "{}",
        again.body
    );
    assert_eq!(again.body["results"][0]["task_id"], first_task);
}

/// An event at 23:00 in the recipient's zone (named by the event's `tz`
/// attribute) is accepted with `scheduled_for` at their 08:00, shown in the
/// task view; an urgent one is not held back; a malformed zone is refused
/// naming the attribute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_hours_over_the_api_and_urgent_events_bypass() {
    let redis = RedisServer::start().await.unwrap();
    let host = host_with_caps(&redis).await;
    let hour = 3_600_000;
    let now = now_ms();
    // A whole-minute offset in -12h..+12h that puts local time in 23:00..23:01.
    let minute = 60_000;
    let mut offset = (23 * hour - now.rem_euclid(DAY_MS)).div_euclid(minute) * minute;
    offset = (offset + 12 * hour).rem_euclid(DAY_MS) - 12 * hour;
    let tz = format!(
        "{}{:02}:{:02}",
        if offset < 0 { '-' } else { '+' },
        offset.abs() / hour,
        offset.abs() % hour / minute
    );
    let eight = ((now + offset).div_euclid(DAY_MS) + 1) * DAY_MS + 8 * hour - offset;
    let night = host
        .post(
            "/v1/events",
            &event("DIGEST", "d-1", json!({"tz": tz})),
            None,
        )
        .await
        .unwrap();
    let r = &night.body["results"][0];
    assert_eq!(r["result"], "accepted", "{}", night.body);
    assert_eq!(
        r["scheduled_for"].as_i64(),
        Some(eight),
        "tz {tz}: {}",
        night.body
    );
    let view = host
        .get(
            &format!("/v1/tasks/{}", r["task_id"].as_str().unwrap()),
            None,
        )
        .await
        .unwrap();
    assert_eq!(view.body["scheduled_for"].as_i64(), Some(eight));
    assert_eq!(view.body["status"], "queued");

    let urgent = host
        .post(
            "/v1/events",
            &event("DIGEST", "d-2", json!({"tz": tz, "urgent": "true"})),
            None,
        )
        .await
        .unwrap();
    let r = &urgent.body["results"][0];
    assert_eq!(r["result"], "accepted", "{}", urgent.body);
    assert!(r.get("scheduled_for").is_none(), "{}", urgent.body);

    let bad = host
        .post(
            "/v1/events",
            &event("DIGEST", "d-3", json!({"tz": "Mars/Olympus"})),
            None,
        )
        .await
        .unwrap();
    assert_eq!(bad.status, 422, "{}", bad.body);
    assert_eq!(bad.body["field"], "attributes.tz", "{}", bad.body);
}

/// `pushonce keys` on an event routed through the repository's policies and
/// configuration, asking the accept script of `redis` (a dry run).
fn keys_cli(redis: &RedisServer, dir: &std::path::Path, biz_id: &str) -> String {
    keys_cli_for(redis, dir, "JOB_RECOMMENDATION", biz_id)
}

fn keys_cli_for(
    redis: &RedisServer,
    dir: &std::path::Path,
    biz_type: &str,
    biz_id: &str,
) -> String {
    let root = pushonce_tests::host::repo_root();
    let event = dir.join(format!("{biz_id}.json"));
    let text = json!({
        "biz_type": biz_type, "biz_id": biz_id, "user_id": "u-9",
        "occurred_at": "2026-11-30T15:59:59Z", "attributes": {"tz": "+08:00"},
    });
    std::fs::write(&event, text.to_string()).unwrap();
    // The repository's configuration with the test host's shard count: the
    // command must see the keys where the host put them.
    let config = dir.join("pushonce.toml");
    let text = std::fs::read_to_string(root.join("pushonce.toml")).unwrap();
    std::fs::write(&config, text.replace("shards = 16", "shards = 4")).unwrap();
    let out = std::process::Command::new(pushonce_tests::process::pushonce_bin().unwrap())
        .arg("keys")
        .arg("--config")
        .arg(&config)
        .arg("--event")
        .arg(&event)
        .args(["--redis", &redis.url()])
        .env("PUSHONCE_PLUGIN_DIR", pushonce_tests::plugins::real_dir())
        .env("PUSHONCE_POLICY_DIR", root.join("policies"))
        .env("PUSHONCE_DATA_DIR", dir.join("data"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The table line of `channel`.
fn line_of<'a>(table: &'a str, channel: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(&format!("{channel} ")))
        .unwrap_or_else(|| panic!("no {channel} line in\n{table}"))
}

/// `pushonce keys` shows each channel's caps and what the accept would
/// answer: accepted while the caps have room, a re-post `duplicate`, and
/// once three events took five messages (the third's app-push was capped)
/// `capped` by the all-channels cap (5 a day) until the recipient's next
/// midnight; asking writes nothing (the same answer twice). Under a bloom
/// policy a key in the filter is `duplicate`, and a dry run sets no bits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keys_command_shows_what_a_cap_would_answer() {
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let before = keys_cli(&redis, dir.path(), "j-1");
    let inbox = line_of(&before, "inbox");
    assert!(
        inbox.contains("per-channel ≤3 per day at +08:00"),
        "{before}"
    );
    assert!(
        inbox.contains("all-channels ≤5 per day at +08:00"),
        "{before}"
    );
    assert!(inbox.ends_with("accepted"), "{before}");
    assert_eq!(
        keys_cli(&redis, dir.path(), "j-1"),
        before,
        "a dry run writes nothing"
    );
    let mut first = String::new();
    for biz_id in ["j-1", "j-2", "j-3"] {
        let job = json!({
            "biz_type": "JOB_RECOMMENDATION", "biz_id": biz_id, "user_id": "u-9",
            "occurred_at": "2026-11-30T15:59:59Z", "attributes": {"tz": "+08:00"},
            "recipients": {"app-push": "token-9"},
        });
        let a = host.post("/v1/events", &job, None).await.unwrap();
        assert_eq!(a.status, 202, "{}", a.body);
        if first.is_empty() {
            let inbox = a.body["results"].as_array().unwrap().iter();
            let inbox = inbox.clone().find(|r| r["channel"] == "inbox").unwrap();
            first = inbox["task_id"].as_str().unwrap().to_string();
        }
    }
    let again = keys_cli(&redis, dir.path(), "j-1");
    assert!(
        line_of(&again, "inbox").contains(&format!("duplicate of {first}")),
        "{again}"
    );
    let fourth = keys_cli(&redis, dir.path(), "j-4");
    let local_midnight = (now_ms() + 8 * 3_600_000) / DAY_MS * DAY_MS + DAY_MS - 8 * 3_600_000;
    let until = humantime::format_rfc3339_seconds(
        UNIX_EPOCH + Duration::from_millis(local_midnight as u64),
    )
    .to_string();
    assert!(
        line_of(&fourth, "inbox").ends_with(&format!(
            "capped by JOB_RECOMMENDATION/all-channels until {until}"
        )),
        "{fourth}"
    );
    // A bloom policy: a key in the filter is a duplicate; a dry run sets no bits.
    let broadcast = json!({
        "biz_type": "SYSTEM_BROADCAST", "biz_id": "b-1", "user_id": "u-9",
        "occurred_at": "2026-11-30T15:59:59Z",
    });
    let a = host.post("/v1/events", &broadcast, None).await.unwrap();
    assert_eq!(a.status, 202, "{}", a.body);
    let seen = keys_cli_for(&redis, dir.path(), "SYSTEM_BROADCAST", "b-1");
    assert!(
        line_of(&seen, "inbox").ends_with("duplicate (its key is in the bloom filter)"),
        "{seen}"
    );
    for _ in 0..2 {
        let new = keys_cli_for(&redis, dir.path(), "SYSTEM_BROADCAST", "b-2");
        assert!(line_of(&new, "inbox").ends_with("accepted"), "{new}");
    }
    host.shutdown().await.unwrap();
}
