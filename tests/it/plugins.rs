//! Plugin runtime tests on the real built plugins (`plugins/`) and the
//! test-only plugins (`tests/fixtures/plugins/`), built by `build.rs`: key
//! policies, key composition, semver resolution, refused files, limits (loop,
//! memory bomb, panic, forbidden imports) and the disk cache.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pushonce::derive::{DeriveError, derive};
use pushonce::event::event_from_json;
use pushonce::plugin::{CallError, LoadError, PluginRegistry, ResolveError};
use pushonce_tests::plugins::*;

/// 2026-11-30T15:59:59Z: 23:59:59 on Nov 30 at +08:00.
const LAST_SECOND_OF_DAY_AT_8: u64 = 1_796_054_399_000;
/// One second later: 00:00:00 on Dec 1 at +08:00, still Nov 30 in UTC.
const FIRST_SECOND_OF_NEXT_DAY_AT_8: u64 = LAST_SECOND_OF_DAY_AT_8 + 1000;

fn key(
    registry: &PluginRegistry,
    policy: &str,
    event: &pushonce::event::Event,
    channel: &str,
    params: &[(String, String)],
) -> Result<String, DeriveError> {
    let plugin = registry
        .resolve_key_policy(policy)
        .expect("policy resolves");
    derive(&plugin, event, channel, params).map(|k| k.key)
}

#[test]
fn the_real_plugins_load_and_describe_themselves() {
    let registry = real_registry(None);
    let mut ids: Vec<String> = registry
        .plugins()
        .iter()
        .map(|p| p.meta().id.clone())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "aliyun-sms@2.2.0",
            "apns@2.0.0",
            "fcm@2.0.0",
            "inbox@2.0.0",
            "per-event@1.0.0",
            "per-user-per-day@1.0.0",
            "per-user-per-job@1.0.0",
            "ses-email@1.2.0",
            "tencent-sms@1.1.0",
            "webhook@2.1.0",
            "wechat@2.3.0"
        ]
    );
    for p in registry.plugins() {
        let world = if p.meta().name.starts_with("per-") {
            "key-policy"
        } else {
            "channel"
        };
        assert_eq!(p.meta().world.to_string(), world);
        assert!(!p.meta().description.is_empty());
    }
    // Contract 2.2's optional `extras`: the email channel takes the
    // unsubscribe link, the SMS channel does not (both take opt-outs).
    let email = registry.resolve_channel("ses-email@^1").unwrap();
    let sms = registry.resolve_channel("aliyun-sms@^2").unwrap();
    assert!(email.takes_extras() && email.takes_opt_outs());
    assert!(!sms.takes_extras() && sms.takes_opt_outs());
}

#[test]
fn keys_are_deterministic_over_many_calls_and_across_registries() {
    let first = real_registry(None);
    let second = real_registry(None);
    let event = event("u-42", LAST_SECOND_OF_DAY_AT_8, &[("job_id", "job-7")]);
    for (policy, params) in [
        ("per-event@^1", params(&[])),
        ("per-user-per-day@^1", params(&[("tz", "+08:00")])),
        ("per-user-per-job@^1", params(&[])),
    ] {
        let expected = key(&first, policy, &event, "sms", &params).unwrap();
        for _ in 0..1000 {
            assert_eq!(
                key(&first, policy, &event, "sms", &params).unwrap(),
                expected
            );
        }
        assert_eq!(
            key(&second, policy, &event, "sms", &params).unwrap(),
            expected
        );
    }
}

#[test]
fn per_event_key_is_composed_with_policy_major_and_channel() {
    let registry = real_registry(None);
    let event = event("u-42", LAST_SECOND_OF_DAY_AT_8, &[]);
    assert_eq!(
        key(&registry, "per-event@^1", &event, "sms", &[]).unwrap(),
        "push:per-event@1:sms:ORDER_SHIPPED:o-1:u-42"
    );
    assert_eq!(
        key(&registry, "per-event@^1", &event, "app-push", &[]).unwrap(),
        "push:per-event@1:app-push:ORDER_SHIPPED:o-1:u-42"
    );
    let plugin = registry.resolve_key_policy("per-event").unwrap();
    let derived = derive(&plugin, &event, "inbox", &[]).unwrap();
    assert_eq!(derived.plugin, "per-event@1.0.0");
    assert_eq!(derived.window_secs, None);
    // Another event of the same user and type gets another key.
    let mut other = event.clone();
    other.biz_id = "o-2".into();
    assert_ne!(
        key(&registry, "per-event", &other, "sms", &[]).unwrap(),
        key(&registry, "per-event", &event, "sms", &[]).unwrap()
    );
}

