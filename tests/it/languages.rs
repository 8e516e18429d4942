//! Key policies written in JavaScript (`plugins/key-policies-js/`, built by
//! componentize-js) and Python (`plugins/key-policies-py/`, built by
//! componentize-py), loaded through the host's plugin runtime like any other
//! plugin: they describe themselves as their package manifests say, the host
//! accepts every key they give, and the keys equal a Rust reference
//! implementation's on 10,000 generated events (odd ids, year boundaries,
//! timezones, missing attributes: errors must match word for word too).
//!
//! `build.rs` builds them when `cargo xtask setup` has installed the
//! toolchains; without them each test says it is skipped and why.

use std::path::PathBuf;

use pushonce::derive::{DeriveError, derive};
use pushonce::event::Event;
use pushonce::plugin::{CallError, KeyPolicyPlugin};
use pushonce_tests::plugins::registry_of;

/// The Rust plugins' key encoding, as the reference.
#[path = "../../plugins/key-util/src/lib.rs"]
#[allow(dead_code)]
mod key_util;

const EVENTS: usize = 10_000;

/// A Rust reference implementation of a key policy: key body or error.
type Reference = fn(&Event, &[(String, String)]) -> Result<String, String>;

/// The component built from `plugins/key-policies-*/<name>`, or `None` (with
/// the reason printed) when its toolchain is not installed.
fn built(name: &str) -> Option<PathBuf> {
    let file = PathBuf::from(env!("PUSHONCE_LANG_PLUGINS"))
        .join(format!("{}.wasm", name.replace('-', "_")));
    if file.is_file() {
        return Some(file);
    }
    let skipped = env!("PUSHONCE_LANG_SKIPPED");
    assert!(
        skipped.contains(name),
        "{} was not built and not skipped",
        file.display()
    );
    eprintln!("skipped: {skipped}");
    None
}

/// What the plugin answers: the key body, or its own error message.
fn body(plugin: &KeyPolicyPlugin, event: &Event, p: &[(String, String)]) -> Result<String, String> {
    match plugin.derive_key(event, "sms", p) {
        Ok(decision) => Ok(decision.key),
        Err(CallError::Refused { message, .. }) => Err(message),
        Err(e) => panic!("{} failed on {event:?} {p:?}: {e}", plugin.id()),
    }
}

/// `name`, `version` and `description` of a package manifest line by line
/// (`package.json` or `pyproject.toml`).
fn manifest_field(text: &str, field: &str) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(&format!("\"{field}\"")) || l.starts_with(&format!("{field} =")))
        .unwrap_or_else(|| panic!("no {field} in {text}"));
    let value = line.split_once([':', '=']).unwrap().1.trim();
    value.trim_end_matches(',').trim_matches('"').to_string()
}

/// Checks that `plugin` says of itself what its package `manifest` says.
fn describes_itself_as_its_manifest(plugin: &KeyPolicyPlugin, manifest: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins")
        .join(manifest);
    let text = std::fs::read_to_string(path).unwrap();
    let meta = plugin.meta();
    assert_eq!(meta.name, manifest_field(&text, "name"));
    assert_eq!(meta.version.to_string(), manifest_field(&text, "version"));
    assert_eq!(meta.description, manifest_field(&text, "description"));
    assert_eq!(meta.world.to_string(), "key-policy");
}

