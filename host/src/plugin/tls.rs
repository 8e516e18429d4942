//! TLS and the connector of the outbound capability: rustls with the web PKI
//! roots (plus a channel's `ca_file`), ALPN `h2` / `http/1.1`, and a
//! hyper-util connector that connects only to addresses the outbound policy
//! checked.
//!
//! [`http`](super::http) resolves and checks a request's authority, then
//! records the checked address under that authority ([`Checked`]). The
//! connector looks the authority up there and never resolves anything
//! itself, so a name cannot be re-resolved elsewhere between the check and
//! the connect; SNI and certificate verification use the checked name (an IP
//! literal is verified against the certificate's IP SANs). Why a connect or
//! handshake failed is a [`ConnectError`]: host-side text for the call's log,
//! and a payload-free `error-code` for the plugin.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, InvalidDnsNameError, ServerName};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use wasmtime_wasi_http::Error as HttpError;

/// Why a channel's TLS settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// `ca_file` cannot be read or is not PEM.
    #[error("ca_file {path}: {source}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What went wrong reading it.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// `ca_file` holds no certificate.
    #[error("ca_file {path}: no PEM certificate in it")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// A certificate of `ca_file` is not a usable trust anchor.
    #[error("ca_file {path}: {source}")]
    BadRoot {
        /// The file.
        path: PathBuf,
        /// rustls's reason.
        #[source]
        source: rustls::Error,
    },
}

/// The client configuration of channels without a `ca_file`: web PKI roots.
static WEB_PKI: LazyLock<Arc<ClientConfig>> =
    LazyLock::new(|| Arc::new(client_config(web_pki_roots())));

fn web_pki_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

/// The TLS client configuration for a channel: the web PKI roots, plus the
/// PEM certificates of `ca_file` when set.
pub(crate) fn tls_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, TlsSetupError> {
    let Some(path) = ca_file else {
        return Ok(WEB_PKI.clone());
    };
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|source| TlsSetupError::CaFile {
            path: path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsSetupError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    let mut roots = web_pki_roots();
    for cert in certs {
        roots.add(cert).map_err(|source| TlsSetupError::BadRoot {
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(Arc::new(client_config(roots)))
}

/// The default web-PKI-only configuration (no `ca_file`).
pub(crate) fn default_tls_config() -> Arc<ClientConfig> {
    WEB_PKI.clone()
}

fn client_config(roots: RootCertStore) -> ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    cfg
}

/// Checked destinations: `host:port` (as the request URI names it) → the
/// address the policy allowed. Only [`http`](super::http) writes it, after
/// the check; the connector only reads it.
#[derive(Clone, Default)]
pub struct Checked(Arc<Mutex<HashMap<String, SocketAddr>>>);

impl Checked {
    /// Records that `host:port` may be reached at `addr`.
    pub fn record(&self, host: &str, port: u16, addr: SocketAddr) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(format!("{host}:{port}"), addr);
    }

    fn get(&self, host: &str, port: u16) -> Option<SocketAddr> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(&format!("{host}:{port}")).copied()
    }
}

/// Why a connection could not be made; nothing of the request was written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// The authority was never checked by the policy (cannot happen through
    /// `send_request`; the connector refuses rather than resolve).
    #[error("{authority} was not checked by the outbound policy")]
    NotChecked {
        /// `host:port`.
        authority: String,
    },
    /// TCP connect or TLS handshake took longer than `connect_timeout`.
    #[error("connecting to {name} ({addr}) timed out")]
    Timeout {
        /// The checked name.
        name: String,
        /// The checked address.
        addr: SocketAddr,
    },
    /// The TCP connect failed.
    #[error("connecting to {name} ({addr}): {source}")]
    Tcp {
        /// The checked name.
        name: String,
        /// The checked address.
        addr: SocketAddr,
        /// The socket error.
        #[source]
        source: io::Error,
    },
    /// The host name is not a valid TLS server name.
    #[error("TLS: {name} is not a valid server name")]
    ServerName {
        /// The name.
        name: String,
        /// rustls's reason.
        #[source]
        source: InvalidDnsNameError,
    },
    /// rustls refused the server (certificate, name, protocol, alert).
    #[error("TLS with {name}: {}", tls_cause(source, name))]
    Tls {
        /// The checked name the certificate was verified against.
        name: String,
        /// rustls's error.
        #[source]
        source: rustls::Error,
    },
    /// The handshake broke off (the server closed, a socket error).
    #[error("TLS handshake with {name} failed: {source}")]
    Handshake {
        /// The checked name.
        name: String,
        /// The socket error.
        #[source]
        source: io::Error,
    },
}

/// The cause of a TLS failure in words an operator looks for.
fn tls_cause(e: &rustls::Error, name: &str) -> String {
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                format!("certificate not valid for name {name}")
            }
            CertificateError::UnknownIssuer => "certificate has an unknown issuer".into(),
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "certificate expired".into()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "certificate not valid yet".into()
            }
            other => format!("invalid certificate ({other:?})"),
        },
        rustls::Error::AlertReceived(alert) => format!("the server sent alert {alert:?}"),
        other => format!("handshake error ({other})"),
    }
}

