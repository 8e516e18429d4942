//! Operator policies against the real plugins: the example files validate,
//! bad files are refused precisely, a running host picks up edits by itself,
//! an invalid edit leaves the old set serving, a minor upgrade of a key policy
//! that would change keys is refused with an example, and a new policy name or
//! major version starts a new key space on purpose. A pasted policy (the
//! console's) is checked against the directory, diffed, applied through the
//! checked reload, and put back when that reload is refused.

use pushonce::config::HostConfig;
use pushonce::route::candidate::{self, ApplyError};
use pushonce::route::live::{Live, RegistryCatalog};
use pushonce::route::watch::{Trigger, reload_loop, reloader, watch_dirs};
use pushonce::route::{PolicySet, stability};
use pushonce_tests::plugins::{event, fixture, real, real_registry};
use pushonce_tests::wait_until;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const CHANNELS: &str = r#"
[channels.inbox]
plugin = "inbox@^2"
[channels.sms]
plugin = "aliyun-sms@^2"
[channels.wechat]
plugin = "wechat@^2"
[channels.app-push]
plugin = "fcm@^2"
"#;

/// The real plugins of [`CHANNELS`]: a host whose configured channels do
/// not all resolve does not start, so every plugin directory has them.
const CHANNEL_PLUGINS: [&str; 4] = ["inbox", "aliyun_sms", "wechat", "fcm"];

/// A host configuration with the four channels and the given directories.
fn config(plugin_dir: &Path, policy_dir: &Path, data_dir: &Path) -> HostConfig {
    let mut c = HostConfig::parse(
        Path::new("test.toml"),
        &format!("[plugin_limits]\ninstances = 96\n{CHANNELS}"),
    )
    .unwrap();
    c.plugin_dir = plugin_dir.to_path_buf();
    c.policy_dir = policy_dir.to_path_buf();
    c.data_dir = data_dir.to_path_buf();
    c
}

/// One compiled-plugin cache for all tests (keyed by wasm hash and engine
/// configuration, so sharing is safe), so tests do not recompile each plugin.
fn shared_data() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-tests")
}

fn shared_cache() -> PathBuf {
    shared_data().join("cache")
}

/// Writes a file whole (temp + rename), as an editor's atomic save does.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn copy_plugin(from: PathBuf, dir: &Path) {
    std::fs::copy(&from, dir.join(from.file_name().unwrap())).unwrap();
}

fn repo_policies() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

fn load(dir: &Path) -> Result<PolicySet, Vec<String>> {
    let registry = real_registry(Some(&shared_cache()));
    let config = config(Path::new("unused"), dir, Path::new("unused"));
    let catalog = RegistryCatalog {
        registry: &registry,
        config: &config,
    };
    PolicySet::load_dir(dir, &catalog).map_err(|e| e.iter().map(|e| e.to_string()).collect())
}

#[test]
fn every_example_policy_validates_against_the_real_plugins() {
    let set = load(&repo_policies()).unwrap_or_else(|e| panic!("{e:#?}"));
    let mut types: Vec<&str> = set.by_biz_type.keys().map(String::as_str).collect();
    types.sort();
    assert_eq!(
        types,
        [
            "INTERVIEW_REMINDER",
            "JOB_RECOMMENDATION",
            "ORDER_SHIPPED",
            "RESUME_VIEWED",
            "SYSTEM_BROADCAST",
            "WEEKLY_DIGEST"
        ]
    );
    let broadcast = set.get("SYSTEM_BROADCAST").unwrap();
    assert_eq!(
        broadcast.spec.dedup,
        pushonce::route::policy::DedupMode::Bloom
    );
    let capped = set.get("JOB_RECOMMENDATION").unwrap();
    let names: Vec<&str> = capped.caps.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "JOB_RECOMMENDATION/all-channels",
            "JOB_RECOMMENDATION/per-channel"
        ]
    );
    assert!(set.get("WEEKLY_DIGEST").unwrap().spec.quiet.is_some());
    let shipped = set.get("ORDER_SHIPPED").unwrap();
    assert_eq!(shipped.key_policy_version.to_string(), "1.0.0");
    assert_eq!(
        shipped.spec.fallback.get("sms").map(String::as_str),
        Some("app-push")
    );
}

