//! The `opted_out` answers in the ledger's database: each channel of an
//! event answered `opted_out` (the recipient switched it off), recorded off
//! the accept path for the event look-up and removed after the ledger's
//! history retention.

use serde::Serialize;

use super::pool::on_pool;
use super::{Ledger, LedgerError};

/// A channel of an event answered `opted_out`, as the look-up shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OptedOutAnswer {
    /// Business type of the event.
    pub biz_type: String,
    /// Business id of the event.
    pub biz_id: String,
    /// SHA-256 (hex) of the user id.
    pub user_digest: String,
    /// The channel.
    pub channel: String,
    /// The key its message would have had.
    pub key: String,
    /// When it was answered (ms since the epoch).
    pub at_ms: i64,
}

impl Ledger {
    /// Records `answers` (one transaction; an answer already recorded for
    /// the same event, user and channel is kept as it is).
    pub async fn record_opted_out(&self, answers: &[OptedOutAnswer]) -> Result<(), LedgerError> {
        on_pool!(self.pool(), p => {
            let mut tx = p.begin().await?;
            for a in answers {
                sqlx::query(
                    "INSERT INTO opted_out (biz_type, biz_id, user_digest, channel, key, at) \
                     VALUES ($1, $2, $3, $4, $5, $6) \
                     ON CONFLICT (biz_type, biz_id, user_digest, channel) DO NOTHING",
                )
                .bind(&a.biz_type)
                .bind(&a.biz_id)
                .bind(&a.user_digest)
                .bind(&a.channel)
                .bind(&a.key)
                .bind(a.at_ms)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
        });
        Ok(())
    }

    /// The channels of event `biz_type`/`biz_id` answered `opted_out`, oldest first.
    pub async fn opted_out_of_event(
        &self,
        biz_type: &str,
        biz_id: &str,
    ) -> Result<Vec<OptedOutAnswer>, LedgerError> {
        let rows: Vec<(String, String, String, i64)> = on_pool!(self.pool(), p => {
            sqlx::query_as(
                "SELECT user_digest, channel, key, at FROM opted_out \
                 WHERE biz_type = $1 AND biz_id = $2 ORDER BY at, channel",
            )
            .bind(biz_type)
            .bind(biz_id)
            .fetch_all(p)
            .await?
        });
        Ok(rows
            .into_iter()
            .map(|(user_digest, channel, key, at_ms)| OptedOutAnswer {
                biz_type: biz_type.to_string(),
                biz_id: biz_id.to_string(),
                user_digest,
                channel,
                key,
                at_ms,
            })
            .collect())
    }

    /// Removes the `opted_out` answers recorded before `before_ms`; how many.
    pub async fn remove_opted_out_before(&self, before_ms: i64) -> Result<u64, LedgerError> {
        let done = on_pool!(self.pool(), p => {
            sqlx::query("DELETE FROM opted_out WHERE at < $1")
                .bind(before_ms)
                .execute(p)
                .await?
                .rows_affected()
        });
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::recipient_digest;

    #[tokio::test]
    async fn opted_out_answers_are_kept_once_and_removed_after_their_time() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Ledger::open(&Ledger::sqlite_url(dir.path())).await.unwrap();
        let answer = |channel: &str, at_ms: i64| OptedOutAnswer {
            biz_type: "ORDER_SHIPPED".into(),
            biz_id: "o-1".into(),
            user_digest: recipient_digest("u-1"),
            channel: channel.into(),
            key: format!("push:k:{channel}"),
            at_ms,
        };
        ledger
            .record_opted_out(&[answer("sms", 10), answer("wechat", 20)])
            .await
            .unwrap();
        ledger.record_opted_out(&[answer("sms", 30)]).await.unwrap();
        let found = ledger
            .opted_out_of_event("ORDER_SHIPPED", "o-1")
            .await
            .unwrap();
        assert_eq!(found, [answer("sms", 10), answer("wechat", 20)]);
        assert_eq!(ledger.remove_opted_out_before(15).await.unwrap(), 1);
        let found = ledger
            .opted_out_of_event("ORDER_SHIPPED", "o-1")
            .await
            .unwrap();
        assert_eq!(found, [answer("wechat", 20)]);
    }
}
