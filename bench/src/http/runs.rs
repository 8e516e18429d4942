//! The HTTP runs of one phase against one host: throughput per kind of event
//! and concurrency, permit latency paced at half of the peak, and (while
//! dispatching) end to end from the post to the simulator. Each run is one
//! table line; a run that fails becomes a line with its error.

use std::time::Duration;

use anyhow::Context;

use super::report::Line;
use super::stack::{BenchStack, FOUR, ONE};
use super::{Args, Floors};
use crate::load::Report;
use crate::permit::memory_usage;
use pushonce::permit::{Layout, PermitConfig};
use pushonce_tests::stack::ServeProcess;

/// One run of the load generator.
struct LoadSpec<'a> {
    /// `(biz_type, channels)` of the events.
    kind: (&'a str, &'a str),
    /// Concurrent connections.
    c: usize,
    /// Most requests.
    requests: usize,
    /// Longest run.
    duration: Duration,
    /// Every event posted twice.
    dup: bool,
    /// Unique per run (biz ids).
    tag: String,
    /// Requests per second (0: as fast as answered).
    rate: f64,
}

/// One phase's runs against `host`.
pub(super) struct PhaseRuns<'a> {
    /// The options.
    pub args: &'a Args,
    /// Redis and the simulator.
    pub stack: &'a BenchStack,
    /// The floors the rates are compared with.
    pub floors: &'a Floors,
    /// The host under test.
    pub host: &'a ServeProcess,
    /// Whether the host dispatches (its backlog is delivered between runs).
    pub dispatch: bool,
    /// Messages the simulator should have once the backlog is delivered.
    pub expected: u64,
    /// Redis memory of the delivered messages of the 1-channel end-to-end run.
    pub delivered_memory: Option<DeliveredMemory>,
    /// Redis's commands per delivered message over that run.
    pub redis_per_message: Option<super::cost::PerMessage>,
    /// Redis's commands per accepted event of each API-only run without
    /// duplicates, by the run's name.
    pub api_commands: Vec<(String, super::cost::PerMessage)>,
}

/// Redis memory a delivered message keeps once it ended (its delivery
/// receipt came back and the delivery ledger holds it).
pub(super) struct DeliveredMemory {
    /// `used_memory` grown over the run, its delivery and its receipts, per
    /// message, bytes (what its messages keep and whatever the dispatch left,
    /// e.g. the ready stream's internal nodes).
    pub per_message: f64,
    /// Mean `MEMORY USAGE` of one delivered message's permit, bytes.
    pub permit: f64,
    /// What one such permit costs Redis in `used_memory`, bytes: the
    /// expiry dictionary's entry and both dictionaries' slots, which
    /// `MEMORY USAGE` leaves out, included ([`permit_cost`]).
    pub permit_cost: f64,
    /// Mean `MEMORY USAGE` of its task record, bytes (0 once it left Redis).
    pub task: f64,
    /// Mean `MEMORY USAGE` of its event record (the event index), bytes (0 once it left).
    pub index: f64,
    /// How many messages the means are over.
    pub sampled: usize,
    /// How many of those still had their task record in Redis.
    pub in_redis: usize,
    /// Keys of other kinds in Redis after the run (all runs so far): provider-id
    /// index entries and receipts that came before their send was recorded.
    pub others: Vec<(&'static str, usize)>,
    /// How `used_memory` grew over the run, split (`INFO memory`, keys by kind).
    pub growth: String,
}

impl DeliveredMemory {
    /// The permits of the first 100 events of 1-channel run `tag`: their
    /// keys as the `per-event` policy derives them (`biz_id` `<tag>-<n>`,
    /// user `u<n>`, the load generator's events), named in the host's
    /// layout (permits are named by the key's digest, so a scan cannot
    /// find them by the run's tag).
    fn sample_permits(tag: &str) -> Vec<String> {
        let layout = Layout::new(PermitConfig::default().namespace, super::stack::SHARDS);
        (0..100)
            .map(|n| {
                let user = format!("u{n}");
                let key = format!(
                    "push:per-event@1:sms:{}:{tag}-{n}:{user}",
                    super::stack::ONE.0
                );
                layout.permit(&key, Some(&user))
            })
            .collect()
    }

