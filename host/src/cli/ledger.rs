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

/// The rows as CSV with a header line, every cell [`spreadsheet_safe`]
/// (business ids, errors and notes come from outside).
fn write_csv(out: impl Write, rows: &[LedgerRow]) -> anyhow::Result<()> {
    let mut raw = csv::Writer::from_writer(Vec::new());
    for row in rows {
        raw.serialize(row)?;
    }
    let raw = raw.into_inner().map_err(|e| e.into_error())?;
    let mut records = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(raw.as_slice());
    let mut w = csv::Writer::from_writer(out);
    for record in records.records() {
        w.write_record(record?.iter().map(|c| spreadsheet_safe(c).into_owned()))?;
    }
    w.flush()?;
    Ok(())
}

/// `cell` as a spreadsheet shows it without running it: text starting with
/// `=`, `+`, `-`, `@`, a tab or a carriage return (what Excel, LibreOffice
/// and Google Sheets read as a formula) gets a leading `'`, as OWASP's "CSV
/// Injection" page advises; anything else is unchanged.
pub(crate) fn spreadsheet_safe(cell: &str) -> std::borrow::Cow<'_, str> {
    match cell.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{cell}").into(),
        _ => cell.into(),
    }
}

fn write_jsonl(mut out: impl Write, rows: &[LedgerRow]) -> anyhow::Result<()> {
    for row in rows {
        serde_json::to_writer(&mut out, row)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formula_leading_cells_are_prefixed() {
        for cell in [
            "=1+1",
            "+1",
            "-2",
            "@SUM(A1)",
            "\tx",
            "\rx",
            "=HYPERLINK(\"http://x\")",
        ] {
            assert_eq!(spreadsheet_safe(cell), format!("'{cell}"), "{cell:?}");
        }
        for cell in ["", "a=1", "order-1", "1700000000000", " =1", "'=1"] {
            assert_eq!(spreadsheet_safe(cell), cell, "{cell:?}");
        }
    }

    #[test]
    fn the_export_writes_no_cell_a_spreadsheet_would_run() {
        let row = LedgerRow {
            key: "order:per-event@1:sms:=cmd|' /C calc'!A0".into(),
            task_id: "t-1".into(),
            channel: "sms".into(),
            policy: "per-event@1".into(),
            recipient_digest: "ab".into(),
            biz_type: "ORDER_SHIPPED".into(),
            biz_id: "=HYPERLINK(\"http://evil.example\",\"x\")".into(),
            status: "sent".into(),
            attempts: 1,
            provider_message_id: Some("@id".into()),
            last_error: Some("-1 busy, \"quoted\"".into()),
            claimed_at_ms: 1,
            updated_at_ms: 2,
            operator_note: Some("+note".into()),
            window_ends_at_ms: None,
            accepted_at_ms: None,
        };
        let mut out = Vec::new();
        write_csv(&mut out, &[row]).unwrap();
        let mut reader = csv::Reader::from_reader(out.as_slice());
        assert_eq!(&reader.headers().unwrap()[6], "biz_id");
        let cells: Vec<String> = reader
            .records()
            .next()
            .unwrap()
            .unwrap()
            .iter()
            .map(String::from)
            .collect();
        assert_eq!(
            cells[0], "order:per-event@1:sms:=cmd|' /C calc'!A0",
            "not leading: kept"
        );
        assert_eq!(cells[6], "'=HYPERLINK(\"http://evil.example\",\"x\")");
        assert_eq!(cells[9], "'@id");
        assert_eq!(cells[10], "'-1 busy, \"quoted\"");
        assert_eq!(cells[13], "'+note");
        assert_eq!(cells[8], "1", "numbers unchanged");
    }
}
