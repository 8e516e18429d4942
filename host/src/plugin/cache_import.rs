//! The `pushonce:channel/shared-cache` import: a small key-value store in
//! Redis shared by every instance of one channel in every host process (one
//! access token for all of them).
//!
//! Namespaced by the host: every key a plugin names is stored under
//! `{<ns>:cache:<channel>}:e:<key>` — the channel comes from the host's
//! configuration, never from the plugin, so a plugin cannot reach another
//! channel's entries; the hash tag keeps a channel's entries and its index in
//! one slot of a Redis Cluster. Bounded: keys up to [`MAX_KEY_BYTES`], values
//! up to [`MAX_VALUE_BYTES`], at most [`MAX_ENTRIES`] live entries per
//! channel, a TTL on every entry, capped at [`MAX_TTL`]. Writes are one Lua
//! script (`shared_cache.lua`, beside this file), so compare-and-set and
//! compare-and-delete are atomic. Every call runs under [`CALL_TIMEOUT`]; a
//! Redis that does not answer is `unavailable`, never a trap.
//!
//! `remember` (the nonces of signed callbacks) writes apart from the entries:
//! `{<ns>:nonce:<channel>}:<key>`, `SET NX PX` (one record, never changed),
//! so a replay reaching any host process meets the first record. Not counted
//! toward [`MAX_ENTRIES`] (a burst of callbacks must not crowd out the access
//! token); bounded instead by [`MAX_REMEMBER_TTL`] and the sizes of key and
//! value ([`MAX_REMEMBER_VALUE_BYTES`]), and written only by a plugin that
//! verified the request's signature first.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::bindings::CacheError;
use crate::store::RedisConn;

/// Longest key a plugin may use, in bytes.
pub(crate) const MAX_KEY_BYTES: usize = 256;
/// Longest value, in bytes.
pub(crate) const MAX_VALUE_BYTES: usize = 16 * 1024;
/// Most live entries per channel instance.
pub(crate) const MAX_ENTRIES: u64 = 1_000;
/// Longest TTL of an entry (a longer one is shortened to this).
pub(crate) const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest a `remember` record lives (a longer TTL is shortened to this).
pub(crate) const MAX_REMEMBER_TTL: Duration = Duration::from_secs(3600);
/// Longest value of a `remember` record, in bytes.
pub(crate) const MAX_REMEMBER_VALUE_BYTES: usize = 256;
/// Budget of one cache call.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The cache's writes (`shared_cache.lua`).
static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("shared_cache.lua")));

/// One channel instance's view of the shared cache. Cheap to clone.
#[derive(Clone)]
pub struct SharedCache {
    /// The host's Redis connection.
    conn: RedisConn,
    /// `{<ns>:cache:<channel>}`: the prefix of every key of this channel.
    prefix: String,
    /// `{<ns>:nonce:<channel>}`: the prefix of this channel's `remember` records.
    nonce_prefix: String,
}

