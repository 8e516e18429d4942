//! Recipient preferences on the accept path (`docs/preferences.md`): each
//! instance reads a user's preferences from the ledger's database
//! (`ledger::preferences`) through [`PreferenceCache`], whose entries are
//! used for at most `[preferences] cache_ttl` after the read that filled
//! them began, and decides per channel with [`Verdict`].
//!
//! A change takes effect at once on the instance that wrote it (the write
//! refreshes its entry) and within `cache_ttl` on every other. When the
//! database cannot be read and no fresh entry is held, the answer is an
//! error (the API answers 503): an event is never sent to a user whose
//! opt-out could not be read.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::ledger::opted_out::OptedOutAnswer;
use crate::ledger::preferences::{ChangeRoute, Edit, PreferenceChange, Preferences};
use crate::ledger::{Ledger, LedgerError, recipient_digest};
use crate::permit::OptOutPolicy;

/// Most `opted_out` answers waiting to be recorded; past it an answer is
/// not recorded (the look-up does not show it; nothing else depends on it).
const ANSWERS_QUEUED: usize = 10_000;
/// Most answers recorded in one transaction.
const ANSWERS_BATCH: usize = 256;
/// How often recorded answers older than the ledger's history are removed.
const ANSWERS_PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// Most users an instance keeps entries of; past it, stale entries go,
/// then all (the next events read again).
const MAX_ENTRIES: usize = 100_000;

/// Why preferences could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PrefsError {
    /// The ledger's database did not answer, and no fresh entry was held.
    #[error("the preferences store (the ledger's database) cannot be read: {0}")]
    Unreadable(#[source] LedgerError),
}

/// Whom an opt-out reported by a channel's callback names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptOutSubject {
    /// A user id, as events name it.
    User(String),
    /// An address on the channel (a phone number), in each form it may have
    /// been sent to: the users the host sent to at any of them.
    Address(Vec<String>),
}

/// An opt-out reported by a channel's callback (a user answered "TD").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptOutRequest {
    /// Whom it names.
    pub subject: OptOutSubject,
    /// The category to switch off; `None`: the channel.
    pub category: Option<String>,
    /// The history's route (`sms_reply`, ...).
    pub route: ChangeRoute,
    /// The provider's words, for the history's `by`.
    pub detail: Option<String>,
}

/// What became of one opt-out (the label of `pushonce_callback_opt_outs_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptOutResult {
    /// At least one user's preferences changed.
    Applied,
    /// Every user it names had it off already.
    Unchanged,
    /// No user was sent to at that address (within the ledger's history).
    Unmatched,
    /// A user id or category that cannot be stored.
    Refused,
}

impl OptOutResult {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            OptOutResult::Applied => "applied",
            OptOutResult::Unchanged => "unchanged",
            OptOutResult::Unmatched => "unmatched",
            OptOutResult::Refused => "refused",
        }
    }
}

/// One user's preferences as last read, and when that read began.
struct Entry {
    read_at: Instant,
    preferences: Arc<Preferences>,
}

/// Per-instance cache of users' preferences over the ledger's database.
pub struct PreferenceCache {
    /// The store (`None`: the ledger is off, no preference applies).
    ledger: Option<Ledger>,
    /// How long an entry is used.
    ttl: Duration,
    /// Categories no preference blocks.
    mandatory: BTreeSet<String>,
    entries: Mutex<HashMap<String, Entry>>,
    /// The queue of the background writer of `opted_out` answers (`None`:
    /// not recorded).
    answers: Option<mpsc::Sender<OptedOutAnswer>>,
}

impl std::fmt::Debug for PreferenceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreferenceCache")
            .field("ttl", &self.ttl)
            .field("mandatory", &self.mandatory)
            .finish_non_exhaustive()
    }
}

impl PreferenceCache {
    /// A cache over `ledger` (`None`: preferences are off with the ledger)
    /// using entries for `ttl`, with the `mandatory` categories.
    pub fn new(ledger: Option<Ledger>, ttl: Duration, mandatory: &[String]) -> PreferenceCache {
        PreferenceCache {
            ledger,
            ttl,
            mandatory: mandatory.iter().cloned().collect(),
            entries: Mutex::new(HashMap::new()),
            answers: None,
        }
    }

