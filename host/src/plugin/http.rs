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
//! ([`HttpClient`]), to the address the host resolved and checked (the pool
//! is keyed by that address), so a name cannot be re-resolved elsewhere
//! between the check and the connect.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

/// One entry of a channel's `allowed_hosts`: `name`, `name:port`, an IP
/// literal or `[v6]:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    /// Lower-case host name or IP literal (without brackets).
    pub host: String,
    /// The port; `None` means the scheme's default port (80).
    pub port: Option<u16>,
    /// Set when `host` is an IP literal: the operator named the address
    /// itself, so it is reachable even when it is private or loopback.
    pub ip: Option<IpAddr>,
}

/// Why an `allowed_hosts` entry does not parse.
#[derive(Debug, thiserror::Error)]
#[error("allowed host `{entry}`: {reason}")]
pub struct AllowedHostError {
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub reason: String,
}

impl AllowedHost {
    /// Parses `name`, `name:port`, `1.2.3.4`, `1.2.3.4:80`, `[::1]:80`.
    pub fn parse(entry: &str) -> Result<AllowedHost, AllowedHostError> {
        let bad = |reason: &str| AllowedHostError {
            entry: entry.to_string(),
            reason: reason.to_string(),
        };
        let e = entry.trim();
        if e.is_empty() || e.contains('/') || e.contains('@') || e.contains("://") {
            return Err(bad(
                "expected `host` or `host:port`, without scheme or path",
            ));
        }
        let (host, port) = split_host_port(e).ok_or_else(|| bad("a port must be 1..=65535"))?;
        if host.is_empty() {
            return Err(bad("empty host"));
        }
        let host = host.to_ascii_lowercase();
        Ok(AllowedHost {
            ip: host.parse().ok(),
            host,
            port,
        })
    }

    fn matches(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port.unwrap_or(80) == port
    }
}

/// Splits `host[:port]` / `[v6][:port]`; `None` when the port does not parse.
fn split_host_port(s: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after.strip_prefix(':') {
            Some(p) => Some((host, Some(p.parse().ok().filter(|p| *p != 0)?))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    match s.rsplit_once(':') {
        // A bare IPv6 literal has several colons and no port.
        Some(_) if s.matches(':').count() > 1 => Some((s, None)),
        Some((h, p)) => Some((h, Some(p.parse().ok().filter(|p| *p != 0)?))),
        None => Some((s, None)),
    }
}

/// What one channel instance may reach, and how long and how much.
#[derive(Debug, Clone)]
pub struct OutboundPolicy {
    /// Destinations allowed; empty allows nothing.
    pub allowed: Vec<AllowedHost>,
    /// Let allowed *names* resolve to private, loopback or link-local
    /// addresses (IP literals in `allowed` are always reachable).
    pub allow_private: bool,
    /// Most time to resolve and connect.
    pub connect_timeout: Duration,
    /// Most time from sending the request to the response head.
    pub first_byte_timeout: Duration,
    /// Most time between two chunks of the response body.
    pub between_bytes_timeout: Duration,
    /// Largest request body a plugin may send, in bytes.
    pub max_request_bytes: u64,
    /// Largest response body a plugin may read, in bytes.
    pub max_response_bytes: u64,
}

impl Default for OutboundPolicy {
    /// Nothing allowed; the default clamps and caps.
    fn default() -> Self {
        OutboundPolicy {
            allowed: Vec::new(),
            allow_private: false,
            connect_timeout: Duration::from_secs(5),
            first_byte_timeout: Duration::from_secs(10),
            between_bytes_timeout: Duration::from_secs(10),
            max_request_bytes: 1 << 20,
            max_response_bytes: 1 << 20,
        }
    }
}

impl OutboundPolicy {
    /// The allowed entry matching `host:port`, if any.
    fn entry(&self, host: &str, port: u16) -> Option<&AllowedHost> {
        self.allowed.iter().find(|a| a.matches(host, port))
    }
}

/// A pooled HTTP/1 client for one channel instance (cheap to clone). It only
/// ever connects to IP addresses the policy already checked.
#[derive(Clone)]
pub struct HttpClient {
    /// hyper's pooling client; its connector never resolves names (it gets IPs).
    inner: Client<HttpConnector, WasiBody>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpClient")
    }
}

impl HttpClient {
    /// A client connecting within `connect_timeout`, keeping idle connections 60 s.
    pub fn new(connect_timeout: Duration) -> HttpClient {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(connect_timeout));
        connector.set_nodelay(true);
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(32)
            .build(connector);
        HttpClient { inner }
    }
}

