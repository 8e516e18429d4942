//! Issue 20's attacks, each replayed against a real host: a panic input
//! (alone and inside a batch), a host on 0.0.0.0 without tokens, a FIFO and
//! a link to `/dev/zero` among the policies and plugins, slow headers and a
//! connection cap, and the exit code of `plugins list` with refused files.

use std::process::Command;
use std::time::Duration;

use pushonce::config::HostConfig;
use pushonce_tests::host::{Setup, TestHost, order_shipped};
use pushonce_tests::process::pushonce_bin;
use pushonce_tests::redis::RedisServer;
use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The input of issue 20: a multi-byte character where the seconds go.
const PANIC_INPUT: &str = "2026-11-30T15:59:\u{20ac}Z";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_occurred_at_is_a_422_naming_it_alone_and_in_a_batch() {
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let mut bad = order_shipped("o-bad");
    bad["occurred_at"] = json!(PANIC_INPUT);
    let a = host.post("/v1/events", &bad, None).await.unwrap();
    assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", a.body);
    assert_eq!(a.content_type(), "application/problem+json");
    assert_eq!(a.body["field"], "occurred_at", "{}", a.body);

    let mut implausible = order_shipped("o-1999");
    implausible["occurred_at"] = json!("1999-12-31T23:59:59Z");
    let batch = json!({"events": [bad, order_shipped("o-good"), implausible]});
    let a = host.post("/v1/events:batch", &batch, None).await.unwrap();
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let results = a.body["results"].as_array().unwrap();
    assert_eq!(results[0]["status"], 422, "{}", a.body);
    // Each item carries its `index`; the field is named within the event.
    assert_eq!(results[0]["index"], 0);
    assert_eq!(results[0]["problem"]["field"], "occurred_at", "{}", a.body);
    assert_eq!(
        results[1]["status"], 202,
        "the rest of the batch is answered"
    );
    assert_eq!(results[2]["problem"]["field"], "occurred_at");
    assert!(
        results[2]["problem"]["detail"]
            .as_str()
            .unwrap()
            .contains("year 1999"),
        "{}",
        a.body
    );
    host.shutdown().await.unwrap();
}

fn config_listening_on(listen: &str, extra: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pushonce.toml");
    let text = format!(
        "listen = \"{listen}\"\nredis_url = \"redis://127.0.0.1:1\"\nplugin_dir = \"{0}/plugins\"\npolicy_dir = \"{0}/policies\"\ndata_dir = \"{0}/data\"\n{extra}",
        dir.path().display()
    );
    std::fs::write(&file, text).unwrap();
    (dir, file)
}

