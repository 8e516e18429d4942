//! The targets of issues 19 and 30, each as a row: what is asked, what this run
//! measured (as the ratio the target names), and whether it is met. A
//! target whose measurement is missing (its run failed) says so.

use super::Notes;
use super::report::Line;

/// Concurrency the single-number targets are read at.
const C: usize = 64;

/// One target: its name, what it asks, the measured value, and how it was computed.
struct Target {
    name: &'static str,
    asked: Bound,
    value: f64,
    how: String,
}

/// What a target asks of its value: one bound, from which both the text of
/// the ASKED column and whether the value meets it are derived.
#[derive(Clone, Copy)]
enum Bound {
    /// At least this ratio (`≥ 1.0×`).
    RatioAtLeast(f64),
    /// At most this ratio (`≤ 1.5×`).
    RatioAtMost(f64),
    /// At most this many units (`≤ 12`).
    AtMost(f64),
    /// Under this many units (`< 2`).
    Below(f64),
}

impl Bound {
    /// Whether `value` meets the bound.
    fn met(self, value: f64) -> bool {
        match self {
            Bound::RatioAtLeast(b) => value >= b,
            Bound::RatioAtMost(b) | Bound::AtMost(b) => value <= b,
            Bound::Below(b) => value < b,
        }
    }

    /// The ASKED column: `≥ 1.0×`, `≤ 12`, `< 2`.
    fn text(self) -> String {
        match self {
            Bound::RatioAtLeast(b) => format!("≥ {b:.1}×"),
            Bound::RatioAtMost(b) => format!("≤ {b:.1}×"),
            Bound::AtMost(b) => format!("≤ {b}"),
            Bound::Below(b) => format!("< {b}"),
        }
    }
}

/// Prints the targets tables of issues 19 and 30; `lean`: the host ran with
/// `event_index = false`, so the accept's own figures are those of that
/// configuration.
pub(super) fn print(lines: &[Line], notes: &Notes, lean: bool) {
    let issue_19 = [
        host_vs_script(lines),
        redis_time(lines, notes, lean),
        four_vs_one(lines),
        delivered_bytes(notes),
        open_bytes(notes),
        open_bytes_four(notes),
        end_to_end(
            lines,
            "5. end to end 1 channel vs the API-only accept rate",
            0.8,
        ),
        paced_p99(lines, "6. permit p99 at half of peak while dispatching, ms"),
    ];
    print_table("targets (issue 19), this run:", &issue_19);
    let issue_30 = [
        delivered_vs_accepted(
            lines,
            "30.1 host CPU per delivered message vs per accepted",
            |l| l.host_us,
            3.0,
        ),
        delivered_vs_accepted(
            lines,
            "30.2 Redis CPU per delivered message vs per accepted",
            |l| l.redis_us,
            2.0,
        ),
        end_to_end(
            lines,
            "30.3 end to end 1 channel vs the API-only accept rate",
            0.4,
        ),
        paced_p99(
            lines,
            "30.4 permit p99 at half of peak while dispatching, ms",
        ),
    ];
    print_table(
        "targets (issue 30: delivery at the cost of a few accepts), this run; against Svix: `pushonce-bench peers`",
        &issue_30,
    );
}

/// One table: a row per target, its value, whether it is met, and how it
/// was computed.
fn print_table(title: &str, targets: &[Target]) {
    println!("{title}");
    let rows: Vec<[String; 5]> = targets
        .iter()
        .map(|t| {
            [
                t.name.to_string(),
                t.asked.text(),
                if t.value.is_nan() {
                    "not measured".into()
                } else {
                    format!("{:.2}", t.value)
                },
                match (t.value.is_nan(), t.asked.met(t.value)) {
                    (true, _) => "-",
                    (false, true) => "met",
                    (false, false) => "NOT met",
                }
                .into(),
                t.how.clone(),
            ]
        })
        .collect();
    pushonce::cli::output::print_table(&["TARGET", "ASKED", "MEASURED", "", "FROM"], &rows);
}

/// CPU (`of`: the host's or Redis's) per delivered 1-channel message (the
/// end-to-end row: its accept and its delivery) against an API-only accept,
/// both at their own rows' concurrency (16 and 64).
fn delivered_vs_accepted(
    lines: &[Line],
    name: &'static str,
    of: fn(&Line) -> f64,
    most: f64,
) -> Target {
    let delivered = find(lines, "end to end 1 channel", 16).map_or(f64::NAN, of);
    let accepted = find(lines, API_ONE, C).map_or(f64::NAN, of);
    Target {
        name,
        asked: Bound::RatioAtMost(most),
        value: delivered / accepted,
        how: format!(
            "{delivered:.1} µs (end to end 1 channel, c=16) / {accepted:.1} µs (API only, 1 channel, c={C})"
        ),
    }
}

/// The line whose `what` starts with `what` at concurrency `c`.
fn find<'a>(lines: &'a [Line], what: &str, c: usize) -> Option<&'a Line> {
    lines.iter().find(|l| l.what.starts_with(what) && l.c == c)
}