    /// Records `opted_out` answers in the ledger (for the event look-up)
    /// through a background writer, keeping each for `keep` (the ledger's
    /// history). The writer stops when the cache is dropped. Nothing is
    /// recorded with the ledger off.
    pub fn recording_answers(mut self, keep: Duration) -> PreferenceCache {
        if let Some(ledger) = &self.ledger {
            let (tx, rx) = mpsc::channel(ANSWERS_QUEUED);
            tokio::spawn(write_answers(ledger.clone(), rx, keep));
            self.answers = Some(tx);
        }
        self
    }

    /// Queues `answer` for the look-up's record (dropped, with a debug
    /// line, when the writer is behind by [`ANSWERS_QUEUED`]).
    pub fn record(&self, answer: OptedOutAnswer) {
        if let Some(tx) = &self.answers
            && tx.try_send(answer).is_err()
        {
            tracing::debug!("opted_out answer not recorded: the writer is behind");
        }
    }

    /// Stores `opt_out`, reported by `reported_by` (the channel instance
    /// whose callback carried it), on `channel`'s preferences: the user it
    /// names, or every user the host sent to on `channel` at its address,
    /// gets `channel` (or its category) switched off, in their history with
    /// its route. Storing it again changes nothing. This instance holds the
    /// change (a user named) or drops its entries of those users (an
    /// address), so its next accept sees it.
    /// `Err` when the ledger did not answer (the provider should push again);
    /// with the ledger off there is nowhere to store it (`Refused`).
    pub async fn store_opt_out(
        &self,
        channel: &str,
        reported_by: &str,
        opt_out: &OptOutRequest,
    ) -> Result<OptOutResult, PrefsError> {
        let Some(ledger) = &self.ledger else {
            return Ok(OptOutResult::Refused);
        };
        if let Some(c) = &opt_out.category
            && crate::config::check_category(c).is_err()
        {
            return Ok(OptOutResult::Refused);
        }
        let off = match &opt_out.category {
            Some(c) => Preferences::off(&[], &[c]),
            None => Preferences::off(&[channel], &[]),
        };
        let by = match &opt_out.detail {
            Some(d) => format!("channel {reported_by}: {d}"),
            None => format!("channel {reported_by}"),
        };
        let changed = match &opt_out.subject {
            OptOutSubject::User(u) if u.is_empty() || u.chars().count() > crate::event::MAX_ID => {
                return Ok(OptOutResult::Refused);
            }
            OptOutSubject::User(u) => self
                .switch_off(u, off, &by, opt_out.route)
                .await
                .map_err(PrefsError::Unreadable)?
                .is_some_and(|c| c.changed),
            OptOutSubject::Address(forms) => {
                let digests: Vec<String> = forms.iter().map(|f| recipient_digest(f)).collect();
                let users = ledger
                    .users_at_addresses(channel, &digests)
                    .await
                    .map_err(PrefsError::Unreadable)?;
                if users.is_empty() {
                    return Ok(OptOutResult::Unmatched);
                }
                let changed = self
                    .switch_off_digests(ledger, &users, off, &by, opt_out.route)
                    .await
                    .map_err(PrefsError::Unreadable)?;
                changed > 0
            }
        };
        Ok(if changed {
            OptOutResult::Applied
        } else {
            OptOutResult::Unchanged
        })
    }

    /// Switches `off` for `user_id` in the ledger (by `by`, through `route`)
    /// and holds the result, so this instance's next accept sees it at once
    /// (the others within the entries' ttl). Switching off what is off
    /// changes nothing. `None` with the ledger off.
    pub async fn switch_off(
        &self,
        user_id: &str,
        off: Preferences,
        by: &str,
        route: ChangeRoute,
    ) -> Result<Option<PreferenceChange>, LedgerError> {
        let Some(ledger) = &self.ledger else {
            return Ok(None);
        };
        let change = ledger
            .change_preferences(user_id, &Edit::SwitchOff(off), by, route)
            .await?;
        self.remember(user_id, change.after.clone());
        Ok(Some(change))
    }

    /// [`PreferenceCache::switch_off`] for the users whose id digests are
    /// `digests` (an opt-out by address knows only those): their entries
    /// here are dropped, so their next event reads the ledger. How many
    /// changed.
    async fn switch_off_digests(
        &self,
        ledger: &Ledger,
        digests: &[String],
        off: Preferences,
        by: &str,
        route: ChangeRoute,
    ) -> Result<usize, LedgerError> {
        let edit = Edit::SwitchOff(off);
        let mut changed = 0;
        for digest in digests {
            let change = ledger
                .change_preferences_of(digest, &edit, by, route)
                .await?;
            changed += usize::from(change.changed);
        }
        self.forget_digests(digests);
        Ok(changed)
    }

