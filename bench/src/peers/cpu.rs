//! CPU time of processes from `/proc/<pid>/stat`: a server process alone,
//! and a process with its children (PostgreSQL's postmaster forks a backend
//! per connection; a backend that exited is in the postmaster's `cutime`).

/// Linux reports these fields in clock ticks of 1/100 s (USER_HZ).
const TICKS_PER_S: f64 = 100.0;

/// The fields of `/proc/<pid>/stat` after the command name, which may hold
/// spaces (the state is then field 0, the parent pid field 1).
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(')')?.1;
    Some(
        rest.split_whitespace()
            .skip(1)
            .map(|f| f.parse::<u64>().unwrap_or(0))
            .collect(),
    )
}

/// User + system CPU seconds process `pid` used so far (0 when it is gone).
pub(super) fn own_s(pid: u32) -> f64 {
    // After the state: ppid 0, pgrp 1, …, utime 10, stime 11, cutime 12, cstime 13.
    stat_fields(pid)
        .map(|f| (f[10] + f[11]) as f64 / TICKS_PER_S)
        .unwrap_or(0.0)
}

/// CPU seconds of `root`, of its children that ended (`cutime` +
/// `cstime`), and of its live children.
pub(super) fn tree_s(root: u32) -> f64 {
    let Some(f) = stat_fields(root) else {
        return 0.0;
    };
    let mut total = (f[10] + f[11] + f[12] + f[13]) as f64 / TICKS_PER_S;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return total;
    };
    for pid in entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != root)
    {
        if let Some(f) = stat_fields(pid).filter(|f| f[0] == u64::from(root)) {
            total += (f[10] + f[11]) as f64 / TICKS_PER_S;
        }
    }
    total
}
