//! TLS for the simulated providers: a CA generated at start (rcgen), a server
//! certificate it signs for `127.0.0.1`, `localhost` and the real provider
//! host names, a rustls acceptor offering `h2` and `http/1.1` by ALPN, and
//! the keys the providers verify with (generated here too).

use crate::Credentials;
use axum::Router;
use base64::Engine;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rand::Rng;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use rsa::pkcs8::{DecodePrivateKey, EncodePrivateKey, LineEnding};
use rsa::traits::PublicKeyParts;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::future::Future;
use std::sync::{Arc, OnceLock};

/// The host names the server certificate is valid for.
pub const SERVER_NAMES: [&str; 8] = [
    "127.0.0.1",
    "localhost",
    "dysmsapi.aliyuncs.com",
    "api.weixin.qq.com",
    "fcm.googleapis.com",
    "oauth2.googleapis.com",
    "api.push.apple.com",
    "api.sandbox.push.apple.com",
];

/// Failures generating the test PKI.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// rcgen could not make a key or certificate.
    #[error("certificate generation failed")]
    Rcgen(#[from] rcgen::Error),
    /// rustls refused the generated certificate or key.
    #[error("TLS configuration failed")]
    Rustls(#[from] rustls::Error),
    /// The RSA key could not be generated or encoded.
    #[error("RSA key generation failed: {0}")]
    Rsa(String),
}

/// The RSA public key of the FCM service account.
#[derive(Debug, Clone)]
pub struct RsaPublic {
    /// Modulus, big-endian.
    pub n: Vec<u8>,
    /// Public exponent, big-endian.
    pub e: Vec<u8>,
}

/// TLS material and the keys the providers verify with.
pub struct Keys {
    /// The CA certificate, PEM.
    pub ca_pem: String,
    /// The server's rustls configuration (ALPN `h2`, `http/1.1`).
    pub server_config: Arc<rustls::ServerConfig>,
    /// The credentials the providers accept.
    pub credentials: Credentials,
    /// The FCM service account's public key.
    pub fcm_public: RsaPublic,
    /// The APNs key's public point (uncompressed SEC1).
    pub apns_public: Vec<u8>,
}

impl Keys {
    /// A fresh CA and server certificate; the given credentials, or fresh ones.
    pub fn generate(given: Option<Credentials>) -> Result<Self, KeyError> {
        let (ca_pem, server_config) = pki()?;
        let credentials = match given {
            Some(c) => c,
            None => fresh_credentials()?,
        };
        let fcm_public = rsa_public(&credentials.fcm_private_key_pem)?;
        let apns_public = KeyPair::from_pem(&credentials.apns_private_key_pem)?
            .public_key_raw()
            .to_vec();
        Ok(Keys {
            ca_pem,
            server_config,
            credentials,
            fcm_public,
            apns_public,
        })
    }
}

/// New random credentials and keys.
fn fresh_credentials() -> Result<Credentials, KeyError> {
    let fcm_pem = rsa_key()?;
    let apns_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
    let app_id: u32 = rand::rng().random_range(0..1_000_000);
    let mut rng = rand::rng();
    let mut hex = |n: usize| -> String {
        (0..n)
            .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap_or('0'))
            .collect()
    };
    Ok(Credentials {
        aliyun_access_key_id: format!("LTAI{}", hex(20)),
        aliyun_access_key_secret: hex(30),
        wechat_appid: format!("wx{}", hex(16)),
        wechat_secret: hex(32),
        wechat_callback_token: hex(24),
        wechat_encoding_aes_key: alphanumeric(43),
        wechat_account: format!("gh_{}", hex(12)),
        fcm_project_id: format!("sim-{}", hex(6)),
        fcm_client_email: format!("push@sim-{}.iam.gserviceaccount.com", hex(6)),
        fcm_private_key_id: hex(40),
        fcm_private_key_pem: fcm_pem,
        apns_team_id: hex(10).to_uppercase(),
        apns_key_id: hex(10).to_uppercase(),
        apns_private_key_pem: apns_key.serialize_pem(),
        webhook_secret: webhook_secret(),
        tencent_secret_id: format!("AKID{}", hex(32)),
        tencent_secret_key: hex(32),
        tencent_sdk_app_id: format!("1400{app_id:06}"),
        aws_access_key_id: format!("AKIA{}", hex(16).to_uppercase()),
        aws_secret_access_key: alphanumeric(40),
    })
}

