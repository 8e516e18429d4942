//! Redis's own cost, read from the server: its CPU time (`INFO cpu`) over a
//! run, and the time per call of each command (`INFO commandstats`,
//! `usec_per_call`), including the commands a script calls. The profile
//! of the accept script is built from these: what each of its writes
//! costs, and what the Lua around them costs.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use pushonce::permit::Permits;
use pushonce::store::RedisConn;

use super::super::permit;

/// Per command: calls and µs in all (`INFO commandstats`).
pub(super) type Stats = BTreeMap<String, (u64, f64)>;

/// Redis's CPU time so far (user + system, all its threads), seconds.
pub(super) async fn cpu_s(conn: &mut RedisConn) -> anyhow::Result<f64> {
    let user: f64 = permit::info_field(conn, "cpu", "used_cpu_user")
        .await?
        .parse()?;
    let sys: f64 = permit::info_field(conn, "cpu", "used_cpu_sys")
        .await?
        .parse()?;
    Ok(user + sys)
}

/// Per command since the last `CONFIG RESETSTAT`: calls and µs in all.
pub(super) async fn command_stats(conn: &mut RedisConn) -> anyhow::Result<Stats> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    Ok(info
        .lines()
        .filter_map(|l| {
            let (name, fields) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
            };
            Some((
                name.to_string(),
                (field("calls")?.parse().ok()?, field("usec")?.parse().ok()?),
            ))
        })
        .collect())
}

/// Forgets the command statistics (`CONFIG RESETSTAT`).
pub(super) async fn reset(conn: &mut RedisConn) -> anyhow::Result<()> {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(conn)
        .await?;
    Ok(())
}

/// One line of the profile: Redis's µs per call of a script (or of a
/// command inside the accept script), per accepted channel.
pub(super) struct ProfileLine {
    /// What was called.
    pub what: String,
    /// µs per call, Redis's own time (`usec_per_call`).
    pub usec: f64,
}

/// A script run under `redis-benchmark` (c = `c`, `n` calls) on an empty
/// Redis, its Redis time per call from `INFO commandstats`, and every
/// command it called. Emptied first so that no run pays for the keys of
/// the ones before (a larger keyspace, an AOF rewrite in the background).
pub(super) async fn script_time(
    conn: &mut RedisConn,
    url: &str,
    n: usize,
    c: usize,
    command: &[String],
) -> anyhow::Result<(f64, Stats)> {
    redis::cmd("FLUSHALL")
        .query_async::<()>(conn)
        .await
        .context("emptying Redis before a profile run (FLUSHALL)")?;
    fresh_aof(conn).await?;
    reset(conn).await?;
    permit::run_redis_benchmark(url, n, c, command)?;
    let stats = command_stats(conn).await?;
    let script = ["evalsha", "eval"]
        .iter()
        .filter_map(|name| stats.get(*name))
        .find(|(calls, _)| *calls > 0)
        .map(|(calls, usec)| usec / *calls as f64)
        .unwrap_or(f64::NAN);
    Ok((script, stats))
}

/// Rewrites the AOF and waits for the rewrite to end, so that no automatic
/// rewrite (a fork and a child writing the whole dataset) starts during the
/// next run: the runs before grew the file.
/// One the runs before started is waited for first.
pub(super) async fn fresh_aof(conn: &mut RedisConn) -> anyhow::Result<()> {
    no_rewrite(conn).await?;
    let _: redis::Value = redis::cmd("BGREWRITEAOF")
        .query_async(conn)
        .await
        .context("rewriting the AOF before a profile run (BGREWRITEAOF)")?;
    no_rewrite(conn).await
}

/// Waits (60 s at most) until no AOF rewrite runs or is scheduled.
async fn no_rewrite(conn: &mut RedisConn) -> anyhow::Result<()> {
    let fields = ["aof_rewrite_in_progress", "aof_rewrite_scheduled"];
    let what = "an AOF rewrite to end (before a profile run)";
    until_zero(conn, "persistence", &fields, Duration::from_secs(60), what).await
}

