//! The one checked reload that watched directories, SIGHUP and the admin
//! API share: key stability over the corpus of recent events, the start's
//! rule on callbacks over the new channel plugins, and a note of the
//! `pushonce.toml` edits only a restart applies.

use std::sync::Arc;

use super::receipts::unreachable_callbacks;
use crate::config::HostConfig;
use crate::corpus::{CORPUS_CHECK_LEN, recent_events};
use crate::permit::Permits;
use crate::route::Live;
use crate::route::watch::{HostCheck, Reloader, reloader_checking};
use crate::send::plugin::PluginSender;

/// The host's checked reload: the corpus is read from Redis (a failure is
/// noted in the reload's outcome, not a refusal); every channel whose new
/// plugin takes callbacks must have a route for them; edits of the
/// configuration file since start are noted as waiting for a restart.
pub(super) fn checked_reloader(
    config: Arc<HostConfig>,
    live: &Arc<Live>,
    permits: &Permits,
    plugins: &Arc<PluginSender>,
) -> Reloader {
    let conn = permits.connection();
    let namespace = permits.layout().namespace().to_string();
    let sender = plugins.clone();
    let host: HostCheck = Arc::new(move |registry| {
        let (config, sender) = (config.clone(), sender.clone());
        Box::pin(async move {
            let unreachable = unreachable_callbacks(&config, &sender, &registry).await;
            if !unreachable.is_empty() {
                return Err(unreachable);
            }
            Ok(restart_needed(&config).into_iter().collect())
        })
    });
    reloader_checking(
        live.clone(),
        move || {
            let (mut conn, namespace) = (conn.clone(), namespace.clone());
            async move {
                recent_events(&mut conn, &namespace, CORPUS_CHECK_LEN)
                    .await
                    .map_err(|e| {
                        tracing::warn!(error = %e, "could not read the event corpus; checking keys on none");
                        e.to_string()
                    })
            }
        },
        Some(host),
    )
}

/// What a reload says of the configuration file: which of its settings
/// were edited since start (a reload applies plugins and policies only).
fn restart_needed(config: &HostConfig) -> Option<String> {
    let file = config.source.as_ref()?.0.display();
    match config.edited_since_start() {
        Ok(keys) if keys.is_empty() => None,
        Ok(keys) => Some(format!(
            "{file} was edited since start; restart needed: {} (a reload applies plugins and policies only)",
            keys.join(", ")
        )),
        Err(why) => Some(format!(
            "{file} cannot be read as it is now ({why}); a restart would fail"
        )),
    }
}
