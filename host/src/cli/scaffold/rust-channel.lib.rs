//! Channel plugin `{{name}}`: `POST {endpoint}/messages` with
//! `{"to","template","params"}`; a 2xx answer with `{"id"}` is sent, 429 and
//! 5xx retryable (honouring `Retry-After`), other statuses permanent, a
//! cut-off answer unknown.
//!
//! Capabilities: none. Before declaring one (a reference the provider
//! dedupes on, a status query, callbacks), cite the provider's documentation
//! that says so here: the no-duplicate guarantee rests on it.
use channel_sdk::{Channel, Message, Receipt, SendError, params_json, require};
use channel_sdk::{provider::post_json, serde_json::json};

/// The plugin.
struct Plugin;

impl Channel for Plugin {
    fn send(msg: Message) -> Result<Receipt, SendError> {
        let url = format!("{}/messages", require("endpoint")?);
        let body = json!({"to": msg.recipient, "template": msg.template, "params": params_json(&msg.params)});
        let resp = post_json(&url, &[], &body)?;
        if !(200..300).contains(&resp.status) {
            return Err(resp.refusal("{{name}}"));
        }
        resp.receipt("id", None)
    }
}

channel_sdk::export_channel!(Plugin);
