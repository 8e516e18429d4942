//! Turning a failed wasmtime call into a `CallError` that names the plugin
//! and the cause in plain words.

use wasmtime::Trap;

use super::error::CallError;
use super::state::HostState;

/// Explains `err` from a call (or instantiation) of plugin `id`, using what
/// the store saw: whether the memory cap was hit, what the guest wrote to stderr.
pub(crate) fn classify(id: &str, err: wasmtime::Error, state: &HostState, fuel: u64) -> CallError {
    let plugin = id.to_string();
    if let Some(busy) = err.downcast_ref::<wasmtime::PoolConcurrencyLimitError>() {
        return CallError::Busy {
            plugin,
            reason: busy.to_string(),
        };
    }
    if state.limiter.hit {
        return CallError::MemoryCap {
            plugin,
            mib: state.limiter_cap_mib(),
        };
    }
    if let Some(trap) = err.downcast_ref::<Trap>() {
        return match trap {
            Trap::OutOfFuel => CallError::OutOfFuel { plugin, fuel },
            Trap::UnreachableCodeReached => {
                let cause = match panic_message(&state.stderr.text()) {
                    Some(msg) => format!("wasm `unreachable` (the plugin panicked: {msg})"),
                    None => "wasm `unreachable` (the plugin panicked or aborted)".into(),
                };
                CallError::Trap { plugin, cause }
            }
            other => CallError::Trap {
                plugin,
                cause: other.to_string(),
            },
        };
    }
    let text = format!("{err:#}");
    if let Some(rest) = text.split("unknown import: `").nth(1)
        && let Some(import) = rest.split('`').next()
    {
        return CallError::Forbidden {
            plugin,
            import: import.to_string(),
        };
    }
    CallError::Trap {
        plugin,
        cause: text,
    }
}

/// The message of a Rust panic as std writes it to stderr:
/// `thread '<unnamed>' (1) panicked at src/lib.rs:3:5:\n<message>\nnote: ...`
/// becomes `<message> (at src/lib.rs:3:5)`. `None` when nothing was written.
fn panic_message(stderr: &str) -> Option<String> {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
        .collect();
    let first = lines.first()?;
    let text = match first
        .strip_prefix("thread '")
        .and_then(|rest| rest.split_once(" panicked at "))
    {
        Some((_, loc)) if lines.len() > 1 => format!(
            "{} (at {})",
            lines[1..].join(" "),
            loc.trim_end_matches(':')
        ),
        _ => lines.join(" "),
    };
    const MAX: usize = 500;
    Some(if text.len() > MAX {
        let mut end = MAX;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &text[..end])
    } else {
        text
    })
}

#[cfg(test)]
mod tests {
    use super::panic_message;

    #[test]
    fn panic_messages_are_shortened() {
        let s = "thread '<unnamed>' (1) panicked at src/lib.rs:37:24:\nboom for u-1\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(
            panic_message(s).as_deref(),
            Some("boom for u-1 (at src/lib.rs:37:24)")
        );
        assert_eq!(panic_message(""), None);
        assert_eq!(
            panic_message("plain words\n").as_deref(),
            Some("plain words")
        );
    }
}
