//! Shared by the key-policy plugins: turns free-form event values into key
//! parts that are readable, safe for Redis, bounded in length, and injective
//! (two different values never give the same part), plus the few helpers the
//! policies share (parameter lookup, fixed-offset timezones, civil dates).
//!
//! Encoding of one part:
//! - bytes in `[A-Za-z0-9._@/-]` are kept as they are;
//! - every other byte (including `:` the separator, `+` and `=`) becomes `+XX`
//!   (upper-case hex of the UTF-8 byte), so `John Doe` gives `John+20Doe`;
//! - when the result is empty or longer than [`MAX_PART`] bytes, the part is
//!   `=` followed by the first 32 hex digits of the value's SHA-256 instead.
//!   An escaped part never contains `=`, so the two forms cannot collide.
use sha2::{Digest, Sha256};

/// The longest part kept readable; longer parts are hashed. Three parts and two
/// separators stay within the host's 200-byte limit on a key body.
pub const MAX_PART: usize = 64;

/// Hex digits of SHA-256 kept in a hashed part (128 bits).
const HASH_HEX: usize = 32;

/// True for the bytes a part keeps as they are.
fn is_plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'/' | b'-')
}

/// Encodes one key part (see the module docs): readable, safe, bounded, injective.
pub fn part(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for &b in value.as_bytes() {
        if out.len() > MAX_PART {
            break;
        }
        if is_plain(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("+{b:02X}"));
        }
    }
    if out.is_empty() || out.len() > MAX_PART {
        hashed(value)
    } else {
        out
    }
}

/// `=` and the first 32 hex digits of the SHA-256 of `value`.
fn hashed(value: &str) -> String {
    let digest = Sha256::digest(value.as_bytes());
    let mut out = String::with_capacity(1 + HASH_HEX);
    out.push('=');
    for b in &digest[..HASH_HEX / 2] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The value of parameter `name` in `params` (the last one wins), if given.
pub fn param<'a>(params: &'a [(String, String)], name: &str) -> Option<&'a str> {
    params
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The value of event attribute `name`, if present (the first one wins).
pub fn attribute<'a>(attributes: &'a [(String, String)], name: &str) -> Option<&'a str> {
    attributes
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Parses a fixed UTC offset `+HH:MM` / `-HH:MM` (also `Z`, `UTC`, `+HH`,
/// `+HHMM`) into seconds east of UTC; at most 18 hours either way.
pub fn parse_offset(tz: &str) -> Option<i64> {
    if tz == "Z" || tz == "UTC" {
        return Some(0);
    }
    let (sign, rest) = match tz.as_bytes().first()? {
        b'+' => (1, &tz[1..]),
        b'-' => (-1, &tz[1..]),
        _ => return None,
    };
    let (hh, mm) = match rest.len() {
        2 => (rest, "00"),
        4 => (&rest[..2], &rest[2..]),
        5 if rest.as_bytes()[2] == b':' => (&rest[..2], &rest[3..]),
        _ => return None,
    };
    if !(hh.bytes().all(|b| b.is_ascii_digit()) && mm.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let (h, m): (i64, i64) = (hh.parse().ok()?, mm.parse().ok()?);
    if m >= 60 || h * 60 + m > 18 * 60 {
        return None;
    }
    Some(sign * (h * 3600 + m * 60))
}

/// The proleptic Gregorian date `(year, month, day)` of `days` since 1970-01-01
/// (Howard Hinnant's `civil_from_days`; pure integer arithmetic).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The local calendar date `YYYY-MM-DD` of instant `ms` (since the Unix epoch,
/// UTC) at a fixed offset of `offset_secs` east of UTC.
pub fn local_date(ms: u64, offset_secs: i64) -> String {
    let local_secs = (ms / 1000) as i64 + offset_secs;
    let (y, m, d) = civil_from_days(local_secs.div_euclid(86_400));
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_parts_are_kept() {
        assert_eq!(part("u-42"), "u-42");
        assert_eq!(part("ORDER_SHIPPED"), "ORDER_SHIPPED");
    }

    #[test]
    fn unsafe_bytes_are_escaped_injectively() {
        assert_eq!(part("John Doe"), "John+20Doe");
        assert_eq!(part("a:b"), "a+3Ab");
        assert_ne!(part("a+3Ab"), part("a:b"));
        assert_eq!(part("é"), "+C3+A9");
    }

    #[test]
    fn long_and_empty_parts_are_hashed() {
        let long = "x".repeat(65);
        let p = part(&long);
        assert!(p.starts_with('=') && p.len() == 33, "{p}");
        assert_eq!(p, part(&long));
        assert!(part("").starts_with('='));
        assert_eq!(part(&"x".repeat(64)), "x".repeat(64));
    }

    #[test]
    fn offsets() {
        assert_eq!(parse_offset("+08:00"), Some(8 * 3600));
        assert_eq!(parse_offset("-05:30"), Some(-(5 * 3600 + 30 * 60)));
        assert_eq!(parse_offset("Z"), Some(0));
        assert_eq!(parse_offset("+0800"), Some(8 * 3600));
        assert_eq!(parse_offset("08:00"), None);
        assert_eq!(parse_offset("+19:00"), None);
        assert_eq!(parse_offset("+08:60"), None);
        assert_eq!(parse_offset("Asia/Shanghai"), None);
    }

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        // 2026-11-30T15:59:59Z and 16:00:00Z: same UTC day, different +08:00 days.
        let a = 1_796_054_399_000; // 2026-11-30T15:59:59Z
        assert_eq!(local_date(a, 0), "2026-11-30");
        assert_eq!(local_date(a, 8 * 3600), "2026-11-30");
        assert_eq!(local_date(a + 1000, 8 * 3600), "2026-12-01");
        assert_eq!(local_date(951_782_400_000, 0), "2000-02-29");
    }
}
