//! How strong a callback path token must be: the one rule the host applies
//! at start (`send::plugin`) and the API documents.

/// Fewest bits of entropy a callback path token must carry.
pub const PATH_TOKEN_BITS: usize = 128;

/// Fewest distinct characters in a path token (`aaaa…` is not random).
const PATH_TOKEN_DISTINCT: usize = 8;

/// Why `token` is too weak to guard a callback route, or `None`.
///
/// The rule: only URL-safe base64 characters (`A-Z a-z 0-9 - _`, which
/// include hex), counted at 4 bits each when all are hex digits and 6 bits
/// otherwise, for at least [`PATH_TOKEN_BITS`]: 32 hex digits (`openssl rand
/// -hex 16`) or 22 base64url characters (`openssl rand -base64 16`, with
/// `+/` as `-_` and no `=`); and at least 8 distinct characters.
pub fn path_token_weakness(token: &str) -> Option<String> {
    if let Some(c) = token
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Some(format!(
            "it holds {c:?}: use only the URL-safe base64 characters A-Z a-z 0-9 - _"
        ));
    }
    let hex = token.chars().all(|c| c.is_ascii_hexdigit());
    let (bits_each, alphabet) = if hex {
        (4, "hex digits")
    } else {
        (6, "base64url characters")
    };
    let needed = PATH_TOKEN_BITS.div_ceil(bits_each);
    if token.len() < needed {
        return Some(format!(
            "{} {alphabet} carry at most {} bits; {PATH_TOKEN_BITS} need at least {needed}",
            token.len(),
            token.len() * bits_each
        ));
    }
    let distinct = token
        .chars()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if distinct < PATH_TOKEN_DISTINCT {
        return Some(format!(
            "it has only {distinct} distinct characters (at least {PATH_TOKEN_DISTINCT}): not a random token"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::path_token_weakness;

    #[test]
    fn a_path_token_needs_128_bits_of_a_url_safe_alphabet() {
        for strong in [
            "0123456789abcdef0123456789abcdef",
            "Kq3xW9vLmP2rT7yZ4nB8cD",
            "cb-sms-9d2e61f0a7c3b5d4e8f1",
        ] {
            assert_eq!(path_token_weakness(strong), None, "{strong}");
        }
        let weak = |t: &str| path_token_weakness(t).unwrap_or_else(|| panic!("{t} passed"));
        assert!(weak("1").contains("need at least 32"), "{}", weak("1"));
        assert!(
            weak("guess").contains("need at least 22"),
            "{}",
            weak("guess")
        );
        assert!(weak("0123456789abcdef0123456789abcde").contains("31 hex digits"));
        assert!(weak("Kq3xW9vLmP2rT7yZ4nB8c").contains("21 base64url characters"));
        assert!(weak("Kq3xW9vLmP2rT7yZ4nB8cD/").contains("'/'"));
        assert!(weak("ghghghghghghghghghghghgh").contains("distinct"));
    }
}