impl ConnectError {
    /// The payload-free `error-code` the plugin reads (every variant is
    /// "not sent" to the SDK: the request was never written).
    pub(crate) fn code(&self) -> HttpError {
        match self {
            ConnectError::Timeout { .. } => HttpError::ConnectionTimeout,
            ConnectError::NotChecked { .. } | ConnectError::Tcp { .. } => {
                HttpError::ConnectionRefused
            }
            ConnectError::ServerName { .. } | ConnectError::Handshake { .. } => {
                HttpError::TlsProtocolError
            }
            ConnectError::Tls { source, .. } => match source {
                rustls::Error::InvalidCertificate(_) => HttpError::TlsCertificateError,
                rustls::Error::AlertReceived(alert) => HttpError::TlsAlertReceived {
                    alert_id: Some(u8::from(*alert)),
                    alert_message: None,
                },
                _ => HttpError::TlsProtocolError,
            },
        }
    }

    /// Finds the connector's error in the chain of a hyper-util error.
    pub(crate) fn find<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a ConnectError> {
        let mut cur = Some(e);
        while let Some(err) = cur {
            if let Some(c) = err.downcast_ref::<ConnectError>() {
                return Some(c);
            }
            cur = err.source();
        }
        None
    }
}

/// hyper-util's connector for one channel instance: TCP to the checked
/// address, then TLS for `https` (SNI and verification = the URI's host, the
/// checked name). Counts TLS handshakes.
#[derive(Clone)]
pub(crate) struct Connector {
    /// Where each checked authority may be reached.
    pub checked: Checked,
    /// rustls configuration (roots, ALPN).
    pub tls: Arc<ClientConfig>,
    /// Most time for the TCP connect, and again for the handshake.
    pub connect_timeout: Duration,
    /// TLS handshakes started.
    pub handshakes: Arc<AtomicU64>,
}

type ConnectFuture = Pin<Box<dyn Future<Output = Result<TokioIo<Stream>, ConnectError>> + Send>>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = ConnectError;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> ConnectFuture {
        let this = self.clone();
        Box::pin(async move { this.connect(uri).await.map(TokioIo::new) })
    }
}

impl Connector {
    async fn connect(self, uri: http::Uri) -> Result<Stream, ConnectError> {
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let name = uri
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let addr = self
            .checked
            .get(&name, port)
            .ok_or_else(|| ConnectError::NotChecked {
                authority: format!("{name}:{port}"),
            })?;
        let tcp = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr)).await {
            Err(_) => return Err(ConnectError::Timeout { name, addr }),
            Ok(Err(source)) => return Err(ConnectError::Tcp { name, addr, source }),
            Ok(Ok(tcp)) => tcp,
        };
        let _ = tcp.set_nodelay(true);
        if !https {
            return Ok(Stream::Plain(tcp));
        }
        self.handshake(tcp, name, addr).await.map(Stream::Tls)
    }

    async fn handshake(
        &self,
        tcp: TcpStream,
        name: String,
        addr: SocketAddr,
    ) -> Result<Box<TlsStream<TcpStream>>, ConnectError> {
        let server =
            ServerName::try_from(name.clone()).map_err(|source| ConnectError::ServerName {
                name: name.clone(),
                source,
            })?;
        self.handshakes.fetch_add(1, Ordering::Relaxed);
        let connector = tokio_rustls::TlsConnector::from(self.tls.clone());
        match tokio::time::timeout(self.connect_timeout, connector.connect(server, tcp)).await {
            Err(_) => Err(ConnectError::Timeout { name, addr }),
            Ok(Ok(tls)) => Ok(Box::new(tls)),
            Ok(Err(e)) => Err(handshake_error(name, e)),
        }
    }
}

/// tokio-rustls reports rustls's error inside an `io::Error`.
fn handshake_error(name: String, e: io::Error) -> ConnectError {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .cloned();
    match tls {
        Some(source) => ConnectError::Tls { name, source },
        None => ConnectError::Handshake { name, source: e },
    }
}

/// A connection: plain TCP (`http`, only with `allow_plaintext`) or TLS.
pub(crate) enum Stream {
    /// Plain HTTP/1.1.
    Plain(TcpStream),
    /// TLS; HTTP/2 when ALPN chose `h2`.
    Tls(Box<TlsStream<TcpStream>>),
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Stream::Plain(_) => Connected::new(),
            Stream::Tls(tls) if tls.get_ref().1.alpn_protocol() == Some(b"h2") => {
                Connected::new().negotiated_h2()
            }
            Stream::Tls(_) => Connected::new(),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, b),
            Stream::Tls(s) => Pin::new(s).poll_write(cx, b),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
