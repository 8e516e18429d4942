//! The shared cache: a small key-value store the host keeps in Redis for this
//! channel, seen alike by every warm instance in every host process. Made for
//! access tokens: one token serves them all, so a provider's daily cap on
//! token fetches and its rotation of old tokens do not bite.

use crate::SendError;
use crate::bindings::pushonce::channel::shared_cache as host;

pub use host::CacheError;

/// The value under `key`, if set and not expired.
pub fn get(key: &str) -> Result<Option<String>, CacheError> {
    host::get(key)
}

/// Sets `key` to `value` for `ttl_ms` milliseconds.
pub fn set(key: &str, value: &str, ttl_ms: u64) -> Result<(), CacheError> {
    host::set(key, value, ttl_ms)
}

/// Sets `key` to `value` only if it holds `expected` (`None`: only if
/// absent); true when set.
pub fn compare_and_set(
    key: &str,
    expected: Option<&str>,
    value: &str,
    ttl_ms: u64,
) -> Result<bool, CacheError> {
    host::compare_and_set(key, expected, value, ttl_ms)
}

/// Removes `key` if it holds `expected`; true when removed.
pub fn compare_and_delete(key: &str, expected: &str) -> Result<bool, CacheError> {
    host::compare_and_delete(key, expected)
}

/// A token kept under `key`: the cached one unless `stale` names it (the
/// provider just refused that one), else a new one from `fetch` (value and
/// lifetime in ms), stored for every other instance. When the cache is
/// unavailable the fetched token is still used, just not shared.
pub fn token(
    key: &str,
    stale: Option<&str>,
    fetch: impl FnOnce() -> Result<(String, u64), SendError>,
) -> Result<String, SendError> {
    if let Ok(Some(cached)) = get(key)
        && Some(cached.as_str()) != stale
    {
        return Ok(cached);
    }
    let (value, ttl_ms) = fetch()?;
    let _ = set(key, &value, ttl_ms.max(1));
    Ok(value)
}
