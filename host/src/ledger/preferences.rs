//! Recipient preferences in the ledger's database (`docs/preferences.md`):
//! what each user switched off (`preferences`, one row per user, by the
//! digest of the user id) and every change to it (`preference_changes`,
//! append-only: when, by which route, by whom, what). Stored beside the
//! deliveries, never in Redis, so a Redis loss cannot turn an opt-out back
//! on. Every route that changes preferences — the API now, a reply to an
//! SMS, a bounce or an unsubscribe link later — writes through
//! [`Ledger::change_preferences`] with its own [`ChangeRoute`].

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

use super::claim::recipient_digest;
use super::pool::on_pool;
use super::{Ledger, LedgerError, now_ms};

/// What one user switched off.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Preferences {
    /// Channels (channel instance names) on which the user gets nothing.
    pub channels_off: BTreeSet<String>,
    /// Categories (a policy's `category`) the user gets nothing of.
    pub categories_off: BTreeSet<String>,
}

impl Preferences {
    /// Whether nothing is switched off (the defaults).
    pub fn is_default(&self) -> bool {
        self.channels_off.is_empty() && self.categories_off.is_empty()
    }

    /// These channels and categories switched off (for tests).
    /// `channels` and `categories` switched off, nothing else.
    pub fn off(channels: &[&str], categories: &[&str]) -> Preferences {
        Preferences {
            channels_off: channels.iter().map(|s| s.to_string()).collect(),
            categories_off: categories.iter().map(|s| s.to_string()).collect(),
        }
    }
}

/// The route a change came by (the history's `route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeRoute {
    /// `PUT` / `DELETE /v1/users/{user_id}/preferences`.
    Api,
    /// The user replied to an SMS with an opt-out word.
    SmsReply,
    /// An email bounced or was reported as spam.
    EmailBounce,
    /// The user followed a one-click unsubscribe link.
    UnsubscribeLink,
}

impl ChangeRoute {
    /// The label stored in the history.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeRoute::Api => "api",
            ChangeRoute::SmsReply => "sms_reply",
            ChangeRoute::EmailBounce => "email_bounce",
            ChangeRoute::UnsubscribeLink => "unsubscribe_link",
        }
    }
}

/// A change to one user's preferences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// The whole document replaced (`PUT`).
    Replace(Preferences),
    /// Back to the defaults: nothing switched off (`DELETE`).
    Clear,
    /// These switched off as well, the rest kept (an opt-out by reply,
    /// bounce or link).
    SwitchOff(Preferences),
}

impl Edit {
    fn action(&self) -> &'static str {
        match self {
            Edit::Replace(_) => "replace",
            Edit::Clear => "clear",
            Edit::SwitchOff(_) => "switch_off",
        }
    }

    fn apply(&self, before: &Preferences) -> Preferences {
        match self {
            Edit::Replace(p) => p.clone(),
            Edit::Clear => Preferences::default(),
            Edit::SwitchOff(p) => Preferences {
                channels_off: before
                    .channels_off
                    .union(&p.channels_off)
                    .cloned()
                    .collect(),
                categories_off: before
                    .categories_off
                    .union(&p.categories_off)
                    .cloned()
                    .collect(),
            },
        }
    }
}

/// One change as the history keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PreferenceChange {
    /// When (ms since the epoch, the writing host's clock).
    pub at_ms: i64,
    /// By which route: `api`, `sms_reply`, `email_bounce`, `unsubscribe_link`.
    pub route: String,
    /// By whom: the token kind (`admin token`, `api token`) or the route's own name.
    pub by: String,
    /// `replace`, `clear` or `switch_off`.
    pub action: String,
    /// What changed, in words, e.g. `channels off +sms; categories off -marketing`.
    pub what: String,
    /// The preferences after the change.
    pub after: Preferences,
    /// Whether anything changed (a switch-off of what is already off
    /// changes nothing and writes nothing).
    #[serde(skip)]
    pub changed: bool,
}

/// A user's stored preferences and when they last changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPreferences {
    /// What is switched off.
    pub preferences: Preferences,
    /// When it last changed (ms since the epoch).
    pub updated_at_ms: i64,
}

fn to_json(names: &BTreeSet<String>) -> String {
    serde_json::to_string(names).unwrap_or_else(|_| "[]".into())
}

