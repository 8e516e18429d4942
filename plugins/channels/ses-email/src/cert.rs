//! The SNS signing certificates, fetched from a checked `SigningCertURL`
//! and kept: in this warm instance, and in the channel's shared cache for
//! every other instance (a day; SNS rotates its certificate rarely and
//! names the new one by a new URL).

use std::sync::Mutex;

use channel_sdk::provider::auth::aws::sns;
use channel_sdk::provider::auth::key_digest;
use channel_sdk::{cache, http};

/// How long a certificate stays in the shared cache.
const TTL_MS: u64 = 24 * 3600 * 1000;
/// Certificates kept in the instance (URLs change only on rotation).
const KEEP: usize = 4;

/// This instance's certificates, by URL.
static CERTS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// Why no certificate could be had.
pub enum CertError {
    /// The fetch failed or SNS did not answer 200: try again later.
    Unavailable(String),
    /// What came back is not a certificate with an RSA key.
    Unusable(sns::SnsError),
}

/// The PEM certificate at `url` (already checked to be under the SNS
/// endpoint), from the instance, the shared cache, or the network.
pub fn certificate(url: &str) -> Result<String, CertError> {
    if let Some(pem) = local(url) {
        return Ok(pem);
    }
    let key = format!("sns-cert:{}", key_digest(url, 32));
    if let Ok(Some(pem)) = cache::get(&key)
        && sns::public_key(&pem).is_ok()
    {
        keep(url, &pem);
        return Ok(pem);
    }
    let resp = http::get(url).map_err(|e| CertError::Unavailable(e.to_string()))?;
    if resp.status != 200 {
        return Err(CertError::Unavailable(format!(
            "the SigningCertURL answered status {}",
            resp.status
        )));
    }
    let pem = resp.text();
    sns::public_key(&pem).map_err(CertError::Unusable)?;
    let _ = cache::set(&key, &pem, TTL_MS);
    keep(url, &pem);
    Ok(pem)
}

/// The certificate this instance holds for `url`.
fn local(url: &str) -> Option<String> {
    let certs = CERTS.lock().unwrap_or_else(|e| e.into_inner());
    certs.iter().find(|(u, _)| u == url).map(|(_, p)| p.clone())
}

/// Keeps `pem` for `url` in this instance, dropping the oldest past [`KEEP`].
fn keep(url: &str, pem: &str) {
    let mut certs = CERTS.lock().unwrap_or_else(|e| e.into_inner());
    certs.retain(|(u, _)| u != url);
    certs.push((url.to_string(), pem.to_string()));
    if certs.len() > KEEP {
        certs.remove(0);
    }
}
