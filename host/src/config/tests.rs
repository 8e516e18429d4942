//! The configuration's unit tests: parsing, environment overrides and checks.

use super::*;

#[test]
fn dispatch_defaults_to_on_and_can_be_switched_off() {
    let file = Path::new("pushonce.toml");
    assert!(HostConfig::parse(file, "workers = 4\n").unwrap().dispatch);
    let api_only = HostConfig::parse(file, "dispatch = false\n").unwrap();
    assert!(!api_only.dispatch);
    api_only.check().unwrap();
}

#[test]
fn redis_cluster_from_file_and_env_and_never_with_redis_url() {
    let file = Path::new("pushonce.toml");
    let mut c = HostConfig::parse(
        file,
        "redis_cluster = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]\n",
    )
    .unwrap();
    c.check().unwrap();
    assert!(matches!(
        c.redis_target(),
        crate::store::RedisTarget::Cluster(urls) if urls.len() == 2
    ));
    c.apply_env(|v| {
        (v == "PUSHONCE_REDIS_CLUSTER")
            .then(|| "redis://10.0.0.1:7000, redis://10.0.0.2:7000".into())
    })
    .unwrap();
    assert_eq!(
        c.redis_cluster,
        ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]
    );
    c.redis_url = Some("redis://127.0.0.1:6379".into());
    let err = c.check().unwrap_err().to_string();
    assert!(
        err.starts_with("redis_cluster:") && err.contains("not both"),
        "{err}"
    );
    c.redis_url = None;
    c.redis_cluster = vec!["redis+unix:///tmp/r.sock".into()];
    let err = c.check().unwrap_err().to_string();
    assert!(err.contains("redis://"), "{err}");
    c.apply_env(|v| (v == "PUSHONCE_REDIS_CLUSTER").then(String::new))
        .unwrap();
    assert!(
        c.redis_cluster.is_empty(),
        "an empty value means no cluster"
    );
}

#[test]
fn ended_tasks_leave_redis_by_default_and_keeping_them_is_an_opt_in() {
    let file = Path::new("pushonce.toml");
    let default = HostConfig::parse(file, "").unwrap();
    default.check().unwrap();
    assert_eq!(default.keep_ended_tasks, None);
    assert_eq!(crate::service::permit_config(&default).keep_ended, None);
    let kept = HostConfig::parse(file, "keep_ended_tasks = \"7d\"\n").unwrap();
    kept.check().unwrap();
    assert_eq!(
        crate::service::permit_config(&kept).keep_ended,
        Some(Duration::from_secs(7 * 24 * 3600))
    );
    let err = HostConfig::parse(file, "keep_ended_tasks = \"10ms\"\n")
        .unwrap()
        .check()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("keep_ended_tasks:") && err.contains("at least 1s"),
        "{err}"
    );
    let err = HostConfig::parse(file, "delivered_retention = \"1h\"\n")
        .unwrap()
        .check()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("delivered_retention:") && err.contains("keep_ended_tasks"),
        "{err}"
    );
    let err = HostConfig::parse(file, "task_retention = \"1ms\"\n")
        .unwrap()
        .check()
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("task_retention:"), "{err}");
}

#[test]
fn ledger_history_defaults_to_30_days_and_is_at_least_a_second() {
    let file = Path::new("pushonce.toml");
    let default = HostConfig::parse(file, "").unwrap();
    assert_eq!(default.ledger_history, Duration::from_secs(30 * 24 * 3600));
    let short = HostConfig::parse(file, "ledger_history = \"5s\"\n").unwrap();
    assert_eq!(short.ledger_history, Duration::from_secs(5));
    short.check().unwrap();
    let err = HostConfig::parse(file, "ledger_history = \"500ms\"\n")
        .unwrap()
        .check()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("ledger_history:") && err.contains("at least 1s"),
        "{err}"
    );
}