/// A line's rate (NaN when the line is missing).
fn rate(lines: &[Line], what: &str, c: usize) -> f64 {
    find(lines, what, c).map_or(f64::NAN, |l| l.rate)
}

const API_ONE: &str = "HTTP /v1/events 1 channel, API only, accepted";
const API_FOUR: &str = "HTTP /v1/events 4 channels, API only, accepted";

fn host_vs_script(lines: &[Line]) -> Target {
    let host = rate(lines, API_ONE, C);
    let script = rate(lines, "redis-benchmark EVALSHA accept.lua", C);
    Target {
        name: "1. host API-only, 1 channel vs redis-benchmark on accept.lua",
        asked: Bound::RatioAtLeast(1.0),
        value: host / script,
        how: format!("{host:.0} / {script:.0} events/s, c={C}"),
    }
}

fn redis_time(lines: &[Line], notes: &Notes, lean: bool) -> Target {
    let row = if lean {
        "accept.lua with"
    } else {
        "accept.lua as"
    };
    let script = notes
        .profile
        .as_ref()
        .ok()
        .and_then(|p| p.iter().find(|l| l.what.starts_with(row)))
        .map_or(f64::NAN, |l| l.usec);
    let cpu = find(lines, API_ONE, C).map_or(f64::NAN, |l| l.redis_us);
    Target {
        name: "2. Redis time per accepted channel, µs",
        asked: Bound::AtMost(12.0),
        value: script,
        how: format!(
            "accept.lua usec_per_call{} (profile below); Redis CPU over the API-only 1-channel run at c={C}: {cpu:.1} µs per message",
            if lean {
                " with event_index = false"
            } else {
                ""
            }
        ),
    }
}

fn four_vs_one(lines: &[Line]) -> Target {
    let one = find(lines, API_ONE, C).map_or(f64::NAN, |l| l.redis_us);
    let four = find(lines, API_FOUR, C).map_or(f64::NAN, |l| l.redis_us);
    let ratio = 4.0 * four / one;
    Target {
        name: "3. Redis cost of a 4-channel event vs a 1-channel one",
        asked: Bound::RatioAtMost(1.5),
        value: ratio,
        how: format!("Redis CPU per event, API only, c={C}: 4 × {four:.1} µs / {one:.1} µs"),
    }
}

fn delivered_bytes(notes: &Notes) -> Target {
    let (value, how) = match notes.delivered.as_ref().map(|(d, _)| d) {
        Some(d) => (
            d.kept(),
            format!(
                "after it ended: permit {:.0} (used_memory per copy; MEMORY USAGE {:.0}) + task record {:.0} + event record {:.0} ({} of {} still in Redis); used_memory delta {:.0}/message",
                d.permit_cost, d.permit, d.task, d.index, d.in_redis, d.sampled, d.per_message
            ),
        ),
        None => (f64::NAN, "no end-to-end 1-channel run".into()),
    };
    Target {
        name: "4a. Redis bytes kept per delivered message",
        asked: Bound::AtMost(200.0),
        value,
        how,
    }
}

fn open_bytes(notes: &Notes) -> Target {
    Target {
        name: "4b. Redis bytes per open permit, 1-channel events",
        asked: Bound::AtMost(700.0),
        value: notes.per_permit,
        how: format!(
            "used_memory delta over Permits::accept direct / accepts; from an empty Redis {:.0} at hash-max-listpack-value 1024, {:.0} at Redis's default 64",
            notes.listpack.0, notes.listpack.1
        ),
    }
}

fn open_bytes_four(notes: &Notes) -> Target {
    Target {
        name: "4c. Redis bytes per open permit, 4-channel events",
        asked: Bound::AtMost(700.0),
        value: notes.per_permit_four,
        how: "used_memory delta over Permits::accept_batch of one event's four channels / permits"
            .into(),
    }
}

fn end_to_end(lines: &[Line], name: &'static str, least: f64) -> Target {
    let e2e = rate(lines, "end to end 1 channel", 16);
    let api = lines
        .iter()
        .filter(|l| l.what.starts_with(API_ONE))
        .map(|l| l.rate)
        .filter(|r| !r.is_nan())
        .fold(f64::NAN, f64::max);
    Target {
        name,
        asked: Bound::RatioAtLeast(least),
        value: e2e / api,
        how: format!("{e2e:.0} messages/s at the simulator (c=16) / {api:.0} (API-only peak)"),
    }
}

fn paced_p99(lines: &[Line], name: &'static str) -> Target {
    let paced = lines
        .iter()
        .position(|l| l.what.starts_with("HTTP 1 channel, paced at half peak"));
    let p99 = paced
        .and_then(|i| lines.get(i + 1))
        .map_or(f64::NAN, |l| l.p99);
    Target {
        name,
        asked: Bound::Below(2.0),
        value: p99,
        how: "the host's permit histogram (bucket upper bound)".into(),
    }
}
