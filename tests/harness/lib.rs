//! Test harness shared by the integration tests in `tests/`: starts real
//! services (redis-server, host processes) on loopback and waits on conditions
//! with deadlines instead of sleeping.

pub mod plugins;
