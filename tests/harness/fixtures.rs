//! Fixtures the tests share: one accept request and one permit
//! configuration. A test that needs other values says only those, with
//! struct update syntax (`AcceptRequest { window, ..accept_request(key) }`).

use std::time::Duration;

use pushonce::permit::{AcceptRequest, PermitConfig, RetryPolicy};

/// Permits kept an hour past their window, a minute of grace: long enough
/// that nothing a test accepted expires while it runs.
pub fn permit_config() -> PermitConfig {
    PermitConfig {
        retention: Duration::from_secs(3600),
        grace: Duration::from_secs(60),
        ..PermitConfig::default()
    }
}

/// [`permit_config`] with one shard: every key of a test meets in one
/// hash tag (one record, one stream).
pub fn one_shard_config() -> PermitConfig {
    PermitConfig {
        shards: 1,
        ..permit_config()
    }
}

/// An accept of `key` on `sms` for a 10-minute window: event `ORDER_SHIPPED`
/// / `key`, policy `per-event@1.0.0`, the default retry policy.
pub fn accept_request(key: &str) -> AcceptRequest {
    AcceptRequest {
        key: key.to_string(),
        channel: "sms".into(),
        window: Duration::from_secs(600),
        biz_type: "ORDER_SHIPPED".into(),
        biz_id: key.to_string(),
        event_json: "{}".into(),
        payload: r#"{"template":"t"}"#.into(),
        policy_name: "per-event".into(),
        policy_version: "1.0.0".into(),
        retry: RetryPolicy::default(),
        gate: Default::default(),
        recipient: None,
        send_at_ms: None,
    }
}
