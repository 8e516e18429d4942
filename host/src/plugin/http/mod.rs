//! The outbound HTTP capability of channel plugins: `wasi:http/outgoing-handler`
//! (wasmtime-wasi-http) with every request passed through the channel
//! instance's [`OutboundPolicy`] before anything leaves the host.
//!
//! The check is made on the request's real destination — the URI authority
//! the guest gave, then every address the name resolves to — never on a
//! `Host` header (the guest cannot set one: `host` stays a forbidden header).
//! A refused request first has its body drained, so the guest finishes its
//! write cleanly and then reads `error-code.HTTP-request-denied`. Timeouts are
//! clamped to the policy's, bodies are capped both ways, and no host error
//! text ever reaches a plugin: only `error-code` values without payload text.
//! Requests go through one pooled hyper client per channel instance
//! ([`HttpClient`]), whose connector ([`super::tls`]) connects only to the
//! address the host resolved and checked, so a name cannot be re-resolved
//! elsewhere between the check and the connect. `https://` is verified by
//! rustls against the checked name and speaks HTTP/2 when ALPN chooses it;
//! plain `http://` is refused unless the channel sets `allow_plaintext`.
//!
//! Whether the provider may have a state-changing request is exact: such a
//! request counts as *pending* from the hand-off (the guest's call may be cut
//! off before the request task runs), becomes *written* when its body is
//! first polled (after connect and handshake), and stops counting when it
//! failed before that (a refusal, a connect or TLS error). A reader treats
//! pending as maybe-sent ([`OutboundLog::may_have_sent`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::tls::{Checked, ConnectError, Connector};

mod body;
mod policy;

use body::{CappedBody, ResponseBody, drain};
use policy::resolve;
pub use policy::{AllowedHost, AllowedHostError, OutboundPolicy};

/// A pooled HTTP/1.1 and HTTP/2 client for one channel instance (cheap to
/// clone). It only ever connects to addresses the policy already checked.
#[derive(Clone)]
pub struct HttpClient {
    /// hyper's pooling client (keyed by scheme and authority); its connector
    /// never resolves names (it reads `checked`).
    inner: Client<Connector, WasiBody>,
    /// The checked address of each authority, written before each request.
    checked: Checked,
    /// TLS handshakes made by this client.
    handshakes: Arc<AtomicU64>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpClient")
    }
}

impl HttpClient {
    /// A client for `policy` (its connect timeout and TLS configuration),
    /// keeping idle connections 60 s.
    pub fn new(policy: &OutboundPolicy) -> HttpClient {
        let connector = Connector {
            checked: Checked::default(),
            tls: policy.tls.clone(),
            connect_timeout: policy.connect_timeout,
            handshakes: Arc::default(),
        };
        let (checked, handshakes) = (connector.checked.clone(), connector.handshakes.clone());
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(32)
            .build(connector);
        HttpClient {
            inner,
            checked,
            handshakes,
        }
    }

    /// TLS handshakes this client made so far (one per new TLS connection).
    pub fn tls_handshakes(&self) -> u64 {
        self.handshakes.load(Ordering::Relaxed)
    }
}

/// What the requests of one plugin call did, read by the host after the call.
#[derive(Debug, Default, Clone)]
pub struct OutboundLog {
    /// A request that can change provider state (any method but GET/HEAD/OPTIONS)
    /// started going out (its body was polled): the provider may have it.
    written: bool,
    /// State-changing requests handed to the client that have neither started
    /// going out nor failed before it: the provider may yet get them.
    pending: u32,
    /// Requests refused by the policy, with the reason (host-side text, for logs
    /// and the call's error; never given to the plugin).
    pub denied: Vec<String>,
    /// Requests that passed the policy but failed before anything was written
    /// (connect, TLS), with the cause (host-side text, like `denied`).
    pub not_sent: Vec<String>,
    /// Requests that passed the policy.
    pub requests: u32,
}