    /// Drops this instance's entries of the users whose id digests are
    /// `digests` (their next event reads the ledger).
    fn forget_digests(&self, digests: &[String]) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|user, _| !digests.contains(&recipient_digest(user)));
    }

    /// The store, when the ledger is on.
    pub fn ledger(&self) -> Option<&Ledger> {
        self.ledger.as_ref()
    }

    /// The categories no preference blocks.
    pub fn mandatory(&self) -> &BTreeSet<String> {
        &self.mandatory
    }

    /// The bound of an entry's age.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The preferences of each of `users`: fresh entries as held, the rest
    /// read in one query (and held). Every user is in the answer (defaults
    /// for one without a row).
    pub async fn of_users(
        &self,
        users: &[&str],
    ) -> Result<HashMap<String, Arc<Preferences>>, PrefsError> {
        let mut found = HashMap::with_capacity(users.len());
        let Some(ledger) = &self.ledger else {
            for user in users {
                found.insert(user.to_string(), Arc::new(Preferences::default()));
            }
            return Ok(found);
        };
        let mut missing: Vec<&str> = Vec::new();
        {
            let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            for user in users {
                match entries.get(*user) {
                    Some(e) if e.read_at.elapsed() < self.ttl => {
                        found.insert(user.to_string(), e.preferences.clone());
                    }
                    _ if !missing.contains(user) => missing.push(user),
                    _ => {}
                }
            }
        }
        if missing.is_empty() {
            return Ok(found);
        }
        let read_at = Instant::now();
        let mut read = ledger
            .preferences_of(&missing)
            .await
            .map_err(PrefsError::Unreadable)?;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() + missing.len() > MAX_ENTRIES {
            entries.retain(|_, e| e.read_at.elapsed() < self.ttl);
            if entries.len() + missing.len() > MAX_ENTRIES {
                entries.clear();
            }
        }
        for user in missing {
            let preferences = Arc::new(read.remove(user).unwrap_or_default());
            let newer = entries.get(user).is_some_and(|e| e.read_at > read_at);
            if !newer {
                entries.insert(
                    user.to_string(),
                    Entry {
                        read_at,
                        preferences: preferences.clone(),
                    },
                );
            }
            found.insert(user.to_string(), preferences);
        }
        Ok(found)
    }

    /// Holds `preferences` for `user` as of now: after this instance
    /// changed them, so its next event sees the change at once.
    pub fn remember(&self, user: &str, preferences: Preferences) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(
            user.to_string(),
            Entry {
                read_at: Instant::now(),
                preferences: Arc::new(preferences),
            },
        );
    }

    /// The verdict for one user's preferences.
    pub fn verdict<'a>(&'a self, preferences: &'a Preferences) -> Verdict<'a> {
        Verdict {
            preferences,
            mandatory: &self.mandatory,
        }
    }
}

impl PreferenceCache {
    /// What `user` switched off that stops a message of `category` on
    /// `channel` (`sms`, `category marketing`), unless the category is
    /// mandatory; `None` when nothing does. Read as an event's accept reads
    /// it: within `cache_ttl` of a change.
    pub async fn stops(
        &self,
        user: &str,
        channel: &str,
        category: Option<&str>,
    ) -> Result<Option<String>, PrefsError> {
        let read = self.of_users(&[user]).await?;
        let Some(preferences) = read.get(user) else {
            return Ok(None);
        };
        if !self.verdict(preferences).blocks(channel, category) {
            return Ok(None);
        }
        Ok(Some(match category {
            Some(c) if !preferences.channels_off.contains(channel) => format!("category {c}"),
            _ => channel.to_string(),
        }))
    }
}

/// The recipients' preferences as the lifecycle reads them again after an
/// accept (a fallback's accept, an attempt of a message accepted earlier):
/// the [`PreferenceCache`], and what the policy in force for a business
/// type says of opt-outs (its category, `fallback_when_opted_out`). When the ledger's database cannot be
/// read the answer is an error: the fallback or the attempt waits.
pub struct RecipientOptOuts {
    preferences: Arc<PreferenceCache>,
    policies: PolicyLookup,
}

/// What the policy in force for a business type says of opt-outs.
type PolicyLookup = Box<dyn Fn(&str) -> Option<OptOutPolicy> + Send + Sync>;