impl std::fmt::Debug for SharedCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCache")
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl SharedCache {
    /// The cache of channel instance `channel` in Redis namespace `namespace`.
    pub fn new(conn: RedisConn, namespace: &str, channel: &str) -> SharedCache {
        SharedCache {
            conn,
            prefix: format!("{{{namespace}:cache:{channel}}}"),
            nonce_prefix: format!("{{{namespace}:nonce:{channel}}}"),
        }
    }

    fn entry_key(&self, key: &str) -> String {
        format!("{}:e:{key}", self.prefix)
    }

    fn index_key(&self) -> String {
        format!("{}:index", self.prefix)
    }

    /// The value under `key`, if set and not expired.
    pub async fn get(&self, key: &str) -> Result<Option<String>, CacheError> {
        check_key(key)?;
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.entry_key(key));
        let mut conn = self.conn.clone();
        timed(cmd.query_async::<Option<String>>(&mut conn)).await
    }

    /// Sets `key` to `value` for `ttl_ms`.
    pub async fn set(&self, key: &str, value: &str, ttl_ms: u64) -> Result<(), CacheError> {
        self.write(key, "set", value, ttl_ms, None)
            .await
            .map(|_| ())
    }

    /// Sets `key` only if its value is `expected` (`None`: only if absent).
    pub async fn compare_and_set(
        &self,
        key: &str,
        expected: Option<&str>,
        value: &str,
        ttl_ms: u64,
    ) -> Result<bool, CacheError> {
        self.write(key, "cas", value, ttl_ms, Some(expected)).await
    }

    /// Removes `key` if its value is `expected`.
    pub async fn compare_and_delete(&self, key: &str, expected: &str) -> Result<bool, CacheError> {
        check_key(key)?;
        let mut inv = SCRIPT.prepare_invoke();
        inv.key(self.entry_key(key))
            .key(self.index_key())
            .arg("cad")
            .arg(expected);
        let mut conn = self.conn.clone();
        let n: i64 = timed(inv.invoke_async(&mut conn)).await?;
        Ok(n == 1)
    }

    /// Records `value` under `key` for `ttl_ms` unless recorded already;
    /// returns the earlier record (`None` the first time).
    pub async fn remember(
        &self,
        key: &str,
        value: &str,
        ttl_ms: u64,
    ) -> Result<Option<String>, CacheError> {
        check_key(key)?;
        if value.len() > MAX_REMEMBER_VALUE_BYTES {
            return Err(CacheError::TooLarge(format!(
                "a value of {} bytes is over the limit of {MAX_REMEMBER_VALUE_BYTES} for `remember`",
                value.len()
            )));
        }
        if ttl_ms == 0 {
            return Err(CacheError::TooLarge(
                "a ttl of 0 ms: every record needs a ttl".into(),
            ));
        }
        let ttl = ttl_ms.min(MAX_REMEMBER_TTL.as_millis() as u64);
        let record = format!("{}:{key}", self.nonce_prefix);
        let mut set = redis::cmd("SET");
        set.arg(&record).arg(value).arg("NX").arg("PX").arg(ttl);
        let mut conn = self.conn.clone();
        let first: Option<String> = timed(set.query_async(&mut conn)).await?;
        if first.is_some() {
            return Ok(None);
        }
        // Recorded before: what (records never change; one that expired
        // between the two calls is gone, and its request is past any window).
        let mut get = redis::cmd("GET");
        get.arg(&record);
        let earlier: Option<String> = timed(get.query_async(&mut conn)).await?;
        Ok(Some(earlier.unwrap_or_default()))
    }

    /// One `set` or `cas` through the script, after the size checks.
    async fn write(
        &self,
        key: &str,
        op: &str,
        value: &str,
        ttl_ms: u64,
        expected: Option<Option<&str>>,
    ) -> Result<bool, CacheError> {
        check_key(key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(CacheError::TooLarge(format!(
                "a value of {} bytes is over the limit of {MAX_VALUE_BYTES}",
                value.len()
            )));
        }
        if ttl_ms == 0 {
            return Err(CacheError::TooLarge(
                "a ttl of 0 ms: every entry needs a ttl".into(),
            ));
        }
        let cap = MAX_TTL.as_millis() as u64;
        let ttl = ttl_ms.min(cap);
        let (has_expected, expected) = match expected.flatten() {
            Some(e) => ("1", e),
            None => ("0", ""),
        };
        let mut inv = SCRIPT.prepare_invoke();
        inv.key(self.entry_key(key))
            .key(self.index_key())
            .arg(op)
            .arg(value)
            .arg(ttl)
            .arg(MAX_ENTRIES)
            .arg(has_expected)
            .arg(expected)
            .arg(cap + 60_000);
        let mut conn = self.conn.clone();
        match timed(inv.invoke_async::<i64>(&mut conn)).await? {
            -1 => Err(CacheError::TooLarge(format!(
                "the channel already holds {MAX_ENTRIES} entries"
            ))),
            n => Ok(n == 1),
        }
    }
}

fn check_key(key: &str) -> Result<(), CacheError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(CacheError::TooLarge(format!(
            "a key of {} bytes (keys are 1..={MAX_KEY_BYTES} bytes)",
            key.len()
        )));
    }
    Ok(())
}

/// Runs one Redis call under [`CALL_TIMEOUT`]; failures are `unavailable`.
async fn timed<T>(
    fut: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, CacheError> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(CacheError::Unavailable(format!(
            "the shared cache failed: {e}"
        ))),
        Err(_) => Err(CacheError::Unavailable(format!(
            "the shared cache did not answer within {} ms",
            CALL_TIMEOUT.as_millis()
        ))),
    }
}
