//! Key policy `per-user-per-job`: at most one message per user and channel per
//! job. The key body is `<user_id>:job=<job id>`; the job id is the event
//! attribute named by param `job_attr` (default `job_id`), and a missing
//! attribute is an error naming it.
use key_policy_sdk::{Event, Params, attribute, non_empty, param, part};

fn derive(event: &Event, _channel: &str, params: &Params) -> Result<String, String> {
    let attr = param(params, "job_attr").unwrap_or("job_id");
    let job = attribute(&event.attributes, attr).ok_or_else(|| {
        format!("event attribute `{attr}` (the job id, param `job_attr`) is missing")
    })?;
    if job.is_empty() {
        return Err(format!("event attribute `{attr}` (the job id) is empty"));
    }
    let user = part(non_empty("user_id", &event.user_id)?);
    Ok(format!("{user}:job={}", part(job)))
}

key_policy_sdk::export_key_policy!(derive);