    /// The task records of run `tag`'s sampled permits still in Redis.
    async fn tasks_left(conn: &mut pushonce::store::RedisConn, tag: &str) -> anyhow::Result<usize> {
        let layout = Layout::new(PermitConfig::default().namespace, 1);
        let mut left = 0;
        for key in Self::sample_permits(tag) {
            let id: Option<String> = redis::cmd("GET").arg(&key).query_async(conn).await?;
            if let Some(task_key) = id.and_then(|id| layout.task(&id)) {
                let n: i64 = redis::cmd("EXISTS").arg(task_key).query_async(conn).await?;
                left += usize::from(n == 1);
            }
        }
        Ok(left)
    }

    /// Reads the sampled permits of run `tag` still held, and their task records
    /// and event records while Redis still has them.
    async fn measure(
        conn: &mut pushonce::store::RedisConn,
        url: &str,
        tag: &str,
        grown: f64,
        messages: usize,
    ) -> anyhow::Result<DeliveredMemory> {
        let mut permits = Vec::new();
        for key in Self::sample_permits(tag) {
            let exists: bool = redis::cmd("EXISTS").arg(&key).query_async(conn).await?;
            if exists {
                permits.push(key);
            }
        }
        // The host's layout: the default namespace (the shard is read from a task id).
        let layout = Layout::new(PermitConfig::default().namespace, 1);
        let (mut permit, mut task, mut index, mut in_redis) = (0, 0, 0, 0);
        for key in &permits {
            permit += memory_usage(conn, key).await?;
            let id: Option<String> = redis::cmd("GET").arg(key).query_async(conn).await?;
            let Some(task_key) = id.and_then(|id| layout.task(&id)) else {
                continue;
            };
            let bytes = memory_usage(conn, &task_key).await?;
            in_redis += usize::from(bytes > 0);
            task += bytes;
            // Layout 5: the task names its event's record (`ev`: `<n>:<name>`).
            let ev: Option<String> = redis::cmd("HGET")
                .arg(&task_key)
                .arg("ev")
                .query_async(conn)
                .await?;
            let named = ev.as_deref().and_then(|ev| ev.split_once(':'));
            if let (Some((_, name)), Some(tag)) = (named, task_key.split_once("}:")) {
                index += memory_usage(conn, &format!("{}}}:event:{name}", tag.0)).await?;
            }
        }
        let n = permits.len().max(1) as f64;
        let permit_cost = match permits.first() {
            Some(key) => permit_cost(conn, url, key).await?,
            None => 0.0,
        };
        let mut others = Vec::new();
        for (kind, pattern) in [("pmid", "*:pmid:*"), ("unmatched", "*:unmatched:*")] {
            others.push((
                kind,
                crate::permit::scan_keys(conn, pattern, usize::MAX)
                    .await?
                    .len(),
            ));
        }
        Ok(DeliveredMemory {
            per_message: grown / messages.max(1) as f64,
            permit: permit as f64 / n,
            permit_cost,
            task: task as f64 / n,
            index: index as f64 / n,
            sampled: permits.len(),
            in_redis,
            others,
            growth: String::new(),
        })
    }