/// `n` random letters and digits (WeChat's console makes an EncodingAESKey
/// of 43 such).
fn alphanumeric(n: usize) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(CHARS[rng.random_range(0..CHARS.len())]))
        .collect()
}

/// The public half of a PKCS#8 PEM RSA key.
fn rsa_public(pem: &str) -> Result<RsaPublic, KeyError> {
    let key = rsa::PrivateKey::from_pkcs8_pem(pem).map_err(|e| KeyError::Rsa(e.to_string()))?;
    Ok(RsaPublic {
        n: key.n_bytes().to_vec(),
        e: key.e_bytes().to_vec(),
    })
}

fn webhook_secret() -> String {
    let bytes: [u8; 24] = rand::rng().random();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The CA (PEM) and a server configuration whose certificate it signed.
fn pki() -> Result<(String, Arc<rustls::ServerConfig>), KeyError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "pushonce provider-sim test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let names: Vec<String> = SERVER_NAMES.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "provider-sim");
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    let chain = vec![
        cert.der().clone(),
        CertificateDer::from(ca_cert.der().to_vec()),
    ];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((ca_cert.pem(), Arc::new(config)))
}

/// The FCM service account's RSA 2048 key as PKCS#8 PEM. Generated once per
/// process (RSA generation is the slow part of a start).
fn rsa_key() -> Result<String, KeyError> {
    static KEY: OnceLock<Result<String, String>> = OnceLock::new();
    KEY.get_or_init(|| {
        let key = rsa::PrivateKey::new(&mut getrandom::SysRng, 2048).map_err(|e| e.to_string())?;
        key.to_pkcs8_pem(LineEnding::LF)
            .map(|pem| pem.to_string())
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(KeyError::Rsa)
}

/// Accepts TLS connections on `listener` and serves `app` on each, HTTP/1.1
/// or HTTP/2 as ALPN chose, until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: Arc<rustls::ServerConfig>,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let configs = Configs::new(config);
    let mut shutdown = std::pin::pin!(shutdown);
    for n in 0u64.. {
        let (tcp, _) = tokio::select! {
            accepted = listener.accept() => accepted?,
            () = &mut shutdown => return Ok(()),
        };
        let configs = configs.clone();
        let app = app.clone().layer(axum::Extension(ConnectionId(n)));
        tokio::spawn(async move {
            // A failed handshake costs that connection only.
            let Ok(tls) = configs.accept(tcp).await else {
                return;
            };
            let service = TowerToHyperService::new(app);
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(tls), service)
                .await;
        });
    }
    Ok(())
}

/// The server configurations: APNs host names (by SNI) offer only `h2`,
/// like Apple, so an HTTP/1.1-only client fails the handshake there; every
/// other name (and a bare IP) offers `h2` and `http/1.1`.
#[derive(Clone)]
struct Configs {
    both: Arc<rustls::ServerConfig>,
    h2_only: Arc<rustls::ServerConfig>,
}

impl Configs {
    fn new(both: Arc<rustls::ServerConfig>) -> Self {
        let mut h2_only = (*both).clone();
        h2_only.alpn_protocols = vec![b"h2".to_vec()];
        Configs {
            both,
            h2_only: Arc::new(h2_only),
        }
    }

    async fn accept(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
        let acceptor = rustls::server::Acceptor::default();
        let start = tokio_rustls::LazyConfigAcceptor::new(acceptor, tcp).await?;
        let apple = matches!(
            start.client_hello().server_name(),
            Some("api.push.apple.com" | "api.sandbox.push.apple.com")
        );
        let config = if apple { &self.h2_only } else { &self.both };
        start.into_stream(config.clone()).await
    }
}

/// Which TLS connection a request came on (APNs tracks provider-token
/// updates per connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectionId(pub u64);
