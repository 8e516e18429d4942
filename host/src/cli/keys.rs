//! `pushonce keys`: the operator's dry run of key derivation. With
//! `--policy NAME@REQ` it loads the plugins, resolves that key policy and
//! prints the key every channel would get for the event in `--event`, one
//! line per channel. Without it, the event is routed by its `biz_type`
//! through the policy files as the host would route it, and each channel's
//! line also shows its frequency caps and quiet hours; with `--redis URL`,
//! what the accept would answer now (a dry run of the accept script:
//! accepted, deferred to a time, duplicate, or capped until a time).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::api::console::when;
use crate::config::HostConfig;
pub use crate::derive::{ChannelKey, dry_run};
use crate::event::Event;
use crate::event::event_from_json;
use crate::permit::{Acceptance, CapPeriod, Gate, Permits};
use crate::plugin::{Limits, PluginRegistry};
use crate::route::plan::{PlanRequest, PlannedEvent, plan};
use crate::store::{RedisTarget, Store};

use super::inputs::{default_cache_dir, default_plugin_dir, parse_param, read_to_string};
use super::output::{print_table, window};

/// Arguments of `pushonce keys`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Key policy and version requirement, e.g. `per-user-per-day@^1.2`;
    /// without it, the event is routed through the policy files (and caps
    /// and quiet hours are shown).
    #[arg(long)]
    policy: Option<String>,
    /// Event JSON file (`-` for stdin): {"biz_type","biz_id","user_id","occurred_at","attributes"}.
    #[arg(long)]
    event: PathBuf,
    /// Channel to derive a key for (repeatable) [default: inbox, sms, wechat, app-push].
    #[arg(long = "channel")]
    channels: Vec<String>,
    /// Policy parameter `name=value` (repeatable), e.g. `--param tz=+08:00`.
    #[arg(long = "param", value_parser = parse_param)]
    params: Vec<(String, String)>,
    /// Plugin directory [default: $PUSHONCE_PLUGIN_DIR or target/plugins].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Host configuration file, when routing [default: ./pushonce.toml when present].
    #[arg(long)]
    config: Option<PathBuf>,
    /// Policy directory, when routing [default: the configuration's `policy_dir`].
    #[arg(long)]
    policies: Option<PathBuf>,
    /// Redis URL, when routing: also show what the accept would answer now
    /// (nothing is written).
    #[arg(long)]
    redis: Option<String>,
}

/// The channels of the product brief.
const DEFAULT_CHANNELS: [&str; 4] = ["inbox", "sms", "wechat", "app-push"];

/// Run `pushonce keys`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let event = event_from_json(&read_to_string(&args.event)?)
        .with_context(|| format!("in {}", args.event.display()))?;
    match args.policy.clone() {
        Some(policy) => under_key_policy(args, &policy, &event),
        None => routed(args, event),
    }
}

/// The keys under one key policy plugin.
fn under_key_policy(args: Args, policy: &str, event: &Event) -> anyhow::Result<()> {
    let dir = args.dir.unwrap_or_else(default_plugin_dir);
    let (registry, refused) =
        PluginRegistry::load_dir(&dir, &Limits::default(), Some(&default_cache_dir()))?;
    for r in &refused {
        tracing::warn!("{r}");
    }
    let channels: Vec<String> = if args.channels.is_empty() {
        DEFAULT_CHANNELS.map(String::from).to_vec()
    } else {
        args.channels
    };
    let (policy, results) = dry_run(&registry, policy, event, &channels, &args.params)?;
    eprintln!("policy {policy}");
    let mut rows = Vec::new();
    let mut errors = 0;
    for (channel, result) in results {
        match result {
            Ok(k) => rows.push([k.channel, k.key, window(k.window_secs)]),
            Err(e) => {
                errors += 1;
                rows.push([channel, format!("error: {e}"), String::new()]);
            }
        }
    }
    print_table(&["CHANNEL", "KEY", "WINDOW"], &rows);
    if errors > 0 {
        bail!("{errors} of {} channel(s) got no key", channels.len());
    }
    Ok(())
}