impl OutboundLog {
    /// Whether the provider may have a state-changing request of this call:
    /// one started going out, or one was handed off and had not failed
    /// before writing when the log was read.
    pub fn may_have_sent(&self) -> bool {
        self.written || self.pending > 0
    }
}

/// One state-changing request from its hand-off to either its first written
/// byte or a failure before it; settles once.
struct Pending {
    /// The call's log.
    log: Arc<Mutex<OutboundLog>>,
    /// Set by the first of `written` / `not_sent`.
    settled: AtomicBool,
}

impl Pending {
    /// Counts a request as pending in `log`.
    fn start(log: &Arc<Mutex<OutboundLog>>) -> Arc<Pending> {
        lock(log).pending += 1;
        Arc::new(Pending {
            log: log.clone(),
            settled: AtomicBool::new(false),
        })
    }

    /// Its bytes started going out: the provider may have it.
    fn written(&self) {
        if !self.settled.swap(true, Ordering::AcqRel) {
            let mut l = lock(&self.log);
            l.pending -= 1;
            l.written = true;
        }
    }

    /// It failed before anything was written.
    fn not_sent(&self) {
        if !self.settled.swap(true, Ordering::AcqRel) {
            lock(&self.log).pending -= 1;
        }
    }
}

/// The `wasi:http` hooks of one store: the policy of its channel instance, the
/// shared client, and the log of the current call.
pub struct OutboundHooks {
    /// What may be reached.
    pub policy: Arc<OutboundPolicy>,
    /// Where allowed requests go; `None` refuses everything (key-policy stores).
    pub client: Option<HttpClient>,
    /// Filled while requests run (also from spawned request tasks).
    pub log: Arc<Mutex<OutboundLog>>,
}

impl OutboundHooks {
    /// Hooks that refuse every request.
    pub(crate) fn deny_all() -> OutboundHooks {
        OutboundHooks {
            policy: Arc::new(OutboundPolicy::default()),
            client: None,
            log: Arc::default(),
        }
    }

    /// A copy of the log of the last call.
    pub fn log(&self) -> OutboundLog {
        lock(&self.log).clone()
    }
}

fn lock(log: &Mutex<OutboundLog>) -> std::sync::MutexGuard<'_, OutboundLog> {
    log.lock().unwrap_or_else(|e| e.into_inner())
}

type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;
type SendFuture =
    Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), HttpError>> + Send>;

impl WasiHttpHooks for OutboundHooks {
    fn is_supported_scheme(&mut self, scheme: &http::uri::Scheme) -> bool {
        // Plain `http` passes here and is refused by the policy (with a
        // reason) unless the channel sets `allow_plaintext`.
        *scheme == http::uri::Scheme::HTTPS || *scheme == http::uri::Scheme::HTTP
    }

    fn default_scheme(&mut self) -> Option<http::uri::Scheme> {
        Some(http::uri::Scheme::HTTPS)
    }

    fn p2_error_from_hyper(
        &mut self,
        _err: &hyper::Error,
    ) -> wasmtime_wasi_http::p2::bindings::http::types::ErrorCode {
        wasmtime_wasi_http::p2::bindings::http::types::ErrorCode::HttpProtocolError
    }

