//! Refusing an evicting Redis.
//!
//! A permit is a key with a TTL. Under memory pressure a Redis whose
//! `maxmemory-policy` evicts (`volatile-lru`, the default of AWS ElastiCache
//! and GCP Memorystore, or any `allkeys-*` / `volatile-*` policy) drops such
//! keys: the key re-opens and a re-posted event is accepted and sent again.
//! The host therefore reads the policy of every Redis it writes to (every
//! master of a cluster) at start, and `/readyz` reads it on every probe (a
//! reconnect may land on a server configured otherwise); anything but
//! `noeviction` is refused, unless the operator opted in to leaning on the
//! delivery ledger alone (`allow_evicting_redis = true`).
//!
//! The policy comes from `CONFIG GET maxmemory-policy`; where `CONFIG` is
//! renamed or forbidden (managed services), from `INFO memory`'s
//! `maxmemory_policy` line.

use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use redis::{FromRedisValue, Value};

pub use crate::store::NOEVICTION;
use crate::store::RedisConn;

/// Why the Redis in use is refused, or its policy could not be read.
#[derive(Debug, thiserror::Error)]
pub enum EvictionError {
    /// The Redis (a node of the cluster) evicts keys under memory pressure.
    #[error(
        "Redis{node} has maxmemory-policy {policy}: under memory pressure it evicts keys with a \
         TTL, and a permit evicted re-opens its key, so a re-posted event would be accepted and \
         sent twice. Fix: `CONFIG SET maxmemory-policy noeviction` (and `maxmemory-policy \
         noeviction` in redis.conf), or on a managed Redis (ElastiCache, Memorystore) set the \
         parameter group's maxmemory-policy to noeviction. To accept this and lean on the \
         delivery ledger alone, set `allow_evicting_redis = true`."
    )]
    Evicting {
        /// ` at <address>` on a cluster; empty for one Redis.
        node: String,
        /// The policy it reported.
        policy: String,
    },
    /// Neither `CONFIG GET` nor `INFO memory` told the policy.
    #[error(
        "could not read Redis{node}'s maxmemory-policy: CONFIG GET maxmemory-policy answered \
         {config}, and INFO memory has no maxmemory_policy line; pushonce refuses a Redis \
         that may evict its permits"
    )]
    Unreadable {
        /// ` at <address>` on a cluster; empty for one Redis.
        node: String,
        /// What `CONFIG GET` answered (or its error).
        config: String,
    },
    /// The opt-in needs the ledger: without one nothing backs an evicted permit.
    #[error(
        "allow_evicting_redis = true needs the delivery ledger (it is what refuses a key whose \
         permit Redis evicted); ledger_url is \"off\""
    )]
    NoLedger,
    /// Redis could not be asked.
    #[error("reading Redis's maxmemory-policy: {0}")]
    Redis(#[from] redis::RedisError),
}

/// What the host accepts of Redis's eviction policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvictionGuard {
    /// `allow_evicting_redis`: an evicting Redis is warned about, not refused.
    pub allow_evicting: bool,
    /// Whether a delivery ledger backs the permits (the opt-in needs it).
    pub ledger: bool,
}

impl EvictionGuard {
    /// Reads the policy of every Redis behind `conn` and refuses an evicting
    /// one (warns instead when the operator opted in).
    pub async fn check(&self, conn: &RedisConn) -> Result<(), EvictionError> {
        if self.allow_evicting && !self.ledger {
            return Err(EvictionError::NoLedger);
        }
        for (node, policy) in read_policies(conn).await? {
            if policy == NOEVICTION {
                continue;
            }
            let refused = EvictionError::Evicting { node, policy };
            if !self.allow_evicting {
                return Err(refused);
            }
            tracing::warn!("allow_evicting_redis = true: {refused}");
        }
        Ok(())
    }
}

/// The `maxmemory-policy` of every Redis behind `conn`, with ` at <address>`
/// naming the node on a cluster (empty for one Redis).
pub async fn read_policies(conn: &RedisConn) -> Result<Vec<(String, String)>, EvictionError> {
    let mut config_get = redis::cmd("CONFIG");
    config_get.arg("GET").arg("maxmemory-policy");
    let mut info = redis::cmd("INFO");
    info.arg("memory");
    let mut infos = None;
    let mut policies = Vec::new();
    for (node, answer) in per_node(conn, &config_get).await? {
        let policy = match answer.as_ref().ok().and_then(config_value) {
            Some(policy) => policy,
            None => {
                if infos.is_none() {
                    infos = Some(per_node(conn, &info).await?);
                }
                let from_info = infos.iter().flatten().find(|(n, _)| *n == node);
                from_info
                    .and_then(|(_, v)| v.as_ref().ok())
                    .and_then(|v| String::from_redis_value(v.clone()).ok())
                    .and_then(|text| policy_from_info(&text))
                    .ok_or_else(|| EvictionError::Unreadable {
                        node: node.clone(),
                        config: match &answer {
                            Ok(v) => format!("{v:?}"),
                            Err(e) => e.to_string(),
                        },
                    })?
            }
        };
        policies.push((node, policy));
    }
    Ok(policies)
}

