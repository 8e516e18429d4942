//! The plugin author's kit on the real `pushonce` binary:
//! `pushonce plugins test <plugin.wasm> --cases FILE` passes the cases files
//! shipped beside the plugins, prints a pass/fail table, and exits non-zero
//! naming how many failed when a case does not hold; bad cases files are
//! refused with a reason. A channel plugin runs against a scripted provider
//! on 127.0.0.1 (expected requests, canned and cut-off answers); `plugins
//! new` then `plugins build` gives a component that passes its own cases.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pushonce_tests::plugins::real;
use pushonce_tests::process::pushonce_bin;

/// `pushonce plugins test <plugin> --cases <cases>`, with a private data dir (plugin cache).
fn plugins_test(plugin: &Path, cases: &Path) -> Output {
    let cache = tempfile::tempdir().unwrap();
    plugins_test_in(plugin, cases, cache.path())
}

/// The same with the data dir `data` (to reuse a plugin compiled before).
fn plugins_test_in(plugin: &Path, cases: &Path, data: &Path) -> Output {
    Command::new(pushonce_bin().unwrap())
        .args(["plugins", "test"])
        .arg(plugin)
        .arg("--cases")
        .arg(cases)
        .env("PUSHONCE_DATA_DIR", data)
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

    // A channel plugin takes a script: a key policy's cases file is not one.
    let (_, stderr) = text(&plugins_test(
        &real("inbox"),
        &cases_of("key-policies/per-event"),
    ));
    assert!(
        stderr.contains("cases.toml: not a channel script") && stderr.contains("`event`"),
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

/// `pushonce plugins build <project> --out <out>`, building Rust offline in
/// the target directory where `build.rs` compiled the plugins' dependencies
/// (wit-bindgen, serde_json, sha2...), so only the project's crates compile.
/// The data dir `data` keeps the compiled component for the next command.
fn plugins_build(project: &Path, out: &Path, data: &Path) -> Output {
    Command::new(pushonce_bin().unwrap())
        .args(["plugins", "build"])
        .arg(project)
        .arg("--out")
        .arg(out)
        .env("CARGO_TARGET_DIR", env!("PUSHONCE_WASM_TARGET_DIR"))
        .env("CARGO_NET_OFFLINE", "true")
        .env(
            "PUSHONCE_PLUGIN_TOOLCHAINS",
            env!("PUSHONCE_PLUGIN_TOOLCHAINS"),
        )
        .env("PUSHONCE_DATA_DIR", data)
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap()
}

/// Why a JavaScript or Python project cannot be built here, if it cannot.
fn toolchain_missing(lang: &str) -> Option<String> {
    let toolchains = PathBuf::from(env!("PUSHONCE_PLUGIN_TOOLCHAINS"));
    let tool = match lang {
        "js" => toolchains.join("js/node_modules/@bytecodealliance/componentize-js/src/cli.js"),
        _ => toolchains.join("py/bin/componentize-py"),
    };
    (!tool.is_file()).then(|| format!("{} is not installed (cargo xtask setup)", tool.display()))
}

#[test]
fn scaffolded_projects_build_with_plugins_build_and_pass_their_own_cases() {
    let tmp = tempfile::tempdir().unwrap();
    let plugin_dir = tmp.path().join("plugins");
    let data = tmp.path().join("data");
    for (args, id, n) in [
        (
            vec!["key-policy", "per-user-per-type"],
            "per-user-per-type@0.1.0",
            3,
        ),
        (vec!["channel", "my-sms"], "my-sms@2.0.0", 4),
        (
            vec!["key-policy", "js-policy", "--lang", "js"],
            "js-policy@0.1.0",
            3,
        ),
        (
            vec!["key-policy", "py-policy", "--lang", "python"],
            "py-policy@0.1.0",
            3,
        ),
    ] {
        if let Some(reason) = args.get(3).and_then(|lang| toolchain_missing(lang)) {
            eprintln!("skipped: {id}: {reason}");
            continue;
        }
        let out = plugins_new(tmp.path(), &args);
        assert!(out.status.success(), "{args:?}: {:?}", text(&out));
        let project = tmp.path().join(args[1]);
        let out = plugins_build(&project, &plugin_dir, &data);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{id}: {stdout}\n{stderr}");
        let wasm = plugin_dir.join(format!("{}.wasm", args[1].replace('-', "_")));
        assert!(
            stdout.contains(&format!("built {}", wasm.display()))
                && stdout.contains(&format!("plugin      {id}")),
            "{stdout}"
        );
        // The same data dir: the component compiled by the build's check is cached.
        let out = plugins_test_in(&wasm, &project.join("cases.toml"), &data);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{id}: {stdout}\n{stderr}");
        assert!(
            stdout.contains(&format!("{id}: {n} passed, 0 failed")),
            "{stdout}"
        );
    }
}

#[test]
fn plugins_build_names_what_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let out = plugins_build(tmp.path(), tmp.path(), tmp.path());
    let (_, stderr) = text(&out);
    assert!(
        !out.status.success()
            && stderr
                .contains("is not a plugin project: no Cargo.toml, package.json or pyproject.toml"),
        "{stderr}"
    );
    // A Python project without componentize-py anywhere names the tool.
    let out = plugins_new(tmp.path(), &["key-policy", "py-policy", "--lang", "python"]);
    assert!(out.status.success());
    let out = Command::new(pushonce_bin().unwrap())
        .args(["plugins", "build"])
        .arg(tmp.path().join("py-policy"))
        .env("PUSHONCE_PLUGIN_TOOLCHAINS", tmp.path().join("none"))
        .env("PATH", tmp.path().join("none"))
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert!(
        !out.status.success()
            && stderr.contains(
                "componentize-py is not installed: run `pip install componentize-py==0.25.1`"
            ),
        "{stderr}"
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

/// Writes `text` as `name` in a new temporary directory.
fn script(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, text).unwrap();
    (dir, file)
}

/// The table row of case `name` (rows start with the case's name).
fn row<'a>(stdout: &'a str, name: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no row {name}: {stdout}"))
}

#[test]
fn the_inbox_script_passes_on_the_real_inbox_plugin() {
    let cases =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/channels/inbox/cases.toml");
    let out = plugins_test(&real("inbox"), &cases);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.starts_with("CASE") && stdout.lines().next().unwrap().ends_with("REQUESTS"),
        "{stdout}"
    );
    assert_eq!(stdout.matches(" pass ").count(), 7, "{stdout}");
    assert!(
        stdout.contains("inbox@2.0.0: 7 passed, 0 failed"),
        "{stdout}"
    );
    let created = row(&stdout, "created");
    assert!(
        created.contains("sent, id m-1") && created.ends_with("1/1"),
        "{created}"
    );
    let busy = row(&stdout, "busy, retry after 2 s");
    assert!(
        busy.contains("retryable, after 2000 ms: the inbox refused"),
        "{busy}"
    );
    let cut = row(&stdout, "cut off after the request");
    assert!(cut.contains(" pass ") && cut.contains("unknown: "), "{cut}");
    assert!(
        row(&stdout, "query: delivered").contains("status delivered"),
        "{stdout}"
    );
}