    fn p2_error_from_connect(
        &mut self,
        _err: &std::io::Error,
    ) -> wasmtime_wasi_http::p2::bindings::http::types::ErrorCode {
        wasmtime_wasi_http::p2::bindings::http::types::ErrorCode::ConnectionRefused
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: IoFuture,
    ) -> SendFuture {
        let log = self.log.clone();
        let Some(client) = self.client.clone() else {
            return deny(request, &log, "no outbound HTTP for this plugin".into());
        };
        let target = match Target::check(&self.policy, request.uri()) {
            Ok(t) => t,
            Err(reason) => return deny(request, &log, reason),
        };
        // Counted now, synchronously: the guest's call may be cut off before
        // the spawned request task runs, and that task may still send.
        let unsafe_method = !matches!(
            *request.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        lock(&log).requests += 1;
        let pending = unsafe_method.then(|| Pending::start(&log));
        let policy = self.policy.clone();
        Box::new(async move {
            let addr = match resolve(&policy, &target.entry, &target.host, target.port).await {
                Ok(addr) => addr,
                Err(reason) => {
                    tracing::info!(%reason, "outbound request refused");
                    lock(&log).denied.push(reason);
                    if let Some(p) = &pending {
                        p.not_sent();
                    }
                    drain(request.into_body(), policy.max_request_bytes).await;
                    return Err(HttpError::HttpRequestDenied);
                }
            };
            client.checked.record(&target.host, target.port, addr);
            let timeouts = Timeouts::clamped(&policy, options);
            let (started, going_out) = tokio::sync::oneshot::channel();
            let req = target.request(request, &policy, pending.clone(), started)?;
            let response = match head_within(client.inner.request(req), going_out, &timeouts).await
            {
                Err(timed_out) => return Err(timed_out),
                Ok(Err(e)) => return Err(request_error(&e, &policy, &log, pending.as_deref())),
                Ok(Ok(r)) => r,
            };
            limit_response(response, policy.max_response_bytes, timeouts.between_bytes)
        })
    }
}

/// A request's destination after the policy's name check: scheme, checked
/// host and port, the allowlist entry, and the authority text for `Host`.
struct Target {
    /// `https` or (with `allow_plaintext`) `http`.
    scheme: http::uri::Scheme,
    /// Lower-case host name or IP literal, without brackets.
    host: String,
    /// The port (the scheme's default when the URI has none).
    port: u16,
    /// The allowlist entry that matched.
    entry: AllowedHost,
    /// `host[:port]` as the request names it (IPv6 bracketed), for `Host`
    /// and the URI hyper sends (`:authority` in HTTP/2).
    authority: String,
}

impl Target {
    /// Checks scheme and authority against the policy (not yet the address).
    fn check(policy: &OutboundPolicy, uri: &http::Uri) -> Result<Target, String> {
        let Some(authority) = uri.authority() else {
            return Err("request without a destination".into());
        };
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let https = uri.scheme() != Some(&http::uri::Scheme::HTTP);
        let default_port = if https { 443 } else { 80 };
        let port = authority.port_u16().unwrap_or(default_port);
        let Some(entry) = policy.entry(&host, port, default_port).cloned() else {
            return Err(format!(
                "{host}:{port} is not in the channel's allowed_hosts"
            ));
        };
        if !https && !policy.allow_plaintext {
            return Err(format!(
                "plain http:// to {host}:{port} is refused: set allow_plaintext = true on the channel to allow unencrypted requests"
            ));
        }
        let bracketed = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        Ok(Target {
            scheme: if https {
                http::uri::Scheme::HTTPS
            } else {
                http::uri::Scheme::HTTP
            },
            authority: match authority.port_u16() {
                Some(p) => format!("{bracketed}:{p}"),
                None => bracketed,
            },
            host,
            port,
            entry,
        })
    }