#[test]
fn bad_files_are_refused_naming_file_line_and_reason() {
    let base = "biz_type = \"A\"\nkey_policy = \"per-event@^1\"\nchannels = [\"sms\", \"app-push\"]\nwindow = \"1h\"\n";
    let cases: [(&str, String, &str); 6] = [
        (
            "malformed.toml",
            "biz_type = \"A\"\nwindow = 24h\n".into(),
            "malformed.toml:2: ",
        ),
        (
            "unknown-key.toml",
            format!("{base}[retry]\nmax_attempt = 3\n"),
            "unknown-key.toml:6: retry.max_attempt: unknown field `max_attempt`, expected `max_attempts` or `backoff`",
        ),
        (
            "no-such-version.toml",
            base.replace("per-event@^1", "per-event@^3"),
            "no-such-version.toml: key_policy: ",
        ),
        (
            "cycle.toml",
            format!("{base}[fallback]\nsms = \"app-push\"\n\"app-push\" = \"sms\"\n"),
            "cycle.toml: fallback.app-push: fallback cycle: app-push -> sms -> app-push",
        ),
        (
            "unknown-channel.toml",
            base.replace("\"app-push\"]", "\"fax\"]"),
            "unknown-channel.toml: channels: channel `fax` is not configured on this host",
        ),
        (
            "bad-window.toml",
            base.replace("\"1h\"", "\"0s\""),
            "bad-window.toml: window: 0s is shorter than 1s",
        ),
    ];
    for (file, text, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join(file), &text);
        let errors = load(dir.path()).expect_err(file);
        assert_eq!(errors.len(), 1, "{errors:?}");
        let shown = errors[0].replace(&format!("{}/", dir.path().display()), "");
        assert!(
            shown.starts_with(expected),
            "{file}: got `{shown}`, want `{expected}…`"
        );
    }
    // An unresolvable version says which versions exist.
    let dir = tempfile::tempdir().unwrap();
    write(
        &dir.path().join("v.toml"),
        &base.replace("per-event@^1", "per-event@^3"),
    );
    let errors = load(dir.path()).unwrap_err();
    assert!(errors[0].contains("1.0.0"), "{}", errors[0]);
    // Two files routing one biz_type: the second names the first.
    write(&dir.path().join("v.toml"), base);
    write(&dir.path().join("w.toml"), base);
    let errors = load(dir.path()).unwrap_err();
    assert!(
        errors[0].contains("w.toml: biz_type: `A` is already routed by"),
        "{}",
        errors[0]
    );
}

/// A running set of plugins and policies on temporary directories, reloaded
/// by the directory watcher with `corpus` as the recent events.
struct Running {
    live: Arc<Live>,
    plugins: tempfile::TempDir,
    policies: tempfile::TempDir,
    _watch: pushonce::route::watch::DirWatch,
    triggers: mpsc::Sender<Trigger>,
}

fn policy(key_policy: &str, channels: &str) -> String {
    format!(
        "biz_type = \"RESUME_VIEWED\"\nkey_policy = \"{key_policy}\"\nchannels = {channels}\nwindow = \"1h\"\n"
    )
}

async fn running(plugins: &[PathBuf], policy_text: &str) -> Running {
    let (plugin_dir, policy_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for p in plugins.iter().cloned().chain(CHANNEL_PLUGINS.map(real)) {
        copy_plugin(p, plugin_dir.path());
    }
    write(&policy_dir.path().join("resume.toml"), policy_text);
    let config = config(plugin_dir.path(), policy_dir.path(), &shared_data());
    let live = Arc::new(Live::load(Arc::new(config)).unwrap_or_else(|e| panic!("{e}")));
    let (tx, rx) = mpsc::channel(4);
    let watch = watch_dirs(&[plugin_dir.path(), policy_dir.path()], tx.clone()).unwrap();
    let mut corpus_event = event("u-7", 1_764_000_000_000, &[]);
    corpus_event.biz_type = "RESUME_VIEWED".into();
    corpus_event.biz_id = "r-42".into();
    let reload = reloader(live.clone(), move || {
        let events = vec![corpus_event.clone()];
        async move { Ok(events) }
    });
    tokio::spawn(reload_loop(reload, rx));
    Running {
        live,
        plugins: plugin_dir,
        policies: policy_dir,
        _watch: watch,
        triggers: tx,
    }
}

impl Running {
    fn generation(&self) -> u64 {
        self.live.current().generation
    }

    fn resolved(&self) -> String {
        let snap = self.live.current();
        let p = snap.policies.get("RESUME_VIEWED").unwrap();
        format!(
            "{}@{}",
            p.spec.key_policy.split('@').next().unwrap(),
            p.key_policy_version
        )
    }

    async fn wait_refused(&self, what: &str) -> Vec<String> {
        let live = self.live.clone();
        wait_until(Duration::from_secs(10), || {
            let live = live.clone();
            async move { live.last_refused().is_some() }
        })
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        self.live.last_refused().unwrap().errors
    }

    /// Waits for a refused reload one of whose reasons contains `text`.
    async fn wait_refused_naming(&self, text: &str) -> Vec<String> {
        let live = self.live.clone();
        wait_until(Duration::from_secs(10), || {
            let live = live.clone();
            async move {
                live.last_refused()
                    .is_some_and(|r| r.errors.iter().any(|e| e.contains(text)))
            }
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "no refusal naming `{text}` ({:?}): {e}",
                self.live.last_refused()
            )
        });
        self.live.last_refused().unwrap().errors
    }

    async fn wait_generation(&self, generation: u64) {
        let live = self.live.clone();
        wait_until(Duration::from_secs(10), || {
            let live = live.clone();
            async move { live.current().generation >= generation }
        })
        .await
        .unwrap_or_else(|e| panic!("generation {generation} never came: {e}"));
    }
}

