//! How the commands print: tables padded to their widest cell, sizes and
//! windows in words.

/// `1234s` or `(policy file)`.
pub fn window(secs: Option<u32>) -> String {
    secs.map_or_else(|| "(policy file)".into(), |s| format!("{s}s"))
}

/// `12.3 KiB`.
pub(crate) fn human_size(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

/// Prints rows under a header, columns padded to their widest cell.
pub fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
