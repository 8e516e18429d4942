//! Which destinations a channel plugin may reach: its `allowed_hosts`
//! ([`AllowedHost`]), the rest of its [`OutboundPolicy`], and the check of
//! the addresses a name resolves to ([`resolve`], [`is_internal`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// One entry of a channel's `allowed_hosts`: `name`, `name:port`, an IP
/// literal or `[v6]:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    /// Lower-case host name or IP literal (without brackets).
    pub host: String,
    /// The port; `None` means the scheme's default port (443 for `https`, 80 for `http`).
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

    fn matches(&self, host: &str, port: u16, default_port: u16) -> bool {
        self.host == host && self.port.unwrap_or(default_port) == port
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
    /// Most time to resolve and connect (and, for a request, to wait for a
    /// connection to send it on).
    pub connect_timeout: Duration,
    /// Most time from the moment the request starts going out to the
    /// response head (not counting the connection's set-up).
    pub first_byte_timeout: Duration,
    /// Most time between two chunks of the response body.
    pub between_bytes_timeout: Duration,
    /// Largest request body a plugin may send, in bytes.
    pub max_request_bytes: u64,
    /// Largest response body a plugin may read, in bytes.
    pub max_response_bytes: u64,
    /// Allow plain `http://` (otherwise only `https://` leaves the host).
    pub allow_plaintext: bool,
    /// rustls client configuration: trusted roots (web PKI, plus the
    /// channel's `ca_file`) and ALPN.
    pub tls: Arc<rustls::ClientConfig>,
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
            allow_plaintext: false,
            tls: crate::plugin::tls::default_tls_config(),
        }
    }
}

impl OutboundPolicy {
    /// The allowed entry matching `host:port`, if any (`default_port`: the
    /// scheme's, for entries without a port).
    pub(super) fn entry(&self, host: &str, port: u16, default_port: u16) -> Option<&AllowedHost> {
        self.allowed
            .iter()
            .find(|a| a.matches(host, port, default_port))
    }
}

/// Resolves `host:port` and picks an address the policy allows: an IP literal
/// named in `allowed_hosts` as is; a name only to public addresses unless
/// `allow_private`.
pub(super) async fn resolve(
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
/// broadcast, reserved (240/4), benchmarking (198.18/15), IETF protocol
/// assignments (192.0.0/24), unique-local and site-local: addresses a name on
/// the allowlist must not reach.
///
/// An IPv6 address that carries an IPv4 address (mapped `::ffff:a.b.c.d`,
/// translated `::ffff:0:a.b.c.d`, compatible `::a.b.c.d`, NAT64
/// `64:ff9b::a.b.c.d`, 6to4 `2002:AABB:CCDD::`) is judged by that IPv4
/// address, because a gateway or the host's own stack delivers it there; the
/// local-use NAT64 prefix `64:ff9b:1::/48` is internal as a whole (where it
/// puts the IPv4 address is the local network's choice).
pub(super) fn is_internal(ip: IpAddr) -> bool {
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
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] >= 240
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_ipv4(v6) {
                return is_internal(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xffc0) == 0xfec0
                || (s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1)
        }
    }
}

/// The IPv4 address an IPv6 address carries in one of the forms that reach
/// it: mapped (`::ffff:0:0/96`), translated (`::ffff:0:0:0/96`), compatible
/// (`::/96`, besides `::` and `::1`, which are judged as IPv6), NAT64's
/// well-known prefix (`64:ff9b::/96`) and 6to4 (`2002::/16`, bits 16..48).
fn embedded_ipv4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, hi, lo]
        | [0, 0, 0, 0, 0xffff, 0, hi, lo]
        | [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(v4(hi, lo)),
        [0, 0, 0, 0, 0, 0, hi, lo] if v6 != Ipv6Addr::UNSPECIFIED && v6 != Ipv6Addr::LOCALHOST => {
            Some(v4(hi, lo))
        }
        [0x2002, hi, lo, ..] => Some(v4(hi, lo)),
        _ => None,
    }
}
