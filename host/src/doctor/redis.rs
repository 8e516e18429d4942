//! Redis as production needs it: reachable, version 7.0 or later, never
//! evicting (the host's own guard, `crate::eviction`), durable the way the
//! configuration asks (AOF, or the replicas `wait_replicas` waits for), and
//! a clock that agrees with this machine's; plus the dispatching instances
//! seen on it (their connections reading the ready streams), which the
//! ledger check weighs.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::FromRedisValue;

use super::{Check, Deployment, Status};
use crate::eviction::{self, EvictionGuard, NOEVICTION};
use crate::permit::Permits;
use crate::store::RedisConn;

/// The oldest Redis the scripts run on (`PEXPIREAT … GT`, listpacks: 7.0).
const MIN_VERSION: (u32, u32) = (7, 0);

/// How long one question to Redis may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// The Redis checks.
pub(super) async fn checks(d: &Deployment<'_>) -> Vec<Check> {
    let permits = match &d.redis {
        Ok(p) => *p,
        Err(e) => {
            return vec![Check::fail(
                "redis.reachable",
                format!("cannot reach Redis: {e}"),
                "start Redis, or correct redis_url / redis_cluster (PUSHONCE_REDIS_URL, PUSHONCE_REDIS_CLUSTER) and its credentials",
            )];
        }
    };
    let conn = permits.connection();
    let started = Instant::now();
    let ping = within(redis::cmd("PING").query_async::<String>(&mut conn.clone())).await;
    if let Err(e) = ping {
        return vec![Check::fail(
            "redis.reachable",
            format!("PING failed: {e}"),
            "start Redis, or correct redis_url / redis_cluster and its credentials",
        )];
    }
    let mut checks = vec![Check::ok(
        "redis.reachable",
        format!("PING answered in {} ms", started.elapsed().as_millis()),
    )];
    checks.push(version(&conn).await);
    checks.push(eviction(d, &conn).await);
    checks.push(durability(d, &conn).await);
    checks.push(clock(&conn).await);
    checks
}

/// Runs a question to Redis (or a guard's check) under [`ANSWER_WITHIN`],
/// its error as text.
async fn within<T, E: std::fmt::Display>(
    question: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(ANSWER_WITHIN, question).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {ANSWER_WITHIN:?}")),
    }
}

/// `INFO <section>` of every Redis behind `conn` (every master of a
/// cluster), as (` at <node>` or empty, text).
async fn info(conn: &RedisConn, section: &str) -> Result<Vec<(String, String)>, String> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg(section);
    let nodes = within(eviction::per_node(conn, &cmd)).await?;
    nodes
        .into_iter()
        .map(|(node, answer)| {
            let value = answer.map_err(|e| format!("INFO {section}{node}: {e}"))?;
            let text = String::from_redis_value(value)
                .map_err(|e| format!("INFO {section}{node}: {e}"))?;
            Ok((node, text))
        })
        .collect()
}

/// The value of `field:` in an `INFO` answer.
pub fn info_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        line.trim()
            .strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

/// `major.minor` of a `redis_version` such as `7.0.15`.
pub fn parse_version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

async fn version(conn: &RedisConn) -> Check {
    let nodes = match info(conn, "server").await {
        Ok(nodes) => nodes,
        Err(e) => {
            return Check::fail(
                "redis.version",
                format!("cannot read INFO server: {e}"),
                "allow the INFO command for pushonce's Redis user",
            );
        }
    };
    let mut found = Vec::new();
    for (node, text) in &nodes {
        let version = info_field(text, "redis_version").unwrap_or("unknown");
        match parse_version(version) {
            Some(v) if v >= MIN_VERSION => found.push(format!("{version}{node}")),
            _ => {
                return Check::fail(
                    "redis.version",
                    format!("Redis{node} is version {version}; the scripts need 7.0 or later"),
                    "upgrade Redis to 7.0 or later",
                );
            }
        }
    }
    Check::ok("redis.version", found.join(", "))
}

