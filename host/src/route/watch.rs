//! Reload triggers: the policy and plugin directories are watched (debounced
//! file events, `notify`), and SIGHUP and the admin API can ask too. Every
//! trigger lands in one channel consumed by `reload_loop`, so reloads never
//! overlap and a burst of edits costs one reload.

use super::Live;
use super::live::Refusal;
use crate::plugin::Event;
use crate::send::BoxFuture;
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

/// Runs one checked reload: what every trigger (file change, SIGHUP, admin
/// API) ends up calling. Returns the generation in force or the refusal.
pub type Reloader = Arc<dyn Fn() -> BoxFuture<'static, Result<u64, Refusal>> + Send + Sync>;

/// Rebuilds `live` off the async threads and swaps it in only if the key
/// policies keep their keys over `corpus` (recent real events).
pub async fn reload_checked(live: Arc<Live>, corpus: Vec<Event>) -> Result<u64, Refusal> {
    tokio::task::spawn_blocking(move || {
        live.reload_with(|old, new| super::stability::check(old, new, &corpus))
    })
    .await
    .unwrap_or_else(|e| {
        Err(Refusal {
            at: std::time::SystemTime::now(),
            errors: vec![format!("the reload task failed: {e}")],
        })
    })
}

/// A reloader for `live` that fetches the corpus with `corpus()` first.
pub fn reloader<F, Fut>(live: Arc<Live>, corpus: F) -> Reloader
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<Event>> + Send + 'static,
{
    let corpus = Arc::new(corpus);
    Arc::new(move || {
        let (live, corpus) = (live.clone(), corpus.clone());
        Box::pin(async move { reload_checked(live, corpus().await).await })
    })
}

/// Reloads once per trigger until the channel closes; triggers that queued
/// up while a reload ran are coalesced into the next one.
pub async fn reload_loop(reload: Reloader, mut triggers: mpsc::Receiver<Trigger>) {
    while let Some(trigger) = triggers.recv().await {
        while triggers.try_recv().is_ok() {}
        match reload().await {
            Ok(generation) => tracing::info!(?trigger, generation, "reloaded"),
            Err(refusal) => {
                tracing::warn!(?trigger, errors = refusal.errors.len(), "reload refused")
            }
        }
    }
}
