//! Issue 32's attacks, each replayed against a real host: callback path
//! tokens looked for in a debug-level log, weak tokens at start, forged log
//! lines, a host without tokens driven from another origin, guessing
//! tokens, the console's headers and sign-out.

use std::time::Duration;

use pushonce::store::free_loopback_port;
use pushonce_tests::host::{Answer, Setup, TestHost};
use pushonce_tests::process::PushonceProcess;
use pushonce_tests::redis::RedisServer;
use reqwest::StatusCode;

/// Strong callback path tokens (24 base64url characters, 144 bits) a test
/// looks for in the log.
const SMS_TOKEN: &str = "Kq3xW9vLmP2rT7yZ4nB8cD1f";
const WECHAT_TOKEN: &str = "Vb6Hs0Jp9QeR3uYt5Wc8Lx2N";

/// Every byte of `s` percent-encoded, in upper or lower case hex.
fn percent_encoded(s: &str, upper: bool) -> String {
    s.bytes()
        .map(|b| {
            if upper {
                format!("%{b:02X}")
            } else {
                format!("%{b:02x}")
            }
        })
        .collect()
}

/// `log` without its terminal colours (`ESC [ ... m`).
fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut rest = log;
    while let Some(i) = rest.find('\u{1b}') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        rest = rest.find('m').map_or("", |end| &rest[end + 1..]);
    }
    out.push_str(rest);
    out
}

/// `pushonce serve` with the repository's configuration at debug level,
/// the callback tokens above, against `redis`: its address and the process.
async fn serve_with_known_tokens(
    dir: &std::path::Path,
    redis: &RedisServer,
    extra_toml: &str,
    env: &[(&str, &str)],
) -> (String, PushonceProcess) {
    let port = free_loopback_port().unwrap();
    let url = redis.url();
    let mut all = vec![
        ("PUSHONCE_REDIS_URL", url.as_str()),
        ("PUSHONCE_SMS_CALLBACK_TOKEN", SMS_TOKEN),
        ("PUSHONCE_WECHAT_CALLBACK_TOKEN", WECHAT_TOKEN),
        ("RUST_LOG", "debug"),
    ];
    all.extend_from_slice(env);
    let listen = format!("127.0.0.1:{port}");
    let host = PushonceProcess::serve_repository_config(dir, &listen, extra_toml, &all).unwrap();
    let base = format!("http://{listen}");
    host.wait_ready(&base, Duration::from_secs(60))
        .await
        .unwrap();
    (base, host)
}