/// The host's own eviction guard decides; the policies are shown.
async fn eviction(d: &Deployment<'_>, conn: &RedisConn) -> Check {
    let name = "redis.maxmemory-policy";
    let guard = EvictionGuard {
        allow_evicting: d.config.allow_evicting_redis,
        ledger: d.config.ledger().is_some(),
    };
    if let Err(e) = within(guard.check(conn)).await {
        return Check::from_refusal(Status::Fail, name, &e);
    }
    let policies = match within(eviction::read_policies(conn)).await {
        Ok(p) => p,
        Err(e) => return Check::from_refusal(Status::Fail, name, &e),
    };
    let shown: Vec<String> = policies
        .iter()
        .map(|(node, policy)| format!("{policy}{node}"))
        .collect();
    if policies.iter().any(|(_, p)| p != NOEVICTION) {
        return Check::warn(
            name,
            format!(
                "{} with allow_evicting_redis = true: an evicted permit leaves only the ledger to refuse its key",
                shown.join(", ")
            ),
            "CONFIG SET maxmemory-policy noeviction, then remove allow_evicting_redis",
        );
    }
    Check::ok(name, shown.join(", "))
}

/// AOF on, or the replicas `wait_replicas` waits for, on every master.
async fn durability(d: &Deployment<'_>, conn: &RedisConn) -> Check {
    let name = "redis.durability";
    let (persistence, replication) = match (
        info(conn, "persistence").await,
        info(conn, "replication").await,
    ) {
        (Ok(p), Ok(r)) => (p, r),
        (Err(e), _) | (_, Err(e)) => {
            return Check::fail(
                name,
                format!("cannot read INFO: {e}"),
                "allow the INFO command for pushonce's Redis user",
            );
        }
    };
    let wanted = d.config.wait_replicas;
    let mut found = Vec::new();
    let mut no_aof = Vec::new();
    // A cluster's masters answer each INFO in no fixed order: join by node.
    let replication: std::collections::HashMap<&str, &str> = replication
        .iter()
        .map(|(node, text)| (node.as_str(), text.as_str()))
        .collect();
    for (node, p) in &persistence {
        let Some(r) = replication.get(node.as_str()) else {
            return Check::fail(
                name,
                format!("Redis{node} answered INFO persistence but not INFO replication"),
                "run doctor again once the cluster's topology is stable (CLUSTER NODES)",
            );
        };
        let aof = info_field(p, "aof_enabled") == Some("1");
        let replicas: u32 = info_field(r, "connected_slaves")
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        if replicas < wanted {
            return Check::fail(
                name,
                format!(
                    "wait_replicas = {wanted}, but Redis{node} has {replicas} replica(s) connected: every accept would wait wait_replicas_timeout and be answered 503"
                ),
                format!(
                    "attach {wanted} replica(s) to it (replicaof), or lower wait_replicas to {replicas}"
                ),
            );
        }
        found.push(format!(
            "AOF {}, {replicas} replica(s){node}",
            if aof { "on" } else { "off" }
        ));
        if !aof && replicas == 0 {
            no_aof.push(node.clone());
        }
    }
    if !no_aof.is_empty() {
        let which = if no_aof.iter().all(String::is_empty) {
            "Redis has".to_string()
        } else {
            format!(
                "Redis{} {}",
                no_aof.join(","),
                if no_aof.len() == 1 { "has" } else { "have" }
            )
        };
        return Check::fail(
            name,
            format!(
                "{which} neither AOF nor a replica, so a restart of it loses every permit and every queued task it holds ({})",
                found.join(", ")
            ),
            "CONFIG SET appendonly yes (and appendonly yes in redis.conf), or run replicas and set wait_replicas = 1",
        );
    }
    if wanted == 0
        && persistence
            .iter()
            .any(|(_, p)| info_field(p, "aof_enabled") != Some("1"))
    {
        return Check::warn(
            name,
            format!(
                "{}, wait_replicas = 0: a failover may lose accepts its replica had not received",
                found.join(", ")
            ),
            "set wait_replicas = 1 (accepts then wait for a replica), or turn AOF on",
        );
    }
    Check::ok(
        name,
        format!("{}; wait_replicas = {wanted}", found.join(", ")),
    )
}

/// How far this machine's clock is from Redis's (`TIME`), judged.
async fn clock(conn: &RedisConn) -> Check {
    let sent = Instant::now();
    let time = within(redis::cmd("TIME").query_async::<Vec<String>>(&mut conn.clone())).await;
    let rtt = sent.elapsed();
    let redis_ms = match time.as_deref() {
        Ok([secs, micros]) => secs
            .parse::<i128>()
            .ok()
            .zip(micros.parse::<i128>().ok())
            .map(|(s, us)| s * 1000 + us / 1000),
        _ => None,
    };
    let Some(redis_ms) = redis_ms else {
        return Check::fail(
            "redis.clock",
            format!("TIME answered {time:?}"),
            "allow the TIME command for pushonce's Redis user",
        );
    };
    let local_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i128)
        .unwrap_or(0)
        - (rtt.as_millis() / 2) as i128;
    judge_skew((local_ms - redis_ms) as i64)
}

