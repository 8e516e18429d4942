//! Key policy `{{name}}`: one message per user, event type and channel. The
//! key body is `<biz_type>:<user_id>`; the host adds `push:{{name}}@<major>:<channel>:`.
use key_policy_sdk::{Event, Params, non_empty, part};

fn derive(event: &Event, _channel: &str, _params: &Params) -> Result<String, String> {
    let biz_type = part(non_empty("biz_type", &event.biz_type)?);
    let user = part(non_empty("user_id", &event.user_id)?);
    Ok(format!("{biz_type}:{user}"))
}

key_policy_sdk::export_key_policy!(derive);