fn from_json(text: &str) -> BTreeSet<String> {
    serde_json::from_str(text).unwrap_or_default()
}

/// `channels off +sms -wechat; categories off +marketing`, or `no change`.
fn difference(before: &Preferences, after: &Preferences) -> String {
    let side = |label: &str, b: &BTreeSet<String>, a: &BTreeSet<String>| {
        let changes: Vec<String> = a
            .difference(b)
            .map(|n| format!("+{n}"))
            .chain(b.difference(a).map(|n| format!("-{n}")))
            .collect();
        (!changes.is_empty()).then(|| format!("{label} {}", changes.join(" ")))
    };
    let parts: Vec<String> = [
        side("channels off", &before.channels_off, &after.channels_off),
        side(
            "categories off",
            &before.categories_off,
            &after.categories_off,
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    if parts.is_empty() {
        "no change".into()
    } else {
        parts.join("; ")
    }
}

type HistoryTuple = (i64, String, String, String, String, String, String);

impl Ledger {
    /// `user_id`'s stored preferences (`None`: never set, the defaults).
    pub async fn preferences(
        &self,
        user_id: &str,
    ) -> Result<Option<StoredPreferences>, LedgerError> {
        let digest = recipient_digest(user_id);
        let row: Option<(String, String, i64)> = on_pool!(self.pool(), p => {
            sqlx::query_as(
                "SELECT channels_off, categories_off, updated_at FROM preferences \
                 WHERE user_digest = $1",
            )
            .bind(&digest)
            .fetch_optional(p)
            .await?
        });
        Ok(row.map(|(ch, cat, at)| StoredPreferences {
            preferences: Preferences {
                channels_off: from_json(&ch),
                categories_off: from_json(&cat),
            },
            updated_at_ms: at,
        }))
    }

    /// The preferences of each of `users` in one query (a user without a
    /// row is absent from the answer: the defaults), on the pool for reads,
    /// so the accept path does not wait behind claims.
    pub async fn preferences_of(
        &self,
        users: &[&str],
    ) -> Result<HashMap<String, Preferences>, LedgerError> {
        if users.is_empty() {
            return Ok(HashMap::new());
        }
        let by_digest: HashMap<String, &str> =
            users.iter().map(|u| (recipient_digest(u), *u)).collect();
        let marks: Vec<String> = (1..=by_digest.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT user_digest, channels_off, categories_off FROM preferences \
             WHERE user_digest IN ({})",
            marks.join(", ")
        );
        let rows: Vec<(String, String, String)> = on_pool!(&self.reads, p => {
            let mut q = sqlx::query_as(&sql);
            for digest in by_digest.keys() {
                q = q.bind(digest);
            }
            q.fetch_all(p).await?
        });
        Ok(rows
            .into_iter()
            .filter_map(|(digest, ch, cat)| {
                let user = by_digest.get(&digest)?;
                Some((
                    user.to_string(),
                    Preferences {
                        channels_off: from_json(&ch),
                        categories_off: from_json(&cat),
                    },
                ))
            })
            .collect())
    }

    /// Applies `edit` to `user_id`'s preferences and appends the change to
    /// their history, in one transaction; `by` is who made it (the token
    /// kind, or the route's own name). Answers the change as recorded.
    pub async fn change_preferences(
        &self,
        user_id: &str,
        edit: &Edit,
        by: &str,
        route: ChangeRoute,
    ) -> Result<PreferenceChange, LedgerError> {
        self.change_preferences_of(&recipient_digest(user_id), edit, by, route)
            .await
    }

    /// [`Ledger::change_preferences`] of the user whose id has the SHA-256
    /// (hex) `digest` (an opt-out by address knows only that). A
    /// [`Edit::SwitchOff`] that changes nothing (already off) writes nothing,
    /// not even history: an opt-out reported twice is recorded once; the
    /// answer's `changed` is then false.
    pub async fn change_preferences_of(
        &self,
        digest: &str,
        edit: &Edit,
        by: &str,
        route: ChangeRoute,
    ) -> Result<PreferenceChange, LedgerError> {
        let at = now_ms();
        on_pool!(self.pool(), p => {
            let mut tx = p.begin().await?;
            // Two changes of one user at once (two instances taking the same
            // SmsUp) must not both read the old row: the row is made to
            // exist and write-locked before it is read, so the second waits
            // for the first and reads its result (PostgreSQL: a row lock;
            // SQLite: the database's write lock). Rolled back with the rest
            // when nothing changes.
            sqlx::query(
                "INSERT INTO preferences (user_digest, channels_off, categories_off, updated_at) \
                 VALUES ($1, '[]', '[]', $2) ON CONFLICT (user_digest) DO NOTHING",
            )
            .bind(digest)
            .bind(at)
            .execute(&mut *tx)
            .await?;
            sqlx::query("UPDATE preferences SET updated_at = updated_at WHERE user_digest = $1")
                .bind(digest)
                .execute(&mut *tx)
                .await?;
            let row: Option<(String, String)> = sqlx::query_as(
                "SELECT channels_off, categories_off FROM preferences WHERE user_digest = $1",
            )
            .bind(digest)
            .fetch_optional(&mut *tx)
            .await?;
            let before = row
                .map(|(ch, cat)| Preferences {
                    channels_off: from_json(&ch),
                    categories_off: from_json(&cat),
                })
                .unwrap_or_default();
            let after = edit.apply(&before);
            let change = PreferenceChange {
                at_ms: at,
                route: route.as_str().to_string(),
                by: by.to_string(),
                action: edit.action().to_string(),
                what: difference(&before, &after),
                changed: before != after,
                after,
            };
            if matches!(edit, Edit::SwitchOff(_)) && !change.changed {
                tx.rollback().await?;
                return Ok(change);
            }
            let channels = to_json(&change.after.channels_off);
            let categories = to_json(&change.after.categories_off);
            sqlx::query(
                "INSERT INTO preferences (user_digest, channels_off, categories_off, updated_at) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (user_digest) DO UPDATE SET \
                 channels_off = excluded.channels_off, categories_off = excluded.categories_off, \
                 updated_at = excluded.updated_at",
            )
            .bind(digest)
            .bind(&channels)
            .bind(&categories)
            .bind(at)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO preference_changes (user_digest, at, route, changed_by, action, \
                 what, channels_off, categories_off) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(digest)
            .bind(at)
            .bind(&change.route)
            .bind(&change.by)
            .bind(&change.action)
            .bind(&change.what)
            .bind(&channels)
            .bind(&categories)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            Ok(change)
        })
    }

    /// The users (SHA-256 hex of their ids) the host sent to on `channel` at
    /// any of the addresses whose digests are `address_digests`, as the
    /// deliveries still held (`ledger_history` after each key's window) say.
    pub async fn users_at_addresses(
        &self,
        channel: &str,
        address_digests: &[String],
    ) -> Result<Vec<String>, LedgerError> {
        if address_digests.is_empty() {
            return Ok(Vec::new());
        }
        let marks: Vec<String> = (2..=address_digests.len() + 1)
            .map(|i| format!("${i}"))
            .collect();
        let sql = format!(
            "SELECT DISTINCT recipient_digest FROM deliveries \
             WHERE channel = $1 AND address_digest IN ({}) ORDER BY recipient_digest",
            marks.join(", ")
        );
        let rows: Vec<(String,)> = on_pool!(self.pool(), p => {
            let mut q = sqlx::query_as(&sql).bind(channel);
            for d in address_digests {
                q = q.bind(d);
            }
            q.fetch_all(p).await?
        });
        Ok(rows.into_iter().map(|(d,)| d).collect())
    }

    /// `user_id`'s changes, newest first, at most `limit`.
    pub async fn preference_history(
        &self,
        user_id: &str,
        limit: u32,
    ) -> Result<Vec<PreferenceChange>, LedgerError> {
        let digest = recipient_digest(user_id);
        let rows: Vec<HistoryTuple> = on_pool!(self.pool(), p => {
            sqlx::query_as(
                "SELECT at, route, changed_by, action, what, channels_off, categories_off \
                 FROM preference_changes WHERE user_digest = $1 ORDER BY id DESC LIMIT $2",
            )
            .bind(&digest)
            .bind(i64::from(limit))
            .fetch_all(p)
            .await?
        });
        Ok(rows
            .into_iter()
            .map(|(at, route, by, action, what, ch, cat)| PreferenceChange {
                at_ms: at,
                route,
                by,
                action,
                what,
                after: Preferences {
                    channels_off: from_json(&ch),
                    categories_off: from_json(&cat),
                },
                changed: true,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn changes_are_stored_with_their_history() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&Ledger::sqlite_url(dir.path())).await.unwrap();
        assert_eq!(ledger.preferences("u-1").await.unwrap(), None);
        let put = Edit::Replace(Preferences::off(&["sms"], &["marketing"]));
        let change = ledger
            .change_preferences("u-1", &put, "admin token", ChangeRoute::Api)
            .await
            .unwrap();
        assert_eq!(change.what, "channels off +sms; categories off +marketing");
        let off = Edit::SwitchOff(Preferences::off(&["wechat"], &[]));
        let change = ledger
            .change_preferences("u-1", &off, "sms_reply", ChangeRoute::SmsReply)
            .await
            .unwrap();
        assert_eq!(change.what, "channels off +wechat");
        let stored = ledger.preferences("u-1").await.unwrap().unwrap();
        assert_eq!(
            stored.preferences,
            Preferences::off(&["sms", "wechat"], &["marketing"])
        );
        let many = ledger.preferences_of(&["u-1", "u-2"]).await.unwrap();
        assert_eq!(many.len(), 1);
        assert_eq!(many["u-1"], stored.preferences);
        ledger
            .change_preferences("u-1", &Edit::Clear, "api token", ChangeRoute::Api)
            .await
            .unwrap();
        assert!(
            ledger
                .preferences("u-1")
                .await
                .unwrap()
                .unwrap()
                .preferences
                .is_default()
        );
        let history = ledger.preference_history("u-1", 10).await.unwrap();
        let seen: Vec<(&str, &str, &str)> = history
            .iter()
            .map(|c| (c.route.as_str(), c.action.as_str(), c.what.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "api",
                    "clear",
                    "channels off -sms -wechat; categories off -marketing"
                ),
                ("sms_reply", "switch_off", "channels off +wechat"),
                (
                    "api",
                    "replace",
                    "channels off +sms; categories off +marketing"
                ),
            ]
        );
        assert!(
            ledger
                .preference_history("u-2", 10)
                .await
                .unwrap()
                .is_empty()
        );
    }

    #[tokio::test]
    async fn an_address_finds_the_users_sent_to_there_and_a_repeated_switch_off_is_kept_once() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&Ledger::sqlite_url(dir.path())).await.unwrap();
        let claim = |key: &str, user: &str, channel: &str| crate::ledger::Claim {
            key: key.into(),
            task_id: format!("t-{key}"),
            channel: channel.into(),
            policy: "per-event@1.0.0".into(),
            recipient_digest: recipient_digest(user),
            biz_type: "ORDER_SHIPPED".into(),
            biz_id: key.into(),
            attempt: 1,
            now_ms: 1,
            window_ends_ms: i64::MAX,
            accepted_ms: 1,
        };
        let at = |address: &str| Some(recipient_digest(address));
        ledger
            .claim_all_at(&[
                (claim("k1", "u-1", "sms"), at("+8613800000042")),
                (claim("k2", "u-2", "sms"), at("13800000042")),
                (claim("k3", "u-3", "wechat"), at("13800000042")),
                (claim("k4", "u-4", "sms"), at("13800000099")),
                (claim("k5", "u-5", "sms"), None),
            ])
            .await
            .unwrap();
        let forms = [
            recipient_digest("13800000042"),
            recipient_digest("+8613800000042"),
        ];
        let mut expected = vec![recipient_digest("u-1"), recipient_digest("u-2")];
        expected.sort();
        assert_eq!(
            ledger.users_at_addresses("sms", &forms).await.unwrap(),
            expected
        );
        assert!(
            ledger
                .users_at_addresses("sms", &[])
                .await
                .unwrap()
                .is_empty()
        );

        let off = Edit::SwitchOff(Preferences::off(&["sms"], &[]));
        let digest = recipient_digest("u-1");
        for _ in 0..2 {
            ledger
                .change_preferences_of(&digest, &off, "channel sms", ChangeRoute::SmsReply)
                .await
                .unwrap();
        }
        let history = ledger.preference_history("u-1", 10).await.unwrap();
        assert_eq!(history.len(), 1, "{history:?}");
        assert_eq!(history[0].route, "sms_reply");
        assert_eq!(history[0].what, "channels off +sms");
    }
}
