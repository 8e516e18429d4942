//! Bearer-token checks: one token for `/v1` (business services), one for
//! `/admin` (operators), one shared secret per channel for receipts. Tokens
//! are kept only as SHA-256 digests and compared in constant time; they are
//! never logged. A surface without a token is open (the service warns at start).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::problem::ApiError;

/// An expected bearer token (its digest), or none: the surface is open.
#[derive(Clone, Default)]
pub struct Token {
    /// SHA-256 of the token; comparing digests keeps the length secret too.
    digest: Option<Arc<[u8; 32]>>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.digest.is_some() {
            "Token(set)"
        } else {
            "Token(open)"
        })
    }
}

impl Token {
    /// A token; `None` or an empty string leaves the surface open.
    pub fn new(secret: Option<&str>) -> Token {
        Token {
            digest: secret
                .filter(|s| !s.is_empty())
                .map(|s| Arc::new(Sha256::digest(s.as_bytes()).into())),
        }
    }

    /// True when no token is required.
    pub(crate) fn is_open(&self) -> bool {
        self.digest.is_none()
    }

    /// Checks the `Authorization: Bearer <token>` header of a request.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if self.digest.is_none() {
            return Ok(());
        }
        let Some(value) = headers.get(header::AUTHORIZATION) else {
            return Err(ApiError::Unauthorized("missing bearer token".into()));
        };
        let presented = value
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or_else(|| {
                ApiError::Unauthorized("expected `Authorization: Bearer <token>`".into())
            })?;
        if self.matches(presented) {
            Ok(())
        } else {
            Err(ApiError::Unauthorized("wrong bearer token".into()))
        }
    }

    /// Whether `presented` is the token (digests compared in constant time);
    /// always true for an open surface.
    pub fn matches(&self, presented: &str) -> bool {
        let Some(expected) = &self.digest else {
            return true;
        };
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        bool::from(digest.ct_eq(expected.as_ref()))
    }

    /// A key for `purpose` derived from the token (SHA-256 of the purpose and
    /// the token's digest), e.g. to sign the console's session cookies: it
    /// changes when the token does. `None` for an open surface.
    pub fn derive_key(&self, purpose: &str) -> Option<[u8; 32]> {
        let digest = self.digest.as_ref()?;
        let mut hasher = Sha256::new();
        hasher.update(purpose.as_bytes());
        hasher.update([0u8]);
        hasher.update(digest.as_ref());
        Some(hasher.finalize().into())
    }
}

/// Middleware: refuses a request whose bearer token does not match `token`
/// (401, the client's address logged), and every request of a client
/// address past its failures (429, [`super::guard::Failures`]).
pub(crate) async fn require(State(token): State<Token>, req: Request, next: Next) -> Response {
    if token.is_open() {
        return next.run(req).await;
    }
    let guard = match super::guard::TokenGuard::of(&req) {
        Ok(guard) => guard,
        Err(refused) => return refused.into_response(),
    };
    match token.check(req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => {
            guard.refused(&req);
            e.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, v.parse().unwrap());
        h
    }

    #[test]
    fn bearer_tokens() {
        let t = Token::new(Some("s3cret"));
        assert!(t.check(&headers("Bearer s3cret")).is_ok());
        assert!(t.check(&headers("bearer s3cret")).is_ok());
        assert!(t.check(&headers("Bearer s3cre")).is_err());
        assert!(t.check(&headers("Basic s3cret")).is_err());
        assert!(t.check(&HeaderMap::new()).is_err());
        assert!(Token::new(None).check(&HeaderMap::new()).is_ok());
        assert!(Token::new(Some("")).is_open());
        assert_eq!(format!("{t:?}"), "Token(set)");
    }
}
