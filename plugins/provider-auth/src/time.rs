//! UTC calendar times from Unix milliseconds, without a date crate: the few
//! formats the providers want (ISO 8601 / RFC 3339 seconds, `yyyyMMdd`).

/// Year, month, day, hour, minute, second of `ms` since the epoch, shifted by
/// `offset_secs` (e.g. `8 * 3600` for China Standard Time).
pub fn civil(ms: u64, offset_secs: i64) -> (i64, u32, u32, u32, u32, u32) {
    let secs = (ms / 1000) as i64 + offset_secs;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = key_util::civil_from_days(days);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    (year, month, day, h as u32, m as u32, s as u32)
}

/// `yyyy-MM-ddTHH:mm:ssZ` (UTC), as Aliyun's `x-acs-date` and RFC 3339 want.
pub fn iso8601(ms: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(ms, 0);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// `yyyyMMdd` of `ms` at `offset_secs` from UTC.
pub fn ymd(ms: u64, offset_secs: i64) -> String {
    let (y, mo, d, ..) = civil(ms, offset_secs);
    format!("{y:04}{mo:02}{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(1_698_315_752_000), "2023-10-26T10:22:32Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00Z");
        // 2023-10-26 20:00 UTC is already the 27th in China.
        assert_eq!(ymd(1_698_350_400_000, 0), "20231026");
        assert_eq!(ymd(1_698_350_400_000, 8 * 3600), "20231027");
    }
}
