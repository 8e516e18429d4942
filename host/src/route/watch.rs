//! Reload triggers: the policy and plugin directories are watched (`notify`),
//! and SIGHUP and the admin API can ask too. Every trigger lands in one
//! channel consumed by `reload_loop`, so reloads never overlap; a file change
//! waits a short settle time and then drains the channel, so a burst of edits
//! costs one reload. Only events that change a directory's content count:
//! a reload *reads* every plugin and policy file, and counting those opens
//! would make each reload trigger the next.

use super::Live;
use super::live::{Refusal, Reloaded};
use crate::event::Event;
use crate::plugin::PluginRegistry;
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
/// API) ends up calling. Returns the generation in force and what its
/// checks could not verify, or the refusal.
pub type Reloader = Arc<dyn Fn() -> BoxFuture<'static, Result<Reloaded, Refusal>> + Send + Sync>;

/// A check that a reload runs besides key stability, given the new
/// snapshot's plugins, e.g. the host's: every channel whose plugin takes
/// callbacks can be reached, and which `pushonce.toml` edits wait for a
/// restart. Refusal lines, or notes of what the reload does not apply.
pub type HostCheck = Arc<
    dyn Fn(Arc<PluginRegistry>) -> BoxFuture<'static, Result<Vec<String>, Vec<String>>>
        + Send
        + Sync,
>;

/// The recent events a reload checks key stability on, or why they could
/// not be read.
pub type Corpus = Result<Vec<Event>, String>;

/// Rebuilds `live` off the async threads and swaps it in only if the key
/// policies keep their keys over `corpus` (recent real events) and `host`
/// refuses nothing.
pub(crate) async fn reload_checked(
    live: Arc<Live>,
    corpus: Corpus,
    host: Option<HostCheck>,
) -> Result<Reloaded, Refusal> {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        live.reload_with(|old, new| {
            let (events, unread) = match &corpus {
                Ok(events) => (&events[..], None),
                Err(why) => (&[][..], Some(why)),
            };
            let stable = super::stability::check(old, new, events);
            let host = match &host {
                Some(check) => runtime.block_on(check(new.registry.clone())),
                None => Ok(Vec::new()),
            };
            match (stable, host) {
                (Err(mut errors), Err(more)) => {
                    errors.extend(more);
                    Err(errors)
                }
                (Err(errors), Ok(_)) | (Ok(_), Err(errors)) => Err(errors),
                (Ok(mut notes), Ok(more)) => {
                    if let Some(why) = unread.filter(|_| !notes.is_empty()) {
                        notes.insert(0, format!("the event corpus could not be read: {why}"));
                    }
                    notes.extend(more);
                    Ok(notes)
                }
            }
        })
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
    Fut: Future<Output = Corpus> + Send + 'static,
{
    reloader_checking(live, corpus, None)
}

/// [`reloader`] that also runs `host` on each new snapshot's plugins.
pub fn reloader_checking<F, Fut>(live: Arc<Live>, corpus: F, host: Option<HostCheck>) -> Reloader
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Corpus> + Send + 'static,
{
    let corpus = Arc::new(corpus);
    Arc::new(move || {
        let (live, corpus, host) = (live.clone(), corpus.clone(), host.clone());
        Box::pin(async move { reload_checked(live, corpus().await, host).await })
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
            Ok(r) => tracing::info!(
                ?trigger,
                generation = r.generation,
                notes = r.notes.len(),
                "reloaded"
            ),
            Err(refusal) => {
                tracing::warn!(?trigger, errors = refusal.errors.len(), "reload refused")
            }
        }
    }
}