    /// What a message keeps in Redis after it ended, bytes: its permit (in
    /// `used_memory`), and its task record and event record if they stayed.
    pub fn kept(&self) -> f64 {
        self.permit_cost + self.task + self.index
    }
}

/// How many copies [`permit_cost`] writes.
const COPIES: usize = 20_000;

/// `used_memory` per permit shaped like `sample` (its value and expiry, a
/// name of the same length), over [`COPIES`] copies written into database
/// 1 of the Redis at `url` (empty, so its dictionaries grow as a fresh
/// Redis's would) and then deleted: what each permit a delivered message
/// keeps costs Redis, which `MEMORY USAGE` understates.
async fn permit_cost(
    conn: &mut pushonce::store::RedisConn,
    url: &str,
    sample: &str,
) -> anyhow::Result<f64> {
    use redis::IntoConnectionInfo;
    let value: Option<String> = redis::cmd("GET").arg(sample).query_async(conn).await?;
    let ttl: i64 = redis::cmd("PTTL").arg(sample).query_async(conn).await?;
    let (Some(value), true) = (value, ttl > 0) else {
        return Ok(0.0);
    };
    // The name's tail is its digest: copies keep its length with another
    // hex tail (`c` and a counter, padded).
    let head = sample.rfind(':').map_or(sample, |i| &sample[..=i]);
    let digits = sample.len() - head.len();
    let names: Vec<String> = (0..COPIES)
        .map(|i| format!("{head}c{i:0>width$x}", width = digits.saturating_sub(1)))
        .collect();
    let info = url.into_connection_info()?;
    let settings = info.redis_settings().clone().set_db(1);
    let client = redis::Client::open(info.set_redis_settings(settings))?;
    let mut db1 = client.get_multiplexed_async_connection().await?;
    let before = crate::permit::used_memory(conn).await?;
    for chunk in names.chunks(1000) {
        let mut pipe = redis::pipe();
        for name in chunk {
            pipe.cmd("SET")
                .arg(name)
                .arg(&value)
                .arg("PX")
                .arg(ttl)
                .ignore();
        }
        pipe.query_async::<()>(&mut db1).await?;
    }
    let after = crate::permit::used_memory(conn).await?;
    redis::cmd("FLUSHDB").query_async::<()>(&mut db1).await?;
    Ok(after.saturating_sub(before) as f64 / COPIES as f64)
}

/// CPU time Redis and the host process had used at one moment, s.
#[derive(Clone, Copy)]
struct CpuMark {
    redis: f64,
    host: f64,
}

impl CpuMark {
    /// Redis's and the host's CPU time from this mark to `now`, µs per
    /// accepted message.
    fn per_message(self, now: CpuMark, accepted: usize) -> (f64, f64) {
        (
            per_message_us(now.redis - self.redis, accepted),
            per_message_us(now.host - self.host, accepted),
        )
    }
}

/// CPU seconds over a run as µs per accepted message (NaN when unknown).
fn per_message_us(cpu_s: f64, accepted: usize) -> f64 {
    if accepted == 0 {
        return f64::NAN;
    }
    cpu_s * 1e6 / accepted as f64
}

impl PhaseRuns<'_> {
    /// Every run of the phase, as table lines.
    pub async fn lines(&mut self) -> Vec<Line> {
        let mut lines = Vec::new();
        let peak_one = self.throughput(&mut lines).await;
        self.paced(peak_one, &mut lines).await;
        if self.dispatch {
            for kind in [("1 channel", ONE, 1), ("4 channels", FOUR, 4)] {
                let what = format!("end to end {}: post → simulator, messages/s", kind.0);
                let line = self.end_to_end(&what, kind.1, kind.2).await;
                lines.push(line.unwrap_or_else(|e| Line::failed(what, 16, &e)));
            }
        }
        lines
    }