#[test]
fn unknown_key_names_file_line_and_field() {
    let err = HostConfig::parse(
        Path::new("pushonce.toml"),
        "shards = 4\n[channels.sms]\nplugin = \"sms@^1\"\nallowed_host = [\"x\"]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("pushonce.toml:4: "), "{err}");
    assert!(err.contains("allowed_host"), "{err}");
}

#[test]
fn wrong_type_names_the_field_path() {
    let err = HostConfig::parse(
        Path::new("pushonce.toml"),
        "[plugin_limits]\nmemory = \"lots\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("pushonce.toml:2: plugin_limits.memory: "),
        "{err}"
    );
}

#[test]
fn environment_overrides_the_file() {
    let mut c = HostConfig::parse(
        Path::new("pushonce.toml"),
        "listen = \"127.0.0.1:9000\"\nredis_url = \"redis://127.0.0.1:1/\"\n",
    )
    .unwrap();
    c.apply_env(|v| match v {
        "PUSHONCE_LISTEN" => Some("127.0.0.1:9100".into()),
        "PUSHONCE_REDIS_URL" => Some(String::new()),
        _ => None,
    })
    .unwrap();
    assert_eq!(c.listen.port(), 9100);
    assert_eq!(c.redis_url, None, "an empty URL means the embedded Redis");
    let bad = c.apply_env(|v| (v == "PUSHONCE_LISTEN").then(|| "nowhere".into()));
    assert!(bad.unwrap_err().to_string().contains("PUSHONCE_LISTEN"));
}

#[test]
fn a_channel_with_providers_names_configured_single_plugin_channels() {
    let parse = |text: &str| {
        HostConfig::parse(Path::new("pushonce.toml"), text).and_then(|c| c.check().map(|_| c))
    };
    let ok = parse(
        "[channels.sms]\nproviders = [\"sms-aliyun\", \"sms-tencent\"]\n\
         [channels.sms-aliyun]\nplugin = \"aliyun-sms@^1\"\n\
         [channels.sms-tencent]\nplugin = \"tencent-sms@^1\"\n",
    )
    .unwrap();
    assert_eq!(ok.channels["sms"].providers, ["sms-aliyun", "sms-tencent"]);
    for (text, says) in [
        (
            "[channels.sms]\nproviders = [\"nope\"]\n",
            "not a configured channel",
        ),
        (
            "[channels.sms]\nplugin = \"a@^1\"\nproviders = [\"b\"]\n[channels.b]\nplugin = \"b@^1\"\n",
            "beside `plugin`",
        ),
        ("[channels.sms]\nsettings = {}\n", "plugin: is missing"),
        (
            "[channels.sms]\nproviders = [\"b\", \"b\"]\n[channels.b]\nplugin = \"b@^1\"\n",
            "twice",
        ),
    ] {
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains(says), "{text}: {err}");
    }
}

#[test]
fn checks_refuse_values_that_cannot_work() {
    let c = HostConfig {
        redis_url: Some("http://127.0.0.1".into()),
        ..HostConfig::default()
    };
    assert!(c.check().unwrap_err().to_string().starts_with("redis_url:"));
    let c = HostConfig {
        shards: 0,
        ..HostConfig::default()
    };
    assert!(c.check().unwrap_err().to_string().starts_with("shards:"));
    let mut c = HostConfig::default();
    c.reconcile.max_checks = 0;
    let err = c.check().unwrap_err().to_string();
    assert!(err.starts_with("reconcile.max_checks:"), "{err}");
    let c = HostConfig {
        event_index: false,
        ledger_url: Some("off".into()),
        ..HostConfig::default()
    };
    let err = c.check().unwrap_err().to_string();
    assert!(
        err.starts_with("event_index: false needs the delivery ledger"),
        "{err}"
    );
    let c = HostConfig {
        event_index: false,
        ..HostConfig::default()
    };
    c.check().unwrap();
    let c = HostConfig {
        allow_evicting_redis: true,
        ledger_url: Some("off".into()),
        ..HostConfig::default()
    };
    let err = c.check().unwrap_err().to_string();
    assert!(
        err.starts_with("allow_evicting_redis: true needs the delivery ledger"),
        "{err}"
    );
}

