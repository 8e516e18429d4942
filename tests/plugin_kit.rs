//! The plugin author's kit on the real `pushonce` binary:
//! `pushonce plugins test <plugin.wasm> --cases FILE` passes the cases files
//! shipped beside the plugins, prints a pass/fail table, and exits non-zero
//! naming how many failed when a case does not hold; bad cases files and a
//! channel plugin are refused with a reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pushonce_tests::plugins::real;
use pushonce_tests::process::pushonce_bin;

/// `pushonce plugins test <plugin> --cases <cases>`, with a private data dir (plugin cache).
fn plugins_test(plugin: &Path, cases: &Path) -> Output {
    let cache = tempfile::tempdir().unwrap();
    Command::new(pushonce_bin().unwrap())
        .args(["plugins", "test"])
        .arg(plugin)
        .arg("--cases")
        .arg(cases)
        .env("PUSHONCE_DATA_DIR", cache.path())
        .output()
        .unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn cases_of(dir: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../plugins")
        .join(dir)
        .join("cases.toml")
}

#[test]
fn the_shipped_cases_pass_on_the_real_key_policies() {
    for (stem, dir, n) in [
        ("per_event", "key-policies/per-event", 3),
        ("per_user_per_day", "key-policies/per-user-per-day", 6),
        ("per_user_per_job", "key-policies/per-user-per-job", 3),
    ] {
        let out = plugins_test(&real(stem), &cases_of(dir));
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stem}: {stdout}\n{stderr}");
        assert_eq!(stdout.matches(" pass ").count(), n, "{stdout}");
        assert!(
            stdout.contains(&format!("{n} passed, 0 failed")),
            "{stdout}"
        );
    }
}

#[test]
fn a_failing_case_is_a_fail_row_and_a_non_zero_exit() {
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases.jsonl");
    std::fs::write(
        &cases,
        [
            "# JSON lines: one case per line",
            r#"{"name":"right","event":{"biz_type":"T","biz_id":"o-1","user_id":"u-1","occurred_at":"2026-11-30T15:59:59Z"},"params":{"tz":"+08:00"},"key":"u-1:2026-11-30"}"#,
            r#"{"name":"wrong day","event":{"biz_type":"T","biz_id":"o-1","user_id":"u-1","occurred_at":"2026-11-30T16:00:00Z"},"params":{"tz":"+08:00"},"key":"u-1:2026-11-30"}"#,
            r#"{"name":"no error comes","event":{"biz_type":"T","biz_id":"o-1","user_id":"u-1","occurred_at":1796054399000},"error":"is empty"}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let out = plugins_test(&real("per_user_per_day"), &cases);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}");
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row {name}: {stdout}"))
            .to_string()
    };
    assert!(row("right").contains(" pass "), "{stdout}");
    let wrong = row("wrong day");
    assert!(
        wrong.contains("FAIL") && wrong.contains("u-1:2026-12-01"),
        "{wrong}"
    );
    let no_error = row("no error comes");
    assert!(
        no_error.contains("FAIL") && no_error.contains("error containing `is empty`"),
        "{no_error}"
    );
    assert!(stderr.contains("2 of 3 case(s) failed"), "{stderr}");
}

#[test]
fn bad_cases_files_and_channel_plugins_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let both = dir.path().join("both.toml");
    std::fs::write(
        &both,
        "[[case]]\nname = \"both\"\nevent = { biz_type = \"T\", biz_id = \"o\", user_id = \"u\", occurred_at = 0 }\nkey = \"u\"\nerror = \"x\"\n",
    )
    .unwrap();
    let out = plugins_test(&real("per_event"), &both);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(
        stderr.contains("both.toml: case both must give exactly one of `key` and `error`"),
        "{stderr}"
    );

    let typo = dir.path().join("typo.jsonl");
    std::fs::write(&typo, "\n{\"evnt\": {}}\n").unwrap();
    let (_, stderr) = text(&plugins_test(&real("per_event"), &typo));
    assert!(
        stderr.contains("typo.jsonl:2: not a JSON case") && stderr.contains("evnt"),
        "{stderr}"
    );

    let (_, stderr) = text(&plugins_test(
        &real("inbox"),
        &cases_of("key-policies/per-event"),
    ));
    assert!(
        stderr.contains("inbox@2.0.0 is a channel plugin: `plugins test` runs key policies"),
        "{stderr}"
    );
}