    /// `" API only,"` or nothing.
    fn label(&self) -> &'static str {
        if self.dispatch { "" } else { "API only, " }
    }

    /// Accepted events/s per kind and concurrency; returns the 1-channel peak.
    async fn throughput(&mut self, lines: &mut Vec<Line>) -> f64 {
        let mut kinds = vec![("1 channel", ONE, false), ("4 channels", FOUR, false)];
        if !self.args.no_dup && !self.dispatch {
            kinds.push(("1 channel, half dup", ONE, true));
            kinds.push(("4 channels, half dup", FOUR, true));
        }
        let mut peak_one: f64 = 0.0;
        for (i, (label, kind, dup)) in kinds.into_iter().enumerate() {
            for &c in &self.args.concurrency {
                let what = format!("HTTP /v1/events {label}, {}accepted events/s", self.label());
                let spec = LoadSpec {
                    kind,
                    c,
                    requests: self.args.requests,
                    duration: self.args.duration,
                    dup,
                    tag: format!("{}h{i}c{c}", self.phase_tag()),
                    rate: 0.0,
                };
                match self.throughput_run(what.clone(), &spec).await {
                    Ok(line) => {
                        if !dup && kind == ONE {
                            peak_one = peak_one.max(line.rate);
                        }
                        lines.push(line);
                    }
                    Err(e) => lines.push(Line::failed(what, c, &e)),
                }
            }
        }
        peak_one
    }

    /// One throughput run, then (dispatching) its backlog delivered.
    async fn throughput_run(&mut self, what: String, spec: &LoadSpec<'_>) -> anyhow::Result<Line> {
        let mut conn = self.stack.conn.clone();
        let profile = !self.dispatch && !spec.dup;
        let mut memory = None;
        if profile {
            // Read before the reset: CONFIG RESETSTAT frees Redis's
            // per-command latency histograms (about 27 KB each), which the
            // run then allocates again.
            memory = Some(crate::permit::used_memory(&mut conn).await?);
            super::cost::reset(&mut conn).await?;
        }
        let mark = self.cpu().await;
        let r = self.load(spec).await?;
        let (redis_us, host_us) = mark.per_message(self.cpu().await, r.accepted);
        // API only, every message stays open: what one open message costs
        // when it came over HTTP (the host's own permit layer wrote it).
        let open_bytes = match memory {
            Some(before) => {
                let after = crate::permit::used_memory(&mut conn).await?;
                Some((after as f64 - before as f64) / r.accepted.max(1) as f64)
            }
            None => None,
        };
        if profile {
            let stats = super::cost::command_stats(&mut conn).await?;
            self.api_commands.push((
                format!("{what}, c={}", spec.c),
                super::cost::PerMessage::of(&stats, r.ok),
            ));
        }
        let events = if spec.dup { r.ok / 2 } else { r.ok };
        eprintln!(
            "{what} c={}: {:.0} req/s, {} accepted, {} duplicate, {} errors",
            spec.c, r.rps, r.accepted, r.duplicates, r.errors
        );
        let mut note = format!("{:.0} req/s, {} errors", r.rps, r.errors);
        if let Some(bytes) = open_bytes {
            note.push_str(&format!(
                ", Redis {bytes:.0} bytes per open message (used_memory delta / accepted)"
            ));
        }
        if spec.dup {
            note.push_str(&format!(", {} dup answers", r.duplicates));
        }
        if !self.deliver_backlog(&r).await {
            note.push_str(", backlog NOT delivered in time");
        }
        Ok(Line {
            what,
            c: spec.c,
            rate: events as f64 / r.elapsed_s,
            p50: r.p50_ms,
            p99: r.p99_ms,
            p999: r.p999_ms,
            floor: self.floors.at(spec.c),
            redis_us,
            host_us,
            note,
        })
    }

    /// Permit latency at half of the 1-channel peak (paced load, 64 connections).
    async fn paced(&mut self, peak_one: f64, lines: &mut Vec<Line>) {
        let what = format!(
            "HTTP 1 channel, {}paced at half peak, events/s",
            self.label()
        );
        let half = (peak_one / 2.0).max(1.0);
        let spec = LoadSpec {
            kind: ONE,
            c: 64,
            requests: self.args.requests,
            duration: self.args.duration,
            dup: false,
            tag: format!("{}half", self.phase_tag()),
            rate: half,
        };
        match self.paced_run(what.clone(), &spec).await {
            Ok(two) => lines.extend(two),
            Err(e) => lines.push(Line::failed(what, 64, &e)),
        }
    }

    /// The paced run and its permit pipeline's latency from the host's histogram.
    async fn paced_run(&mut self, what: String, spec: &LoadSpec<'_>) -> anyhow::Result<[Line; 2]> {
        let before = self.permit_buckets().await?;
        let mark = self.cpu().await;
        let r = self.load(spec).await?;
        let (redis_us, host_us) = mark.per_message(self.cpu().await, r.accepted);
        let after = self.permit_buckets().await?;
        let delivered = self.deliver_backlog(&r).await;
        let run = Line {
            what,
            c: spec.c,
            rate: r.ok as f64 / r.elapsed_s,
            p50: r.p50_ms,
            p99: r.p99_ms,
            p999: r.p999_ms,
            floor: self.floors.at(spec.c),
            redis_us,
            host_us,
            note: format!(
                "target {:.0}/s{}",
                spec.rate,
                if delivered {
                    ""
                } else {
                    ", backlog NOT delivered in time"
                }
            ),
        };
        let permit = Line {
            what: "  its permit pipeline (host histogram), ms".into(),
            c: spec.c,
            rate: f64::NAN,
            p50: bucket_quantile(&before, &after, 0.50),
            p99: bucket_quantile(&before, &after, 0.99),
            p999: f64::NAN,
            floor: f64::NAN,
            redis_us: f64::NAN,
            host_us: f64::NAN,
            note: "bucket upper bounds".into(),
        };
        Ok([run, permit])
    }

    /// End to end: `per`-channel events posted, every message's time from its
    /// post to the simulator's accept.
    async fn end_to_end(
        &mut self,
        what: &str,
        kind: (&str, &str),
        per: usize,
    ) -> anyhow::Result<Line> {
        let spec = LoadSpec {
            kind,
            c: 16,
            requests: self.args.e2e_events,
            duration: Duration::from_secs(60),
            dup: false,
            tag: format!("e2e{per}"),
            rate: 0.0,
        };
        let mut conn = self.stack.conn.clone();
        // No AOF rewrite of the runs before may run during this one.
        super::cost::fresh_aof(&mut conn).await?;
        // Memory is read before CONFIG RESETSTAT: it frees Redis's
        // per-command latency histograms (about 27 KB each), which the run
        // allocates again; read after it, a run of 1,000 messages seemed to
        // grow Redis by 0.9 KB each.
        let memory = super::super::permit::used_memory(&mut conn).await?;
        let before = if per == 1 {
            Some(crate::anatomy::Snapshot::take(&mut conn).await?)
        } else {
            None
        };
        super::cost::reset(&mut conn).await?;
        if per == 1 {
            // The SMS channel awaits a delivery receipt: the simulator posts
            // one per message, so the run's messages end delivered.
            self.stack.receipts_to(Some(self.host));
        }
        let mark = self.cpu().await;
        let r = self.load(&spec).await?;
        let all = self.deliver_backlog(&r).await;
        let (redis_us, host_us) = mark.per_message(self.cpu().await, r.accepted);
        if per == 1 {
            // The sampled messages ended and left Redis.
            let ended = self
                .wait_for(Duration::from_millis(200), async || {
                    Ok(DeliveredMemory::tasks_left(&mut conn, &spec.tag).await? == 0)
                })
                .await;
            // The growth is read once every message of the run ended, not
            // only the sampled ones: no more task records than before it.
            let tasks = before.as_ref().map_or(0, |b| b.keys_of("task"));
            let all_ended = ended
                && self
                    .wait_for(Duration::from_millis(500), async || {
                        let keys =
                            crate::permit::scan_keys(&mut conn, "{*}:task:*", usize::MAX).await?;
                        Ok(keys.len() as u64 <= tasks)
                    })
                    .await;
            self.stack.receipts_to(None);
            if !all_ended {
                eprintln!("  not every message of the run ended (receipt) in time");
            }
        }
        let memory = super::super::permit::used_memory(&mut conn).await? as f64 - memory as f64;
        let (mut lat, last) = post_to_accept_ms(self.stack, r.first_post_ms);
        if per == 1 {
            let stats = super::cost::command_stats(&mut conn).await?;
            self.redis_per_message = Some(super::cost::PerMessage::of(&stats, lat.len()));
            let mut delivered = DeliveredMemory::measure(
                &mut conn,
                self.stack.store.url(),
                &spec.tag,
                memory,
                lat.len(),
            )
            .await?;
            let after = crate::anatomy::Snapshot::take(&mut conn).await?;
            if let Some(before) = &before {
                delivered.growth = after.growth_since(before, lat.len());
            }
            self.delivered_memory = Some(delivered);
        }
        lat.sort_unstable();
        let pct = |q: f64| crate::percentile(&lat, q).map_or(f64::NAN, |ms| ms as f64);
        let span = last.saturating_sub(r.first_post_ms).max(1) as f64 / 1000.0;
        Ok(Line {
            what: what.to_string(),
            c: spec.c,
            rate: lat.len() as f64 / span,
            p50: pct(0.50),
            p99: pct(0.99),
            p999: pct(0.999),
            floor: self.floors.at(spec.c),
            redis_us,
            host_us,
            note: format!(
                "{} msgs of {} events{}",
                lat.len(),
                r.ok,
                if all { "" } else { ", NOT all delivered" }
            ),
        })
    }

    /// Polls `done` every `every` until it answers true (true) or the drain
    /// timeout passes or it fails (false).
    async fn wait_for(
        &self,
        every: Duration,
        mut done: impl AsyncFnMut() -> anyhow::Result<bool>,
    ) -> bool {
        let deadline = std::time::Instant::now() + self.args.drain_timeout;
        loop {
            match done().await {
                Ok(true) => return true,
                Ok(false) if std::time::Instant::now() < deadline => {}
                _ => return false,
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Redis's and the host process's CPU time so far (Redis's NaN when it
    /// cannot be read: the run's line then shows no Redis cost rather than failing).
    async fn cpu(&self) -> CpuMark {
        CpuMark {
            redis: super::cost::cpu_s(&mut self.stack.conn.clone())
                .await
                .unwrap_or(f64::NAN),
            host: super::report::cpu_of(self.host.pid()),
        }
    }

    /// `a` (API only) or `f` (dispatching): keeps biz ids apart between phases.
    fn phase_tag(&self) -> &'static str {
        if self.dispatch { "f" } else { "a" }
    }

    /// Dispatching: waits until the run's accepted messages reached the
    /// simulator (false on timeout). API only: nothing to wait for.
    async fn deliver_backlog(&mut self, r: &Report) -> bool {
        if !self.dispatch {
            return true;
        }
        self.expected += r.accepted as u64;
        let done = self
            .stack
            .drain(self.expected, self.args.drain_timeout)
            .await;
        if !done {
            // The next run starts from what is there.
            self.expected = self.stack.delivered();
        }
        done
    }

    /// Runs the load generator as a separate process and reads its report.
    async fn load(&self, spec: &LoadSpec<'_>) -> anyhow::Result<Report> {
        let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
        cmd.args(["load", "--url", self.host.base(), "--biz-type", spec.kind.0])
            .args(["--channels", spec.kind.1, "--tag", &spec.tag])
            .args(["--concurrency", &spec.c.to_string()])
            .args(["--requests", &spec.requests.to_string()])
            .args(["--duration", &format!("{}ms", spec.duration.as_millis())])
            .args(["--rate", &spec.rate.to_string()]);
        if spec.dup {
            cmd.arg("--dup");
        }
        let out = cmd.output().await.context("running the load generator")?;
        anyhow::ensure!(
            out.status.success(),
            "the load generator failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Report = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "the load generator's report {:?}",
                String::from_utf8_lossy(&out.stdout)
            )
        })?;
        if let Some(e) = &report.first_error {
            let e: String = e.chars().take(300).collect();
            eprintln!("  ({} errors in {}; first: {e})", report.errors, spec.tag);
        }
        Ok(report)
    }

    /// Cumulative counts of the host's permit-latency histogram, by bucket
    /// bound (s), from its `/metrics`.
    async fn permit_buckets(&self) -> anyhow::Result<Vec<(f64, f64)>> {
        let text = reqwest::get(self.host.url("/metrics"))
            .await
            .and_then(|r| r.error_for_status())
            .context("reading the host's /metrics")?
            .text()
            .await?;
        let name = format!("{}_bucket{{le=\"", pushonce::metric_names::PERMIT_SECONDS);
        Ok(text
            .lines()
            .filter_map(|l| {
                let (le, count) = l.strip_prefix(&name)?.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, count.trim().parse().ok()?))
            })
            .collect())
    }
}

