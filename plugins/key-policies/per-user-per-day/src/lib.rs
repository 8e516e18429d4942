//! Key policy `per-user-per-day`: at most one message per user and channel per
//! calendar day. The key body is `<user_id>:<YYYY-MM-DD>`, the date of the
//! event's `occurred-at-ms` in the fixed offset given by param `tz` (`+08:00`;
//! default `+00:00`). Pure integer date math: no clock is read.
use key_policy_sdk::{Event, Params, local_date, non_empty, param, parse_offset, part};

fn derive(event: &Event, _channel: &str, params: &Params) -> Result<String, String> {
    let tz = param(params, "tz").unwrap_or("+00:00");
    let offset = parse_offset(tz).ok_or_else(|| {
        format!("param `tz`: `{tz}` is not a fixed UTC offset like `+08:00` (at most ±18:00)")
    })?;
    let user = part(non_empty("user_id", &event.user_id)?);
    Ok(format!(
        "{user}:{}",
        local_date(event.occurred_at_ms, offset)
    ))
}

key_policy_sdk::export_key_policy!(derive);