/// `pushonce plugins new <args>` in `dir`.
fn plugins_new(dir: &Path, args: &[&str]) -> Output {
    Command::new(pushonce_bin().unwrap())
        .current_dir(dir)
        .args(["plugins", "new"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_scaffolded_rust_key_policy_builds_offline_and_passes_its_cases() {
    let tmp = tempfile::tempdir().unwrap();
    let out = plugins_new(tmp.path(), &["key-policy", "per-user-per-type"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains(
            "build: cd per-user-per-type && cargo build --release --target wasm32-wasip2"
        ),
        "{stdout}"
    );
    let project = tmp.path().join("per-user-per-type");
    for file in [
        "Cargo.toml",
        "Cargo.lock",
        "src/lib.rs",
        "cases.toml",
        "wit/plugin.wit",
        "sdk/key-policy-sdk/src/lib.rs",
    ] {
        assert!(project.join(file).is_file(), "{file} not written");
    }
    // The build command the scaffold prints, offline, sharing the compiled
    // dependencies (wit-bindgen, sha2) of the plugins built by build.rs.
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = PathBuf::from(env!("PUSHONCE_WASM_TARGET_DIR"));
    let build = Command::new(cargo)
        .current_dir(&project)
        .args([
            "build",
            "--release",
            "--offline",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
        ])
        .arg(&target)
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let wasm = target.join("wasm32-wasip2/release/per_user_per_type.wasm");
    let out = plugins_test(&wasm, &project.join("cases.toml"));
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("per-user-per-type@0.1.0: 3 passed, 0 failed"),
        "{stdout}"
    );
}

#[test]
fn channel_and_other_language_projects_are_written_and_bad_requests_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            vec!["channel", "my-sms"],
            vec![
                "Cargo.toml",
                "src/lib.rs",
                "sdk/channel-sdk/src/http.rs",
                "sdk/provider-auth/src/lib.rs",
                "wit/channel.wit",
                "wit/deps/http.wit",
            ],
        ),
        (
            vec!["key-policy", "js-policy", "--lang", "js"],
            vec![
                "package.json",
                "src/js-policy.js",
                "src/key-util.js",
                "cases.toml",
                "wit/plugin.wit",
            ],
        ),
        (
            vec!["key-policy", "py-policy", "--lang", "python"],
            vec![
                "pyproject.toml",
                "app.py",
                "key_util.py",
                "cases.toml",
                "wit/plugin.wit",
            ],
        ),
    ];
    for (args, files) in cases {
        let out = plugins_new(tmp.path(), &args);
        assert!(out.status.success(), "{args:?}: {:?}", text(&out));
        for file in files {
            assert!(
                tmp.path().join(args[1]).join(file).is_file(),
                "{args:?}: {file} not written"
            );
        }
    }
    let js = std::fs::read_to_string(tmp.path().join("js-policy/package.json")).unwrap();
    assert!(
        js.contains("componentize-js src/js-policy.js --wit wit -n key-policy-plugin")
            && js.contains("-o js_policy.wasm"),
        "{js}"
    );
    for (args, reason) in [
        (
            vec!["channel", "x", "--lang", "js"],
            "channel plugins are written in Rust",
        ),
        (
            vec!["key-policy", "Bad_Name"],
            "`Bad_Name` is not a plugin name",
        ),
        (
            vec!["key-policy", "my-sms"],
            "my-sms already exists and is not empty",
        ),
    ] {
        let out = plugins_new(tmp.path(), &args);
        let (_, stderr) = text(&out);
        assert!(
            !out.status.success() && stderr.contains(reason),
            "{args:?}: {stderr}"
        );
    }
}