/// A small deterministic generator (SplitMix64), so a failure repeats.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }

    /// An id: mostly plain, else spaces, separators, CJK, over-long, empty.
    fn id(&mut self, prefix: &str) -> String {
        match self.next() % 10 {
            0 => format!("{prefix} {}", self.next() % 100),
            1 => format!("{prefix}:+={}/é", self.next() % 100),
            2 => format!("用户{}", self.next() % 100),
            3 => format!("{prefix}-{}", "x".repeat(60 + (self.next() % 20) as usize)),
            4 if self.next().is_multiple_of(20) => String::new(),
            _ => format!("{prefix}-{}", self.next() % 1000),
        }
    }

    /// An instant: anywhere in 1970–2100, or within four days of a new year.
    fn instant(&mut self) -> u64 {
        if self.next().is_multiple_of(3) {
            let year = 1971 + (self.next() % 129) as i64;
            let new_year = days_from_civil(year, 1, 1) * 86_400_000;
            let around = (self.next() % (8 * 86_400_000)) as i64 - 4 * 86_400_000;
            (new_year + around) as u64
        } else {
            self.next() % 4_102_444_800_000
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
}

/// ISO weeks in `year`: 53 when it starts on a Thursday, or on a Wednesday
/// in a leap year.
fn iso_weeks_in(year: i64) -> i64 {
    let jan1 = (days_from_civil(year, 1, 1) + 3).rem_euclid(7) + 1; // 1 = Monday
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    if jan1 == 4 || (leap && jan1 == 3) {
        53
    } else {
        52
    }
}

/// The ISO week-numbering year and week of local day `days` (the ordinal
/// date rule: week = (ordinal − weekday + 10) / 7).
fn iso_week(days: i64) -> (i64, i64) {
    let (year, _, _) = key_util::civil_from_days(days);
    let ordinal = days - days_from_civil(year, 1, 1) + 1;
    let weekday = (days + 3).rem_euclid(7) + 1;
    let week = (ordinal - weekday + 10) / 7;
    if week < 1 {
        (year - 1, iso_weeks_in(year - 1))
    } else if week > iso_weeks_in(year) {
        (year + 1, 1)
    } else {
        (year, week)
    }
}

/// The Rust reference of `per-user-per-week`.
fn per_user_per_week(event: &Event, p: &[(String, String)]) -> Result<String, String> {
    let tz = key_util::param(p, "tz").unwrap_or("+00:00");
    let offset = key_util::parse_offset(tz).ok_or_else(|| {
        format!("param `tz`: `{tz}` is not a fixed UTC offset like `+08:00` (at most ±18:00)")
    })?;
    if event.user_id.is_empty() {
        return Err("event field `user_id` is empty".into());
    }
    let days = ((event.occurred_at_ms / 1000) as i64 + offset).div_euclid(86_400);
    let (year, week) = iso_week(days);
    Ok(format!(
        "{}:{year}-W{week:02}",
        key_util::part(&event.user_id)
    ))
}

/// The Rust reference of `per-tenant-per-hour`.
fn per_tenant_per_hour(event: &Event, p: &[(String, String)]) -> Result<String, String> {
    let attr = key_util::param(p, "tenant_attr").unwrap_or("tenant_id");
    let tenant = key_util::attribute(&event.attributes, attr).ok_or_else(|| {
        format!("event attribute `{attr}` (the tenant, param `tenant_attr`) is missing")
    })?;
    if tenant.is_empty() {
        return Err(format!("event attribute `{attr}` (the tenant) is empty"));
    }
    let hours = event.occurred_at_ms / 3_600_000;
    let (y, m, d) = key_util::civil_from_days((hours / 24) as i64);
    Ok(format!(
        "tenant={}:{y:04}-{m:02}-{d:02}T{:02}",
        key_util::part(tenant),
        hours % 24
    ))
}

/// A generated event and the params to derive it with.
fn generated(g: &mut Gen) -> (Event, Vec<(String, String)>) {
    let tz = g.pick(&[
        "+08:00",
        "-05:30",
        "Z",
        "+14:00",
        "-12:00",
        "+0530",
        "+05",
        "UTC",
        "",
        "Asia/Shanghai",
        "+19:00",
    ]);
    let tenant_attr = g.pick(&["", "", "", "org"]);
    let mut p = Vec::new();
    if !tz.is_empty() {
        p.push(("tz".to_string(), tz.to_string()));
    }
    if !tenant_attr.is_empty() {
        p.push(("tenant_attr".to_string(), tenant_attr.to_string()));
    }
    let mut attributes = vec![("job_id".to_string(), g.id("job"))];
    if !g.next().is_multiple_of(10) {
        let name = if g.next().is_multiple_of(4) {
            "org"
        } else {
            "tenant_id"
        };
        attributes.push((name.to_string(), g.id("t")));
    }
    let event = Event {
        biz_type: "ORDER_SHIPPED".into(),
        biz_id: g.id("o"),
        user_id: g.id("u"),
        occurred_at_ms: g.instant(),
        attributes,
    };
    (event, p)
}

/// Loads `name` through the host's runtime (one compile: these components
/// take about a CPU-minute), checks it describes itself as `manifest` says,
/// then runs it and `reference` on [`EVENTS`] generated events: same key
/// bodies and errors, and the host composes every key it returns.
fn same_as_reference(name: &str, manifest: &str, reference: Reference) {
    let Some(file) = built(name) else { return };
    let registry = registry_of(&[file], None);
    let plugin = registry.resolve_key_policy(name).expect("resolves");
    describes_itself_as_its_manifest(&plugin, manifest);
    let mut g = Gen(17);
    let (mut keys, mut errors) = (0, 0);
    for _ in 0..EVENTS {
        let (event, p) = generated(&mut g);
        let expected = reference(&event, &p);
        assert_eq!(body(&plugin, &event, &p), expected, "{event:?} {p:?}");
        match (derive(&plugin, &event, "sms", &p), expected) {
            (Ok(k), Ok(body)) => {
                assert_eq!(k.key, format!("push:{name}@1:sms:{body}"));
                keys += 1;
            }
            (Err(DeriveError::Call(CallError::Refused { .. })), Err(_)) => errors += 1,
            (got, want) => panic!("{event:?} {p:?}: derive gave {got:?}, expected {want:?}"),
        }
    }
    // Both kinds of answer were exercised, most of them keys.
    assert!(
        keys > EVENTS / 2 && errors > 0,
        "{keys} keys, {errors} errors"
    );
}

#[test]
fn the_javascript_policy_is_its_package_and_gives_the_rust_reference_keys_on_10000_events() {
    same_as_reference(
        "per-user-per-week",
        "key-policies-js/per-user-per-week/package.json",
        per_user_per_week,
    );
}

#[test]
fn the_python_policy_is_its_package_and_gives_the_rust_reference_keys_on_10000_events() {
    same_as_reference(
        "per-tenant-per-hour",
        "key-policies-py/per-tenant-per-hour/pyproject.toml",
        per_tenant_per_hour,
    );
}

#[test]
fn iso_weeks_of_known_dates() {
    // The reference itself, on dates whose ISO week is published (ISO 8601 examples).
    let day = |y, m, d| days_from_civil(y, m, d);
    assert_eq!(iso_week(day(2005, 1, 1)), (2004, 53));
    assert_eq!(iso_week(day(2007, 12, 31)), (2008, 1));
    assert_eq!(iso_week(day(2008, 12, 29)), (2009, 1));
    assert_eq!(iso_week(day(2010, 1, 3)), (2009, 53));
}
