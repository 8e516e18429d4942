//! The delivery ledger as production needs it: on, reachable, its
//! migrations those of this binary, and the ledger every instance on the
//! Redis claims in (`crate::ledger_guard`'s comparison, read only); a SQLite
//! ledger serves one instance, so more than one instance seen on the Redis
//! fails, naming a PostgreSQL URL as the fix.

use super::{Check, Deployment, Status};
use crate::ledger::{LedgerPool, identity};
use crate::ledger_guard::LedgerGuard;

/// The fix that names a shared ledger.
const POSTGRES_FIX: &str = "set ledger_url = \"postgres://pushonce@db.example/pushonce\" (one PostgreSQL database) on every instance";

/// The ledger checks.
pub(super) async fn checks(d: &Deployment<'_>) -> Vec<Check> {
    let pool = match &d.ledger {
        None => {
            return vec![Check::fail(
                "ledger.reachable",
                "ledger_url = \"off\": no delivery ledger, so a Redis failover that loses permits sends re-posted events twice",
                "remove ledger_url (SQLite in data_dir, one machine) or set it to a PostgreSQL URL shared by every instance",
            )];
        }
        Some(Err(e)) => {
            return vec![Check::fail(
                "ledger.reachable",
                format!("cannot open the ledger: {e}"),
                "start the database, or correct ledger_url (PUSHONCE_LEDGER_URL) and its credentials",
            )];
        }
        Some(Ok(pool)) => *pool,
    };
    if let Err(e) = pool.ping().await {
        return vec![Check::fail(
            "ledger.reachable",
            format!("{} ledger does not answer: {e}", pool.backend()),
            "start the database, or correct ledger_url (PUSHONCE_LEDGER_URL) and its credentials",
        )];
    }
    let mut checks = vec![Check::ok(
        "ledger.reachable",
        format!("{} ledger answers", pool.backend()),
    )];
    let (migrations, current) = migrations(pool).await;
    checks.push(migrations);
    checks.push(if current {
        shared(d, pool).await
    } else {
        Check::warn(
            "ledger.shared",
            "not checked: the ledger's identity comes with its migrations",
            "start one instance of this version, then run doctor again",
        )
    });
    checks
}

/// The migrations check, and whether every migration is applied.
async fn migrations(pool: &LedgerPool) -> (Check, bool) {
    let name = "ledger.migrations";
    let gaps = pool.migration_gaps().await;
    let current = matches!(&gaps, Ok((pending, _)) if pending.is_empty());
    let check = match gaps {
        Err(e) => Check::fail(
            name,
            format!("cannot read the applied migrations: {e}"),
            "give pushonce's database user read access to _sqlx_migrations",
        ),
        Ok((_, unknown)) if !unknown.is_empty() => Check::fail(
            name,
            format!(
                "the ledger has migrations {unknown:?}, which this binary does not know (a newer pushonce applied them)"
            ),
            "run this pushonce version's successor (the one that applied them), not this one",
        ),
        Ok((pending, _)) if !pending.is_empty() => {
            let names: Vec<String> = pending.iter().map(|(v, d)| format!("{v} {d}")).collect();
            Check::warn(
                name,
                format!("not applied yet: {}", names.join(", ")),
                "start one instance of this version (it applies them at start), with a database user allowed to create tables",
            )
        }
        Ok(_) => Check::ok(name, "every migration of this binary is applied"),
    };
    (check, current)
}

/// The ledger is the one the Redis records, and fits the instances seen.
async fn shared(d: &Deployment<'_>, pool: &LedgerPool) -> Check {
    let name = "ledger.shared";
    let Ok(permits) = &d.redis else {
        return Check::warn(name, "not checked: Redis is unreachable", "fix Redis first");
    };
    let ours = match identity::read(pool).await {
        Ok(Some(id)) => id,
        Ok(None) => {
            return Check::warn(
                name,
                "the ledger has no identity yet (no instance opened it)",
                "start one instance (it writes it), then run doctor again",
            );
        }
        Err(e) => {
            return Check::fail(
                name,
                format!("cannot read the ledger's identity: {e}"),
                "start one instance of this version (it applies the migrations)",
            );
        }
    };
    let guard = LedgerGuard::new(
        permits.layout().namespace(),
        pool.backend(),
        &ours,
        d.config.allow_separate_ledgers,
    );
    let recorded = match guard.recorded(&permits.connection()).await {
        Ok(r) => r,
        Err(e) => {
            return Check::fail(
                name,
                e.to_string(),
                "let pushonce's Redis user GET the {<namespace>:meta}:ledger key",
            );
        }
    };
    if let Some(refused) = guard.refusal(recorded.clone()) {
        let status = if guard.allows_separate() {
            Status::Warn
        } else {
            Status::Fail
        };
        return Check::from_refusal(status, name, &refused.to_string());
    }
    let seen = match super::redis::instances_seen(permits).await {
        Ok(seen) => seen,
        Err(e) => {
            return Check::fail(
                name,
                format!("cannot list the instances on Redis (CLIENT LIST): {e}"),
                "allow CLIENT LIST for pushonce's Redis user",
            );
        }
    };
    let recorded = match recorded {
        Some(_) => format!("ledger {ours} is the one recorded in Redis"),
        None => format!("ledger {ours}; no instance recorded one in Redis yet"),
    };
    let instances = format!(
        "{} instance(s) dispatching{}",
        seen.len(),
        if seen.is_empty() {
            String::new()
        } else {
            format!(" ({})", seen.join(", "))
        }
    );
    if pool.backend() == "sqlite" && seen.len() > 1 {
        return Check::fail(
            name,
            format!(
                "{recorded}, {instances}, on a SQLite ledger: a file one machine's instances share at best, and every instance's claims contend for its one writer"
            ),
            POSTGRES_FIX,
        );
    }
    Check::ok(name, format!("{recorded}; {instances}"))
}
