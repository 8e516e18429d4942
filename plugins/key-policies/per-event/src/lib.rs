//! Key policy `per-event`: one message per event and channel. The key body is
//! `<biz_type>:<biz_id>:<user_id>`, each part encoded by `key_util::part`;
//! the host adds `push:per-event@1:<channel>:` in front.
use key_policy_sdk::{Event, Params, non_empty, part};

fn derive(event: &Event, _channel: &str, _params: &Params) -> Result<String, String> {
    let biz_type = part(non_empty("biz_type", &event.biz_type)?);
    let biz_id = part(non_empty("biz_id", &event.biz_id)?);
    let user = part(non_empty("user_id", &event.user_id)?);
    Ok(format!("{biz_type}:{biz_id}:{user}"))
}

key_policy_sdk::export_key_policy!(derive);