    /// The request hyper sends: URI and `Host` = the checked authority
    /// (without userinfo, whatever header came in), the body capped and
    /// marking `pending` written on its first poll.
    fn request(
        &self,
        request: http::Request<WasiBody>,
        policy: &OutboundPolicy,
        pending: Option<Arc<Pending>>,
        started: tokio::sync::oneshot::Sender<()>,
    ) -> Result<
        http::Request<http_body_util::combinators::UnsyncBoxBody<Bytes, HttpError>>,
        HttpError,
    > {
        let (mut parts, body) = request.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        parts.uri = format!("{}://{}{path}", self.scheme, self.authority)
            .parse()
            .map_err(|_| HttpError::HttpRequestUriInvalid)?;
        parts.headers.insert(
            http::header::HOST,
            http::HeaderValue::from_str(&self.authority)
                .map_err(|_| HttpError::HttpRequestUriInvalid)?,
        );
        let body = CappedBody {
            inner: body,
            seen: 0,
            cap: policy.max_request_bytes,
            pending,
            started: Some(started),
        }
        .boxed_unsync();
        Ok(http::Request::from_parts(parts, body))
    }
}

/// Waits for the response head of `request` (hyper's future): up to
/// `connect` until the request starts going out (`going_out`: its body is
/// first polled, once the connection and TLS are up, or at once on a pooled
/// connection), then up to `first_byte` from that moment. So
/// `response_timeout` counts from the request, not from the start of a
/// connection a pooled request never needed.
async fn head_within<F: Future>(
    request: F,
    going_out: tokio::sync::oneshot::Receiver<()>,
    timeouts: &Timeouts,
) -> Result<F::Output, HttpError> {
    tokio::pin!(request);
    tokio::select! {
        answer = &mut request => return Ok(answer),
        started = tokio::time::timeout(timeouts.connect, going_out) => {
            if started.is_err() {
                return Err(HttpError::ConnectionTimeout);
            }
            // Ok(Err(_)): hyper dropped the body unpolled; its own error
            // follows at once, under the head's timeout as any answer.
        }
    }
    tokio::time::timeout(timeouts.first_byte, request)
        .await
        .map_err(|_| HttpError::HttpResponseTimeout)
}

/// The guest's timeouts, each clamped to the policy's.
struct Timeouts {
    /// Resolve and connect (and TLS handshake).
    connect: Duration,
    /// To the response head.
    first_byte: Duration,
    /// Between two response body chunks.
    between_bytes: Duration,
}

impl Timeouts {
    fn clamped(policy: &OutboundPolicy, options: Option<RequestOptions>) -> Timeouts {
        Timeouts {
            connect: clamp(
                options.and_then(|o| o.connect_timeout),
                policy.connect_timeout,
            ),
            first_byte: clamp(
                options.and_then(|o| o.first_byte_timeout),
                policy.first_byte_timeout,
            ),
            between_bytes: clamp(
                options.and_then(|o| o.between_bytes_timeout),
                policy.between_bytes_timeout,
            ),
        }
    }
}

/// The `error-code` for a failed request. A connect or TLS failure wrote
/// nothing: the request stops being pending and its cause is logged.
fn request_error(
    e: &hyper_util::client::legacy::Error,
    policy: &OutboundPolicy,
    log: &Mutex<OutboundLog>,
    pending: Option<&Pending>,
) -> HttpError {
    if e.is_connect() {
        if let Some(p) = pending {
            p.not_sent();
        }
        let Some(cause) = ConnectError::find(e) else {
            lock(log).not_sent.push("connect failed".into());
            return HttpError::ConnectionRefused;
        };
        tracing::info!(reason = %cause, "outbound request not sent");
        lock(log).not_sent.push(cause.to_string());
        return cause.code();
    }
    let too_big = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<HttpError>())
        .is_some_and(|s| matches!(s, HttpError::HttpRequestBodySize(_)));
    if too_big {
        HttpError::HttpRequestBodySize(Some(policy.max_request_bytes))
    } else {
        HttpError::ConnectionTerminated
    }
}

/// Refuses a response whose declared length is over `cap`; otherwise wraps
/// its body in the size cap and the between-bytes timeout.
fn limit_response(
    response: http::Response<hyper::body::Incoming>,
    cap: u64,
    between: Duration,
) -> Result<(http::Response<WasiBody>, IoFuture), HttpError> {
    if let Some(len) = response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > cap
    {
        return Err(HttpError::HttpResponseBodySize(Some(len)));
    }
    let response = response.map(|incoming| {
        ResponseBody {
            inner: incoming,
            seen: 0,
            cap,
            between,
            sleep: Box::pin(tokio::time::sleep(between)),
        }
        .boxed_unsync()
    });
    Ok((response, Box::new(async { Ok(()) }) as IoFuture))
}