#[tokio::test]
async fn an_edited_policy_is_picked_up_and_an_invalid_edit_leaves_the_old_set() {
    let r = running(
        &[real("per_user_per_day")],
        &policy("per-user-per-day@^1", "[\"inbox\"]"),
    )
    .await;
    assert_eq!(r.generation(), 1);
    write(
        &r.policies.path().join("resume.toml"),
        &policy("per-user-per-day@^1", "[\"inbox\", \"sms\"]"),
    );
    r.wait_generation(2).await;
    let snap = r.live.current();
    assert_eq!(
        snap.policies.get("RESUME_VIEWED").unwrap().spec.channels,
        ["inbox", "sms"]
    );
    assert!(r.live.last_refused().is_none());

    write(
        &r.policies.path().join("resume.toml"),
        "biz_type = \"RESUME_VIEWED\"\nwindow = forever\n",
    );
    let errors = r.wait_refused("an invalid edit").await;
    assert!(
        errors[0].contains("/resume.toml:2: "),
        "names the file and line: {errors:?}"
    );
    assert_eq!(r.generation(), 2, "the running set stays in force");
    let snap = r.live.current();
    assert_eq!(
        snap.policies.get("RESUME_VIEWED").unwrap().spec.channels,
        ["inbox", "sms"]
    );

    // An explicit trigger (SIGHUP, admin API) reloads too.
    write(
        &r.policies.path().join("resume.toml"),
        &policy("per-user-per-day@^1", "[\"wechat\"]"),
    );
    r.triggers.send(Trigger::Admin).await.unwrap();
    r.wait_generation(3).await;
}

#[tokio::test]
async fn a_minor_upgrade_that_changes_keys_is_refused_with_an_example() {
    let r = running(
        &[fixture("versioned_1_0_0")],
        &policy("versioned@^1", "[\"inbox\"]"),
    )
    .await;
    assert_eq!(r.resolved(), "versioned@1.0.0");
    copy_plugin(fixture("versioned_1_2_0"), r.plugins.path());
    let errors = r.wait_refused("versioned 1.2.0").await;
    let line = &errors[0];
    assert!(line.contains("resume.toml: key policy versioned@1.0.0 -> versioned@1.2.0 changes keys within major version 1"), "{line}");
    assert!(
        line.contains("biz_id=r-42 user_id=u-7"),
        "names the example event: {line}"
    );
    assert!(
        line.contains(
            "`push:versioned@1:inbox:v1.0.0:u-7` would become `push:versioned@1:inbox:v1.2.0:u-7`"
        ),
        "{line}"
    );
    assert_eq!(r.generation(), 1);
    assert_eq!(
        r.resolved(),
        "versioned@1.0.0",
        "the old version keeps serving"
    );
}

#[tokio::test]
async fn a_minor_upgrade_that_keeps_keys_is_swapped_in() {
    let r = running(
        &[fixture("stable_1_0_0")],
        &policy("stable@^1", "[\"inbox\", \"sms\"]"),
    )
    .await;
    copy_plugin(fixture("stable_1_1_0"), r.plugins.path());
    r.wait_generation(2).await;
    assert_eq!(r.resolved(), "stable@1.1.0");
    assert!(r.live.last_refused().is_none());
}

