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

/// Records `value` under `key` for `ttl_ms` unless `key` is recorded
/// already; returns the earlier record (`None` the first time). Seen by every
/// instance in every host process, kept apart from the entries above: for the
/// nonces of signed callbacks (a replay meets the first record).
pub fn remember(key: &str, value: &str, ttl_ms: u64) -> Result<Option<String>, CacheError> {
    host::remember(key, value, ttl_ms)
}

/// How long a fetch may hold the refresh lock of [`token`].
const LOCK_TTL_MS: u64 = 10_000;

/// How long [`token`] waits for another instance's fetch before fetching itself.
const WAIT_MS: u64 = 5_000;

/// A token kept under `key`: the cached one unless `stale` names it (the
/// provider just refused that one), else a new one from `fetch` (value and
/// lifetime in ms), stored for every other instance. One instance fetches
/// at a time (a lock entry `<key>:lock`, taken with compare-and-set; the
/// others wait for its token), so concurrent instances in every host process
/// make one fetch between them. When the cache is unavailable the fetched
/// token is still used, just not shared.
pub fn token(
    key: &str,
    stale: Option<&str>,
    fetch: impl FnOnce() -> Result<(String, u64), SendError>,
) -> Result<String, SendError> {
    let fresh = |v: &Option<String>| v.as_deref().is_some_and(|v| Some(v) != stale);
    let lock = format!("{key}:lock");
    let me = lock_holder();
    let started = crate::now_ms();
    loop {
        match get(key) {
            Ok(cached) if fresh(&cached) => return Ok(cached.unwrap_or_default()),
            Ok(_) => {}
            // No cache: fetch, unshared.
            Err(_) => return fetch().map(|(value, _)| value),
        }
        match compare_and_set(&lock, None, &me, LOCK_TTL_MS) {
            Ok(true) => break,
            Ok(false) if crate::now_ms() < started + WAIT_MS => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            // Waited long enough, or no cache: fetch without the lock.
            _ => return fetch_and_store(key, fetch),
        }
    }
    // Holding the lock: another instance may have stored a token meanwhile.
    let result = match get(key) {
        Ok(cached) if fresh(&cached) => Ok(cached.unwrap_or_default()),
        _ => fetch_and_store(key, fetch),
    };
    let _ = compare_and_delete(&lock, &me);
    result
}

/// A value naming this holder of the lock: random (the host lends plugins
/// `wasi:random`, which `RandomState` draws from), so no other instance
/// can delete the lock it took.
fn lock_holder() -> String {
    use std::hash::BuildHasher;
    let state = std::collections::hash_map::RandomState::new();
    format!(
        "{:016x}{:013x}",
        state.hash_one(crate::now_ms()),
        crate::now_ms()
    )
}

/// Fetches a token and stores it for the other instances.
fn fetch_and_store(
    key: &str,
    fetch: impl FnOnce() -> Result<(String, u64), SendError>,
) -> Result<String, SendError> {
    let (value, ttl_ms) = fetch()?;
    let _ = set(key, &value, ttl_ms.max(1));
    Ok(value)
}
