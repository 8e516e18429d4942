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
    use Class::{Permanent, Refresh, Retryable};
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
        Some("QUOTA_EXCEEDED" | "UNAVAILABLE" | "INTERNAL") => r(Retryable),
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
            (503, Some("UNAVAILABLE"), Retryable),
            (500, Some("INTERNAL"), Retryable),
            (401, None, Refresh),
            (403, None, Permanent),
            (502, None, Retryable),
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
