//! This plugin's bindings of world `pushonce:channel/channel-plugin-extras`
//! (contract 2.2: the `extras` export besides `channel` and `callbacks`),
//! which `channel_sdk::export_channel!` does not export. Every import is the
//! SDK's own (`with`), so `channel_sdk::http`, `channel_sdk::cache`, the
//! settings and the SDK's types (`Message`, `Receipt`, `SendError`...) are
//! the ones these exports take and give.

wit_bindgen::generate!({
    world: "pushonce:channel/channel-plugin-extras",
    path: "../../../wit",
    with: {
        "pushonce:channel/types@2.2.0": channel_sdk::bindings::pushonce::channel::types,
        "pushonce:channel/config@2.2.0": channel_sdk::bindings::pushonce::channel::config,
        "pushonce:channel/shared-cache@2.2.0": channel_sdk::bindings::pushonce::channel::shared_cache,
        "wasi:http/outgoing-handler@0.2.12": channel_sdk::bindings::wasi::http::outgoing_handler,
        "wasi:http/types@0.2.12": channel_sdk::bindings::wasi::http::types,
        "wasi:io/error@0.2.12": channel_sdk::bindings::wasi::io::error,
        "wasi:io/poll@0.2.12": channel_sdk::bindings::wasi::io::poll,
        "wasi:io/streams@0.2.12": channel_sdk::bindings::wasi::io::streams,
        "wasi:clocks/monotonic-clock@0.2.12": channel_sdk::bindings::wasi::clocks::monotonic_clock,
    },
    generate_all,
});
