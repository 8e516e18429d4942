//! `pushonce ledger export --since <time> [--format csv|jsonl]`: the rows of
//! the delivery ledger changed since a time, for audits (what was sent to
//! which recipient digest, when, under which key and policy version).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

use crate::config::HostConfig;
use crate::ledger::{Ledger, LedgerRow};

/// Arguments of `pushonce ledger`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Print the rows changed since a time, oldest change first.
    Export(ExportArgs),
}

/// Output formats of the export.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Format {
    /// Comma-separated values with a header line.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

#[derive(Debug, clap::Args)]
struct ExportArgs {
    /// A time (`2026-12-01T00:00:00Z`) or an age (`24h`, `7days`: that long ago).
    #[arg(long)]
    since: String,
    /// Output format.
    #[arg(long, value_enum, default_value = "csv")]
    format: Format,
    /// Host configuration file (its `ledger_url`, or the SQLite ledger in its `data_dir`).
    #[arg(long)]
    config: Option<PathBuf>,
}

/// Run `pushonce ledger`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let Command::Export(args) = args.command;
    let config = HostConfig::load(args.config.as_deref())?;
    let Some(url) = config.ledger() else {
        bail!("ledger_url = \"off\": there is no ledger to export");
    };
    let since = since_ms(&args.since)?;
    let rows = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let ledger = Ledger::open(&url).await?;
            ledger.since(since).await
        })
        .context("reading the ledger")?;
    let out = std::io::stdout().lock();
    match args.format {
        Format::Csv => write_csv(out, &rows),
        Format::Jsonl => write_jsonl(out, &rows),
    }
}

/// `--since` as ms since the epoch: an RFC 3339 time, or an age before now.
fn since_ms(text: &str) -> anyhow::Result<i64> {
    let at = match humantime::parse_rfc3339_weak(text) {
        Ok(t) => t,
        Err(_) => {
            let age: Duration = humantime::parse_duration(text).with_context(|| {
                format!("--since {text:?}: neither a time (2026-12-01T00:00:00Z) nor an age (24h)")
            })?;
            SystemTime::now() - age
        }
    };
    Ok(at
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0))
}

fn write_csv(out: impl Write, rows: &[LedgerRow]) -> anyhow::Result<()> {
    let mut w = csv::Writer::from_writer(out);
    for row in rows {
        w.serialize(row)?;
    }
    w.flush()?;
    Ok(())
}

fn write_jsonl(mut out: impl Write, rows: &[LedgerRow]) -> anyhow::Result<()> {
    for row in rows {
        serde_json::to_writer(&mut out, row)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}
