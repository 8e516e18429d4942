//! How long the pieces of an event record's values are.
//!
//! Redis keeps a hash as a listpack (its compact encoding) while every
//! value is at most `hash-max-listpack-value` bytes; one longer value turns
//! the whole record into a hash table, several times its size. So
//! `accept.lua` stores a longer value in pieces of exactly that length
//! (`lib.lua`'s `rec_pairs`), and the host reads the setting once, at
//! [`super::Permits::prepare`]. Readers follow the pieces whatever their
//! length, so a record written under another setting reads the same.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::eviction::{config_value, per_node};
use crate::store::RedisConn;

/// Redis's own default `hash-max-listpack-value`: the length used until the
/// setting is read, and when it cannot be (`CONFIG` renamed or forbidden,
/// as on managed services).
pub(crate) const REDIS_DEFAULT: u64 = 64;

/// The shortest piece: shorter ones would cost more in field names than
/// the listpack saves (a Redis set that low keeps records as hash tables).
const SHORTEST: u64 = 16;

/// The longest piece: past it a listpack's every insert (it is rewritten
/// whole) costs more than the encoding saves.
const LONGEST: u64 = 8192;

/// The piece length in use, shared by the clones of one permit layer.
#[derive(Debug, Clone)]
pub(crate) struct PieceLength(Arc<AtomicU64>);

impl Default for PieceLength {
    fn default() -> Self {
        PieceLength(Arc::new(AtomicU64::new(REDIS_DEFAULT)))
    }
}

impl PieceLength {
    /// The length to write pieces in now.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// Reads `hash-max-listpack-value` from every Redis behind `conn` and
    /// keeps the smallest (a cluster's nodes may differ); Redis's default
    /// when a node does not tell it.
    pub(crate) async fn read(&self, conn: &RedisConn) -> Result<(), redis::RedisError> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("hash-max-listpack-value");
        let answers = per_node(conn, &cmd).await?;
        let length = answers
            .iter()
            .map(|(_, answer)| of_answer(answer.as_ref().ok()))
            .min()
            .unwrap_or(REDIS_DEFAULT);
        self.0.store(length, Ordering::Relaxed);
        Ok(())
    }
}

/// The piece length a node's `CONFIG GET` answer gives: its setting, kept
/// between [`SHORTEST`] and [`LONGEST`]; Redis's default when it tells none.
fn of_answer(answer: Option<&redis::Value>) -> u64 {
    answer
        .and_then(config_value)
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(REDIS_DEFAULT, |v| v.clamp(SHORTEST, LONGEST))
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;

    fn answer(value: &str) -> Value {
        Value::Array(vec![
            Value::BulkString(b"hash-max-listpack-value".to_vec()),
            Value::BulkString(value.as_bytes().to_vec()),
        ])
    }

    #[test]
    fn the_setting_is_the_length_within_bounds_and_the_default_stands_in_for_none() {
        assert_eq!(of_answer(Some(&answer("1024"))), 1024);
        assert_eq!(of_answer(Some(&answer("0"))), SHORTEST);
        assert_eq!(of_answer(Some(&answer("1000000"))), LONGEST);
        assert_eq!(of_answer(Some(&Value::Array(vec![]))), REDIS_DEFAULT);
        assert_eq!(of_answer(None), REDIS_DEFAULT);
    }
}