#[test]
fn long_parts_are_hashed_and_unsafe_bytes_escaped() {
    let registry = real_registry(None);
    let long_user = "u".repeat(5000);
    let k = key(
        &registry,
        "per-event",
        &event(&long_user, 0, &[]),
        "sms",
        &[],
    )
    .unwrap();
    let body = k.strip_prefix("push:per-event@1:sms:").unwrap();
    let user_part = body.rsplit(':').next().unwrap();
    assert_eq!(user_part.len(), 33, "{k}");
    assert!(user_part.starts_with('='), "{k}");
    assert!(k.len() <= "push:per-event@1:sms:".len() + 200, "{k}");

    let k = key(
        &registry,
        "per-event",
        &event("John Doe:1\n", 0, &[]),
        "sms",
        &[],
    )
    .unwrap();
    assert_eq!(
        k,
        "push:per-event@1:sms:ORDER_SHIPPED:o-1:John+20Doe+3A1+0A"
    );
    // Escaping is injective: the escaped text itself gives another key.
    let k2 = key(
        &registry,
        "per-event",
        &event("John+20Doe+3A1+0A", 0, &[]),
        "sms",
        &[],
    )
    .unwrap();
    assert_ne!(k, k2);
    // Every key is safe for Redis: no spaces or control bytes.
    for k in [&k, &k2] {
        assert!(k.bytes().all(|b| b.is_ascii_graphic()), "{k}");
    }
    // Long values differing only at the end still get different keys.
    let a = key(
        &registry,
        "per-event",
        &event(&format!("{long_user}a"), 0, &[]),
        "sms",
        &[],
    );
    let b = key(
        &registry,
        "per-event",
        &event(&format!("{long_user}b"), 0, &[]),
        "sms",
        &[],
    );
    assert_ne!(a.unwrap(), b.unwrap());
}

#[test]
fn per_user_per_day_follows_the_calendar_day_of_the_timezone() {
    let registry = real_registry(None);
    let tz8 = params(&[("tz", "+08:00")]);
    let late = event("u-42", LAST_SECOND_OF_DAY_AT_8, &[]);
    let next = event("u-42", FIRST_SECOND_OF_NEXT_DAY_AT_8, &[]);
    let policy = "per-user-per-day@^1";
    assert_eq!(
        key(&registry, policy, &late, "sms", &tz8).unwrap(),
        "push:per-user-per-day@1:sms:u-42:2026-11-30"
    );
    assert_eq!(
        key(&registry, policy, &next, "sms", &tz8).unwrap(),
        "push:per-user-per-day@1:sms:u-42:2026-12-01"
    );
    // The same two instants are one UTC day (the default timezone).
    assert_eq!(
        key(&registry, policy, &late, "sms", &[]).unwrap(),
        key(&registry, policy, &next, "sms", &[]).unwrap()
    );
    // Other events of the same user on the same local day share the key.
    let mut same_day = event("u-42", LAST_SECOND_OF_DAY_AT_8 - 3600 * 1000 * 20, &[]);
    same_day.biz_id = "o-99".into();
    assert_eq!(
        key(&registry, policy, &same_day, "sms", &tz8).unwrap(),
        key(&registry, policy, &late, "sms", &tz8).unwrap()
    );
    // A negative offset moves the day the other way.
    assert_eq!(
        key(
            &registry,
            policy,
            &late,
            "sms",
            &params(&[("tz", "-05:00")])
        )
        .unwrap(),
        "push:per-user-per-day@1:sms:u-42:2026-11-30"
    );
}