/// The clock check for a skew of `skew_ms` (this machine minus Redis):
/// leases, due times and windows run on Redis's clock, timeouts on the
/// host's; up to 250 ms is ok, up to 2 s a warning, beyond a failure.
pub fn judge_skew(skew_ms: i64) -> Check {
    let found = format!("this machine's clock is {skew_ms} ms off Redis's TIME");
    let fix = "synchronise this machine's and Redis's clocks (NTP: chrony or systemd-timesyncd)";
    match skew_ms.unsigned_abs() {
        0..=250 => Check::ok("redis.clock", found),
        251..=2000 => Check::warn("redis.clock", found, fix),
        _ => Check::fail(
            "redis.clock",
            format!(
                "{found}: leases and holds measured on Redis's clock outlive or undercut the host's timeouts"
            ),
            fix,
        ),
    }
}

/// The dispatching instances on the Redis: the clients whose last command
/// is `XREADGROUP` (each dispatching host reads the ready streams on a
/// connection of its own, per Redis; on a cluster, the most on any
/// master), by address. API-only instances (`dispatch = false`) read no
/// stream and are not seen.
pub async fn instances_seen(permits: &Permits) -> Result<Vec<String>, String> {
    let mut cmd = redis::cmd("CLIENT");
    cmd.arg("LIST");
    let nodes = within(eviction::per_node(&permits.connection(), &cmd)).await?;
    let mut most = Vec::new();
    for (node, answer) in nodes {
        let value = answer.map_err(|e| format!("CLIENT LIST{node}: {e}"))?;
        let text =
            String::from_redis_value(value).map_err(|e| format!("CLIENT LIST{node}: {e}"))?;
        let readers = stream_readers(&text);
        if readers.len() > most.len() {
            most = readers;
        }
    }
    Ok(most)
}

/// The `addr` of every client in a `CLIENT LIST` answer whose last
/// command is `xreadgroup`, sorted.
pub fn stream_readers(client_list: &str) -> Vec<String> {
    let mut readers: Vec<String> = client_list
        .lines()
        .filter(|line| line.split(' ').any(|field| field == "cmd=xreadgroup"))
        .filter_map(|line| {
            line.split(' ')
                .find_map(|field| field.strip_prefix("addr="))
                .map(String::from)
        })
        .collect();
    readers.sort();
    readers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_and_info_fields_are_read() {
        assert_eq!(parse_version("7.0.15"), Some((7, 0)));
        assert_eq!(parse_version("6.2.14"), Some((6, 2)));
        assert!(parse_version("6.2.14").unwrap() < MIN_VERSION);
        assert_eq!(parse_version("x"), None);
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\n";
        assert_eq!(info_field(info, "connected_slaves"), Some("2"));
        assert_eq!(info_field(info, "connected"), None);
    }

    #[test]
    fn the_stream_readers_are_found_in_client_list() {
        let list = "id=10 addr=127.0.0.1:59216 laddr=127.0.0.1:6392 fd=8 name= flags=N cmd=evalsha user=default\n\
                    id=11 addr=127.0.0.1:59224 laddr=127.0.0.1:6392 fd=9 name= flags=b cmd=xreadgroup user=default\n\
                    id=13 addr=10.0.0.7:40000 laddr=127.0.0.1:6392 fd=9 name= flags=b cmd=xreadgroup user=default\n";
        assert_eq!(stream_readers(list), ["10.0.0.7:40000", "127.0.0.1:59224"]);
    }

    #[test]
    fn a_skewed_clock_warns_then_fails_naming_ntp() {
        assert_eq!(judge_skew(-40).status, Status::Ok);
        assert_eq!(judge_skew(900).status, Status::Warn);
        let far = judge_skew(-5_000);
        assert_eq!(far.status, Status::Fail);
        assert!(far.line().contains("-5000 ms off"), "{}", far.line());
        assert!(far.line().contains("NTP"), "{}", far.line());
    }
}
