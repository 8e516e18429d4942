//! The JSON body extractor of the API: checks the media type (415), the size
//! (413, enforced by the body limit layer), the syntax (400) and the shape
//! (422 naming the field: missing, unknown, wrong type), so every refusal is a
//! problem-details answer rather than axum's plain-text rejections.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde::de::DeserializeOwned;

use super::problem::ApiError;

/// A JSON request body, deserialised strictly.
#[derive(Debug)]
pub(crate) struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        check_json_media_type(req.headers().get(header::CONTENT_TYPE))?;
        let limit = req
            .extensions()
            .get::<BodyLimit>()
            .map(|l| l.0)
            .unwrap_or(0);
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge { limit }
            } else {
                ApiError::BadJson(format!("could not read the body: {e}"))
            }
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Answers 413 at once when the request declares (`Content-Length`) a body
/// over `limit`, without waiting for it: the body limit would refuse it only
/// once that much had arrived, and a client that declares 10 GiB and sends
/// nothing would hold the request until its timeout. The connection is
/// closed after the answer (the body is never read).
pub(crate) async fn refuse_declared_oversize(
    axum::extract::State(limit): axum::extract::State<usize>,
    req: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        let mut response = ApiError::TooLarge { limit }.into_response();
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        return response;
    }
    next.run(req).await
}

/// The body limit in force, put in the request's extensions by the router so
/// the 413 answer can name it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimit(pub usize);

/// `application/json`, with or without parameters (`; charset=utf-8`), or `+json`.
pub(crate) fn check_json_media_type(value: Option<&header::HeaderValue>) -> Result<(), ApiError> {
    let Some(value) = value else {
        return Err(ApiError::UnsupportedMediaType(
            "missing Content-Type: send application/json".into(),
        ));
    };
    let text = value.to_str().unwrap_or("");
    let essence = text
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
    {
        Ok(())
    } else {
        Err(ApiError::UnsupportedMediaType(format!(
            "Content-Type {:?} is not application/json",
            text.chars().take(100).collect::<String>()
        )))
    }
}

/// Parses JSON text into `T`: syntax errors are 400; a body that is not an
/// object, or an object of the wrong shape, is 422 naming the field.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| ApiError::BadJson(e.to_string()))?;
    if !value.is_object() {
        // serde would otherwise read a struct from an array of its fields.
        return Err(ApiError::invalid("body", "must be a JSON object"));
    }
    from_value(value)
}

/// Converts a value already parsed (a batch item) into `T`, naming the field on error.
pub(crate) fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, ApiError> {
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(v) => Ok(v),
        Err(e) => {
            let path = e.path().to_string();
            let message = strip_position(&e.into_inner().to_string());
            Err(ApiError::invalid(
                field_of(&path, &message, "body"),
                message,
            ))
        }
    }
}

/// Parses a raw query string (without `?`) into `T`: a malformed one is
/// 422 naming the parameter at fault (a bad value, an unknown or repeated
/// parameter), else `query`.
pub(crate) fn parse_query<T: DeserializeOwned>(query: Option<&str>) -> Result<T, ApiError> {
    let pairs = form_urlencoded::parse(query.unwrap_or_default().as_bytes());
    match serde_path_to_error::deserialize(serde_urlencoded::Deserializer::new(pairs)) {
        Ok(v) => Ok(v),
        Err(e) => {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            Err(ApiError::invalid(
                field_of(&path, &message, "query"),
                message,
            ))
        }
    }
}

/// The field an error is about: its path, or for errors at the top level
/// (missing or unknown field) the name in backquotes in the message, else
/// `whole`.
fn field_of(path: &str, message: &str, whole: &str) -> String {
    if path != "." && !path.is_empty() {
        // A path into the unknown field already ends with it.
        return path.to_string();
    }
    message
        .split('`')
        .nth(1)
        .map(str::to_string)
        .unwrap_or_else(|| whole.to_string())
}

/// serde_json appends " at line 1 column 42"; the field names the place better.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::model::EventRequest;

    fn field(text: &str) -> (u16, Option<String>) {
        let e = parse_json::<EventRequest>(text.as_bytes()).unwrap_err();
        (e.status().as_u16(), e.problem().field)
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(field("{"), (400, None));
        assert_eq!(
            field(r#"{"biz_type":"A","user_id":"u"}"#),
            (422, Some("biz_id".into()))
        );
        assert_eq!(
            field(r#"{"biz_type":"A","biz_id":"b","user_id":"u","colour":1}"#),
            (422, Some("colour".into()))
        );
        assert_eq!(
            field(r#"{"biz_type":"A","biz_id":"b","user_id":"u","recipients":{"sms":1}}"#),
            (422, Some("recipients.sms".into()))
        );
        assert_eq!(field("[1]"), (422, Some("body".into())));
    }

    #[test]
    fn media_types() {
        let ok = |v: &str| check_json_media_type(Some(&header::HeaderValue::from_str(v).unwrap()));
        assert!(ok("application/json").is_ok());
        assert!(ok("Application/JSON; charset=utf-8").is_ok());
        assert!(ok("application/problem+json").is_ok());
        assert!(ok("text/plain").is_err());
        assert!(check_json_media_type(None).is_err());
    }
}
