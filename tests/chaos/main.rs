//! `chaos`: the full chaos run as a program. Starts Redis, the provider
//! simulator and several `pushonce serve` processes, fires the load while
//! killing hosts and restarting Redis, and prints the table; exits 1 when a
//! duplicate, a miss or an unexplained hold was found. Run it with
//! `cargo xtask chaos [-- ARGS]`, which builds `pushonce` first.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use pushonce_tests::chaos::{ChaosConfig, ChaosLedger, ProviderOutage, run};

/// Proves no duplicate and no miss under chaos; prints a table.
#[derive(Debug, Parser)]
#[command(name = "chaos")]
struct Args {
    /// Distinct events (over four business types, one of them a digest, and all four channels).
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Times each event is posted, concurrently, to different instances.
    #[arg(long, default_value_t = 3)]
    posts: usize,
    /// `pushonce serve` processes sharing the Redis.
    #[arg(long, default_value_t = 3)]
    instances: usize,
    /// Events in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Kills spread evenly over the load.
    #[arg(long, default_value_t = 6)]
    kills: usize,
    /// Pause between two timed `kill -9`s, until the backlog drains (humantime, e.g. `5s`).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    kill_every: Duration,
    /// Redis restarts during the load.
    #[arg(long, default_value_t = 2)]
    redis_restarts: usize,
    /// Share of sends each provider answers 5xx (and half of it 429).
    #[arg(long, default_value_t = 0.05)]
    fail_rate: f64,
    /// Share of sends each provider accepts and then cuts the answer off.
    #[arg(long, default_value_t = 0.02)]
    drop_rate: f64,
    /// Seed of the kills' choices.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Run on a Redis Cluster of three local masters (a "Redis restart"
    /// restarts one master in turn).
    #[arg(long)]
    cluster: bool,
    /// The delivery ledger: `postgres` (one real PostgreSQL shared by every
    /// instance, as a deployment has it) or `sqlite` (each instance its own
    /// file, claims not shared).
    #[arg(long, default_value = "postgres", value_parser = ["postgres", "sqlite"])]
    ledger: String,
    /// An outage of the SMS channel's first provider: `START,LENGTH`
    /// (humantime, e.g. `20s,30s`, counted from the start of the load).
    /// The `sms` channel then fails over from Aliyun to Tencent
    /// (`providers`), and Aliyun's gateway answers 503 to every send and
    /// status query for that stretch; the run checks that the tasks held
    /// when it recovers were unknown at Aliyun, and that they settle.
    #[arg(long, value_parser = parse_outage)]
    provider_outage: Option<(Duration, Duration)>,
    /// With `--provider-outage`: how long after Aliyun recovers the tasks
    /// held there may take to settle.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    settle_timeout: Duration,
}

/// `START,LENGTH` as two durations.
fn parse_outage(text: &str) -> Result<(Duration, Duration), String> {
    let (start, length) = text
        .split_once(',')
        .ok_or_else(|| format!("`{text}`: expected START,LENGTH, e.g. 20s,30s"))?;
    let parse = |what: &str, v: &str| {
        humantime::parse_duration(v.trim()).map_err(|e| format!("{what} `{v}`: {e}"))
    };
    let (start, length) = (parse("START", start)?, parse("LENGTH", length)?);
    if length.is_zero() {
        return Err("LENGTH must be more than 0".into());
    }
    Ok((start, length))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let config = ChaosConfig {
        events: args.events,
        posts: args.posts,
        instances: args.instances,
        concurrency: args.concurrency,
        kills: args.kills,
        kill_every: args.kill_every,
        redis_restarts: args.redis_restarts,
        fail_rate: args.fail_rate,
        drop_rate: args.drop_rate,
        seed: args.seed,
        cluster: args.cluster,
        ledger: match args.ledger.as_str() {
            "sqlite" => ChaosLedger::SqlitePerInstance,
            _ => ChaosLedger::Postgres,
        },
        provider_outage: args.provider_outage.map(|(start, length)| ProviderOutage {
            start,
            length,
            settle_timeout: args.settle_timeout,
        }),
        ..ChaosConfig::default()
    };
    let outage = config
        .provider_outage
        .map(|o| {
            format!(
                ", sms = aliyun → tencent with aliyun dark {:?} from {:?}",
                o.length, o.start
            )
        })
        .unwrap_or_default();
    let title = format!(
        "chaos: {}, ledger {}, {} instances, {} events × {} posts{outage}",
        if config.cluster {
            "Redis Cluster (3 masters)"
        } else {
            "one Redis"
        },
        args.ledger,
        config.instances,
        config.events,
        config.posts
    );
    match run(&config, &|line| eprintln!("{line}")).await {
        Ok(report) => {
            println!("{}", report.table(&title));
            if report.is_clean() {
                ExitCode::SUCCESS
            } else {
                for e in &report.examples {
                    eprintln!("{e}");
                }
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("chaos: {e:#}");
            ExitCode::FAILURE
        }
    }
}
