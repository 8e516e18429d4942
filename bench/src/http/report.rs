//! The table `pushonce-bench http` prints: one line per measurement, each
//! rate also a ratio to the floor at the same concurrency; a row that failed
//! keeps its place with the error, so one failure does not lose the table.

/// One line of the table.
pub(super) struct Line {
    /// What was measured.
    pub what: String,
    /// Concurrency (0: not applicable).
    pub c: usize,
    /// Rate (unit in `what`).
    pub rate: f64,
    /// Latency percentiles, ms (NaN: not measured).
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    /// The floor it is compared with.
    pub floor: f64,
    /// A remark.
    pub note: String,
}

impl Line {
    /// The line of a measurement that failed: no numbers, the error as its note.
    pub fn failed(what: String, c: usize, error: &anyhow::Error) -> Line {
        Line {
            what,
            c,
            rate: f64::NAN,
            p50: f64::NAN,
            p99: f64::NAN,
            p999: f64::NAN,
            floor: f64::NAN,
            note: format!("FAILED: {error:#}"),
        }
    }
}

/// Prints the table.
pub(super) fn print(lines: &[Line]) {
    let f = |v: f64, p: usize| {
        if v.is_nan() {
            "-".to_string()
        } else {
            format!("{v:.p$}")
        }
    };
    let rows: Vec<[String; 8]> = lines
        .iter()
        .map(|l| {
            [
                l.what.clone(),
                if l.c == 0 {
                    "-".into()
                } else {
                    l.c.to_string()
                },
                f(l.rate, 0),
                f(l.p50, 3),
                f(l.p99, 3),
                f(l.p999, 3),
                f(l.rate / l.floor, 3),
                l.note.clone(),
            ]
        })
        .collect();
    pushonce::cli::output::print_table(
        &[
            "WHAT", "C", "RATE", "P50 MS", "P99 MS", "P999 MS", "VS FLOOR", "NOTE",
        ],
        &rows,
    );
}

/// `VmRSS` and `VmHWM` of process `pid`, MiB (NaN when unreadable).
pub(super) fn rss_of(pid: Option<u32>) -> (f64, f64) {
    let status = pid
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(f64::NAN)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The machine's load average (1, 5, 15 minutes).
pub(super) fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