/// A timeout the guest asked for, never longer than the policy's (nor zero).
fn clamp(asked: Option<Duration>, max: Duration) -> Duration {
    asked.filter(|d| !d.is_zero()).map_or(max, |d| d.min(max))
}

/// Refuses a request: logs why, drains its body (so the guest's writes
/// succeed), then answers `HTTP-request-denied`.
fn deny(
    request: http::Request<WasiBody>,
    log: &Arc<Mutex<OutboundLog>>,
    reason: String,
) -> SendFuture {
    tracing::info!(%reason, "outbound request refused");
    lock(log).denied.push(reason);
    Box::new(async move {
        drain(request.into_body(), 4 << 20).await;
        Err(HttpError::HttpRequestDenied)
    })
}

#[cfg(test)]
mod tests {
    use super::policy::is_internal;
    use super::*;

    #[test]
    fn entries_parse() {
        let a = AllowedHost::parse("127.0.0.1:9090").unwrap();
        assert_eq!(a.port, Some(9090));
        assert!(a.ip.is_some());
        let a = AllowedHost::parse("SMS.Example.com").unwrap();
        assert_eq!(a.host, "sms.example.com");
        assert_eq!(a.port, None);
        assert!(a.ip.is_none());
        let a = AllowedHost::parse("[::1]:80").unwrap();
        assert_eq!(a.host, "::1");
        assert!(AllowedHost::parse("http://x").is_err());
        assert!(AllowedHost::parse("x:0").is_err());
        assert!(AllowedHost::parse("x:y").is_err());
    }

    #[test]
    fn internal_addresses() {
        for ip in [
            "127.0.0.2",
            "10.1.2.3",
            "192.168.0.1",
            "169.254.169.254",
            "::1",
            "fe80::1",
            "100.64.0.1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "2001:4860::8888"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn reserved_ipv4_ranges_are_internal() {
        for ip in [
            "198.18.0.1",
            "198.19.255.254",
            "240.0.0.1",
            "255.255.255.254",
            "192.0.0.1",
            "192.0.0.170",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        // The neighbours of each range stay public.
        for ip in [
            "198.17.255.255",
            "198.20.0.0",
            "192.0.1.1",
            "191.255.255.255",
        ] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn ipv6_forms_carrying_an_ipv4_address_are_judged_by_it() {
        // (form, carrying an internal IPv4, carrying a public one)
        for (form, internal, public) in [
            ("mapped", "::ffff:10.0.0.1", "::ffff:8.8.8.8"),
            ("translated", "::ffff:0:127.0.0.1", "::ffff:0:8.8.8.8"),
            ("compatible", "::169.254.169.254", "::8.8.8.8"),
            ("NAT64", "64:ff9b::192.168.1.1", "64:ff9b::8.8.8.8"),
            ("NAT64", "64:ff9b::7f00:1", "64:ff9b::808:808"),
            ("6to4", "2002:a00:1::1", "2002:808:808::1"),
            ("6to4", "2002:7f00:1:1::", "2002:808:808:1::"),
            ("6to4", "2002:c612:1::", "2002:c614:1::"),
        ] {
            assert!(is_internal(internal.parse().unwrap()), "{form} {internal}");
            assert!(!is_internal(public.parse().unwrap()), "{form} {public}");
        }
    }

    #[test]
    fn internal_ipv6_prefixes() {
        for ip in [
            "fec0::1",
            "feff::1",
            "64:ff9b:1::808:808",
            "64:ff9b:1:ffff::1",
            "::",
            "::1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["2606:4700::1111", "64:ff9b:2::1", "fe00::1"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn timeouts_are_clamped() {
        let max = Duration::from_secs(5);
        assert_eq!(clamp(None, max), max);
        assert_eq!(clamp(Some(Duration::from_secs(600)), max), max);
        assert_eq!(
            clamp(Some(Duration::from_secs(1)), max),
            Duration::from_secs(1)
        );
        assert_eq!(clamp(Some(Duration::ZERO), max), max);
    }
}