/// A script for the real inbox plugin with cases that must fail.
const FAILING_INBOX_SCRIPT: &str = r#"
[channel]
settings = { endpoint = "{provider}/api" }

[[case]]
name = "right"
expect = "sent"
[[case.step]]
request = { method = "POST", path = "/api/inbox/v1/messages", body_contains = ['"user_id":"u-1"'] }
reply = { status = 201, body = '{"id":"m-9"}' }

[[case]]
name = "a cut-off taken for a failure"
expect = "retryable"
[[case.step]]
request = { method = "POST", path = "/api/inbox/v1/messages" }
cut_off = true

[[case]]
name = "wrong path and header"
expect = "sent"
[[case.step]]
request = { method = "POST", path = "/api/inbox/v2/messages", headers = { idempotency-key = "other" } }
reply = { status = 201, body = '{"id":"m-9"}' }

[[case]]
name = "a step never requested"
expect = "sent"
[[case.step]]
request = { method = "POST", path = "/api/inbox/v1/messages" }
reply = { status = 201, body = '{"id":"m-9"}' }
[[case.step]]
request = { method = "GET", path = "/api/inbox/v1/messages" }
reply = { status = 200, body = '{"status":"delivered"}' }

[[case]]
name = "a request beyond the script"
expect = "unknown"
"#;

#[test]
fn a_wrong_outcome_or_request_is_a_fail_row_and_a_cut_off_is_unknown() {
    let (_dir, file) = script("inbox.toml", FAILING_INBOX_SCRIPT);
    let out = plugins_test(&real("inbox"), &file);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}");
    assert!(row(&stdout, "right").contains(" pass "), "{stdout}");
    // The cut-off answer comes out as unknown (the provider may have the
    // message), never as a failure the host would retry.
    let cut = row(&stdout, "a cut-off taken for a failure");
    assert!(
        cut.contains("FAIL") && cut.contains("retryable") && cut.contains("unknown: "),
        "{cut}"
    );
    assert!(
        row(&stdout, "wrong path and header").contains("FAIL"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "wrong path and header: step 1 (POST /api/inbox/v2/messages): path /api/inbox/v1/messages (expected /api/inbox/v2/messages); header idempotency-key: `push:kit@1:test:case-3` (expected `other`)"
        ),
        "{stdout}"
    );
    let never = row(&stdout, "a step never requested");
    assert!(never.contains("FAIL") && never.ends_with("1/2"), "{never}");
    assert!(
        stdout.contains(
            "a step never requested: step 2 (GET /api/inbox/v1/messages) was never requested"
        ),
        "{stdout}"
    );
    // Answered 500 (so unknown, as expected: the plugin cannot tell a 5xx
    // from a message taken), yet the case fails.
    let beyond = row(&stdout, "a request beyond the script");
    assert!(
        beyond.contains("FAIL") && beyond.contains("unknown: ") && beyond.ends_with("0/0"),
        "{beyond}"
    );
    assert!(
        stdout.contains("a request beyond the script: unexpected request POST /api/inbox/v1/messages (the case scripts 0 step(s); answered 500)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("inbox@2.0.0: 1 passed, 4 failed"),
        "{stdout}"
    );
    assert!(stderr.contains("4 of 5 case(s) failed"), "{stderr}");
}

