//! A local HTTPS (or plain HTTP) server for the outbound tests and the
//! outbound benchmark: rustls with certificates made by rcgen from a CA
//! generated in the test, hyper serving HTTP/1.1 and HTTP/2 (as ALPN
//! decides). It counts TCP connections and completed TLS handshakes and
//! records each request's HTTP version, method, authority and body length.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, date_time_ymd};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A certificate authority made for one test.
pub struct TestCa {
    /// Signs leaf certificates.
    issuer: Issuer<'static, KeyPair>,
    /// Its certificate, PEM.
    pub pem: String,
}

/// A leaf certificate and its key, for a server.
#[derive(Clone)]
pub struct Leaf {
    /// The certificate chain (leaf only; the CA is the client's root).
    pub chain: Vec<CertificateDer<'static>>,
    /// The private key, PKCS#8 DER.
    pub key: Vec<u8>,
}

impl TestCa {
    /// A fresh CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names` (DNS names or IP literals), valid now.
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, false)
    }

    /// A certificate for `names` that expired in 2001.
    pub fn expired_leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, true)
    }

    fn leaf_with(&self, names: &[&str], expired: bool) -> Leaf {
        let sans: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(sans).unwrap();
        params.distinguished_name.push(DnType::CommonName, names[0]);
        if expired {
            params.not_before = date_time_ymd(2000, 1, 1);
            params.not_after = date_time_ymd(2001, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            chain: vec![cert.der().clone()],
            key: key.serialize_der(),
        }
    }

    /// Writes the CA certificate to `dir/<file>` (a channel's `ca_file`).
    pub fn write(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        std::fs::write(&path, &self.pem).unwrap();
        path
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// HTTP/1.1 or HTTP/2.
    pub version: http::Version,
    /// The method.
    pub method: http::Method,
    /// `Host` (HTTP/1.1) or `:authority` (HTTP/2).
    pub authority: String,
    /// Bytes of body received.
    pub body_len: usize,
}

/// What the server counts, shared with its tasks.
#[derive(Default)]
struct Counters {
    connections: AtomicUsize,
    handshakes: AtomicUsize,
    requests: Mutex<Vec<Seen>>,
}

/// A running server on a loopback address; stops with the test's runtime.
pub struct TestServer {
    /// Where it listens.
    pub addr: SocketAddr,
    counters: Arc<Counters>,
}

/// Which ALPN protocols an HTTPS server offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    /// `h2` and `http/1.1` (the client's preference, h2, wins).
    H2AndH1,
    /// `http/1.1` only.
    H1Only,
}

impl TestServer {
    /// An HTTPS server on `ip` (port chosen) presenting `leaf`.
    pub async fn https(ip: &str, leaf: &Leaf, alpn: Alpn) -> TestServer {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf.key.clone()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(leaf.chain.clone(), key)
            .unwrap();
        config.alpn_protocols = match alpn {
            Alpn::H2AndH1 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Alpn::H1Only => vec![b"http/1.1".to_vec()],
        };
        Self::start(ip, Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    /// A plain HTTP server on `ip` (port chosen).
    pub async fn plain(ip: &str) -> TestServer {
        Self::start(ip, None).await
    }

    async fn start(ip: &str, tls: Option<tokio_rustls::TlsAcceptor>) -> TestServer {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                c.connections.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(tcp, tls.clone(), c.clone()));
            }
        });
        TestServer { addr, counters }
    }

    /// TCP connections accepted.
    pub fn connections(&self) -> usize {
        self.counters.connections.load(Ordering::SeqCst)
    }

    /// TLS handshakes completed.
    pub fn handshakes(&self) -> usize {
        self.counters.handshakes.load(Ordering::SeqCst)
    }

    /// Requests received (complete heads), in order.
    pub fn requests(&self) -> Vec<Seen> {
        self.counters.requests.lock().unwrap().clone()
    }
}

/// How long the server waits, after reading a request, before it answers:
/// `/delay/<ms>` that many milliseconds, any other path not at all.
fn response_delay(path: &str) -> std::time::Duration {
    let ms = path
        .strip_prefix("/delay/")
        .and_then(|ms| ms.parse().ok())
        .unwrap_or(0);
    std::time::Duration::from_millis(ms)
}

/// Serves one connection: TLS handshake (if any), then HTTP/1.1 or HTTP/2.
async fn serve(
    tcp: tokio::net::TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    counters: Arc<Counters>,
) {
    let c = counters.clone();
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let c = c.clone();
        async move {
            let authority = req
                .uri()
                .authority()
                .map(|a| a.to_string())
                .or_else(|| {
                    let h = req.headers().get(http::header::HOST)?;
                    h.to_str().ok().map(str::to_string)
                })
                .unwrap_or_default();
            let (version, method) = (req.version(), req.method().clone());
            let delay = response_delay(req.uri().path());
            let body = req.into_body().collect().await?.to_bytes();
            c.requests.lock().unwrap().push(Seen {
                version,
                method,
                authority,
                body_len: body.len(),
            });
            tokio::time::sleep(delay).await;
            Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    match tls {
        None => {
            let _ = builder.serve_connection(TokioIo::new(tcp), service).await;
        }
        Some(acceptor) => {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            counters.handshakes.fetch_add(1, Ordering::SeqCst);
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        }
    }
}
