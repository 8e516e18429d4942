//! Key policy `per-user-per-job`: at most one message per user and channel per
//! job. The key body is `<user_id>:job=<job id>`; the job id is the event
//! attribute named by param `job_attr` (default `job_id`), and a missing
//! attribute is an error naming it.

wit_bindgen::generate!({ world: "key-policy-plugin", path: "../../../wit" });

use exports::pushonce::plugin::key_policy::{Guest as KeyPolicy, KeyDecision};
use pushonce::plugin::types::Event;

/// The plugin; its methods are the world's exports.
struct PerUserPerJob;

impl KeyPolicy for PerUserPerJob {
    fn derive_key(
        event: Event,
        _channel: String,
        params: Vec<(String, String)>,
    ) -> Result<KeyDecision, String> {
        let attr = key_util::param(&params, "job_attr").unwrap_or("job_id");
        let job = key_util::attribute(&event.attributes, attr).ok_or_else(|| {
            format!("event attribute `{attr}` (the job id, param `job_attr`) is missing")
        })?;
        if job.is_empty() {
            return Err(format!("event attribute `{attr}` (the job id) is empty"));
        }
        if event.user_id.is_empty() {
            return Err("event field `user_id` is empty".into());
        }
        let key = format!(
            "{}:job={}",
            key_util::part(&event.user_id),
            key_util::part(job)
        );
        Ok(KeyDecision {
            key,
            window_secs: None,
        })
    }
}

impl Guest for PerUserPerJob {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "per-user-per-job".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: env!("CARGO_PKG_DESCRIPTION").into(),
        }
    }
}

export!(PerUserPerJob);
