//! Reload triggers: the policy and plugin directories are watched (`notify`),
//! and SIGHUP and the admin API can ask too. Every trigger lands in one
//! channel consumed by `reload_loop`, so reloads never overlap; a file change
//! waits a short settle time and then drains the channel, so a burst of edits
//! costs one reload. Only events that change a directory's content count:
//! a reload *reads* every plugin and policy file, and counting those opens
//! would make each reload trigger the next.

use super::Live;
use super::live::Refusal;
use crate::event::Event;
use crate::send::BoxFuture;
use notify::event::ModifyKind;
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
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

/// How long a file change waits for the rest of its burst before reloading.
pub(crate) const SETTLE: Duration = Duration::from_millis(200);

/// Keeps the directory watch alive; dropping it stops watching.
pub struct DirWatch {
    /// The watcher (its thread stops when it is dropped).
    _watcher: RecommendedWatcher,
}

/// Whether an event changes what a directory holds (a file created,
/// written, renamed or removed) — not an open, a read or a metadata touch.
fn changes_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Create(_) | EventKind::Remove(_) => true,
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        EventKind::Modify(_) => true,
        _ => false,
    }
}

/// Watches `dirs` (not recursively) and sends `Trigger::FileChange` when
/// their content changes.
pub fn watch_dirs(
    dirs: &[&Path],
    triggers: mpsc::Sender<Trigger>,
) -> Result<DirWatch, notify::Error> {
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match event {
            Ok(e) if changes_content(&e.kind) => {
                // A full channel already holds a pending reload: nothing is lost.
                let _ = triggers.try_send(Trigger::FileChange);
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "watching the policy/plugin directories failed"),
        }
    })?;
    for dir in dirs {
        watcher.watch(dir, RecursiveMode::NonRecursive)?;
    }
    Ok(DirWatch { _watcher: watcher })
}

/// Runs one checked reload: what every trigger (file change, SIGHUP, admin
/// API) ends up calling. Returns the generation in force or the refusal.
pub type Reloader = Arc<dyn Fn() -> BoxFuture<'static, Result<u64, Refusal>> + Send + Sync>;

/// Rebuilds `live` off the async threads and swaps it in only if the key
/// policies keep their keys over `corpus` (recent real events).
pub(crate) async fn reload_checked(live: Arc<Live>, corpus: Vec<Event>) -> Result<u64, Refusal> {
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
        if trigger == Trigger::FileChange {
            tokio::time::sleep(SETTLE).await;
        }
        while triggers.try_recv().is_ok() {}
        match reload().await {
            Ok(generation) => tracing::info!(?trigger, generation, "reloaded"),
            Err(refusal) => {
                tracing::warn!(?trigger, errors = refusal.errors.len(), "reload refused")
            }
        }
    }
}