#[test]
fn serve_on_a_non_loopback_address_without_tokens_is_refused_before_binding() {
    let (_dir, file) = config_listening_on("0.0.0.0:0", "");
    let out = Command::new(pushonce_bin().unwrap())
        .args(["serve", "--config"])
        .arg(&file)
        .env_remove("PUSHONCE_LISTEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("0.0.0.0:0"), "{stderr}");
    assert!(stderr.contains("auth.api_token_env"), "{stderr}");
    assert!(stderr.contains("allow_open_network"), "{stderr}");
    assert!(
        !stderr.contains("redis"),
        "refused before anything else is opened: {stderr}"
    );
}

#[test]
fn a_non_loopback_address_needs_both_tokens_or_the_explicit_opt_in() {
    let open: std::net::SocketAddr = "0.0.0.0:8080".parse().unwrap();
    let mut c = HostConfig::default();
    c.auth.api_token_env = Some("API".into());
    c.auth.admin_token_env = Some("ADMIN".into());
    let env = |v: &str| matches!(v, "API" | "ADMIN").then(|| "t0ken".to_string());
    c.check_exposure(open, env).unwrap();
    let only_api = |v: &str| (v == "API").then(|| "t0ken".to_string());
    let err = c.check_exposure(open, only_api).unwrap_err().to_string();
    assert!(err.contains("auth.admin_token_env"), "{err}");
    assert!(!err.contains("auth.api_token_env"), "{err}");
    let c = HostConfig::parse(
        std::path::Path::new("pushonce.toml"),
        "[http]\nallow_open_network = true\n",
    )
    .unwrap();
    c.check_exposure(open, |_| None).unwrap();
    HostConfig::default()
        .check_exposure("127.0.0.1:8080".parse().unwrap(), |_| None)
        .unwrap();
    HostConfig::default()
        .check_exposure("[::1]:8080".parse().unwrap(), |_| None)
        .unwrap();
}

/// Resident memory of this process, in KiB (`VmRSS` of /proc/self/status).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_and_a_link_to_dev_zero_among_the_policies_are_refused_by_name() {
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let fifo = host.policy_dir().join("stall.toml");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // A FIFO would block the reload's read forever: the answer comes, naming it.
    let a = host.post("/admin/reload", &json!({}), None).await.unwrap();
    assert_eq!(a.status.as_u16(), 422, "{}", a.body);
    assert_names(&a.body["errors"].to_string(), "stall.toml", "FIFO");
    std::fs::remove_file(&fifo).unwrap();

    let before = rss_kib();
    let zero = host.policy_dir().join("zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let a = host.post("/admin/reload", &json!({}), None).await.unwrap();
    let grown = rss_kib().saturating_sub(before);
    assert_eq!(a.status.as_u16(), 422, "{}", a.body);
    assert_names(
        &a.body["errors"].to_string(),
        "zero.toml",
        "character device",
    );
    eprintln!("resident memory grew by {grown} KiB across the /dev/zero reload");
    assert!(grown < 256 * 1024, "grew by {grown} KiB");
    host.shutdown().await.unwrap();
}

#[test]
fn plugins_list_exits_non_zero_and_names_refused_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("junk.wasm"), b"not wasm").unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.wasm")).unwrap();
    let fifo = dir.path().join("pipe.wasm");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let out = Command::new(pushonce_bin().unwrap())
        .args(["plugins", "list", "--dir"])
        .arg(dir.path())
        .env("PUSHONCE_DATA_DIR", dir.path().join("data"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(stdout.contains("junk.wasm"), "{stdout}");
    assert_names(&stdout, "zero.wasm", "character device");
    assert_names(&stdout, "pipe.wasm", "FIFO");
}

#[test]
fn plugins_check_and_list_load_under_the_configured_plugin_limits() {
    let dir = tempfile::tempdir().unwrap();
    let plugin = pushonce_tests::plugins::real("per_event");
    std::fs::copy(&plugin, dir.path().join("per_event.wasm")).unwrap();
    let config = dir.path().join("pushonce.toml");
    std::fs::write(&config, "[plugin_limits]\nmax_file_size = \"16 KiB\"\n").unwrap();
    // A working directory without a pushonce.toml of its own.
    let cwd = dir.path().join("cwd");
    std::fs::create_dir(&cwd).unwrap();
    let run = |args: &[&str], with_config: bool| {
        let mut cmd = Command::new(pushonce_bin().unwrap());
        cmd.args(args)
            .current_dir(&cwd)
            .env("PUSHONCE_DATA_DIR", dir.path().join("data"));
        if with_config {
            cmd.arg("--config").arg(&config);
        }
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let file = dir.path().join("per_event.wasm");
    let file = file.to_str().unwrap();
    let listed = dir.path().to_str().unwrap();
    // The default limits load it; the configuration's 16 KiB cap refuses it,
    // as the host with that configuration would.
    let (ok, text) = run(&["plugins", "check", file], false);
    assert!(ok, "{text}");
    let (ok, text) = run(&["plugins", "check", file], true);
    assert!(!ok, "{text}");
    assert!(text.contains("larger than the 16"), "{text}");
    let (ok, text) = run(&["plugins", "list", "--dir", listed], true);
    assert!(!ok, "{text}");
    assert_names(&text, "per_event.wasm", "larger than the 16");
}

/// `output` names `file` and says it is `what`.
fn assert_names(output: &str, file: &str, what: &str) {
    assert!(
        output.contains(file) && output.contains(what),
        "{file} ({what}) not named in:\n{output}"
    );
}

fn short_http_limits(config: &mut HostConfig) {
    config.http.header_read_timeout = Duration::from_millis(500);
    config.http.max_connections = 3;
}

async fn host_with_short_http_limits(redis: &RedisServer) -> TestHost {
    let setup = Setup {
        configure: Some(Box::new(short_http_limits)),
        ..Setup::default()
    };
    TestHost::start_with(redis, setup).await.unwrap()
}

/// Reads until the server closes the connection (`Ok(bytes)`), or fails
/// after `within`.
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> anyhow::Result<Vec<u8>> {
    let mut seen = Vec::new();
    tokio::time::timeout(within, async {
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await?;
    Ok(seen)
}

fn addr_of(host: &TestHost) -> String {
    host.base.trim_start_matches("http://").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_header_is_disconnected_while_others_are_served() {
    let redis = RedisServer::start().await.unwrap();
    let host = host_with_short_http_limits(&redis).await;
    let mut slow = TcpStream::connect(addr_of(&host)).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let a = host.get("/healthz", None).await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
    // Closed by the header timeout (500 ms); the deadline only bounds the test.
    let seen = read_until_closed(&mut slow, Duration::from_secs(20))
        .await
        .expect("the slow client is disconnected");
    assert!(!String::from_utf8_lossy(&seen).contains("200 OK"));
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_connection_cap_a_connection_is_closed_and_served_after_one_ends() {
    let redis = RedisServer::start().await.unwrap();
    let setup = Setup {
        configure: Some(Box::new(|c: &mut HostConfig| c.http.max_connections = 2)),
        ..Setup::default()
    };
    let host = TestHost::start_with(&redis, setup).await.unwrap();
    let addr = addr_of(&host);
    // Two connections in the middle of a request head hold the cap (not
    // idle keep-alive ones: those are closed to make room when the cap is
    // near, `tests/it/security.rs`).
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    let mut third = TcpStream::connect(&addr).await.unwrap();
    let _ = third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await;
    let seen = read_until_closed(&mut third, Duration::from_secs(20))
        .await
        .expect("the connection over the cap is closed");
    assert!(seen.is_empty(), "{}", String::from_utf8_lossy(&seen));
    drop(held.pop());
    pushonce_tests::wait_until(Duration::from_secs(20), || {
        let addr = addr.clone();
        async move {
            let Ok(mut s) = TcpStream::connect(&addr).await else {
                return false;
            };
            let req = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
            if s.write_all(req).await.is_err() {
                return false;
            }
            let mut text = Vec::new();
            let _ = s.read_to_end(&mut text).await;
            String::from_utf8_lossy(&text).starts_with("HTTP/1.1 200")
        }
    })
    .await
    .expect("served again once a held connection closed");
    drop(held);
    host.shutdown().await.unwrap();
}

#[test]
fn policies_check_finishes_and_names_a_fifo_and_a_link_to_dev_zero() {
    let dir = tempfile::tempdir().unwrap();
    let root = pushonce_tests::host::repo_root();
    std::fs::copy(
        root.join("policies/order-shipped.toml"),
        dir.path().join("order-shipped.toml"),
    )
    .unwrap();
    assert!(
        Command::new("mkfifo")
            .arg(dir.path().join("stall.toml"))
            .status()
            .unwrap()
            .success()
    );
    std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero.toml")).unwrap();
    let out = Command::new(pushonce_bin().unwrap())
        .args(["policies", "--config"])
        .arg(root.join("pushonce.toml"))
        .arg("check")
        .arg(dir.path())
        .env("PUSHONCE_PLUGIN_DIR", pushonce_tests::plugins::real_dir())
        .env("PUSHONCE_DATA_DIR", dir.path().join("data"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_names(&stderr, "stall.toml", "FIFO");
    assert_names(&stderr, "zero.toml", "character device");
}

/// Sends `request` on a new connection and reads the whole answer.
async fn raw_answer(addr: &str, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before it read everything.
    let _ = s.write_all(request).await;
    let seen = read_until_closed(&mut s, Duration::from_secs(20))
        .await
        .expect("the server answers and closes");
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_hyper_cannot_parse_are_answered_with_problem_json() {
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let addr = addr_of(&host);
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
    let mut many_headers = String::from("GET /healthz HTTP/1.1\r\nHost: x\r\n");
    for i in 0..200 {
        many_headers.push_str(&format!("x-h{i}: v\r\n"));
    }
    many_headers.push_str("\r\n");
    let cases: [(&[u8], u16); 3] = [
        (b"NOT HTTP AT ALL\r\n\r\n", 400),
        (long_uri.as_bytes(), 414),
        (many_headers.as_bytes(), 431),
    ];
    for (request, status) in cases {
        let answer = raw_answer(&addr, request).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{answer}"
        );
        assert!(
            answer.contains("content-type: application/problem+json"),
            "{answer}"
        );
        let body = answer.split("\r\n\r\n").nth(1).unwrap();
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["status"], status, "{problem}");
        assert_eq!(problem["type"], "urn:pushonce:problem:bad-http-request");
    }
    host.shutdown().await.unwrap();
}