/// The event routed as the host would: each channel's key, window, caps and
/// quiet hours, and with `--redis` what the accept would answer now.
fn routed(args: Args, event: Event) -> anyhow::Result<()> {
    if !args.params.is_empty() || args.dir.is_some() {
        bail!(
            "--param and --dir go with --policy; a routed event takes them from the policy files and the configuration"
        );
    }
    let config = HostConfig::load(args.config.as_deref())?;
    let dir = args
        .policies
        .clone()
        .unwrap_or_else(|| config.policy_dir.clone());
    let snapshot = super::policies::snapshot_of(&config, &dir)?;
    // Addresses change neither keys nor caps: a stand-in for every channel.
    let recipients: BTreeMap<String, String> = config
        .channels
        .keys()
        .map(|c| (c.clone(), "(dry run)".into()))
        .collect();
    let request = PlanRequest {
        event,
        channels: (!args.channels.is_empty()).then_some(args.channels.as_slice()),
        template: None,
        params: &BTreeMap::new(),
        recipients: &recipients,
        send_at_ms: None,
        now_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        preferences: None,
        unsubscribe: None,
    };
    let planned = plan(&snapshot, &config.channels, request)?;
    let answers = match &args.redis {
        Some(url) => Some(would_answer(&config, url, &planned)?),
        None => None,
    };
    eprintln!("biz_type {} ({})", planned.biz_type, dir.display());
    let rows: Vec<[String; 6]> = planned
        .channels
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let r = &p.request;
            [
                p.channel.clone(),
                r.key.clone(),
                humantime::format_duration(r.window).to_string(),
                caps_text(&r.gate),
                quiet_text(&r.gate),
                answers
                    .as_ref()
                    .map_or_else(|| "(no --redis)".into(), |a| a[i].clone()),
            ]
        })
        .collect();
    print_table(
        &["CHANNEL", "KEY", "WINDOW", "CAPS", "QUIET", "WOULD ANSWER"],
        &rows,
    );
    Ok(())
}

/// What the accept script would answer for each planned channel, asked of
/// the Redis at `url` (a dry run: nothing is written).
fn would_answer(
    config: &HostConfig,
    url: &str,
    planned: &PlannedEvent,
) -> anyhow::Result<Vec<String>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = Store::open(&RedisTarget::Url(url.to_string())).await?;
        let permits = Permits::new(
            store.manager().await?,
            crate::service::permit_config(config),
        );
        let mut answers = Vec::new();
        for p in &planned.channels {
            let answer = permits
                .would_accept(&p.request)
                .await
                .with_context(|| format!("asking {url} about channel {}", p.channel))?;
            answers.push(answer_text(&answer));
        }
        Ok(answers)
    })
}

fn answer_text(answer: &Acceptance) -> String {
    match answer {
        Acceptance::Accepted { .. } => "accepted".into(),
        Acceptance::Deferred {
            scheduled_for_ms, ..
        } => {
            format!("accepted, first attempt at {}", when(*scheduled_for_ms))
        }
        Acceptance::Digested {
            task_id,
            scheduled_for_ms,
        } => {
            format!(
                "digested into {task_id}, sent at {}",
                when(*scheduled_for_ms)
            )
        }
        Acceptance::Duplicate { task_id, .. } if task_id.is_empty() => {
            "duplicate (its key is in the bloom filter)".into()
        }
        Acceptance::Duplicate { task_id, status } => match status {
            Some(status) => format!("duplicate of {task_id} ({status})"),
            None => format!("duplicate of {task_id}"),
        },
        Acceptance::Capped {
            cap,
            next_allowed_ms,
        } => {
            format!("capped by {cap} until {}", when(*next_allowed_ms))
        }
    }
}

/// `marketing ≤2 per 1h, daily ≤3 per day at +08:00`, or `-`.
fn caps_text(gate: &Gate) -> String {
    if gate.caps.is_empty() {
        return "-".into();
    }
    let caps: Vec<String> = gate
        .caps
        .iter()
        .map(|c| {
            let per = match c.period {
                CapPeriod::Rolling(w) => format!("per {}", humantime::format_duration(w)),
                CapPeriod::Day { offset_ms } => format!("per day at {}", offset(offset_ms)),
            };
            format!("{} ≤{} {per}", c.name, c.max)
        })
        .collect();
    caps.join(", ")
}

/// `22:00-08:00 at +08:00`, or `-`.
fn quiet_text(gate: &Gate) -> String {
    let Some(q) = &gate.quiet else {
        return "-".into();
    };
    let clock = |ms: i64| format!("{:02}:{:02}", ms / 3_600_000, ms / 60_000 % 60);
    format!(
        "{}-{} at {}",
        clock(q.from_ms),
        clock(q.to_ms),
        offset(q.offset_ms)
    )
}

/// A UTC offset in ms as `+08:00`.
fn offset(ms: i64) -> String {
    let sign = if ms < 0 { '-' } else { '+' };
    let minutes = ms.abs() / 60_000;
    format!("{sign}{:02}:{:02}", minutes / 60, minutes % 60)
}