#[test]
fn per_user_per_day_bad_timezone_is_an_error_naming_the_param() {
    let registry = real_registry(None);
    let err = key(
        &registry,
        "per-user-per-day",
        &event("u-42", 0, &[]),
        "sms",
        &params(&[("tz", "Asia/Shanghai")]),
    )
    .unwrap_err();
    let DeriveError::Call(CallError::Refused { plugin, message }) = &err else {
        panic!("expected the plugin's refusal, got {err:?}");
    };
    assert_eq!(plugin, "per-user-per-day@1.0.0");
    assert!(message.contains("param `tz`"), "{message}");
    assert!(message.contains("Asia/Shanghai"), "{message}");
    assert!(
        err.to_string()
            .starts_with("plugin per-user-per-day@1.0.0 refused the input")
    );
}

#[test]
fn per_user_per_job_keys_by_job_and_names_a_missing_attribute() {
    let registry = real_registry(None);
    let policy = "per-user-per-job@^1";
    let job7 = event("u-42", 0, &[("job_id", "job-7")]);
    let mut job7_again = event("u-42", 999_999, &[("job_id", "job-7")]);
    job7_again.biz_id = "o-2".into();
    let job8 = event("u-42", 0, &[("job_id", "job-8")]);
    let k7 = key(&registry, policy, &job7, "sms", &[]).unwrap();
    assert_eq!(k7, "push:per-user-per-job@1:sms:u-42:job=job-7");
    assert_eq!(key(&registry, policy, &job7_again, "sms", &[]).unwrap(), k7);
    assert_ne!(key(&registry, policy, &job8, "sms", &[]).unwrap(), k7);

    // The attribute name comes from `job_attr`.
    let by_resume = event("u-42", 0, &[("resume_id", "r-1")]);
    let p = params(&[("job_attr", "resume_id")]);
    assert_eq!(
        key(&registry, policy, &by_resume, "sms", &p).unwrap(),
        "push:per-user-per-job@1:sms:u-42:job=r-1"
    );
    let err = key(&registry, policy, &by_resume, "sms", &[]).unwrap_err();
    assert!(
        err.to_string().contains("event attribute `job_id`"),
        "{err}"
    );
    let err = key(&registry, policy, &job7, "sms", &p).unwrap_err();
    assert!(
        err.to_string().contains("event attribute `resume_id`")
            && err.to_string().contains("missing"),
        "{err}"
    );
}

#[test]
fn bad_channels_are_refused_before_the_plugin_runs() {
    let registry = real_registry(None);
    let err = key(&registry, "per-event", &event("u", 0, &[]), "SMS:x", &[]).unwrap_err();
    assert!(matches!(err, DeriveError::BadChannel { .. }), "{err:?}");
    assert!(err.to_string().contains("`SMS:x`"), "{err}");
}

