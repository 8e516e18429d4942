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
    /// Redis's CPU time (all its threads) over the run per accepted channel
    /// (one message), µs (NaN: not measured).
    pub redis_us: f64,
    /// The host process's CPU time over the run per accepted message, µs
    /// (NaN: not measured).
    pub host_us: f64,
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
            redis_us: f64::NAN,
            host_us: f64::NAN,
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
    let rows: Vec<[String; 10]> = lines
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
                f(l.redis_us, 1),
                f(l.host_us, 1),
                l.note.clone(),
            ]
        })
        .collect();
    pushonce::cli::output::print_table(
        &[
            "WHAT",
            "C",
            "RATE",
            "P50 MS",
            "P99 MS",
            "P999 MS",
            "VS FLOOR",
            "REDIS µS/MSG",
            "HOST µS/MSG",
            "NOTE",
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

/// CPU time (user + system) process `pid` has used so far, s (NaN when unreadable).
pub(super) fn cpu_of(pid: Option<u32>) -> f64 {
    let stat = pid
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is the
    // 3rd field, utime the 14th, stime the 15th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    match (ticks(11), ticks(12)) {
        // Linux reports these in clock ticks of 1/100 s (USER_HZ).
        (Some(u), Some(s)) => (u + s) / 100.0,
        _ => f64::NAN,
    }
}

/// The machine's load average (1, 5, 15 minutes).
pub(crate) fn load_avg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}
