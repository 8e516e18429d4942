//! Reload triggers: the policy and plugin directories are watched (debounced
//! file events, `notify`), and SIGHUP and the admin API can ask too. Every
//! trigger lands in one channel consumed by `reload_loop`, so reloads never
//! overlap and a burst of edits costs one reload.

use super::Live;
use crate::plugin::Event;
use notify_debouncer_mini::notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_mini::{DebounceEventResult, Debouncer, new_debouncer};
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Why a reload was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A file changed in a watched directory.
    FileChange,
    /// SIGHUP.
    Signal,
    /// `POST /admin/reload`.
    Admin,
}

/// Keeps the directory watch alive; dropping it stops watching.
pub struct DirWatch {
    /// The debouncer thread and its watcher.
    _debouncer: Debouncer<RecommendedWatcher>,
}

/// Watches `dirs` (not recursively) and sends `Trigger::FileChange` once per
/// burst of changes, `debounce` after the last one.
pub fn watch_dirs(
    dirs: &[&Path],
    debounce: Duration,
    triggers: mpsc::Sender<Trigger>,
) -> Result<DirWatch, notify_debouncer_mini::notify::Error> {
    let mut debouncer = new_debouncer(debounce, move |result: DebounceEventResult| match result {
        Ok(events) if !events.is_empty() => {
            // A full channel already holds a pending reload: nothing is lost.
            let _ = triggers.try_send(Trigger::FileChange);
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "watching the policy/plugin directories failed"),
    })?;
    for dir in dirs {
        debouncer
            .watcher()
            .watch(dir, RecursiveMode::NonRecursive)?;
    }
    Ok(DirWatch {
        _debouncer: debouncer,
    })
}

/// Reloads `live` once per trigger until the channel closes. Before each
/// reload, `corpus()` fetches recent real events for the key-stability check.
pub async fn reload_loop<F, Fut>(live: Arc<Live>, mut triggers: mpsc::Receiver<Trigger>, corpus: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Vec<Event>>,
{
    while let Some(trigger) = triggers.recv().await {
        // Coalesce triggers that queued up while the last reload ran.
        while triggers.try_recv().is_ok() {}
        let events = corpus().await;
        let live = live.clone();
        let result = tokio::task::spawn_blocking(move || {
            live.reload_with(|old, new| super::stability::check(old, new, &events))
        })
        .await;
        match result {
            Ok(Ok(generation)) => tracing::info!(?trigger, generation, "reloaded"),
            Ok(Err(refusal)) => {
                tracing::warn!(?trigger, errors = refusal.errors.len(), "reload refused")
            }
            Err(e) => tracing::error!(?trigger, error = %e, "reload task failed"),
        }
    }
}
