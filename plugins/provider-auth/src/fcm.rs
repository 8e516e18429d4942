//! FCM HTTP v1 error table: "FCM error codes" / `ErrorCode` enum
//! (<https://firebase.google.com/docs/reference/fcm/rest/v1/ErrorCode>) and
//! "Best practices / Handle errors" for `Retry-After`; the code comes from the
//! `error.details[]` entry of type `type.googleapis.com/google.firebase.fcm.v1.FcmError`
//! (as firebase/firebase-admin-go `messaging/messaging_utils.go` reads it).

use serde_json::Value;

use crate::{Class, Refusal};

/// The OAuth2 scope of the FCM send API.
pub const SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";

/// The `@type` of FCM's own error detail.
const FCM_ERROR: &str = "type.googleapis.com/google.firebase.fcm.v1.FcmError";

/// The FCM `message` for device `token`: params `title` / `body` make the
/// notification; every param and `template` go in `data` (FCM data values
/// are strings).
pub fn message(token: &str, template: &str, params: &[(String, String)]) -> Value {
    let mut data: serde_json::Map<String, Value> = params
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    data.insert("template".into(), Value::String(template.to_string()));
    let notification: serde_json::Map<String, Value> = params
        .iter()
        .filter(|(k, _)| k == "title" || k == "body")
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let mut message = serde_json::json!({ "token": token, "data": data });
    if !notification.is_empty() {
        message["notification"] = Value::Object(notification);
    }
    message
}

/// The `errorCode` of an FCM error body, if it carries one.
pub fn error_code(body: &Value) -> Option<&str> {
    body.pointer("/error/details")?
        .as_array()?
        .iter()
        .find(|d| d.get("@type").and_then(Value::as_str) == Some(FCM_ERROR))?
        .get("errorCode")?
        .as_str()
}

/// Sorts a non-2xx answer by its FCM `errorCode`, else by the status.
pub fn classify(status: u16, body: &Value) -> Refusal {
    use Class::{Permanent, Refresh, Retryable, Unknown};
    let code = error_code(body);
    let r = |class| {
        Refusal::new(
            class,
            code.map_or_else(|| status.to_string(), str::to_string),
        )
    };
    match code {
        Some("UNREGISTERED" | "INVALID_ARGUMENT" | "SENDER_ID_MISMATCH") => r(Permanent),
        Some("THIRD_PARTY_AUTH_ERROR") => r(Permanent)
            .because("the APNs certificate or web push key in the Firebase project was refused"),
        Some("QUOTA_EXCEEDED") => r(Retryable),
        // "The server is overloaded" / "An unknown internal error occurred":
        // neither says the message was not taken.
        Some("UNAVAILABLE" | "INTERNAL") => r(Unknown),
        _ if status == 401 => r(Refresh),
        _ if status == 403 => {
            r(Permanent).because("the service account may not send for this project")
        }
        _ => r(crate::class_of_status(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(code: &str, status: u16) -> Value {
        json!({"error": {"code": status, "message": "m", "status": "S", "details": [
            {"@type": "type.googleapis.com/google.rpc.BadRequest"},
            {"@type": FCM_ERROR, "errorCode": code}]}})
    }

    #[test]
    fn message_shape() {
        let p = |k: &str, v: &str| (k.to_string(), v.to_string());
        let m = message("dev", "order.paid", &[p("title", "Paid"), p("n", "3")]);
        assert_eq!(
            m,
            json!({"token": "dev", "notification": {"title": "Paid"},
                   "data": {"title": "Paid", "n": "3", "template": "order.paid"}})
        );
        assert!(message("dev", "t", &[]).get("notification").is_none());
    }

    /// The error table: (status, errorCode) → class.
    #[test]
    fn error_table() {
        use Class::*;
        let table = [
            (404, Some("UNREGISTERED"), Permanent),
            (400, Some("INVALID_ARGUMENT"), Permanent),
            (403, Some("SENDER_ID_MISMATCH"), Permanent),
            (401, Some("THIRD_PARTY_AUTH_ERROR"), Permanent),
            (429, Some("QUOTA_EXCEEDED"), Retryable),
            (503, Some("UNAVAILABLE"), Unknown),
            (500, Some("INTERNAL"), Unknown),
            (401, None, Refresh),
            (403, None, Permanent),
            (502, None, Unknown),
            (429, None, Retryable),
            (400, None, Permanent),
        ];
        for (status, code, class) in table {
            let b = code.map_or(Value::Null, |c| body(c, status));
            assert_eq!(classify(status, &b).class, class, "{status} {code:?}");
        }
        assert_eq!(
            classify(404, &body("UNREGISTERED", 404)).code,
            "UNREGISTERED"
        );
    }
}