#[tokio::test]
async fn a_new_major_version_or_policy_name_starts_a_new_key_space() {
    let r = running(
        &[fixture("versioned_1_0_0"), fixture("versioned_2_0_0")],
        &policy("versioned@^1", "[\"inbox\"]"),
    )
    .await;
    let mut ev = event("u-7", 1_764_000_000_000, &[]);
    ev.biz_type = "RESUME_VIEWED".into();
    let before = stability::keys_for(&r.live.current(), &ev).unwrap();
    assert_eq!(
        before,
        [(
            "inbox".to_string(),
            "push:versioned@1:inbox:v1.0.0:u-7".to_string()
        )]
    );

    // Major 2: allowed, on purpose, and its keys live in another space.
    write(
        &r.policies.path().join("resume.toml"),
        &policy("versioned@^2", "[\"inbox\"]"),
    );
    r.wait_generation(2).await;
    let after = stability::keys_for(&r.live.current(), &ev).unwrap();
    assert_eq!(after[0].1, "push:versioned@2:inbox:v2.0.0:u-7");

    // Another policy name: a new key space too, whatever the version.
    copy_plugin(real("per_user_per_day"), r.plugins.path());
    write(
        &r.policies.path().join("resume.toml"),
        &policy("per-user-per-day@^1", "[\"inbox\"]"),
    );
    r.wait_generation(3).await;
    let renamed = stability::keys_for(&r.live.current(), &ev).unwrap();
    assert!(
        renamed[0].1.starts_with("push:per-user-per-day@1:inbox:"),
        "{renamed:?}"
    );
}

/// A `per-user-per-day` policy for `biz_type` with `params.tz = tz`.
fn daily(biz_type: &str, tz: &str) -> String {
    format!(
        "biz_type = \"{biz_type}\"\nkey_policy = \"per-user-per-day@^1\"\nchannels = [\"inbox\"]\nwindow = \"1h\"\nparams = {{ tz = \"{tz}\" }}\n"
    )
}

#[tokio::test]
async fn a_params_edit_that_changes_keys_or_breaks_the_key_policy_is_refused() {
    let r = running(
        &[real("per_user_per_day")],
        &daily("RESUME_VIEWED", "+08:00"),
    )
    .await;
    let file = r.policies.path().join("resume.toml");
    // Same plugin, new `tz`: the corpus event (16:00 UTC) falls on another
    // day, so a re-post within the window would be sent again.
    write(&file, &daily("RESUME_VIEWED", "+00:00"));
    let errors = r.wait_refused_naming("params").await;
    let line = &errors[0];
    assert!(
        line.contains(&format!(
            "{}: params: {{tz = \"+08:00\"}} -> {{tz = \"+00:00\"}} (key policy per-user-per-day@1.0.0) changes keys within major version 1",
            file.display()
        )),
        "{line}"
    );
    assert!(line.contains("biz_id=r-42 user_id=u-7"), "{line}");
    assert!(
        line.contains("`push:per-user-per-day@1:inbox:u-7:2025-11-25` would become `push:per-user-per-day@1:inbox:u-7:2025-11-24`"),
        "{line}"
    );
    assert_eq!(r.generation(), 1, "the running set stays in force");

    // A typo the key policy refuses on every event: refused at load, naming
    // the file and the field, whatever the corpus holds.
    write(&file, &daily("RESUME_VIEWED", "+8"));
    let errors = r.wait_refused_naming("params.tz").await;
    assert!(
        errors[0].starts_with(&format!(
            "{}: params.tz: \"+8\" makes key policy per-user-per-day@1.0.0 refuse every event",
            file.display()
        )),
        "{errors:?}"
    );
    assert!(errors[0].contains("not a fixed UTC offset"), "{errors:?}");
    assert_eq!(r.generation(), 1);
    let snap = r.live.current();
    let params = &snap.policies.get("RESUME_VIEWED").unwrap().spec.params;
    assert_eq!(params.get("tz").map(String::as_str), Some("+08:00"));
}

