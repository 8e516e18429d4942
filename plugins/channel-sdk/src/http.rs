//! A blocking HTTP client over `wasi:http/outgoing-handler`: enough for a
//! provider API call in a few lines. `https://` is the norm (the host speaks
//! TLS, and HTTP/2 where the provider offers it); `http://` only reaches a
//! channel that allows plaintext. The host decides where a request may go;
//! this module reports what happened in terms a sender needs:
//! refused by the host, not sent (safe to retry), or maybe sent (unknown).
//! Errors never carry the URL: a query string may hold a token or a secret.

use crate::bindings::wasi::http::outgoing_handler;
use crate::bindings::wasi::http::types::{
    ErrorCode, Fields, IncomingResponse, Method, OutgoingBody, OutgoingRequest, Scheme,
};
use crate::bindings::wasi::io::streams::StreamError;

/// A response read in full.
#[derive(Debug, Clone)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// Header names (lower case) and values.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as (lossy) UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `Retry-After` in milliseconds, when given as delta-seconds.
    pub fn retry_after_ms(&self) -> Option<u64> {
        self.header("retry-after")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|s| s.saturating_mul(1000))
    }

    /// The error for a refused answer from `provider`, classed by its status
    /// alone: 429 retryable (honouring `Retry-After`), 5xx unknown (the
    /// provider may have the message), other statuses permanent. The text names the status and the start of the provider's
    /// answer, which is what an operator reads to tell why.
    pub fn refusal(&self, provider: &str) -> crate::SendError {
        let mut refusal = crate::provider::auth::Refusal::of_status(self.status);
        let answer: String = self.text().trim().chars().take(200).collect();
        if !answer.is_empty() {
            refusal.code = format!("{}: {answer}", refusal.code);
        }
        crate::provider::refused_by(provider, &refusal, self)
    }

    /// A receipt whose provider id is the string field `id_field` of the
    /// JSON body, with `reference`; an answer without it is `unknown` (the
    /// provider may have taken the message).
    pub fn receipt(
        &self,
        id_field: &str,
        reference: Option<String>,
    ) -> Result<crate::Receipt, crate::SendError> {
        let id = self.json_str(id_field).ok_or_else(|| {
            crate::SendError::Unknown(format!("status {} without a message id", self.status))
        })?;
        Ok(crate::Receipt {
            provider_message_id: id,
            reference,
        })
    }

    /// The string field `name` of the JSON body, if there is one.
    pub fn json_str(&self, name: &str) -> Option<String> {
        self.json().get(name)?.as_str().map(str::to_string)
    }

    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// Why a request got no complete response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The host's outbound policy refused the request (not on the allowlist,
    /// a forbidden header, a private address): nothing was sent.
    Denied(String),
    /// The request certainly did not reach the provider (bad URL, connection
    /// refused, name not found): safe to retry.
    NotSent(String),
    /// The request may have reached the provider, but no complete answer came
    /// back (timeout, connection cut off mid-response).
    MaybeSent(String),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Denied(m) => write!(f, "request denied by the host's outbound policy: {m}"),
            HttpError::NotSent(m) => write!(f, "request not sent: {m}"),
            HttpError::MaybeSent(m) => write!(f, "no complete answer: {m}"),
        }
    }
}

/// `GET url` without extra headers.
pub fn get(url: &str) -> Result<Response, HttpError> {
    request("GET", url, &[], None)
}

/// Sends `method url` with `headers` and `body`, and reads the whole response.
/// `url` is `http://host[:port]/path?query`.
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Result<Response, HttpError> {
    let (scheme, authority, path) = split_url(url)?;
    let req = OutgoingRequest::new(fields(headers, body)?);
    let bad = |what: &str| HttpError::NotSent(format!("invalid {what} in the request URL"));
    req.set_method(&to_method(method))
        .map_err(|()| bad("method"))?;
    req.set_scheme(Some(&scheme)).map_err(|()| bad("scheme"))?;
    req.set_authority(Some(authority))
        .map_err(|()| bad("authority"))?;
    req.set_path_with_query(Some(path))
        .map_err(|()| bad("path"))?;
    let out = req.body().map_err(|()| bad("body"))?;
    let future = outgoing_handler::handle(req, None).map_err(|e| classify(&e))?;
    write_body(out, body);
    future.subscribe().block();
    let resp = match future.get() {
        Some(Ok(Ok(r))) => r,
        Some(Ok(Err(e))) => return Err(classify(&e)),
        Some(Err(())) | None => return Err(HttpError::MaybeSent("no response".into())),
    };
    read_response(resp)
}