#[test]
fn bad_scripts_are_refused_naming_the_case_step_and_field() {
    for (body, reason) in [
        (
            "[[case]]\nname = \"x\"\nexpect = \"sent\"\n[[case.step]]\nrequest = { method = \"POST\", path = \"/m\" }\n",
            "script.toml: case x, step 1: give `reply = { status = ... }` or `cut_off = true`",
        ),
        (
            "[[case]]\nexpect = \"sent\"\n[[case.step]]\nrequest = { method = \"POST\", path = \"/m\" }\nreply = { stauts = 200 }\n",
            "unknown field `stauts`",
        ),
        (
            "[[case]]\nname = \"no expectation\"\n",
            "case no expectation: give `expect` (sent, retryable, permanent or unknown)",
        ),
        (
            "[[case]]\nname = \"q\"\ncall = \"query\"\nexpect = \"sent\"\n",
            "case q: `expect = \"sent\"` is for a send",
        ),
        (
            "[[case]]\nname = \"p\"\nexpect = \"sent\"\n[[case.step]]\nrequest = { method = \"POST\", path = \"m\" }\ncut_off = true\n",
            "case p, step 1: request.path `m` must start with `/`",
        ),
        ("[channel]\n", "script.toml: no `[[case]]`"),
    ] {
        let (_dir, file) = script("script.toml", body);
        let out = plugins_test(&real("inbox"), &file);
        let (_, stderr) = text(&out);
        assert!(
            !out.status.success() && stderr.contains(reason),
            "{body}\n{stderr}"
        );
    }
}

/// The webhook plugin's script: an endpoint name mapped by a setting, the
/// signing secret as a setting, the signature headers present.
const WEBHOOK_SCRIPT: &str = r#"
[channel]
settings = { "endpoint.shop" = "{provider}/hooks/shop", secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" }

[[case]]
name = "2xx"
message = { recipient = "shop", template = "ORDER_SHIPPED", params = { order = "o-1" } }
expect = "sent"
[[case.step]]
request = { method = "POST", path = "/hooks/shop", headers = { content-type = "application/json", webhook-id = "*", webhook-timestamp = "*", webhook-signature = "*" }, body_contains = ['"type":"ORDER_SHIPPED"', '"order":"o-1"'] }
reply = { status = 204 }

[[case]]
name = "gone"
message = { recipient = "shop" }
expect = "permanent"
reason = "status 410"
[[case.step]]
request = { method = "POST", path = "/hooks/shop" }
reply = { status = 410 }

[[case]]
name = "cut off"
message = { recipient = "shop" }
expect = "unknown"
[[case.step]]
request = { method = "POST", path = "/hooks/shop" }
cut_off = true

[[case]]
name = "no such endpoint"
message = { recipient = "nowhere" }
expect = "permanent"
reason = "neither a configured endpoint name"

[[case]]
name = "unsigned"
message = { recipient = "shop" }
expect = "sent"
[[case.step]]
request = { method = "POST", path = "/hooks/shop", headers = { authorization = "*" } }
reply = { status = 200 }
"#;

#[test]
fn the_kit_runs_the_webhook_plugin_with_its_settings_and_headers() {
    let (_dir, file) = script("webhook.toml", WEBHOOK_SCRIPT);
    let out = plugins_test(&real("webhook"), &file);
    let (stdout, stderr) = text(&out);
    assert!(!out.status.success(), "{stdout}");
    for name in ["2xx", "gone", "cut off", "no such endpoint"] {
        assert!(row(&stdout, name).contains(" pass "), "{name}: {stdout}");
    }
    assert!(row(&stdout, "2xx").contains("sent, id msg_"), "{stdout}");
    // A header the plugin does not send fails the case, even with `*`.
    assert!(row(&stdout, "unsigned").contains("FAIL"), "{stdout}");
    assert!(
        stdout.contains(
            "unsigned: step 1 (POST /hooks/shop): header authorization missing (expected `*`)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("webhook@2.1.0: 4 passed, 1 failed"),
        "{stdout}"
    );
    assert!(stderr.contains("1 of 5 case(s) failed"), "{stderr}");
}