#[tokio::test]
async fn a_key_change_with_no_event_to_check_on_is_swapped_in_with_a_note() {
    let (plugin_dir, policy_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    for p in [real("per_user_per_day")]
        .into_iter()
        .chain(CHANNEL_PLUGINS.map(real))
    {
        copy_plugin(p, plugin_dir.path());
    }
    let file = policy_dir.path().join("job.toml");
    write(&file, &daily("JOB_POSTED", "+08:00"));
    let config = config(plugin_dir.path(), policy_dir.path(), &shared_data());
    let live = Arc::new(Live::load(Arc::new(config)).unwrap_or_else(|e| panic!("{e}")));
    // A fresh deployment: the corpus holds no event of the type.
    write(&file, &daily("JOB_POSTED", "+00:00"));
    let reload = reloader(live.clone(), || async { Ok(vec![resume_event()]) });
    let done = reload().await.unwrap_or_else(|r| panic!("{:?}", r.errors));
    assert_eq!(done.generation, 2);
    assert_eq!(done.notes.len(), 1, "{:?}", done.notes);
    assert!(
        done.notes[0].contains("params: {tz = \"+08:00\"} -> {tz = \"+00:00\"}")
            && done.notes[0]
                .contains("keys not checked: the corpus holds no recent `JOB_POSTED` event"),
        "{:?}",
        done.notes
    );
    assert_eq!(
        live.current().notes,
        done.notes,
        "the set in force says so too"
    );
    // Redis did not answer: said too.
    write(&file, &daily("JOB_POSTED", "+05:30"));
    let reload = reloader(live.clone(), || async {
        Err("connection refused".to_string())
    });
    let done = reload().await.unwrap_or_else(|r| panic!("{:?}", r.errors));
    assert_eq!(
        done.notes[0], "the event corpus could not be read: connection refused",
        "{:?}",
        done.notes
    );
    // Nothing changed: nothing to note.
    let done = reload().await.unwrap();
    assert!(done.notes.is_empty(), "{:?}", done.notes);
}

#[test]
fn policies_diff_counts_changed_keys_with_examples() {
    let (old, new) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    write(
        &old.path().join("r.toml"),
        &policy("per-event@^1", "[\"inbox\", \"sms\"]"),
    );
    write(
        &new.path().join("r.toml"),
        &policy("per-user-per-day@^1", "[\"inbox\", \"wechat\"]"),
    );
    let build = |dir: &Path| {
        let c = config(&pushonce_tests::plugins::real_dir(), dir, &shared_data());
        pushonce::route::live::build(&c, &pushonce::route::live::limits_of(&c), 1).unwrap()
    };
    let (a, b) = (build(old.path()), build(new.path()));
    let mut events: Vec<_> = (0..5)
        .map(|i| event(&format!("u-{i}"), 1_764_000_000_000, &[]))
        .collect();
    for e in &mut events {
        e.biz_type = "RESUME_VIEWED".into();
    }
    events.push(event("u-9", 1, &[])); // ORDER_SHIPPED: routed by neither set
    let d = stability::diff(&a, &b, &events, 3);
    assert_eq!(
        (d.events, d.compared, d.changed, d.added, d.removed),
        (6, 5, 5, 5, 5)
    );
    assert_eq!(d.examples.len(), 3);
    assert_eq!(d.examples[0][1], "inbox");
    assert!(d.examples[0][2].starts_with("push:per-event@1:inbox:"));
    assert!(d.examples[0][3].starts_with("push:per-user-per-day@1:inbox:"));
    assert_eq!(
        d.errors,
        ["ORDER_SHIPPED/o-1/u-9: old set: no policy routes biz_type `ORDER_SHIPPED`"]
    );
}

/// The corpus event of [`running`], for a reloader of one's own.
fn resume_event() -> pushonce::event::Event {
    let mut e = event("u-7", 1_764_000_000_000, &[]);
    e.biz_type = "RESUME_VIEWED".into();
    e.biz_id = "r-42".into();
    e
}

/// The checked reload of [`running`]'s host, as `POST /admin/reload` runs it.
fn admin_reload(r: &Running) -> pushonce::route::watch::Reloader {
    reloader(r.live.clone(), || async { Ok(vec![resume_event()]) })
}

#[tokio::test]
async fn a_pasted_policy_is_checked_diffed_and_applied() {
    let r = running(
        &[real("per_event"), real("per_user_per_day")],
        &policy("per-event@^1", "[\"inbox\"]"),
    )
    .await;
    let file = r.policies.path().join("resume.toml");
    let (current, config) = (r.live.current(), r.live.config().clone());
    let bad = policy("per-week@^1", "[\"inbox\"]");
    let errors = candidate::plan(&current, &config, &bad, &[], 10).unwrap_err();
    assert!(
        errors[0].contains("resume.toml: key_policy: ") && errors[0].contains("per-week"),
        "names the file the candidate would replace and the field: {errors:?}"
    );
    let unparsable = candidate::plan(&current, &config, "biz_type = [", &[], 10).unwrap_err();
    assert!(unparsable[0].starts_with("pasted.toml:1"), "{unparsable:?}");

    let good = policy("per-user-per-day@^1", "[\"inbox\", \"sms\"]");
    let plan = candidate::plan(&current, &config, &good, &[resume_event()], 10).unwrap();
    assert_eq!(
        (plan.target.as_path(), plan.replaces),
        (file.as_path(), true)
    );
    assert_eq!(
        (plan.diff.compared, plan.diff.changed, plan.diff.added),
        (1, 1, 1),
        "{}",
        plan.diff.summary()
    );
    assert!(plan.diff.examples[0][3].starts_with("push:per-user-per-day@1:inbox:u-7:"));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        policy("per-event@^1", "[\"inbox\"]")
    );

    let applied = candidate::apply(&r.live, &admin_reload(&r), &good)
        .await
        .unwrap();
    assert_eq!(applied.target, file);
    assert!(applied.generation >= 2);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), good);
    assert!(
        r.resolved().starts_with("per-user-per-day@1."),
        "{}",
        r.resolved()
    );

    // A new business type goes to a file of its own.
    let other = good.replace("RESUME_VIEWED", "JOB_POSTED");
    let plan = candidate::plan(&r.live.current(), &config, &other, &[], 10).unwrap();
    assert_eq!(plan.target, r.policies.path().join("job-posted.toml"));
    assert!(!plan.replaces);
}

