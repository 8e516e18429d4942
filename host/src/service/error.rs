//! Why the host could not start, or stopped with an error.

use crate::dispatch::DispatchError;
use crate::permit::PermitError;
use crate::route::live::LiveError;
use crate::send::plugin::SenderSetupError;
use crate::store::StoreError;

/// Why the host could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// Redis could not be opened or prepared.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Scripts or consumer groups could not be prepared.
    #[error(transparent)]
    Permit(#[from] PermitError),
    /// Plugins or policies were refused at start.
    #[error(transparent)]
    Live(#[from] LiveError),
    /// The dispatcher failed.
    #[error(transparent)]
    Dispatch(#[from] DispatchError),
    /// Redis may evict permits (`maxmemory-policy` other than `noeviction`).
    #[error(transparent)]
    Eviction(#[from] crate::eviction::EvictionError),
    /// Another instance on this Redis claims in another ledger.
    #[error(transparent)]
    SeparateLedger(#[from] crate::ledger_guard::LedgerGuardError),
    /// The delivery ledger could not be opened or migrated.
    #[error(transparent)]
    Ledger(#[from] crate::ledger::LedgerError),
    /// The channel plugins' sender could not be set up (a missing secret, a
    /// bad TLS setting).
    #[error("sender")]
    Sender(#[source] SenderSetupError),
    /// A channel's plugin takes delivery callbacks but no way to reach them
    /// was configured.
    #[error(
        "channel {channel}: its plugin takes delivery callbacks, but `callback_token_env` is not set (callback routes are closed by default): set `channels.{channel}.callback_token_env` to a variable holding an unguessable path token, or write `open_callbacks = true` to serve them without one"
    )]
    CallbacksUnreachable {
        /// The channel's name.
        channel: String,
    },
    /// The plugin and policy directories cannot be watched for changes.
    #[error("cannot watch the plugin and policy directories")]
    Watch(#[source] notify::Error),
    /// The data directory (the SQLite ledger's home) cannot be created.
    #[error("cannot create {}", path.display())]
    DataDir {
        /// The directory.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Serving HTTP failed.
    #[error("http server: {0}")]
    Serve(std::io::Error),
    /// The configuration cannot be served as it is (e.g. open beyond loopback).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// `[unsubscribe] secret_env` names a variable that is unset or too short.
    #[error(transparent)]
    UnsubscribeSecret(#[from] crate::unsubscribe::SecretError),
    /// A task of the host panicked.
    #[error("host task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}