/// Stops `host` (SIGTERM) and returns its whole log without colours.
async fn log_after_stop(mut host: PushonceProcess) -> String {
    host.terminate(Duration::from_secs(30)).await.unwrap();
    plain(&host.log())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callback_path_tokens_are_in_no_log_line_in_any_form() {
    let mut redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (base, host) = serve_with_known_tokens(dir.path(), &redis, "", &[]).await;
    let client = reqwest::Client::new();
    let post = |path: String, body: &'static str| {
        let (client, url) = (client.clone(), format!("{base}{path}"));
        async move {
            client
                .post(url)
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // 400: a body the SMS plugin cannot parse, with the token raw and encoded.
    for token in [
        SMS_TOKEN.to_string(),
        percent_encoded(SMS_TOKEN, true),
        percent_encoded(SMS_TOKEN, false),
    ] {
        assert_eq!(post(format!("/v1/receipts/sms/{token}"), "x").await, 400);
    }
    // 403: a WeChat event with a forged signature.
    let forged = "signature=0123456789abcdef0123456789abcdef01234567&timestamp=1700000000&nonce=42";
    let event = "<xml><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[TEMPLATESENDJOBFINISH]]></Event><MsgID>1</MsgID><Status><![CDATA[success]]></Status></xml>";
    assert_eq!(
        post(
            format!("/v1/receipts/wechat/{WECHAT_TOKEN}?{forged}"),
            event
        )
        .await,
        403
    );
    // 503: a well-formed SMS report while Redis is down (logged as a warning).
    redis.stop().await.unwrap();
    let report = r#"[{"phone_number":"+8613800000001","send_time":"2026-12-01 08:00:00","report_time":"2026-12-01 08:00:05","success":true,"err_code":"DELIVERED","err_msg":"ok","sms_size":"1","biz_id":"b-1","out_id":"o-1"}]"#;
    assert_eq!(
        post(format!("/v1/receipts/sms/{SMS_TOKEN}"), report).await,
        503
    );
    let log = log_after_stop(host).await;
    for status in ["status=400", "status=403", "status=503"] {
        assert!(
            log.lines()
                .any(|l| l.contains(status) && l.contains("/v1/receipts/")),
            "the {status} callback was logged:\n{log}"
        );
    }
    assert!(log.contains("path=/v1/receipts/sms/***"), "{log}");
    for token in [SMS_TOKEN, WECHAT_TOKEN] {
        for form in [
            token.to_string(),
            percent_encoded(token, true),
            percent_encoded(token, false),
        ] {
            assert!(!log.contains(&form), "{form} is in the log:\n{log}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weak_callback_path_token_stops_the_host_naming_the_variable() {
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = free_loopback_port().unwrap();
    let url = redis.url();
    let env = [
        ("PUSHONCE_REDIS_URL", url.as_str()),
        ("PUSHONCE_SMS_CALLBACK_TOKEN", "guessable-1"),
    ];
    let listen = format!("127.0.0.1:{port}");
    let mut host = PushonceProcess::serve_repository_config(dir.path(), &listen, "", &env).unwrap();
    let status = host.wait_exit(Duration::from_secs(60)).await.unwrap();
    let log = plain(&host.log());
    assert!(!status.success(), "started with a weak token:\n{log}");
    for named in [
        "channel sms",
        "PUSHONCE_SMS_CALLBACK_TOKEN",
        "11 base64url characters carry at most 66 bits",
        "openssl rand -hex 16",
    ] {
        assert!(
            log.contains(named),
            "the refusal does not say {named:?}:\n{log}"
        );
    }
    assert!(!log.contains("guessable-1"), "the token is shown:\n{log}");
}

/// The admin token of the hosts below that have one.
const ADMIN_TOKEN: &str = "admin-Zr8Qw3Lx6Vn1Kp4T";

/// `[auth]` with an admin token (read from `ADMIN_T`).
const WITH_ADMIN_TOKEN: &str = "\n[auth]\nadmin_token_env = \"ADMIN_T\"\n";

/// A `pushonce serve` process on `redis` whose admin token is [`ADMIN_TOKEN`].
async fn process_with_admin_token(
    dir: &std::path::Path,
    redis: &RedisServer,
) -> (String, PushonceProcess) {
    serve_with_known_tokens(dir, redis, WITH_ADMIN_TOKEN, &[("ADMIN_T", ADMIN_TOKEN)]).await
}

/// A client that shows redirects instead of following them (a sign-in
/// answers one).
fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_name_with_a_newline_cannot_forge_a_log_line() {
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (base, host) = process_with_admin_token(dir.path(), &redis).await;
    let client = no_redirects();
    let name = "ana\n2026-12-03T07:00:00Z  INFO pushonce: forged\r\u{1b}[2K";
    let answer = client
        .post(format!("{base}/console/login"))
        .form(&[("name", name), ("token", ADMIN_TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 303, "signed in");
    let log = log_after_stop(host).await;
    assert!(
        log.contains("by=ana\\u{a}2026-12-03T07:00:00Z  INFO pushonce: forged\\u{d}\\u{1b}[2K"),
        "the name is logged escaped, on its line:\n{log}"
    );
    assert!(
        !log.lines().any(|l| l.starts_with("2026-12-03T07:00:00Z")),
        "a forged line:\n{log}"
    );
    assert!(!log.contains('\r'), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_only_loopback_hosts_and_same_origin_posts_are_served() {
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let post = |headers: &[(&str, &str)]| {
        let mut req = host.client.post(host.url("/admin/reload"));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        host.send(req)
    };
    let refused = |a: &Answer, named: &str| {
        assert_eq!(a.status, StatusCode::FORBIDDEN, "{}", a.body);
        assert_eq!(a.content_type(), "application/problem+json");
        assert_eq!(a.body["type"], "urn:pushonce:problem:origin-refused");
        let detail = a.body["detail"].as_str().unwrap();
        assert!(detail.contains(named), "{detail}");
        assert!(detail.contains("[auth]"), "{detail}");
    };
    // DNS rebinding: the page's own name in Host.
    refused(
        &post(&[("host", "evil.example")]).await.unwrap(),
        "evil.example",
    );
    let read = host
        .send(
            host.client
                .get(host.url("/admin/plugins"))
                .header("host", "evil.example:80"),
        )
        .await
        .unwrap();
    refused(&read, "evil.example:80");
    // A cross-site form.
    let origin = [("origin", "http://evil.example")];
    refused(&post(&origin).await.unwrap(), "Origin");
    let fetch = [("sec-fetch-site", "cross-site")];
    refused(&post(&fetch).await.unwrap(), "Sec-Fetch-Site");
    // The operator's own requests.
    assert_eq!(post(&[]).await.unwrap().status, StatusCode::OK);
    let own = host.base.clone();
    let same = [("origin", own.as_str()), ("sec-fetch-site", "same-origin")];
    assert_eq!(post(&same).await.unwrap().status, StatusCode::OK);
    let localhost = host.base.replace("127.0.0.1", "localhost");
    let named = [("host", localhost.trim_start_matches("http://"))];
    assert_eq!(post(&named).await.unwrap().status, StatusCode::OK);
    // Probes hold nothing to protect.
    let probe = host
        .send(
            host.client
                .get(host.url("/healthz"))
                .header("host", "evil.example"),
        )
        .await
        .unwrap();
    assert_eq!(probe.status, StatusCode::OK);
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_sign_ins_and_wrong_tokens_are_limited_per_client_address() {
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (base, host) = process_with_admin_token(dir.path(), &redis).await;
    let client = no_redirects();
    let admin = |client: &reqwest::Client, token: &str| {
        client
            .get(format!("{base}/admin/plugins"))
            .bearer_auth(token)
            .send()
    };
    let sign_in = |token: &str| {
        client
            .post(format!("{base}/console/login"))
            .form(&[("name", "mallory"), ("token", token)])
            .send()
    };
    // Ten failures from 127.0.0.1, on /admin and on the console alike.
    for i in 0..10 {
        let status = if i % 2 == 0 {
            admin(&client, &format!("guess-{i}"))
                .await
                .unwrap()
                .status()
        } else {
            sign_in(&format!("guess-{i}")).await.unwrap().status()
        };
        assert_eq!(status, 401, "failure {i}");
    }
    // Then every attempt of that address waits, even with the right token.
    for answer in [
        admin(&client, "guess-10").await.unwrap(),
        admin(&client, ADMIN_TOKEN).await.unwrap(),
        sign_in(ADMIN_TOKEN).await.unwrap(),
    ] {
        assert_eq!(answer.status(), 429);
        let retry: u64 = answer.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&retry), "Retry-After: {retry}");
        assert_eq!(answer.headers()["content-type"], "application/problem+json");
        let body: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(body["type"], "urn:pushonce:problem:too-many-failures");
    }
    // Another address is served.
    let other = reqwest::Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    assert_eq!(admin(&other, ADMIN_TOKEN).await.unwrap().status(), 200);
    let log = log_after_stop(host).await;
    let refusals = log
        .lines()
        .filter(|l| l.contains("client=127.0.0.1") && l.contains("wrong"))
        .count();
    assert_eq!(
        refusals, 10,
        "each failure is logged with the address:\n{log}"
    );
}

/// A host whose console takes `ADMIN_TOKEN`.
async fn host_with_admin_token(redis: &RedisServer) -> TestHost {
    let env = [("ADMIN_T".to_string(), ADMIN_TOKEN.to_string())].into();
    let setup = Setup {
        env,
        auth: (None, Some("ADMIN_T".into())),
        ..Setup::default()
    };
    TestHost::start_with(redis, setup).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_pages_resist_framing_sniffing_caching_and_a_signed_out_cookie() {
    use base64::Engine;
    use sha2::Digest;
    let redis = RedisServer::start().await.unwrap();
    let host = host_with_admin_token(&redis).await;
    let client = no_redirects();
    let header = |r: &reqwest::Response, name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    let form = client.get(host.url("/console/login")).send().await.unwrap();
    assert_eq!(header(&form, "x-frame-options"), "DENY");
    assert_eq!(header(&form, "x-content-type-options"), "nosniff");
    assert_eq!(header(&form, "cache-control"), "no-store");
    let csp = header(&form, "content-security-policy");
    for part in [
        "default-src 'none'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    // The policy allows the page's own stylesheet, by its hash.
    let page = form.text().await.unwrap();
    let style = page
        .split_once("<style>")
        .and_then(|(_, rest)| rest.split_once("</style>"))
        .unwrap()
        .0;
    let hash = base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(style));
    assert!(csp.contains(&format!("style-src 'sha256-{hash}'")), "{csp}");

    // `Secure` when a TLS-terminating proxy says the request came over HTTPS.
    let sign_in = |https: bool| {
        let mut req = client
            .post(host.url("/console/login"))
            .form(&[("name", "ana"), ("token", ADMIN_TOKEN)]);
        if https {
            req = req.header("x-forwarded-proto", "https");
        }
        req.send()
    };
    let plain_cookie = header(&sign_in(false).await.unwrap(), "set-cookie");
    assert!(!plain_cookie.contains("Secure"), "{plain_cookie}");
    let signed_in = sign_in(true).await.unwrap();
    assert_eq!(signed_in.status(), 303);
    let set_cookie = header(&signed_in, "set-cookie");
    assert!(set_cookie.contains("; Secure"), "{set_cookie}");
    assert!(set_cookie.contains("HttpOnly"), "{set_cookie}");
    let cookie = set_cookie.split(';').next().unwrap().to_string();

    // Signed in: the overview; signed out: the same cookie no longer works.
    let overview = || {
        client
            .get(host.url("/console/overview"))
            .header("cookie", &cookie)
            .send()
    };
    let page = overview().await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(header(&page, "cache-control"), "no-store");
    let page = page.text().await.unwrap();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_string();
    let out = client
        .post(host.url("/console/logout"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), 303);
    assert!(header(&out, "set-cookie").contains("Max-Age=0"));
    let after = overview().await.unwrap();
    assert_eq!(after.status(), 303, "the old cookie is refused");
    assert_eq!(header(&after, "location"), "/console/login");
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holding_its_connections_does_not_starve_another() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = RedisServer::start().await.unwrap();
    let setup = Setup {
        configure: Some(Box::new(|c: &mut pushonce::config::HostConfig| {
            c.http.max_connections = 8;
            c.http.max_connections_per_client = 4;
        })),
        ..Setup::default()
    };
    let host = TestHost::start_with(&redis, setup).await.unwrap();
    let addr = host.base.trim_start_matches("http://").to_string();
    // 127.0.0.1 opens ten idle connections: four are served, the rest closed.
    let mut idle = Vec::new();
    for _ in 0..10 {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    let probe = |from: &'static str| {
        let addr = addr.clone();
        async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
            let mut s = socket.connect(addr.parse().unwrap()).await.unwrap();
            let req = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
            if s.write_all(req).await.is_err() {
                return String::new();
            }
            let mut text = Vec::new();
            let _ = s.read_to_end(&mut text).await;
            String::from_utf8_lossy(&text).into_owned()
        }
    };
    // A fresh probe from the same address is closed unanswered...
    pushonce_tests::wait_until(Duration::from_secs(20), || async {
        probe("127.0.0.1").await.is_empty()
    })
    .await
    .expect("the fifth connection of 127.0.0.1 is closed");
    // ...while probes from another address keep being served.
    for _ in 0..20 {
        let answer = probe("127.0.0.2").await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    }
    drop(idle);
    host.shutdown().await.unwrap();
}

/// An address at its connection cap whose connections are idle keep-alive
/// ones (answered, waiting for their next request — as a provider pushing
/// receipts from one address leaves them) is not refused: one of its idle
/// connections is closed for each new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_at_its_cap_with_idle_connections_gets_new_ones_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = RedisServer::start().await.unwrap();
    let setup = Setup {
        configure: Some(Box::new(|c: &mut pushonce::config::HostConfig| {
            c.http.max_connections_per_client = 4;
        })),
        ..Setup::default()
    };
    let host = TestHost::start_with(&redis, setup).await.unwrap();
    let addr = host.base.trim_start_matches("http://").to_string();
    // One keep-alive request on a new connection; the connection is kept.
    let request = |addr: String| async move {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let req = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
        if s.write_all(req).await.is_err() {
            return (s, String::new());
        }
        let mut buf = vec![0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(0);
        (s, String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    let mut kept = Vec::new();
    for i in 0..12 {
        let (conn, answer) = request(addr.clone()).await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "connection {i} of one address (cap 4, earlier ones idle): {answer:?}"
        );
        kept.push(conn);
    }
    drop(kept);
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_that_is_not_utf8_once_decoded_is_a_problem() {
    let redis = RedisServer::start().await.unwrap();
    let host = TestHost::start(&redis).await.unwrap();
    let a = host.get("/v1/events/x/%ff%fe", None).await.unwrap();
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body);
    assert_eq!(a.content_type(), "application/problem+json");
    assert_eq!(a.body["type"], "urn:pushonce:problem:bad-request");
    assert!(
        a.body["detail"].as_str().unwrap().contains("UTF-8"),
        "{}",
        a.body
    );
    host.shutdown().await.unwrap();
}

/// A `TEMPLATESENDJOBFINISH` event for message `msgid` with `status`, as
/// WeChat posts it.
fn wechat_event(msgid: &str, status: &str) -> String {
    format!(
        "<xml><ToUserName><![CDATA[gh_test]]></ToUserName><FromUserName><![CDATA[openid-1]]></FromUserName>\
         <CreateTime>1700000000</CreateTime><MsgType><![CDATA[event]]></MsgType>\
         <Event><![CDATA[TEMPLATESENDJOBFINISH]]></Event><MsgID>{msgid}</MsgID>\
         <Status><![CDATA[{status}]]></Status></xml>"
    )
}

/// `pushonce serve` in `dir` at the simulator `sim` and `redis`, with the
/// repository's policies and the `[channels.*]` tables `channels`.
async fn serve_at_simulator(
    dir: &std::path::Path,
    redis: &RedisServer,
    sim: &pushonce_tests::providers::Sim,
    channels: String,
) -> pushonce_tests::stack::ServeProcess {
    use pushonce_tests::stack::{ServeConfig, ServeProcess, copy_dir};
    let policies = dir.join("policies");
    copy_dir(
        &pushonce_tests::host::repo_root().join("policies"),
        &policies,
    )
    .unwrap();
    let mut config = ServeConfig::new(&redis.url(), sim);
    config.channels = channels;
    ServeProcess::start(&config, dir, &policies).await.unwrap()
}

/// The task `id` as the host at `base` shows it.
async fn task_json(client: &reqwest::Client, base: &str, id: &str) -> serde_json::Value {
    let answer = client
        .get(format!("{base}/v1/tasks/{id}"))
        .send()
        .await
        .unwrap();
    answer.json().await.unwrap()
}

/// The status of task `id` on the host at `base`.
async fn task_status(client: &reqwest::Client, base: &str, id: &str) -> serde_json::Value {
    task_json(client, base, id).await["status"].clone()
}

/// Sends an event for user `u-{tag}-{n}` to the host at `base` and waits
/// until its WeChat task is `sent` (or already `delivered`); its task id and
/// WeChat `msgid`.
async fn sent_wechat_task(
    client: &reqwest::Client,
    host: &pushonce_tests::stack::ServeProcess,
    tag: &str,
    n: u32,
) -> (String, String) {
    use serde_json::{Value, json};
    let base = host.base();
    let event = json!({
        "biz_type": "ORDER_SHIPPED", "biz_id": format!("o-{tag}-{n}"), "user_id": format!("u-{tag}-{n}"),
        "occurred_at": "2026-11-30T08:00:00Z", "template": "order_shipped",
        "params": {"order": "o-1"},
        "recipients": {"sms": format!("1380000000{n}"), "wechat": format!("openid-{n}"), "app-push": format!("device-{n}")}
    });
    let answer: Value = client
        .post(format!("{base}/v1/events"))
        .json(&event)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut found = None;
    for r in answer["results"].as_array().unwrap() {
        let id = r["task_id"].as_str().unwrap().to_string();
        if task_json(client, base, &id).await["channel"] == "wechat" {
            found = Some(id);
        }
    }
    let id = found.unwrap_or_else(|| panic!("no wechat task: {answer}"));
    pushonce_tests::wait_until(Duration::from_secs(30), || async {
        let status = task_status(client, base, &id).await;
        status == "sent" || status == "delivered"
    })
    .await
    .unwrap_or_else(|_| panic!("{id} not sent:\n{}", host.log()));
    let task = task_json(client, base, &id).await;
    let msgid = task["provider_message_id"].as_str().unwrap().to_string();
    (id, msgid)
}

/// Seconds since the epoch.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_or_stale_wechat_callback_is_refused_and_its_task_stays_sent() {
    use pushonce_tests::providers;
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let host = serve_at_simulator(dir.path(), &redis, &sim, sim.toml()).await;
    let base = host.base().to_string();
    let client = reqwest::Client::new();
    // Two WeChat messages, sent; the simulator sends no receipts by itself.
    let mut wechat = Vec::new();
    let mut msgids = Vec::new();
    for n in 1..=2 {
        let (id, msgid) = sent_wechat_task(&client, &host, "replay", n).await;
        wechat.push(id);
        msgids.push(msgid);
    }
    let status = |id: String| {
        let (client, base) = (client.clone(), base.clone());
        async move { task_status(&client, &base, &id).await }
    };
    let url = sim.callback_url(&base, "wechat");
    let token = sim.state.credentials().wechat_callback_token.clone();
    let post = |timestamp: u64, nonce: &str, body: String| {
        let timestamp = timestamp.to_string();
        let signature = provider_sim::receipts::wechat_signature(&token, &timestamp, nonce);
        client
            .post(format!(
                "{url}?signature={signature}&timestamp={timestamp}&nonce={nonce}"
            ))
            .header("content-type", "text/xml")
            .body(body)
            .send()
    };
    let now = now_secs();

    // WeChat's callback for the first message: delivered.
    let genuine = wechat_event(&msgids[0], "success");
    let a = post(now, "1029384756", genuine.clone()).await.unwrap();
    assert_eq!(a.status(), 200);
    assert_eq!(a.text().await.unwrap(), "success");
    assert_eq!(status(wechat[0].clone()).await, "delivered");
    // Its timestamp, nonce and signature, replayed with a body that fails the
    // second message: refused, nothing settled.
    let forged = wechat_event(&msgids[1], "failed:user block");
    let a = post(now, "1029384756", forged.clone()).await.unwrap();
    assert_eq!(a.status(), 403);
    let detail = a.text().await.unwrap();
    assert!(
        detail.contains("already signed another request"),
        "{detail}"
    );
    assert_eq!(status(wechat[1].clone()).await, "sent");
    // The same request again (WeChat retries) is answered as before and
    // changes nothing.
    let a = post(now, "1029384756", genuine).await.unwrap();
    assert_eq!(a.status(), 200);
    assert_eq!(status(wechat[0].clone()).await, "delivered");
    // Correctly signed, but six minutes old, or six minutes ahead: refused.
    for (timestamp, said) in [(now - 360, "s old"), (now + 360, "s ahead")] {
        let a = post(timestamp, "5647382910", forged.clone()).await.unwrap();
        assert_eq!(a.status(), 403);
        let detail = a.text().await.unwrap();
        assert!(detail.contains(said), "{detail}");
        assert!(detail.contains("outside the window of ±300 s"), "{detail}");
    }
    assert_eq!(status(wechat[1].clone()).await, "sent");
    // A fresh request for the second message still settles it.
    let a = post(now, "1122334455", forged).await.unwrap();
    assert_eq!(a.status(), 200);
    assert_eq!(status(wechat[1].clone()).await, "failed");
}

/// Safe mode (issue 32, item 3): the channel has the account's
/// EncodingAESKey, so `msg_signature` covers the encrypted body. The
/// simulator's push, encrypted as WeChat documents, settles a task through a
/// real `pushonce serve`; an altered or re-used `Encrypt`, a plain-mode
/// request, another account's message, a replayed timestamp and nonce and a
/// stale timestamp are all refused and the second task stays `sent`, until a
/// genuine push fails it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_wechat_safe_mode_only_a_genuine_encrypted_callback_settles_a_task() {
    use provider_sim::receipts::{wechat_encrypt, wechat_msg_signature, wechat_signature};
    use provider_sim::{ReceiptConfig, WechatMode};
    use pushonce_tests::providers::{self, Sim};
    let redis = RedisServer::start().await.unwrap();
    let sim = providers::sim().await;
    let dir = tempfile::tempdir().unwrap();
    let mut channels = sim.channels();
    providers::wechat_safe_mode(channels.get_mut("wechat").unwrap());
    let host = serve_at_simulator(dir.path(), &redis, &sim, Sim::toml_of(channels)).await;
    let base = host.base().to_string();
    let client = reqwest::Client::new();
    let url = sim.callback_url(&base, "wechat");

    // WeChat, set to safe mode, pushes the first message's receipt: delivered.
    let pushes = ReceiptConfig {
        url: url.clone(),
        wechat_mode: WechatMode::Safe,
        ..ReceiptConfig::default()
    };
    assert!(sim.state.set_receipts("wechat", Some(pushes)));
    let (first, first_msgid) = sent_wechat_task(&client, &host, "safe", 1).await;
    pushonce_tests::wait_until(Duration::from_secs(30), || async {
        task_status(&client, &base, &first).await == "delivered"
    })
    .await
    .unwrap_or_else(|_| panic!("the safe-mode push did not settle {first}:\n{}", host.log()));
    assert!(
        sim.state
            .stats()
            .get("wechat.receipt_posted")
            .copied()
            .unwrap_or(0)
            >= 1
    );
    assert!(sim.state.set_receipts("wechat", None));

    // The second message: its receipts are posted by hand.
    let (second, second_msgid) = sent_wechat_task(&client, &host, "safe", 2).await;
    let creds = sim.state.credentials();
    let token = creds.wechat_callback_token.clone();
    let seal = |xml: &str, appid: &str| {
        wechat_encrypt(
            &creds.wechat_encoding_aes_key,
            b"0123456789abcdef",
            xml,
            appid,
        )
        .unwrap()
    };
    let account = creds.wechat_account.clone();
    // A safe-mode push of `encrypt`, whose msg_signature covers `signed`.
    let post = |timestamp: u64, nonce: &str, encrypt: &str, signed: &str| {
        let timestamp = timestamp.to_string();
        let signature = wechat_signature(&token, &timestamp, nonce);
        let msg_signature = wechat_msg_signature(&token, &timestamp, nonce, signed);
        client
            .post(format!(
                "{url}?signature={signature}&timestamp={timestamp}&nonce={nonce}\
                 &openid=openid-2&encrypt_type=aes&msg_signature={msg_signature}"
            ))
            .header("content-type", "text/xml")
            .body(format!(
                "<xml><ToUserName><![CDATA[{account}]]></ToUserName>\
                 <Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>"
            ))
            .send()
    };
    let refused = |answer: reqwest::Response, says: &'static str| async move {
        assert_eq!(answer.status(), 403);
        let detail = answer.text().await.unwrap();
        assert!(detail.contains(says), "{says:?} not in {detail}");
    };
    let now = now_secs();
    let appid = creds.wechat_appid.clone();
    let fail_second = seal(&wechat_event(&second_msgid, "failed:user block"), &appid);
    let first_again = seal(&wechat_event(&first_msgid, "success"), &appid);

    // `Encrypt` altered after signing (one base64 character changed): refused.
    let mut altered = fail_second.clone().into_bytes();
    altered[40] = if altered[40] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    let a = post(now, "3141592653", &altered, &fail_second)
        .await
        .unwrap();
    refused(a, "msg_signature does not verify").await;
    // A body signed for another `Encrypt`: refused.
    let a = post(now, "3141592654", &fail_second, &first_again)
        .await
        .unwrap();
    refused(a, "msg_signature does not verify").await;
    // Plain mode, correctly signed with the token: refused, no downgrade.
    let ts = now.to_string();
    let signature = wechat_signature(&token, &ts, "2718281828");
    let a = client
        .post(format!(
            "{url}?signature={signature}&timestamp={ts}&nonce=2718281828"
        ))
        .header("content-type", "text/xml")
        .body(wechat_event(&second_msgid, "failed:user block"))
        .send()
        .await
        .unwrap();
    refused(a, "no downgrade to plain mode").await;
    // Signed and encrypted with the account's key, but for another AppID.
    let elsewhere = seal(
        &wechat_event(&second_msgid, "failed:user block"),
        "wx0000000000000000",
    );
    let a = post(now, "1618033988", &elsewhere, &elsewhere)
        .await
        .unwrap();
    refused(a, "not this channel's `app_id`").await;
    assert_eq!(task_status(&client, &base, &second).await, "sent");

    // A genuine push under a timestamp and nonce (it changes nothing: the
    // first task is delivered already), then another `Encrypt` signed with
    // the same timestamp and nonce: refused. The genuine one again (WeChat's
    // retry) is answered as before.
    let a = post(now, "1414213562", &first_again, &first_again)
        .await
        .unwrap();
    assert_eq!(a.status(), 200);
    assert_eq!(a.text().await.unwrap(), "success");
    let a = post(now, "1414213562", &fail_second, &fail_second)
        .await
        .unwrap();
    refused(a, "already signed another request").await;
    let a = post(now, "1414213562", &first_again, &first_again)
        .await
        .unwrap();
    assert_eq!(a.status(), 200);
    // Correctly signed and encrypted, six minutes old or ahead: refused.
    for (timestamp, said) in [(now - 360, "s old"), (now + 360, "s ahead")] {
        let a = post(timestamp, "1732050807", &fail_second, &fail_second)
            .await
            .unwrap();
        assert_eq!(a.status(), 403);
        let detail = a.text().await.unwrap();
        assert!(detail.contains(said), "{detail}");
        assert!(detail.contains("outside the window of ±300 s"), "{detail}");
    }
    assert_eq!(task_status(&client, &base, &second).await, "sent");
    assert_eq!(task_status(&client, &base, &first).await, "delivered");

    // A fresh genuine push for the second message settles it.
    let a = post(now, "2236067977", &fail_second, &fail_second)
        .await
        .unwrap();
    assert_eq!(a.status(), 200);
    assert_eq!(a.text().await.unwrap(), "success");
    assert_eq!(task_status(&client, &base, &second).await, "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_directory_is_private_and_a_huge_declared_body_is_refused_at_once() {
    use std::os::unix::fs::PermissionsExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = RedisServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (base, host) = serve_with_known_tokens(dir.path(), &redis, "", &[]).await;

    // 10 GiB declared, nothing sent: 413 at once, and the connection closed.
    let mut s = tokio::net::TcpStream::connect(base.trim_start_matches("http://"))
        .await
        .unwrap();
    let head = "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                Content-Length: 10737418240\r\n\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    // Well inside the request timeout (10 s), which used to answer it.
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer))
        .await
        .expect("answered and closed within 5 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(answer.contains("body-too-large"), "{answer}");

    // Everything the host wrote under its data directory is its user's alone.
    let data = dir.path().join("data");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700, "{}", data.display());
    let mut seen = Vec::new();
    let mut todo = vec![data.clone()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let m = mode(&path);
            assert_eq!(m & 0o077, 0, "{} is {m:o}", path.display());
            if path.is_dir() {
                todo.push(path.clone());
            }
            seen.push(path);
        }
    }
    assert!(
        seen.iter().any(|p| p.ends_with("ledger.sqlite3")),
        "the ledger is among {seen:?}"
    );
    let log = log_after_stop(host).await;
    assert!(log.contains("status=413"), "the refusal is logged:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_head_over_the_per_connection_buffer_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = RedisServer::start().await.unwrap();
    let setup = Setup {
        configure: Some(Box::new(|c: &mut pushonce::config::HostConfig| {
            c.http.max_head_bytes = 16 * 1024;
        })),
        ..Setup::default()
    };
    let host = TestHost::start_with(&redis, setup).await.unwrap();
    let addr = host.base.trim_start_matches("http://").to_string();
    let ask = |header_bytes: usize| {
        let addr = addr.clone();
        async move {
            let mut head =
                String::from("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
            // 40 headers: under hyper's count limit, so only the size counts.
            for i in 0..40 {
                head.push_str(&format!(
                    "x-filler-{i:02}: {}\r\n",
                    "a".repeat(header_bytes / 40)
                ));
            }
            head.push_str("\r\n");
            let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
            // The host may answer and close before it has read all of it.
            let _ = s.write_all(head.as_bytes()).await;
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer).await;
            String::from_utf8_lossy(&answer).into_owned()
        }
    };
    let small = ask(8 * 1024).await;
    assert!(small.starts_with("HTTP/1.1 200"), "{small}");
    let large = ask(20 * 1024).await;
    assert!(large.starts_with("HTTP/1.1 431"), "{large}");
    assert!(large.contains("application/problem+json"), "{large}");
    host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_the_connection_cap_idle_keep_alive_connections_are_closed_first() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = RedisServer::start().await.unwrap();
    let setup = Setup {
        configure: Some(Box::new(|c: &mut pushonce::config::HostConfig| {
            c.http.max_connections = 8;
            c.http.max_connections_per_client = 8;
            // Longer than the test: only the cap can close them.
            c.http.header_read_timeout = Duration::from_secs(120);
        })),
        ..Setup::default()
    };
    let host = TestHost::start_with(&redis, setup).await.unwrap();
    let addr = host.base.trim_start_matches("http://").to_string();
    let request = |close: bool| {
        format!(
            "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: {}\r\n\r\n",
            if close { "close" } else { "keep-alive" }
        )
    };
    // 127.0.0.1 takes every slot with keep-alive connections, each answered
    // once and then idle.
    let mut idle = Vec::new();
    for _ in 0..8 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(request(false).as_bytes()).await.unwrap();
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).await.unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        idle.push(s);
    }
    // A new client is served: idle connections made room.
    let probe = || {
        let addr = addr.clone();
        let req = request(true);
        async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            let mut s = socket.connect(addr.parse().unwrap()).await.unwrap();
            if s.write_all(req.as_bytes()).await.is_err() {
                return String::new();
            }
            let mut text = Vec::new();
            let _ = s.read_to_end(&mut text).await;
            String::from_utf8_lossy(&text).into_owned()
        }
    };
    pushonce_tests::wait_until(Duration::from_secs(10), || async {
        probe().await.starts_with("HTTP/1.1 200")
    })
    .await
    .expect("a new client is served while idle connections hold the cap");
    // The idle connections closed were closed cleanly: end of stream.
    let mut closed = 0;
    for s in &mut idle {
        let mut buf = [0u8; 16];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await
        {
            closed += 1;
        }
    }
    assert!(closed >= 1, "no idle connection was closed");
    host.shutdown().await.unwrap();
}