#[tokio::test]
async fn a_refused_apply_puts_the_policy_directory_back() {
    let original = policy("versioned@^1", "[\"inbox\"]");
    let r = running(&[fixture("versioned_1_0_0")], &original).await;
    // A minor upgrade that changes keys arrives in the plugin directory:
    // the reload it triggers is refused, 1.0.0 keeps serving.
    copy_plugin(fixture("versioned_1_2_0"), r.plugins.path());
    r.wait_refused("versioned 1.2.0").await;
    let edit = policy("versioned@^1", "[\"inbox\", \"sms\"]");
    let refused = candidate::apply(&r.live, &admin_reload(&r), &edit).await;
    let Err(ApplyError::Refused { errors, restored }) = refused else {
        panic!("refused: {refused:?}");
    };
    assert!(restored);
    assert!(
        errors[0].contains("changes keys within major version 1"),
        "{errors:?}"
    );
    let file = r.policies.path().join("resume.toml");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        original,
        "put back"
    );
    assert_eq!(r.generation(), 1);
    let new_file = candidate::apply(
        &r.live,
        &admin_reload(&r),
        &edit.replace("RESUME_VIEWED", "JOB_POSTED"),
    )
    .await;
    assert!(matches!(
        new_file,
        Err(ApplyError::Refused { restored: true, .. })
    ));
    assert!(
        !r.policies.path().join("job-posted.toml").exists(),
        "a new file is removed again"
    );
}

#[tokio::test]
async fn an_apply_that_cannot_write_the_file_says_why() {
    let r = running(&[real("per_event")], &policy("per-event@^1", "[\"inbox\"]")).await;
    // Where the pasted file is staged before its rename is taken by a directory.
    std::fs::create_dir(r.policies.path().join(".resume.toml.pasting")).unwrap();
    let edit = policy("per-event@^1", "[\"inbox\", \"sms\"]");
    let refused = candidate::apply(&r.live, &admin_reload(&r), &edit).await;
    let Err(e @ ApplyError::Write { .. }) = refused else {
        panic!("not written: {refused:?}");
    };
    let text = e.to_string();
    assert!(
        text.contains("cannot write") && text.contains("resume.toml: Is a directory"),
        "names the file and the cause: {text}"
    );
    assert_eq!(
        std::fs::read_to_string(r.policies.path().join("resume.toml")).unwrap(),
        policy("per-event@^1", "[\"inbox\"]")
    );
}
