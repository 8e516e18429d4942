//! [`HostConfig::check`]: values that parse but cannot work, refused by
//! name before the host starts.

use std::time::Duration;

use super::{ConfigError, HostConfig, invalid};

/// Plugin instance slots kept beside the channels' sends for key policies
/// (their warm instances, and the calls of requests in flight).
const KEY_POLICY_INSTANCES: usize = 32;

impl HostConfig {
    /// Checks values that parse but cannot work.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.check_workers_and_plugins()?;
        self.check_reconcile()?;
        self.check_http_and_events()?;
        self.check_caps()?;
        self.check_providers()?;
        self.check_retention_and_index()?;
        self.preferences.check()?;
        self.unsubscribe.check()?;
        self.check_redis()
    }

    /// Without the event index, event look-ups come from the ledger alone;
    /// a delivered retention and the ledger's history are positive times.
    fn check_retention_and_index(&self) -> Result<(), ConfigError> {
        if self.delivered_retention.is_some() {
            return Err(invalid(
                "delivered_retention",
                "was removed: a delivered task now leaves Redis once the delivery ledger holds it (the default); set keep_ended_tasks = \"1h\" (or longer) to keep ended tasks in Redis",
            ));
        }
        if self
            .keep_ended_tasks
            .is_some_and(|d| d < Duration::from_secs(1))
        {
            return Err(invalid("keep_ended_tasks", "must be at least 1s"));
        }
        if self.task_retention < Duration::from_secs(1) {
            return Err(invalid("task_retention", "must be at least 1s"));
        }
        if self.ledger_history < Duration::from_secs(1) {
            return Err(invalid("ledger_history", "must be at least 1s"));
        }
        if !self.event_index && self.ledger().is_none() {
            return Err(invalid(
                "event_index",
                "false needs the delivery ledger (event look-ups then come from it); ledger_url is \"off\"",
            ));
        }
        Ok(())
    }

    /// Every channel names a plugin or providers, not both; each provider is
    /// a configured single-plugin channel, named once.
    fn check_providers(&self) -> Result<(), ConfigError> {
        for (name, cfg) in &self.channels {
            let field = |f: &str| format!("channels.{name}.{f}");
            match (cfg.plugin.is_empty(), cfg.providers.is_empty()) {
                (true, true) => {
                    return Err(invalid(
                        &field("plugin"),
                        "is missing: name a channel plugin (`plugin = \"aliyun-sms@^1\"`) or provider instances (`providers = [...]`)",
                    ));
                }
                (false, false) => {
                    return Err(invalid(
                        &field("providers"),
                        "cannot be set beside `plugin`: a channel sends through one plugin, or fails over between provider instances that each name their own",
                    ));
                }
                _ => {}
            }
            for (i, provider) in cfg.providers.iter().enumerate() {
                let Some(p) = self.channels.get(provider) else {
                    return Err(invalid(
                        &field("providers"),
                        &format!("names `{provider}`, which is not a configured channel instance"),
                    ));
                };
                if !p.providers.is_empty() {
                    return Err(invalid(
                        &field("providers"),
                        &format!(
                            "names `{provider}`, which has providers of its own: a provider names a `plugin`"
                        ),
                    ));
                }
                if cfg.circuit_failures == 0 {
                    return Err(invalid(&field("circuit_failures"), "must be at least 1"));
                }
                if cfg.providers[..i].contains(provider) {
                    return Err(invalid(
                        &field("providers"),
                        &format!("names `{provider}` twice"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every cap group on its own (`max`, exactly one period).
    fn check_caps(&self) -> Result<(), ConfigError> {
        for (name, cap) in &self.caps {
            cap.check()
                .map_err(|(field, reason)| ConfigError::Invalid {
                    field: format!("caps.{name}.{field}"),
                    reason,
                })?;
        }
        Ok(())
    }

    /// Shards, workers, the lease, replica waits and the plugin limits.
    fn check_workers_and_plugins(&self) -> Result<(), ConfigError> {
        if self.shards == 0 {
            return Err(invalid("shards", "must be at least 1"));
        }
        if self.workers == 0 {
            return Err(invalid("workers", "must be at least 1"));
        }
        if self.dispatch_batch == 0 {
            return Err(invalid("dispatch_batch", "must be at least 1"));
        }
        if self.lease < Duration::from_millis(100) {
            return Err(invalid("lease", "must be at least 100ms"));
        }
        if self.wait_replicas > 0 && self.wait_replicas_timeout < Duration::from_millis(1) {
            // `WAIT n 0` would block an accept for ever.
            return Err(invalid("wait_replicas_timeout", "must be at least 1ms"));
        }
        if self.plugin_limits.fuel < 1_000 {
            return Err(invalid("plugin_limits.fuel", "must be at least 1000"));
        }
        if self.plugin_limits.instances < 4 {
            return Err(invalid("plugin_limits.instances", "must be at least 4"));
        }
        let sends: usize = self
            .channels
            .values()
            .filter(|c| !c.plugin.is_empty())
            .map(|c| c.concurrency)
            .sum();
        let needed = sends.saturating_add(KEY_POLICY_INSTANCES);
        if (self.plugin_limits.instances as usize) < needed {
            return Err(invalid(
                "plugin_limits.instances",
                &format!(
                    "is {}, fewer than the channels may hold at once ({sends}: the sum of their \
                     `concurrency`) plus {KEY_POLICY_INSTANCES} for key policies: set it to at \
                     least {needed}, or lower a channel's `concurrency`",
                    self.plugin_limits.instances
                ),
            ));
        }
        if self.plugin_limits.memory < bytesize::ByteSize::mib(1) {
            return Err(invalid("plugin_limits.memory", "must be at least 1 MiB"));
        }
        Ok(())
    }

    /// The reconciler's pace and limits.
    fn check_reconcile(&self) -> Result<(), ConfigError> {
        let r = &self.reconcile;
        if r.every < Duration::from_millis(10) {
            return Err(invalid("reconcile.every", "must be at least 10ms"));
        }
        if r.max_checks == 0 {
            return Err(invalid("reconcile.max_checks", "must be at least 1"));
        }
        if r.batch == 0 {
            return Err(invalid("reconcile.batch", "must be at least 1"));
        }
        if r.check_timeout < Duration::from_millis(100) {
            return Err(invalid("reconcile.check_timeout", "must be at least 100ms"));
        }
        if r.backoff.factor.is_nan() || r.backoff.factor < 1.0 {
            return Err(invalid("reconcile.backoff.factor", "must be at least 1.0"));
        }
        Ok(())
    }

    /// The HTTP server's limits, the accepted years of `occurred_at` and the
    /// bounds of `send_at`.
    fn check_http_and_events(&self) -> Result<(), ConfigError> {
        if self.http.max_connections == 0 {
            return Err(invalid("http.max_connections", "must be at least 1"));
        }
        if self.http.max_connections_per_client == 0 {
            return Err(invalid(
                "http.max_connections_per_client",
                "must be at least 1",
            ));
        }
        if self.http.max_head_bytes < 8192 {
            return Err(invalid(
                "http.max_head_bytes",
                "must be at least 8192 (hyper's smallest read buffer)",
            ));
        }
        if self.http.header_read_timeout < Duration::from_millis(10) {
            return Err(invalid("http.header_read_timeout", "must be at least 10ms"));
        }
        let years = self.occurred_at_years;
        if !(1970..=9999).contains(&years.from) || !(years.from..=9999).contains(&years.to) {
            return Err(invalid(
                "occurred_at_years",
                "needs 1970 <= from <= to <= 9999",
            ));
        }
        if self.send_at.horizon < Duration::from_secs(1) {
            return Err(invalid("send_at.horizon", "must be at least 1s"));
        }
        Ok(())
    }

    /// The Redis URL, its CA file, the cluster's node URLs, and the
    /// eviction opt-in (it needs the ledger).
    fn check_redis(&self) -> Result<(), ConfigError> {
        if self.allow_evicting_redis && self.ledger().is_none() {
            return Err(invalid(
                "allow_evicting_redis",
                "true needs the delivery ledger (it alone then refuses a key whose permit Redis evicted); ledger_url is \"off\"",
            ));
        }
        if let Some(url) = &self.redis_url {
            let known = ["redis://", "rediss://", "redis+unix://", "unix://"];
            if !known.iter().any(|p| url.starts_with(p)) {
                return Err(invalid(
                    "redis_url",
                    "must start with redis://, rediss://, redis+unix:// or unix://",
                ));
            }
        }
        if self.redis_ca_file.is_some()
            && !self
                .redis_url
                .as_deref()
                .is_some_and(|u| u.starts_with("rediss://"))
        {
            return Err(invalid(
                "redis_ca_file",
                "applies to a rediss:// redis_url only (set redis_url = \"rediss://...\")",
            ));
        }
        if !self.redis_cluster.is_empty() {
            if self.redis_url.is_some() {
                return Err(invalid(
                    "redis_cluster",
                    "set either redis_url (one Redis) or redis_cluster (a Redis Cluster), not both",
                ));
            }
            if let Some(bad) = self
                .redis_cluster
                .iter()
                .find(|u| !u.starts_with("redis://") && !u.starts_with("rediss://"))
            {
                return Err(ConfigError::Invalid {
                    field: "redis_cluster".into(),
                    reason: format!(
                        "`{}`: every node URL must start with redis:// or rediss:// (host:port)",
                        bad.split('@').next_back().unwrap_or_default()
                    ),
                });
            }
        }
        Ok(())
    }
}