/// Waits until each of `fields` of `INFO <section>` reads 0, for at most
/// `deadline`; the error names what it waited for and the values last read.
pub(super) async fn until_zero(
    conn: &mut RedisConn,
    section: &str,
    fields: &[&str],
    deadline: Duration,
    what: &str,
) -> anyhow::Result<()> {
    let end = std::time::Instant::now() + deadline;
    loop {
        let mut last = Vec::with_capacity(fields.len());
        for field in fields {
            last.push(format!(
                "{field}={}",
                permit::info_field(conn, section, field).await?
            ));
        }
        if last.iter().all(|kv| kv.ends_with("=0")) {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < end,
            "waited {deadline:?} for {what}: still {}",
            last.join(", ")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many times each profile row runs; its median is shown.
const ROUNDS: usize = 3;

/// The accept script's profile at concurrency `c`: the host's accept.lua
/// as it calls it, broken down by the commands it calls, for one
/// 4-channel event, and next to scripts that do only the writes the
/// invariants of `docs/redis.md` need (a permit `SET NX PX`, a queue
/// entry, a task record). Each row is the median of [`ROUNDS`] runs taken
/// in turn, so a disturbance of the machine moves one run, not a row.
pub(super) async fn accept_profile(
    conn: &mut RedisConn,
    url: &str,
    n: usize,
    c: usize,
    permits: &Permits,
) -> anyhow::Result<Vec<ProfileLine>> {
    let mut commands = vec![
        permit::accept_command(permits),
        permit::event_accept_command(permits, 4),
    ];
    commands.extend(MINIMAL.iter().map(|(_, body, k)| minimal_command(body, *k)));
    commands.push(minimal_event_command(4));
    commands.push(permits_command(1));
    commands.push(permits_command(4));
    let mut runs: Vec<Vec<(f64, Stats)>> = vec![Vec::new(); commands.len()];
    for _ in 0..ROUNDS {
        for (command, row) in commands.iter().zip(runs.iter_mut()) {
            row.push(script_time(conn, url, n, c, command).await?);
        }
    }
    for row in runs.iter_mut() {
        row.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let median = |i: usize| &runs[i][ROUNDS / 2];
    let (accept, stats) = median(0);
    let mut lines = vec![ProfileLine {
        what: "accept.lua as the host calls it (EVALSHA, all of it)".into(),
        usec: *accept,
    }];
    lines.extend(breakdown(stats, n, *accept));
    lines.push(ProfileLine {
        what: format!(
            "accept.lua, one 4-channel event (one call; {:.2}× the 1-channel call)",
            median(1).0 / accept
        ),
        usec: median(1).0,
    });
    for (i, (what, _, _)) in MINIMAL.iter().enumerate() {
        lines.push(ProfileLine {
            what: (*what).into(),
            usec: median(2 + i).0,
        });
    }
    let ratio = |first: usize, what: &dyn Fn(f64, f64) -> String| {
        let (one, four) = (median(first).0, median(first + 1).0);
        ProfileLine {
            what: what(one, four),
            usec: four,
        }
    };
    lines.push(ratio(1 + MINIMAL.len(), &|one, four| {
        format!(
            "the same for one 4-channel event, one call ({:.2}× the 1-channel call)",
            four / one
        )
    }));
    lines.push(ratio(3 + MINIMAL.len(), &|one, four| {
        format!(
            "the permits alone (SET NX PX each), one call: 4 of them {:.2}× 1 ({one:.2} µs for 1)",
            four / one
        )
    }));
    Ok(lines)
}

/// The commands an accept run called (each at least once per 100
/// accepts), µs per accept, and what is left of `total` for Lua.
fn breakdown(stats: &Stats, n: usize, total: f64) -> Vec<ProfileLine> {
    let mut lines = Vec::new();
    let mut inner = 0.0;
    for (name, (calls, usec)) in stats {
        if ["evalsha", "eval"].contains(&name.as_str()) || *calls * 100 < n as u64 {
            // The script itself, and what the benchmark's own set-up called.
            continue;
        }
        let per = usec / n as f64;
        inner += per;
        lines.push(ProfileLine {
            what: format!(
                "  of which {} ({:.2} calls per accept)",
                name.to_uppercase(),
                *calls as f64 / n as f64
            ),
            usec: per,
        });
    }
    lines.push(ProfileLine {
        what: "  of which Lua, arguments, and each call's own overhead (the rest)".into(),
        usec: total - inner,
    });
    lines
}

/// Scripts with only the writes every accept needs, one more each.
const MINIMAL: &[(&str, &str, usize)] = &[
    (
        "EVAL SET NX PX only (the floor)",
        "return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
        1,
    ),
    (
        "EVAL SET NX PX + XADD (permit + queue entry)",
        "redis.call('XADD', KEYS[2], '*', 'task', ARGV[1], 'key', KEYS[1]) \
         return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
        2,
    ),
    (
        "EVAL SET NX PX + XADD + HSET of 3 fields (+ a task record)",
        "redis.call('HSET', KEYS[3], 'status', 'queued', 'key', KEYS[1], 'body', ARGV[3]) \
         redis.call('XADD', KEYS[2], '*', 'task', ARGV[1], 'key', KEYS[1]) \
         return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
        3,
    ),
];

/// `EVAL <body>` with a unique permit key, the ready stream, a unique task
/// key, and a body of the size of an accept's event, payload and spec.
fn minimal_command(body: &str, nkeys: usize) -> Vec<String> {
    let keys = [
        "{benchm:3}:permit:push:per-event@1:sms:ORDER_SHIPPED:o-__rand_int__:u-1",
        "{benchm:3}:ready",
        "{benchm:3}:task:3-0-__rand_int__",
    ];
    let mut command = vec!["EVAL".to_string(), body.to_string(), nkeys.to_string()];
    command.extend(keys[..nkeys].iter().map(|k| k.to_string()));
    command.extend(["3-0-__rand_int__".to_string(), "86400000".to_string()]);
    if nkeys == 3 {
        command.push("x".repeat(400));
    }
    command
}

/// The last [`MINIMAL`] script for one event on `channels` channels in one
/// call: per channel a unique permit `SET NX PX` and a task record of three
/// fields (the 1-channel call's 400-byte body split over them), and one
/// queue entry naming them all — the writes no layout with a permit and a
/// task per channel can leave out (layout 6 writes one queue entry per
/// event). Its ratio to the 1-channel call is what those writes alone cost
/// against one call's own overhead; more work per call (an event record)
/// lowers it, more per channel raises it.
fn minimal_event_command(channels: usize) -> Vec<String> {
    let body = "local ids = {} \
         for i = 0, #ARGV / 3 - 1 do \
         redis.call('HSET', KEYS[3 * i + 3], 'status', 'queued', 'key', KEYS[3 * i + 1], 'body', ARGV[3 * i + 3]) \
         redis.call('SET', KEYS[3 * i + 1], ARGV[3 * i + 1], 'NX', 'PX', ARGV[3 * i + 2]) \
         ids[#ids + 1] = ARGV[3 * i + 1] end \
         redis.call('XADD', KEYS[2], '*', 'task', table.concat(ids, ' '))";
    let mut command = vec![
        "EVAL".to_string(),
        body.to_string(),
        (3 * channels).to_string(),
    ];
    for c in 0..channels {
        command.extend([
            format!("{{benchm:3}}:permit:push:per-event@1:c{c}:ORDER_SHIPPED:o-__rand_int__:u-1"),
            "{benchm:3}:ready".to_string(),
            format!("{{benchm:3}}:task:3-{c}-__rand_int__"),
        ]);
    }
    for c in 0..channels {
        command.extend([
            format!("3-{c}-__rand_int__"),
            "86400000".to_string(),
            "x".repeat(400 / channels.max(1)),
        ]);
    }
    command
}

/// One call that takes `channels` unique permits and nothing else: what
/// target 3's ratio is bounded by while each channel's key has a permit
/// of its own (a key names one permit, and an event's channels name
/// different keys). Its ratio to the 1-permit call is a floor no layout
/// goes below; only more fixed work per call (the 1-channel event's
/// record, its queue entry) brings a whole accept's ratio under it.
fn permits_command(channels: usize) -> Vec<String> {
    let body = "for i = 1, #KEYS do \
         redis.call('SET', KEYS[i], ARGV[1], 'NX', 'PX', ARGV[2]) end \
         return #KEYS";
    let mut command = vec!["EVAL".to_string(), body.to_string(), channels.to_string()];
    command.extend((0..channels).map(|c| {
        format!("{{benchm:3}}:permit:push:per-event@1:c{c}:ORDER_SHIPPED:o-__rand_int__:u-1")
    }));
    command.extend(["3-0-__rand_int__".to_string(), "86400000".to_string()]);
    command
}

/// Prints the profile as a table (or why it is missing).
pub(super) fn print_profile(profile: &anyhow::Result<Vec<ProfileLine>>) {
    println!(
        "accept.lua profile: Redis's own µs per call (INFO commandstats usec_per_call), redis-benchmark -c 64 -P 1, each key unique; each row the median of 3 runs, each on an emptied Redis with a rewritten AOF"
    );
    match profile {
        Ok(lines) => {
            let rows: Vec<[String; 2]> = lines
                .iter()
                .map(|l| [l.what.clone(), format!("{:.2}", l.usec)])
                .collect();
            pushonce::cli::output::print_table(&["SCRIPT OR COMMAND", "µS PER ACCEPT"], &rows);
        }
        Err(e) => println!("  FAILED: {e:#}"),
    }
}

/// One command's share of a delivery run.
pub(super) struct CommandCost {
    /// The command, upper case (`EVALSHA`, `HSET`, …).
    pub name: String,
    /// Calls per delivered message.
    pub calls: f64,
    /// Redis's µs per delivered message.
    pub usec: f64,
}

/// Redis's commands over a delivery run (from `CONFIG RESETSTAT` before it).
pub(super) struct PerMessage {
    /// The commands, the costliest first.
    pub commands: Vec<CommandCost>,
    /// Messages delivered in the run.
    pub messages: usize,
}

impl PerMessage {
    /// From the command statistics of a run that delivered `messages`.
    pub fn of(stats: &Stats, messages: usize) -> PerMessage {
        let n = messages.max(1) as f64;
        let mut commands: Vec<CommandCost> = stats
            .iter()
            .map(|(name, (calls, usec))| CommandCost {
                name: name.to_uppercase(),
                calls: *calls as f64 / n,
                usec: usec / n,
            })
            .filter(|c| c.usec >= 0.05)
            .collect();
        commands.sort_by(|a, b| b.usec.total_cmp(&a.usec));
        PerMessage { commands, messages }
    }

    /// Prints what Redis did per message of `what` (a run's name).
    pub fn print(&self, what: &str) {
        println!(
            "Redis per message, {what} ({} messages; INFO commandstats; a script's commands are also counted on their own lines)",
            self.messages
        );
        let table: Vec<[String; 3]> = self
            .commands
            .iter()
            .map(|c| {
                [
                    c.name.clone(),
                    format!("{:.2}", c.calls),
                    format!("{:.2}", c.usec),
                ]
            })
            .collect();
        pushonce::cli::output::print_table(&["COMMAND", "CALLS PER MSG", "µS PER MSG"], &table);
        println!();
    }
}
