//! The outbound policy is checked on the real destination, never on a `Host`
//! header: a real channel plugin (`http-probe`, a test fixture) tries to forge
//! `Host`, and the policy hook itself is handed forged requests. Listeners on
//! two loopback addresses (127.0.0.1 allowed, 127.0.0.2 not) count what
//! actually arrives.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use pushonce::config::ChannelConfig;
use pushonce::plugin::bindings::{Message, Receipt, SendError};
use pushonce::plugin::http::{OutboundHooks, OutboundLog};
use pushonce::plugin::{AllowedHost, HttpClient, OutboundPolicy};
use pushonce::send::plugin::PluginSender;
use pushonce_tests::plugins::{fixture, registry_of};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wasmtime_wasi_http::{Error as HttpError, WasiBody, WasiHttpHooks};

/// A plain HTTP/1 listener that counts connections and records each
/// request's `Host` header, answering `200 ok`.
struct Listener {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    hosts: Arc<Mutex<Vec<String>>>,
}

impl Listener {
    async fn bind(ip: &str) -> Listener {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let hosts = Arc::new(Mutex::new(Vec::new()));
        let (c, h) = (connections.clone(), hosts.clone());
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let h = h.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i;
                        }
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                    let header = |name: &str| {
                        head.lines().find_map(|l| {
                            let (k, v) = l.split_once(':')?;
                            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                        })
                    };
                    let len: usize = header("content-length")
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + 4 + len {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    h.lock()
                        .unwrap()
                        .push(header("host").unwrap_or_else(|| "<none>".into()));
                    let _ = sock
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                        )
                        .await;
                });
            }
        });
        Listener {
            addr,
            connections,
            hosts,
        }
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn hosts(&self) -> Vec<String> {
        self.hosts.lock().unwrap().clone()
    }
}

/// A `PluginSender` with one channel `probe` (the `http-probe` fixture)
/// allowed to reach `allowed` only.
fn probe_sender(allowed: SocketAddr) -> PluginSender {
    let registry = Arc::new(registry_of(&[fixture("http_probe")], None));
    let mut c = ChannelConfig::new("http-probe@^2");
    c.allowed_hosts = vec![allowed.to_string()];
    c.allow_plaintext = true;
    c.call_timeout = Duration::from_secs(10);
    let channels: BTreeMap<String, ChannelConfig> = [("probe".to_string(), c)].into();
    PluginSender::new(&channels, Arc::new(move || registry.clone()), |_| None).unwrap()
}

/// Has the probe send to `url` with a forged `Host: host`.
async fn probe(
    sender: &PluginSender,
    url: &str,
    host: &str,
) -> (Result<Receipt, SendError>, OutboundLog) {
    let inst = sender.instance("probe", None).unwrap();
    let answer = inst
        .send(Message {
            task_id: "t-probe".into(),
            idempotency_key: "probe:1".into(),
            recipient: "nobody".into(),
            template: "T".into(),
            params: vec![("url".into(), url.into()), ("host".into(), host.into())],
            attempt: 1,
        })
        .await
        .expect("the call itself works");
    (answer.value, answer.log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_cannot_reach_a_host_off_the_allowlist_with_a_forged_host_header() {
    let allowed = Listener::bind("127.0.0.1").await;
    let other = Listener::bind("127.0.0.2").await;
    let sender = probe_sender(allowed.addr);

    // To another loopback address, pretending to be the allowed one: denied.
    let (res, log) = probe(
        &sender,
        &format!("http://{}/probe", other.addr),
        &allowed.addr.to_string(),
    )
    .await;
    match &res {
        Err(SendError::Permanent(m)) => {
            assert!(
                m.contains("request denied by the host's outbound policy"),
                "{m}"
            );
            assert!(
                m.contains("host-header=forbidden"),
                "the guest cannot even set Host: {m}"
            );
            assert!(
                !m.contains("allowed_hosts"),
                "no host text reaches the plugin: {m}"
            );
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(log.denied.len(), 1, "{log:?}");
    assert!(
        log.denied[0].contains(&format!(
            "{} is not in the channel's allowed_hosts",
            other.addr
        )),
        "{log:?}"
    );
    assert!(!log.may_have_sent(), "{log:?}");
    assert_eq!(log.requests, 0);

    // To the allowed address, pretending to be another: goes there, and only
    // there, under its real name.
    let (res, log) = probe(
        &sender,
        &format!("http://{}/probe", allowed.addr),
        &other.addr.to_string(),
    )
    .await;
    let receipt = res.expect("the allowed destination answers");
    assert_eq!(
        receipt.provider_message_id,
        "status=200 host-header=forbidden"
    );
    assert!(log.denied.is_empty(), "{log:?}");
    assert_eq!(allowed.connections(), 1);
    assert_eq!(allowed.hosts(), vec![allowed.addr.to_string()]);
    assert_eq!(
        other.connections(),
        0,
        "nothing ever arrived at {}",
        other.addr
    );
}

fn body(bytes: &'static [u8]) -> WasiBody {
    Full::new(Bytes::from_static(bytes))
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn forged(uri: String, host: String) -> http::Request<WasiBody> {
    http::Request::post(uri)
        .header(http::header::HOST, host)
        .body(body(b"forged"))
        .unwrap()
}

/// Even if a guest could set `Host` (the header is forbidden today), the
/// policy hook decides on the URI, and sends the checked authority as `Host`:
/// it is handed forged requests directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_hook_ignores_a_forged_host_header() {
    let allowed = Listener::bind("127.0.0.1").await;
    let other = Listener::bind("127.0.0.2").await;
    let policy = OutboundPolicy {
        allowed: vec![AllowedHost::parse(&allowed.addr.to_string()).unwrap()],
        allow_plaintext: true,
        ..OutboundPolicy::default()
    };
    let mut hooks = OutboundHooks {
        client: Some(HttpClient::new(&policy)),
        policy: Arc::new(policy),
        log: Arc::default(),
    };

    let req = forged(format!("http://{}/x", other.addr), allowed.addr.to_string());
    let res = Box::into_pin(hooks.send_request(req, None, Box::new(async { Ok(()) }))).await;
    assert!(
        matches!(res, Err(HttpError::HttpRequestDenied)),
        "{:?}",
        res.err()
    );
    assert_eq!(hooks.log().denied.len(), 1);

    let req = forged(format!("http://{}/x", allowed.addr), other.addr.to_string());
    let res = Box::into_pin(hooks.send_request(req, None, Box::new(async { Ok(()) }))).await;
    let (resp, _) = res.unwrap_or_else(|e| panic!("the allowed destination: {e:?}"));
    assert_eq!(resp.status(), 200);
    assert_eq!(allowed.connections(), 1);
    assert_eq!(
        allowed.hosts(),
        vec![allowed.addr.to_string()],
        "the forged Host is replaced by the checked authority"
    );
    assert_eq!(
        other.connections(),
        0,
        "nothing ever arrived at {}",
        other.addr
    );
}