impl RecipientOptOuts {
    /// Reads `preferences`; `policies` answers what the policy in force for
    /// a business type says of opt-outs.
    pub fn new(
        preferences: Arc<PreferenceCache>,
        policies: impl Fn(&str) -> Option<OptOutPolicy> + Send + Sync + 'static,
    ) -> RecipientOptOuts {
        RecipientOptOuts {
            preferences,
            policies: Box::new(policies),
        }
    }
}

impl crate::permit::OptOuts for RecipientOptOuts {
    fn switched_off<'a>(
        &'a self,
        user: &'a str,
        channel: &'a str,
        category: Option<&'a str>,
    ) -> futures_util::future::BoxFuture<'a, Result<Option<String>, crate::permit::OptOutsError>>
    {
        Box::pin(async move { Ok(self.preferences.stops(user, channel, category).await?) })
    }

    fn policy_of(&self, biz_type: &str) -> Option<OptOutPolicy> {
        (self.policies)(biz_type)
    }

    fn bound(&self) -> Duration {
        self.preferences.ttl()
    }
}

/// The background writer of `opted_out` answers: batches of what is
/// queued, each tried three times; hourly, the removal of answers older
/// than `keep`.
async fn write_answers(ledger: Ledger, mut rx: mpsc::Receiver<OptedOutAnswer>, keep: Duration) {
    let mut prune = tokio::time::interval(ANSWERS_PRUNE_EVERY);
    loop {
        tokio::select! {
            got = rx.recv() => {
                let Some(first) = got else { return };
                let mut batch = vec![first];
                while batch.len() < ANSWERS_BATCH {
                    match rx.try_recv() {
                        Ok(a) => batch.push(a),
                        Err(_) => break,
                    }
                }
                for attempt in 0..3u32 {
                    match ledger.record_opted_out(&batch).await {
                        Ok(()) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, answers = batch.len(), attempt, "could not record opted_out answers");
                            tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                        }
                    }
                }
            }
            _ = prune.tick() => {
                let keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
                let before = crate::ledger::now_ms().saturating_sub(keep_ms);
                if let Err(e) = ledger.remove_opted_out_before(before).await {
                    tracing::warn!(error = %e, "could not remove old opted_out answers");
                }
            }
        }
    }
}

/// One user's preferences with the mandatory categories: which channel of
/// which category may be sent.
#[derive(Debug, Clone, Copy)]
pub struct Verdict<'a> {
    preferences: &'a Preferences,
    mandatory: &'a BTreeSet<String>,
}

impl Verdict<'_> {
    /// Whether the user switched off `channel` or the policy's `category`,
    /// and the category is not mandatory (a mandatory one is sent on every
    /// channel whatever the user switched off).
    pub fn blocks(&self, channel: &str, category: Option<&str>) -> bool {
        if category.is_some_and(|c| self.mandatory.contains(c)) {
            return false;
        }
        self.preferences.channels_off.contains(channel)
            || category.is_some_and(|c| self.preferences.categories_off.contains(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mandatory_category_is_never_blocked() {
        let cache = PreferenceCache::new(None, Duration::from_secs(2), &["security".into()]);
        let p = Preferences::off(&["sms"], &["marketing", "security"]);
        let v = cache.verdict(&p);
        assert!(v.blocks("sms", None));
        assert!(v.blocks("sms", Some("transactional")));
        assert!(!v.blocks("wechat", Some("transactional")));
        assert!(v.blocks("wechat", Some("marketing")));
        assert!(!v.blocks("sms", Some("security")));
        assert!(!v.blocks("wechat", Some("security")));
    }

    #[tokio::test]
    async fn entries_are_used_for_the_ttl_then_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&Ledger::sqlite_url(dir.path())).await.unwrap();
        let cache = PreferenceCache::new(Some(ledger.clone()), Duration::from_millis(200), &[]);
        let read = cache.of_users(&["u-1"]).await.unwrap();
        assert!(read["u-1"].is_default());
        let edit = crate::ledger::preferences::Edit::Replace(Preferences::off(&["sms"], &[]));
        ledger
            .change_preferences(
                "u-1",
                &edit,
                "admin token",
                crate::ledger::preferences::ChangeRoute::Api,
            )
            .await
            .unwrap();
        // Within the bound the entry may still be used; after it, never.
        let started = Instant::now();
        loop {
            let read = cache.of_users(&["u-1", "u-1"]).await.unwrap();
            if read["u-1"].channels_off.contains("sms") {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_millis(200),
                "stale past the ttl"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cache.remember("u-1", Preferences::default());
        assert!(cache.of_users(&["u-1"]).await.unwrap()["u-1"].is_default());
    }
}