/// What the requests of one plugin call did, read by the host after the call.
#[derive(Debug, Default, Clone)]
pub struct OutboundLog {
    /// A request that can change provider state (any method but GET/HEAD/OPTIONS)
    /// passed the policy and was handed to the client: the provider may have it.
    pub may_have_sent: bool,
    /// Requests refused by the policy, with the reason (host-side text, for logs
    /// and the call's error; never given to the plugin).
    pub denied: Vec<String>,
    /// Requests that passed the policy.
    pub requests: u32,
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
    pub fn deny_all() -> OutboundHooks {
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
        // No TLS stack is compiled into the host yet: plain HTTP only.
        *scheme == http::uri::Scheme::HTTP
    }

    fn default_scheme(&mut self) -> Option<http::uri::Scheme> {
        Some(http::uri::Scheme::HTTP)
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
        let policy = self.policy.clone();
        let log = self.log.clone();
        let Some(client) = self.client.clone() else {
            return deny(request, &log, "no outbound HTTP for this plugin".into());
        };
        let uri = request.uri().clone();
        let Some(authority) = uri.authority().cloned() else {
            return deny(request, &log, "request without a destination".into());
        };
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        let port = authority.port_u16().unwrap_or(80);
        let Some(entry) = policy.entry(&host, port).cloned() else {
            return deny(
                request,
                &log,
                format!("{host}:{port} is not in the channel's allowed_hosts"),
            );
        };
        // Decided now, synchronously: the guest's call may be cut off before
        // the spawned request task runs, and that task may still send.
        let unsafe_method = !matches!(
            *request.method(),
            http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
        );
        {
            let mut l = lock(&log);
            l.requests += 1;
            if unsafe_method {
                l.may_have_sent = true;
            }
        }
        Box::new(async move {
            let addr = match resolve(&policy, &entry, &host, port).await {
                Ok(addr) => addr,
                Err(reason) => {
                    lock(&log).denied.push(reason);
                    drain(request.into_body(), policy.max_request_bytes).await;
                    return Err(HttpError::HttpRequestDenied);
                }
            };
            let connect = clamp(
                options.and_then(|o| o.connect_timeout),
                policy.connect_timeout,
            );
            let first_byte = clamp(
                options.and_then(|o| o.first_byte_timeout),
                policy.first_byte_timeout,
            );
            let between = clamp(
                options.and_then(|o| o.between_bytes_timeout),
                policy.between_bytes_timeout,
            );
            let (mut parts, body) = request.into_parts();
            let path = parts
                .uri
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/")
                .to_string();
            let ip = match addr.ip() {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            };
            // `Host` names the checked authority (without userinfo), whatever header came in.
            let host_header = match authority.port() {
                Some(p) => format!("{}:{p}", authority.host()),
                None => authority.host().to_string(),
            };
            parts.headers.insert(
                http::header::HOST,
                http::HeaderValue::from_str(&host_header)
                    .map_err(|_| HttpError::HttpRequestUriInvalid)?,
            );
            parts.uri = format!("http://{ip}:{}{path}", addr.port())
                .parse()
                .map_err(|_| HttpError::HttpRequestUriInvalid)?;
            let body = CappedBody {
                inner: body,
                seen: 0,
                cap: policy.max_request_bytes,
                request: true,
            }
            .boxed_unsync();
            let req = http::Request::from_parts(parts, body);
            let response =
                match tokio::time::timeout(connect + first_byte, client.inner.request(req)).await {
                    Err(_) => return Err(HttpError::HttpResponseTimeout),
                    Ok(Err(e)) if e.is_connect() => return Err(HttpError::ConnectionRefused),
                    Ok(Err(e)) => {
                        let too_big = std::error::Error::source(&e)
                            .and_then(|s| s.downcast_ref::<HttpError>())
                            .is_some_and(|s| matches!(s, HttpError::HttpRequestBodySize(_)));
                        return Err(if too_big {
                            HttpError::HttpRequestBodySize(Some(policy.max_request_bytes))
                        } else {
                            HttpError::ConnectionTerminated
                        });
                    }
                    Ok(Ok(r)) => r,
                };
            let cap = policy.max_response_bytes;
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
        })
    }
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

/// Reads and discards a request body, up to `limit` bytes.
async fn drain(mut body: WasiBody, limit: u64) {
    let mut seen = 0u64;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Some(d) = f.data_ref() {
                    seen += d.len() as u64;
                    if seen > limit {
                        return;
                    }
                }
            }
            Err(_) => return,
        }
    }
}

