//! Two guards in front of the router, both keyed on what the listener knows
//! of a request's connection ([`Client`]):
//!
//! - [`loopback_only`]: a host with `/v1` or `/admin` open (no token) on a
//!   loopback listener serves only requests whose `Host` is a loopback name
//!   or address (a DNS-rebinding page's requests carry its own name), and a
//!   state-changing request only from its own origin (`Origin` equal to
//!   `Host`, `Sec-Fetch-Site` `same-origin` or `none` when sent): a
//!   cross-site form cannot drive `POST /admin/reload`. Refused: 403
//!   `urn:pushonce:problem:origin-refused`. Only `/v1` (callbacks aside),
//!   `/admin` and `/console` are guarded: probes hold nothing to protect.
//! - [`Failures`]: failed sign-ins and wrong bearer tokens counted per client
//!   address; past [`FAILURES_PER_WINDOW`] in a [`WINDOW`], every attempt of
//!   that address is answered 429 with `Retry-After` until the window ends.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::problem::ApiError;

/// Failed attempts one client address may make in a [`WINDOW`].
pub(crate) const FAILURES_PER_WINDOW: u32 = 10;

/// The window failures are counted in.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);

/// Most client addresses tracked at once (a bound on memory).
const MAX_TRACKED: usize = 100_000;

/// Failed attempts per client address (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct Failures {
    /// Each address's current window: when it began, failures in it.
    windows: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Failures {
    /// Refuses `client` (429) while it is over its failures; `None` (no
    /// address known) is never refused.
    pub(crate) fn check(&self, client: Option<IpAddr>) -> Result<(), ApiError> {
        let Some(ip) = client else { return Ok(()) };
        let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        match windows.get(&key(ip)) {
            Some((began, n)) if *n >= FAILURES_PER_WINDOW && began.elapsed() < WINDOW => {
                Err(ApiError::TooManyFailures {
                    client: ip,
                    retry_after: (WINDOW - began.elapsed()).as_secs().max(1),
                })
            }
            _ => Ok(()),
        }
    }

    /// Counts one failed attempt of `client`.
    pub(crate) fn failed(&self, client: Option<IpAddr>) {
        let Some(ip) = client else { return };
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if windows.len() >= MAX_TRACKED {
            windows.retain(|_, (began, _)| began.elapsed() < WINDOW);
        }
        if windows.len() >= MAX_TRACKED {
            return;
        }
        let now = Instant::now();
        let entry = windows.entry(key(ip)).or_insert((now, 0));
        if entry.0.elapsed() >= WINDOW {
            *entry = (now, 0);
        }
        entry.1 += 1;
    }
}

/// The address failures are counted under: an IPv6 client's /64 (one
/// host usually holds a whole /64), else the address.
fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        IpAddr::V6(v6) => IpAddr::V4(v6.to_ipv4_mapped().unwrap_or([0, 0, 0, 0].into())),
        v4 => v4,
    }
}

/// A request's bearer-token check, guarded by its client's failures: what
/// an auth middleware needs before and after comparing the token.
pub(crate) struct TokenGuard {
    client: Option<IpAddr>,
    failures: Option<std::sync::Arc<Failures>>,
}

impl TokenGuard {
    /// The guard of `req`, or the 429 refusal while its client is over its
    /// failures.
    pub(crate) fn of(req: &Request) -> Result<TokenGuard, ApiError> {
        let guard = TokenGuard {
            client: client_ip(req.extensions()),
            failures: req.extensions().get::<std::sync::Arc<Failures>>().cloned(),
        };
        if let Some(failures) = &guard.failures {
            failures.check(guard.client)?;
        }
        Ok(guard)
    }

    /// Counts and logs a missing or wrong token of `req`.
    pub(crate) fn refused(&self, req: &Request) {
        let path = super::log::loggable_path(req.uri().path());
        let client = self
            .client
            .map_or_else(|| "unknown".to_string(), |ip| ip.to_string());
        tracing::warn!(%client, %path, "refused: missing or wrong bearer token");
        if let Some(failures) = &self.failures {
            failures.failed(self.client);
        }
    }
}

/// The client address of a request (from the listener), if known.
pub(crate) fn client_ip(req_extensions: &axum::http::Extensions) -> Option<IpAddr> {
    req_extensions.get::<Client>().map(|c| c.peer.ip())
}

