//! The ledger's identity: a random id the first instance to open the ledger
//! writes into it (`ledger_identity`, one row), the same for every instance
//! that shares the ledger. `crate::ledger_guard` compares it through Redis.

use super::pool::on_pool;
use super::{LedgerError, LedgerPool};

/// The ledger's id: creates it if no instance did yet (one row, the first
/// insert wins; instances racing read the same winner).
pub(crate) async fn read_or_create(pool: &LedgerPool) -> Result<String, LedgerError> {
    let fresh = format!("{:032x}", rand::random::<u128>());
    on_pool!(pool, p => {
        sqlx::query(
            "INSERT INTO ledger_identity (singleton, id) VALUES (1, $1) \
             ON CONFLICT (singleton) DO NOTHING",
        )
        .bind(&fresh)
        .execute(p)
        .await?;
        let (id,): (String,) = sqlx::query_as("SELECT id FROM ledger_identity WHERE singleton = 1")
            .fetch_one(p)
            .await?;
        Ok(id)
    })
}

/// The ledger's id, if an instance created it (reads only: `pushonce doctor`).
pub(crate) async fn read(pool: &LedgerPool) -> Result<Option<String>, LedgerError> {
    on_pool!(pool, p => {
        let row: Option<(String,)> =
            sqlx::query_as("SELECT id FROM ledger_identity WHERE singleton = 1")
                .fetch_optional(p)
                .await?;
        Ok(row.map(|(id,)| id))
    })
}