/// `url`'s scheme, authority and path with query.
fn split_url(url: &str) -> Result<(Scheme, &str, &str), HttpError> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        HttpError::NotSent("the endpoint is not an absolute URL (scheme://host/path)".into())
    })?;
    let scheme = match scheme {
        "http" => Scheme::Http,
        "https" => Scheme::Https,
        other => return Err(HttpError::NotSent(format!("unsupported scheme `{other}`"))),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    Ok((scheme, authority, path))
}

/// The request's header fields, with `content-length` when there is a body.
fn fields(headers: &[(&str, &str)], body: Option<&[u8]>) -> Result<Fields, HttpError> {
    let fields = Fields::new();
    for (name, value) in headers {
        fields
            .append(name, value.as_bytes())
            .map_err(|e| HttpError::Denied(format!("header `{name}` refused ({e:?})")))?;
    }
    if let Some(body) = body {
        let _ = fields.append("content-length", body.len().to_string().as_bytes());
    }
    Ok(fields)
}

fn to_method(method: &str) -> Method {
    match method {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "HEAD" => Method::Head,
        other => Method::Other(other.to_string()),
    }
}

/// Writes `body` (if any) and finishes the request body; a failed write
/// leaves the rest to the response, which then tells what happened.
fn write_body(out: OutgoingBody, body: Option<&[u8]>) {
    if let Some(bytes) = body
        && let Ok(stream) = out.write()
    {
        for chunk in bytes.chunks(4096) {
            if stream.blocking_write_and_flush(chunk).is_err() {
                break;
            }
        }
    }
    let _ = OutgoingBody::finish(out, None);
}

/// The response's status, headers (names in lower case) and whole body; a
/// body cut off after the status is `MaybeSent`.
fn read_response(resp: IncomingResponse) -> Result<Response, HttpError> {
    let status = resp.status();
    let headers = resp
        .headers()
        .entries()
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_ascii_lowercase(),
                String::from_utf8_lossy(&v).into_owned(),
            )
        })
        .collect();
    let unavailable = || HttpError::MaybeSent("response body unavailable".into());
    let incoming = resp.consume().map_err(|()| unavailable())?;
    let mut body = Vec::new();
    {
        let stream = incoming.stream().map_err(|()| unavailable())?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => body.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(_)) => {
                    return Err(HttpError::MaybeSent(format!(
                        "the response was cut off after status {status}"
                    )));
                }
            }
        }
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// Sorts a `wasi:http` error code into denied / not sent / maybe sent.
fn classify(e: &ErrorCode) -> HttpError {
    match e {
        ErrorCode::HttpRequestDenied => HttpError::Denied("destination not allowed".into()),
        ErrorCode::DnsTimeout
        | ErrorCode::DnsError(_)
        | ErrorCode::DestinationNotFound
        | ErrorCode::DestinationUnavailable
        | ErrorCode::DestinationIpProhibited
        | ErrorCode::DestinationIpUnroutable
        | ErrorCode::ConnectionRefused
        | ErrorCode::ConnectionTimeout
        | ErrorCode::HttpRequestUriInvalid
        | ErrorCode::HttpRequestMethodInvalid
        | ErrorCode::HttpProtocolError
        | ErrorCode::TlsProtocolError
        | ErrorCode::TlsCertificateError
        | ErrorCode::TlsAlertReceived(_)
        | ErrorCode::HttpRequestBodySize(_) => HttpError::NotSent(format!("{e:?}")),
        other => HttpError::MaybeSent(format!("{other:?}")),
    }
}