/// Middleware: with `open` (a surface without a token) on a loopback
/// listener, refuses a non-loopback `Host` and a cross-origin
/// state-changing request (see the module doc).
pub(crate) async fn loopback_only(State(open): State<bool>, req: Request, next: Next) -> Response {
    let beyond_loopback = req
        .extensions()
        .get::<Client>()
        .is_some_and(|c| !c.local.ip().is_loopback());
    // Beyond loopback without tokens is `allow_open_network`: the operator's
    // proxy decides which names reach the host.
    if !open || beyond_loopback || !guarded(req.uri().path()) {
        return next.run(req).await;
    }
    match refusal(req.method(), req.headers()) {
        Some(why) => ApiError::OriginRefused(why).into_response(),
        None => next.run(req).await,
    }
}

/// Whether `path` is on a surface a token would guard: `/v1` (but the
/// callbacks, guarded by their path tokens and reached through providers'
/// proxies), `/admin` and `/console`; the probes, `/metrics` and
/// `/openapi.json` hold nothing to protect.
fn guarded(path: &str) -> bool {
    (path.starts_with("/v1/") && !path.starts_with("/v1/receipts/") && path != "/v1/receipts")
        || path == "/admin"
        || path.starts_with("/admin/")
        || path == "/console"
        || path.starts_with("/console/")
}

/// Why a request to a host without tokens is refused, if it is.
fn refusal(method: &Method, headers: &HeaderMap) -> Option<String> {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(host) = host
        && !is_loopback_authority(host)
    {
        return Some(format!(
            "this host has no [auth] tokens, so it answers only requests addressed to a loopback name or address (Host: {:?} is not one); set auth.api_token_env and auth.admin_token_env to serve other names",
            super::log::escaped(host)
        ));
    }
    if matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    ) {
        return None;
    }
    if let Some(site) = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .filter(|s| !matches!(*s, "same-origin" | "none"))
    {
        return Some(format!(
            "a {method} from another site (Sec-Fetch-Site: {}) to a host without [auth] tokens",
            super::log::escaped(site)
        ));
    }
    let origin = headers.get(header::ORIGIN)?;
    let same = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .is_some_and(|(_, authority)| host.is_some_and(|h| authority.eq_ignore_ascii_case(h)));
    (!same).then(|| {
        format!(
            "a {method} from another origin (Origin: {:?}) to a host without [auth] tokens",
            super::log::escaped(&String::from_utf8_lossy(origin.as_bytes()))
        )
    })
}

/// Whether `authority` (`name[:port]`, `[v6][:port]`) names this machine:
/// `localhost`, `*.localhost`, `127.0.0.0/8` or `::1`.
fn is_loopback_authority(authority: &str) -> bool {
    let name = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((addr, _)) => addr,
            None => return false,
        },
        None => authority
            .rsplit_once(':')
            .filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit()))
            .map_or(authority, |(name, _)| name),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses() {
        for ok in [
            "localhost",
            "localhost:8080",
            "LOCALHOST.",
            "app.localhost:1",
            "127.0.0.1:8080",
            "127.1.2.3",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(is_loopback_authority(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1:8080",
            "[::2]:80",
            "127.0.0.1.nip.io",
            "[::1",
        ] {
            assert!(!is_loopback_authority(bad), "{bad}");
        }
    }

    #[test]
    fn failures_past_the_limit_are_refused_until_the_window_ends() {
        let failures = Failures::default();
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        for _ in 0..FAILURES_PER_WINDOW {
            assert!(failures.check(Some(ip)).is_ok());
            failures.failed(Some(ip));
        }
        let refused = failures.check(Some(ip)).unwrap_err();
        assert_eq!(refused.status().as_u16(), 429);
        assert!(failures.check(Some("192.0.2.8".parse().unwrap())).is_ok());
        assert!(failures.check(None).is_ok());
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::2".parse().unwrap();
        assert_eq!(key(a), key(b), "one IPv6 /64 is one client");
    }
}

/// Where a request came from: an extension of every request the listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Client {
    /// The peer's address.
    pub peer: std::net::SocketAddr,
    /// The listener's own address (loopback or not).
    pub local: std::net::SocketAddr,
}