/// For every message the simulator accepted from an event posted at or after
/// `since_ms`: ms from its post (stamped in its params by the load generator)
/// to its accept; and the last accept's time.
fn post_to_accept_ms(stack: &BenchStack, since_ms: u64) -> (Vec<u64>, u64) {
    let mut lat = Vec::new();
    let mut last = 0u64;
    for m in stack.sim.state.ledger().values().flatten() {
        let posted = m.params.to_string();
        let posted = posted
            .split("@@")
            .nth(1)
            .and_then(|t| t.parse::<u64>().ok());
        if let Some(p) = posted.filter(|p| *p >= since_ms && m.accepted_at_ms >= since_ms) {
            lat.push(m.accepted_at_ms.saturating_sub(p));
            last = last.max(m.accepted_at_ms);
        }
    }
    (lat, last)
}

/// The bucket bound (ms) under which fraction `q` of the calls between two snapshots fell.
fn bucket_quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let b = before
                .iter()
                .find(|(l, _)| l == le)
                .map(|(_, n)| *n)
                .unwrap_or(0.0);
            (*le, n - b)
        })
        .collect();
    let total = delta.last().map(|(_, n)| *n).unwrap_or(0.0);
    delta
        .iter()
        .find(|(_, n)| *n >= q * total)
        .map(|(le, _)| le * 1000.0)
        .unwrap_or(f64::NAN)
}