#[test]
fn semver_resolution_picks_the_highest_matching_version() {
    let registry = registry_of(
        &[
            fixture("versioned_1_0_0"),
            fixture("versioned_1_2_0"),
            fixture("versioned_1_3_1"),
            fixture("versioned_2_0_0"),
        ],
        None,
    );
    let version_of = |spec: &str| {
        let p = registry.resolve_key_policy(spec).unwrap();
        // The plugin that answers is the one resolved.
        let k = derive(&p, &event("u", 0, &[]), "sms", &[]).unwrap();
        assert!(
            k.key.contains(&format!(":v{}:", p.meta().version)),
            "{}",
            k.key
        );
        assert!(
            k.key
                .starts_with(&format!("push:versioned@{}:", p.meta().version.major))
        );
        p.meta().version.to_string()
    };
    assert_eq!(version_of("versioned@^1"), "1.3.1");
    assert_eq!(version_of("versioned@^1.2"), "1.3.1");
    assert_eq!(version_of("versioned@~1.2"), "1.2.0");
    assert_eq!(version_of("versioned@=1.0.0"), "1.0.0");
    assert_eq!(version_of("versioned@>=1.1, <1.3"), "1.2.0");
    assert_eq!(version_of("versioned@*"), "2.0.0");
    assert_eq!(version_of("versioned"), "2.0.0");

    let err = registry.resolve_key_policy("versioned@^3").err().unwrap();
    assert_eq!(
        err.to_string(),
        "no version of `versioned` matches `^3` (available: 1.0.0, 1.2.0, 1.3.1, 2.0.0)"
    );
    let err = registry.resolve_key_policy("per-event@^1").err().unwrap();
    assert!(matches!(err, ResolveError::UnknownName { .. }));
    assert_eq!(
        err.to_string(),
        "no key-policy plugin named `per-event` is loaded (known: versioned)"
    );
    let err = registry.resolve_key_policy("versioned@one").err().unwrap();
    assert!(matches!(err, ResolveError::BadSpec { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("`one` is not a semver requirement"),
        "{err}"
    );
    let err = registry.resolve_key_policy("Versioned@1").err().unwrap();
    assert!(err.to_string().contains("is not a plugin name"), "{err}");
}

#[test]
fn bad_files_are_refused_with_a_reason_and_good_ones_still_load() {
    // Deterministic "random" bytes (an LCG): not WebAssembly.
    let mut x: u32 = 12345;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (x >> 16) as u8
        })
        .collect();
    let core = wat::parse_str(r#"(module (func (export "derive-key") (result i32) i32.const 0))"#)
        .unwrap();
    let mut truncated = std::fs::read(real("per_event")).unwrap();
    truncated.truncate(truncated.len() / 2);
    let per_event = std::fs::read(real("per_event")).unwrap();
    let wrong = std::fs::read(fixture("wrong_world")).unwrap();
    let dir = dir_with(&[
        ("random.wasm", &random),
        ("core.wasm", &core),
        ("truncated.wasm", &truncated),
        ("wrong_world.wasm", &wrong),
        ("a_per_event.wasm", &per_event),
        ("b_per_event_copy.wasm", &per_event),
        ("notes.txt", b"not a plugin, not looked at"),
    ]);
    let (registry, refused) = PluginRegistry::load_dir(dir.path(), &limits(), None).unwrap();
    assert_eq!(refused.len(), 5, "{refused:#?}");

    let msg = |name: &str| refusal_of(&refused, name).to_string();
    assert!(
        msg("random.wasm").ends_with("random.wasm: is not WebAssembly (no `\\0asm` header)"),
        "{}",
        msg("random.wasm")
    );
    assert!(matches!(
        refusal_of(&refused, "core.wasm"),
        LoadError::CoreModule { .. }
    ));
    assert!(
        msg("core.wasm").ends_with("core.wasm: is a core wasm module, not a component (build the plugin for `wasm32-wasip2`)"),
        "{}",
        msg("core.wasm")
    );
    assert!(
        msg("truncated.wasm").contains("truncated.wasm: is not a valid component"),
        "{}",
        msg("truncated.wasm")
    );
    assert!(matches!(
        refusal_of(&refused, "wrong_world.wasm"),
        LoadError::WrongWorld { .. }
    ));
    let wrong_msg = msg("wrong_world.wasm");
    assert!(wrong_msg.contains("exports neither world"), "{wrong_msg}");
    assert!(wrong_msg.contains("it exports: greet"), "{wrong_msg}");
    let dup = msg("b_per_event_copy.wasm");
    assert!(
        dup.contains(
            "b_per_event_copy.wasm: duplicate plugin per-event@1.0.0: already loaded from"
        ) && dup.ends_with("a_per_event.wasm"),
        "{dup}"
    );
    // The good file is served.
    assert_eq!(registry.plugins().len(), 1);
    let k = key(&registry, "per-event@1", &event("u", 0, &[]), "sms", &[]).unwrap();
    assert_eq!(k, "push:per-event@1:sms:ORDER_SHIPPED:o-1:u");
}

#[test]
fn a_channel_of_contract_1_is_refused_naming_the_change_and_key_policies_still_load() {
    let v1 = std::fs::read(fixture("channel_v1")).unwrap();
    let per_event = std::fs::read(real("per_event")).unwrap();
    let sms = std::fs::read(real("aliyun_sms")).unwrap();
    let dir = dir_with(&[
        ("channel_v1.wasm", &v1),
        ("per_event.wasm", &per_event),
        ("sms.wasm", &sms),
    ]);
    let (registry, refused) = PluginRegistry::load_dir(dir.path(), &limits(), None).unwrap();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    let err = refusal_of(&refused, "channel_v1.wasm");
    assert!(
        matches!(err, LoadError::OldChannelContract { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    for part in [
        "channel_v1.wasm: channel contract 1.x (pushonce:plugin/channel@1.0.0) is no longer supported",
        "rebuild the plugin against pushonce:channel@2",
        "docs/channels.md",
    ] {
        assert!(text.contains(part), "{text}");
    }
    // The key policy (contract pushonce:plugin@1, unchanged) and the v2
    // channel beside it load and work.
    let k = key(&registry, "per-event@1", &event("u", 0, &[]), "sms", &[]).unwrap();
    assert_eq!(k, "push:per-event@1:sms:ORDER_SHIPPED:o-1:u");
    assert_eq!(
        registry.resolve_channel("aliyun-sms@^2").unwrap().id(),
        "aliyun-sms@2.2.0"
    );
}

/// A channel plugin whose `describe` waits forever on the monotonic clock
/// (no fuel burns while it waits) is refused once the load timeout passes,
/// naming its file; the plugins beside it load and work.
#[test]
fn a_describe_that_waits_is_refused_after_the_load_timeout_and_the_rest_loads() {
    let waits = std::fs::read(fixture("describe_waits")).unwrap();
    let inbox = std::fs::read(real("inbox")).unwrap();
    let per_event = std::fs::read(real("per_event")).unwrap();
    let dir = dir_with(&[
        ("describe_waits.wasm", &waits),
        ("inbox.wasm", &inbox),
        ("per_event.wasm", &per_event),
    ]);
    let limits = pushonce::plugin::Limits {
        load_timeout: Duration::from_millis(500),
        ..limits()
    };
    // Loaded on a thread of its own, so a load that never ends fails this
    // test instead of hanging it.
    let path = dir.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(PluginRegistry::load_dir(&path, &limits, None));
    });
    let (registry, refused) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("loading the directory never finished")
        .unwrap();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    let err = refusal_of(&refused, "describe_waits.wasm");
    assert!(matches!(err, LoadError::Describe { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("describe_waits.wasm") && text.contains("did not answer within 500 ms"),
        "{text}"
    );
    assert!(registry.resolve_channel("inbox@^2").is_ok());
    let k = key(&registry, "per-event@1", &event("u", 0, &[]), "sms", &[]).unwrap();
    assert_eq!(k, "push:per-event@1:sms:ORDER_SHIPPED:o-1:u");
}

#[test]
fn a_missing_plugin_directory_is_an_error() {
    let err = PluginRegistry::load_dir(
        std::path::Path::new("/nonexistent/plugins"),
        &limits(),
        None,
    )
    .err()
    .unwrap();
    assert!(
        err.to_string()
            .starts_with("plugin directory /nonexistent/plugins:"),
        "{err}"
    );
}

/// Asserts that `f` took less than `limit` (the budget plus a generous margin
/// for a loaded CI machine).
fn within<T>(limit: Duration, f: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    let out = f();
    assert!(started.elapsed() < limit, "took {:?}", started.elapsed());
    out
}

#[test]
fn misbehaving_calls_fail_clearly_and_the_next_calls_work() {
    let registry = registry_of(&[fixture("misbehave"), real("per_event")], None);
    let bad = registry.resolve_key_policy("misbehave@1").unwrap();
    let good = registry.resolve_key_policy("per-event@1").unwrap();
    let ev = event("u-1", 0, &[]);
    let works = || {
        assert_eq!(bad.derive_key(&ev, "sms", &[]).unwrap().key, "ok:u-1");
        assert_eq!(
            derive(&good, &ev, "sms", &[]).unwrap().key,
            "push:per-event@1:sms:ORDER_SHIPPED:o-1:u-1"
        );
    };
    works();

    let err = within(Duration::from_secs(5), || bad.derive_key(&ev, "loop", &[])).unwrap_err();
    assert_eq!(
        err,
        CallError::OutOfFuel {
            plugin: "misbehave@1.0.0".into(),
            fuel: 50_000_000
        }
    );
    assert_eq!(
        err.to_string(),
        "plugin misbehave@1.0.0 ran out of its time budget (fuel: 50000000 units)"
    );
    works();

    let err = within(Duration::from_secs(5), || bad.derive_key(&ev, "bomb", &[])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "plugin misbehave@1.0.0 exceeded its memory cap of 64 MiB"
    );
    works();

    let err = within(Duration::from_secs(5), || bad.derive_key(&ev, "panic", &[])).unwrap_err();
    let CallError::Trap { plugin, cause } = &err else {
        panic!("expected a trap, got {err:?}");
    };
    assert_eq!(plugin, "misbehave@1.0.0");
    assert!(
        cause.starts_with("wasm `unreachable` (the plugin panicked: misbehave was asked to panic for user u-1 (at "),
        "{cause}"
    );
    works();

    let err = bad.derive_key(&ev, "clock", &[]).unwrap_err();
    let CallError::Forbidden { import, .. } = &err else {
        panic!("expected a forbidden import, got {err:?}");
    };
    assert!(import.starts_with("wasi:clocks/wall-clock@"), "{import}");
    assert!(
        err.to_string().contains("which plugins may not use"),
        "{err}"
    );
    works();

    let err = derive(&bad, &ev, "bad-key", &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "plugin misbehave@1.0.0 returned a bad key `has a space`: it contains ' ' (allowed: A-Z a-z 0-9 . _ : @ + = / -)"
    );
    works();

    let stats = bad.stats();
    assert_eq!(stats.failures, 4, "{stats:?}");
    // Each failed call dropped its instance: the first call plus four replacements.
    assert_eq!(stats.instantiations, 5, "{stats:?}");
    assert_eq!(good.stats().failures, 0);
}

/// A key policy's refusal of any length reaches the host cut to a few KiB,
/// with a marker saying how much was cut.
#[test]
fn an_oversized_refusal_is_cut_with_a_marker() {
    use pushonce::plugin::bounds::MAX_TEXT;
    let registry = registry_of(&[fixture("misbehave")], None);
    let bad = registry.resolve_key_policy("misbehave@1").unwrap();
    let err = bad
        .derive_key(&event("u-1", 0, &[]), "long-error", &[])
        .unwrap_err();
    let CallError::Refused { message, .. } = &err else {
        panic!("expected a refusal, got {err:?}");
    };
    let returned = "refused: ".len() + (8 << 20);
    assert!(message.starts_with("refused: xxx"), "{}", &message[..40]);
    assert!(
        message.ends_with(&format!("… [{} more bytes cut]", returned - MAX_TEXT)),
        "{}",
        &message[message.len() - 60..]
    );
    assert!(message.len() < MAX_TEXT + 64, "{} bytes", message.len());
}

#[test]
fn a_smaller_budget_and_cap_are_honoured() {
    let limits = pushonce::plugin::Limits {
        fuel_per_call: 1_000_000,
        memory_bytes: 16 << 20,
        ..limits()
    };
    let mut registry = PluginRegistry::new(&limits, None).unwrap();
    registry.load_file(&fixture("misbehave")).unwrap();
    let bad = registry.resolve_key_policy("misbehave").unwrap();
    let ev = event("u-1", 0, &[]);
    assert_eq!(
        bad.derive_key(&ev, "loop", &[]).unwrap_err().to_string(),
        "plugin misbehave@1.0.0 ran out of its time budget (fuel: 1000000 units)"
    );
    assert_eq!(
        bad.derive_key(&ev, "bomb", &[]).unwrap_err().to_string(),
        "plugin misbehave@1.0.0 exceeded its memory cap of 16 MiB"
    );
    assert!(bad.derive_key(&ev, "ok", &[]).is_ok());
}

/// With every instance slot taken (here one slot, held by another key
/// policy's warm instance), a call fails as `Busy`, naming the setting to
/// raise (the API answers it 503, retry, not 422); once a slot is free the
/// same call works.
#[test]
fn a_call_finding_no_free_instance_slot_is_busy_not_refused() {
    let limits = pushonce::plugin::Limits {
        pool_slots: 1,
        ..limits()
    };
    let (registry, refused) =
        PluginRegistry::load_dir(&real_dir(), &limits, None).expect("plugin dir");
    assert!(refused.is_empty(), "{refused:?}");
    let day = registry.resolve_key_policy("per-user-per-day@^1").unwrap();
    let event_key = registry.resolve_key_policy("per-event").unwrap();
    let ev = event("u-42", 0, &[]);
    day.derive_key(&ev, "sms", &params(&[("tz", "+08:00")]))
        .unwrap();
    let err = event_key.derive_key(&ev, "sms", &[]).unwrap_err();
    assert!(matches!(err, CallError::Busy { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with("plugin per-event@") && text.contains("`plugin_limits.instances`"),
        "{text}"
    );
    day.clear_pool();
    assert!(event_key.derive_key(&ev, "sms", &[]).is_ok());
}

#[test]
fn plugins_serve_many_threads_at_once() {
    let registry = real_registry(None);
    let plugin = registry.resolve_key_policy("per-user-per-day@^1").unwrap();
    let ev = Arc::new(event("u-42", LAST_SECOND_OF_DAY_AT_8, &[]));
    let tz = Arc::new(params(&[("tz", "+08:00")]));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (plugin, ev, tz) = (plugin.clone(), ev.clone(), tz.clone());
            std::thread::spawn(move || {
                (0..500)
                    .map(|_| derive(&plugin, &ev, "sms", &tz).unwrap().key)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for h in handles {
        for k in h.join().unwrap() {
            assert_eq!(k, "push:per-user-per-day@1:sms:u-42:2026-11-30");
        }
    }
    let stats = plugin.stats();
    assert_eq!(stats.calls, 2000);
    assert!(stats.instantiations <= 8, "{stats:?}");
}

#[test]
fn a_fresh_instance_gives_the_same_key_as_a_warm_one() {
    let registry = real_registry(None);
    let plugin = registry.resolve_key_policy("per-event").unwrap();
    let ev = event("u-42", 0, &[]);
    let warm = plugin.derive_key(&ev, "sms", &[]).unwrap();
    let fresh = plugin.derive_key_fresh(&ev, "sms", &[]).unwrap();
    assert_eq!(warm, fresh);
    assert!(plugin.fuel_used_by_one_call(&ev, "sms", &[]).unwrap() < 1_000_000);
}

#[test]
fn the_disk_cache_is_used_on_the_second_load() {
    let cache = tempfile::tempdir().unwrap();
    let first = real_registry(Some(cache.path()));
    // 3 key policies + 8 channel plugins.
    let shipped = 11;
    assert_eq!(first.stats().compiled, shipped);
    assert_eq!(first.stats().from_cache, 0);
    let mut cwasm: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    cwasm.sort();
    assert_eq!(cwasm.len(), shipped, "{cwasm:?}");
    assert!(
        cwasm
            .iter()
            .all(|p| p.extension().is_some_and(|e| e == "cwasm")),
        "{cwasm:?}"
    );

    let second = real_registry(Some(cache.path()));
    assert_eq!(second.stats().compiled, 0);
    assert_eq!(second.stats().from_cache, shipped);
    let ev = event("u-42", LAST_SECOND_OF_DAY_AT_8, &[("job_id", "j")]);
    for policy in ["per-event", "per-user-per-day", "per-user-per-job"] {
        assert_eq!(
            key(&first, policy, &ev, "sms", &[]).unwrap(),
            key(&second, policy, &ev, "sms", &[]).unwrap()
        );
    }

    // A damaged cache file is not trusted: it is recompiled and replaced.
    std::fs::write(&cwasm[0], b"garbage").unwrap();
    let third = real_registry(Some(cache.path()));
    assert_eq!(third.stats().compiled, 1);
    assert_eq!(third.stats().from_cache, shipped - 1);
    assert!(std::fs::read(&cwasm[0]).unwrap().len() > 1000);

    // Another engine configuration never reads these files.
    let other_limits = pushonce::plugin::Limits {
        pooling: false,
        ..limits()
    };
    let (other, refused) =
        PluginRegistry::load_dir(&real_dir(), &other_limits, Some(cache.path())).unwrap();
    assert!(refused.is_empty());
    assert_eq!(other.stats().from_cache + other.stats().compiled, shipped);
    assert_eq!(
        key(&other, "per-event", &ev, "sms", &[]).unwrap(),
        key(&first, "per-event", &ev, "sms", &[]).unwrap()
    );
}

#[test]
fn event_json_is_read_as_the_cli_and_api_read_it() {
    let ev = event_from_json(
        r#"{"biz_type":"ORDER_SHIPPED","biz_id":"o-1","user_id":"u-42",
            "occurred_at":"2026-12-01T00:00:00+08:00","attributes":{"job_id":"job-7","n":3}}"#,
    )
    .unwrap();
    assert_eq!(ev.occurred_at_ms, FIRST_SECOND_OF_NEXT_DAY_AT_8);
    assert_eq!(ev.attributes, params(&[("job_id", "job-7"), ("n", "3")]));
    let ms = event_from_json(
        r#"{"biz_type":"T","biz_id":"b","user_id":"u","occurred_at":1796054399000}"#,
    )
    .unwrap();
    assert_eq!(ms.occurred_at_ms, LAST_SECOND_OF_DAY_AT_8);
    assert!(ms.attributes.is_empty());

    let err =
        event_from_json(r#"{"biz_type":"T","biz_id":"b","user_id":"u","occurred_at":"yesterday"}"#)
            .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("event field `occurred_at`: `yesterday` is not an RFC 3339 time"),
        "{err}"
    );
    let err = event_from_json(r#"{"biz_type":"T","user_id":"u","occurred_at":0}"#).unwrap_err();
    assert!(err.to_string().contains("missing field `biz_id`"), "{err}");

    // The dry run's whole path: JSON event → resolve → derive per channel.
    let registry = real_registry(None);
    let policy = registry
        .resolve_key_policy("per-user-per-day@^1.0")
        .unwrap();
    let keys: Vec<String> = ["inbox", "sms"]
        .iter()
        .map(|c| {
            derive(&policy, &ev, c, &params(&[("tz", "+08:00")]))
                .unwrap()
                .key
        })
        .collect();
    assert_eq!(
        keys,
        [
            "push:per-user-per-day@1:inbox:u-42:2026-12-01",
            "push:per-user-per-day@1:sms:u-42:2026-12-01"
        ]
    );
}

#[test]
fn the_cli_dry_run_derives_every_channel_and_reports_each_failure() {
    use pushonce::cli::inputs::parse_param;
    use pushonce::cli::keys::dry_run;
    let registry = real_registry(None);
    let ev = event_from_json(
        r#"{"biz_type":"ORDER_SHIPPED","biz_id":"o-1","user_id":"u-42","occurred_at":1796054399000}"#,
    )
    .unwrap();
    let channels: Vec<String> = ["inbox", "sms", "Bad Channel"].map(String::from).to_vec();
    let tz = vec![parse_param("tz=+08:00").unwrap()];
    let (id, results) = dry_run(&registry, "per-user-per-day@^1", &ev, &channels, &tz).unwrap();
    assert_eq!(id, "per-user-per-day@1.0.0");
    assert_eq!(results.len(), 3);
    assert_eq!(
        results[0].1.as_ref().unwrap().key,
        "push:per-user-per-day@1:inbox:u-42:2026-11-30"
    );
    assert_eq!(
        results[1].1.as_ref().unwrap().key,
        "push:per-user-per-day@1:sms:u-42:2026-11-30"
    );
    assert!(matches!(results[2].1, Err(DeriveError::BadChannel { .. })));
    // A job policy without the attribute: every channel says which attribute.
    let (_, results) = dry_run(&registry, "per-user-per-job", &ev, &channels[..2], &[]).unwrap();
    for (_, r) in results {
        assert!(r.unwrap_err().to_string().contains("`job_id`"));
    }
    assert!(parse_param("tz").is_err());
    let err = dry_run(&registry, "per-week@^1", &ev, &channels, &[])
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "no key-policy plugin named `per-week` is loaded (known: per-event, per-user-per-day, per-user-per-job)"
    );
}