#[test]
fn http_and_occurred_at_years_are_read_and_checked() {
    let file = Path::new("pushonce.toml");
    let c = HostConfig::parse(
            file,
            "occurred_at_years = { from = 2010, to = 2030 }\n[http]\nheader_read_timeout = \"2s\"\nmax_connections = 8\n",
        )
        .unwrap();
    c.check().unwrap();
    assert_eq!(c.occurred_at_years.from, 2010);
    assert_eq!(c.http.header_read_timeout, Duration::from_secs(2));
    assert_eq!(c.http.max_connections, 8);
    assert!(!c.http.allow_open_network);
    for (text, field) in [
        (
            "occurred_at_years = { from = 2100, to = 2000 }\n",
            "occurred_at_years:",
        ),
        ("[http]\nmax_connections = 0\n", "http.max_connections:"),
        ("redis_ca_file = \"/ca.pem\"\n", "redis_ca_file:"),
    ] {
        let c = HostConfig::parse(file, text).unwrap();
        let err = c.check().unwrap_err().to_string();
        assert!(err.starts_with(field), "{err}");
    }
}

#[test]
fn send_at_bounds_are_read_defaulted_and_checked() {
    let file = Path::new("pushonce.toml");
    let c = HostConfig::parse(file, "").unwrap();
    assert_eq!(c.send_at.grace, Duration::from_secs(300));
    assert_eq!(c.send_at.horizon, Duration::from_secs(30 * 86400));
    let c = HostConfig::parse(file, "send_at = { horizon = \"2d\" }\n").unwrap();
    c.check().unwrap();
    assert_eq!(c.send_at.horizon, Duration::from_secs(2 * 86400));
    assert_eq!(
        c.send_at.grace,
        Duration::from_secs(300),
        "grace keeps its default"
    );
    let c = HostConfig::parse(file, "send_at = { horizon = \"0s\" }\n").unwrap();
    let err = c.check().unwrap_err().to_string();
    assert!(
        err.starts_with("send_at.horizon: must be at least 1s"),
        "{err}"
    );
    let err = HostConfig::parse(file, "send_at = { horizn = \"2d\" }\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("horizn"), "{err}");
}

#[test]
fn plugin_instances_must_cover_the_channels_sends_and_key_policies() {
    let file = Path::new("pushonce.toml");
    let channels = "[channels.a]\nplugin = \"inbox@^2\"\nconcurrency = 40\n\
                    [channels.b]\nplugin = \"inbox@^2\"\nconcurrency = 24\n";
    let c = HostConfig::parse(
        file,
        &format!("[plugin_limits]\ninstances = 96\n{channels}"),
    )
    .unwrap();
    c.check().unwrap();
    let c = HostConfig::parse(
        file,
        &format!("[plugin_limits]\ninstances = 95\n{channels}"),
    )
    .unwrap();
    let err = c.check().unwrap_err().to_string();
    assert!(
        err.starts_with(
            "plugin_limits.instances: is 95, fewer than the channels may hold at once (64"
        ) && err.contains("at least 96"),
        "{err}"
    );
}

#[test]
fn reconcile_table_reads_durations_and_refuses_unknown_keys() {
    let c = HostConfig::parse(
            Path::new("pushonce.toml"),
            "[reconcile]\nunknown_age = \"2s\"\nmax_checks = 3\n[reconcile.backoff]\ninitial = \"1s\"\n",
        )
        .unwrap();
    assert_eq!(c.reconcile.unknown_age, Duration::from_secs(2));
    assert_eq!(c.reconcile.max_checks, 3);
    assert_eq!(
        c.reconcile.sent_age,
        Duration::from_secs(600),
        "default kept"
    );
    let b = &c.reconcile.backoff;
    assert_eq!(b.delay_after(1), Duration::from_secs(1));
    assert_eq!(b.delay_after(3), Duration::from_secs(4));
    assert_eq!(b.delay_after(40), b.max);
    let err = HostConfig::parse(Path::new("pushonce.toml"), "[reconcile]\nevery_ = \"1s\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("pushonce.toml:2: "), "{err}");
}

#[cfg(test)]
mod example {
    use super::*;

    #[test]
    fn the_repository_pushonce_toml_is_valid() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pushonce.toml");
        let text = std::fs::read_to_string(&file).unwrap();
        let config = HostConfig::parse(&file, &text).unwrap_or_else(|e| panic!("{e}"));
        config.check().unwrap();
        let channels: Vec<&str> = config.channels.keys().map(String::as_str).collect();
        assert_eq!(
            channels,
            ["apns", "app-push", "inbox", "sms", "webhook", "wechat"]
        );
    }
}
