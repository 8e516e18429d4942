//! pushonce: push delivery exactly once per channel.
//!
//! The data path reads in module order: `api` → `route` → `derive` (key) →
//! `permit` → `dispatch` → `send` → `reconcile`. The plugin runtime (`plugin`)
//! serves `derive` and `send`; `store` owns the Redis connection (and the
//! embedded `redis-server`). See `ARCHITECTURE.md` for the map and invariants.

//!
//! The modules below are the library's surface for the binary, the tests and
//! the benches; the types most callers start from are also re-exported here.
//! `unreachable_pub` keeps everything else `pub(crate)`, and `missing_docs`
//! keeps the surface documented.

#![warn(unreachable_pub, missing_docs)]

pub mod api;
pub mod caps;
pub mod cli;
pub mod config;
pub mod corpus;
pub mod derive;
pub mod dispatch;
pub mod doctor;
pub mod event;
pub mod eviction;
pub(crate) mod files;
pub mod ledger;
pub mod ledger_guard;
pub(crate) mod listener;
pub mod metric_names;
pub mod permit;
pub mod plugin;
pub mod prefs;
pub mod reconcile;
pub mod route;
pub mod send;
pub mod service;
pub mod store;
pub mod unsubscribe;

pub use config::HostConfig;
pub use ledger::Ledger;
pub use permit::{Permits, Task, TaskStatus};
pub use service::{Running, ServiceOptions};
pub use store::{RedisConn, Store};