/// Resolves `host:port` and picks an address the policy allows: an IP literal
/// named in `allowed_hosts` as is; a name only to public addresses unless
/// `allow_private`.
async fn resolve(
    policy: &OutboundPolicy,
    entry: &AllowedHost,
    host: &str,
    port: u16,
) -> Result<SocketAddr, String> {
    if let Some(ip) = entry.ip {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = match tokio::time::timeout(
        policy.connect_timeout,
        tokio::net::lookup_host((host, port)),
    )
    .await
    {
        Ok(Ok(a)) => a.collect(),
        Ok(Err(_)) | Err(_) => return Err(format!("{host} does not resolve")),
    };
    let usable = addrs
        .iter()
        .find(|a| policy.allow_private || !is_internal(a.ip()));
    match usable {
        Some(a) => Ok(*a),
        None if addrs.is_empty() => Err(format!("{host} does not resolve")),
        None => Err(format!(
            "{host} resolves to a private, loopback or link-local address ({}); list the IP itself or set allow_private = true",
            addrs[0].ip()
        )),
    }
}

/// Loopback, private, link-local, unspecified, shared (CGNAT), multicast,
/// broadcast, unique-local: addresses a name on the allowlist must not reach.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
        }
    }
}

/// A request body that fails once more than `cap` bytes went through.
struct CappedBody {
    /// The guest's body.
    inner: WasiBody,
    /// Bytes passed so far.
    seen: u64,
    /// Most bytes allowed.
    cap: u64,
    /// Always true for now: the error names a request body.
    request: bool,
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.seen += d.len() as u64;
                    if this.seen > this.cap {
                        return Poll::Ready(Some(Err(if this.request {
                            HttpError::HttpRequestBodySize(Some(this.seen))
                        } else {
                            HttpError::HttpResponseBodySize(Some(this.seen))
                        })));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body under the size cap and the between-bytes timeout; a
/// transport error becomes `connection-terminated` (no host text).
struct ResponseBody {
    /// hyper's body.
    inner: hyper::body::Incoming,
    /// Bytes read so far.
    seen: u64,
    /// Most bytes allowed.
    cap: u64,
    /// Longest wait between two frames.
    between: Duration,
    /// The running between-bytes timer.
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(_))) => Poll::Ready(Some(Err(HttpError::ConnectionTerminated))),
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.seen += d.len() as u64;
                    if this.seen > this.cap {
                        return Poll::Ready(Some(Err(HttpError::HttpResponseBodySize(Some(
                            this.seen,
                        )))));
                    }
                }
                let deadline = tokio::time::Instant::now() + this.between;
                this.sleep.as_mut().reset(deadline);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(HttpError::ConnectionReadTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
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