/// `cmd`'s answer from every Redis behind `conn`: one Redis (node name
/// empty), or every master of a cluster (` at <address>`). A node's error
/// answer is its entry's `Err`; failing to reach Redis at all is the outer one.
pub(crate) async fn per_node(
    conn: &RedisConn,
    cmd: &redis::Cmd,
) -> Result<Vec<(String, redis::RedisResult<Value>)>, redis::RedisError> {
    match conn {
        RedisConn::Single(c) => {
            let answer = cmd.query_async::<Value>(&mut c.clone()).await;
            match answer {
                Err(e) if e.code().is_none() => Err(e),
                answer => Ok(vec![(String::new(), answer)]),
            }
        }
        RedisConn::Cluster(c) => {
            let masters = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            let answer = c.conn().route_command(cmd.clone(), masters).await?;
            let Value::Map(nodes) = answer else {
                return Ok(vec![(String::new(), Ok(answer))]);
            };
            Ok(nodes
                .into_iter()
                .map(|(node, value)| {
                    let node = String::from_redis_value(node).unwrap_or_default();
                    let value = match value {
                        Value::ServerError(e) => Err(e.into()),
                        v => Ok(v),
                    };
                    (format!(" at {node}"), value)
                })
                .collect())
        }
    }
}

/// The value in a `CONFIG GET <name>` answer for one parameter (here
/// `maxmemory-policy`): a flat `[name, value]` array (RESP2) or a map
/// (RESP3); `None` when empty (the parameter hidden) or of another shape.
pub fn config_value(answer: &Value) -> Option<String> {
    let value = match answer {
        Value::Array(items) if items.len() == 2 => &items[1],
        Value::Map(pairs) if pairs.len() == 1 => &pairs[0].1,
        _ => return None,
    };
    String::from_redis_value(value.clone())
        .ok()
        .filter(|p| !p.is_empty())
}

/// The `maxmemory_policy:` line of an `INFO memory` answer.
pub fn policy_from_info(info: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix("maxmemory_policy:"))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
}

/// Whether a Redis error is its out-of-memory refusal (`OOM command not
/// allowed when used memory > 'maxmemory'`), alone or in a pipeline's
/// failures: memory is full and the policy is `noeviction`, so a write is
/// refused rather than a key dropped.
pub fn is_out_of_memory(e: &redis::RedisError) -> bool {
    e.code() == Some("OOM")
        || e.clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, error)| error.code() == "OOM"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn the_policy_is_read_from_a_config_get_answer() {
        let resp2 = Value::Array(vec![bulk("maxmemory-policy"), bulk("volatile-lru")]);
        assert_eq!(config_value(&resp2).as_deref(), Some("volatile-lru"));
        let resp3 = Value::Map(vec![(bulk("maxmemory-policy"), bulk("noeviction"))]);
        assert_eq!(config_value(&resp3).as_deref(), Some("noeviction"));
        assert_eq!(config_value(&Value::Array(vec![])), None);
        assert_eq!(config_value(&Value::Nil), None);
    }

    #[test]
    fn the_policy_is_read_from_info_memory() {
        let info = "# Memory\r\nused_memory:1043392\r\nmaxmemory:67108864\r\n\
                    maxmemory_human:64.00M\r\nmaxmemory_policy:allkeys-lru\r\n\
                    allocator_frag_ratio:1.10\r\n";
        assert_eq!(policy_from_info(info).as_deref(), Some("allkeys-lru"));
        assert_eq!(policy_from_info("# Memory\r\nused_memory:1\r\n"), None);
        assert_eq!(policy_from_info("maxmemory_policy:\r\n"), None);
    }

    #[test]
    fn an_oom_answer_is_recognised() {
        let server_error = |text: &[u8]| -> redis::RedisError {
            match redis::parse_redis_value(text).unwrap() {
                Value::ServerError(e) => e.into(),
                other => panic!("not an error: {other:?}"),
            }
        };
        let oom = server_error(b"-OOM command not allowed when used memory > 'maxmemory'.\r\n");
        assert!(is_out_of_memory(&oom));
        assert!(!is_out_of_memory(&server_error(
            b"-ERR unknown command\r\n"
        )));
    }

    #[test]
    fn the_refusal_names_the_policy_why_and_the_fix() {
        let e = EvictionError::Evicting {
            node: String::new(),
            policy: "volatile-lru".into(),
        };
        let text = e.to_string();
        for part in [
            "maxmemory-policy volatile-lru",
            "permit evicted re-opens its key",
            "CONFIG SET maxmemory-policy noeviction",
            "parameter group",
            "allow_evicting_redis",
        ] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
    }
}
