//! Route patterns: `*` stands for any run of characters (`/` included); every other character
//! stands for itself.

/// Whether `pattern` matches `subject`. A `*` in `pattern` matches any run of `subject`'s
/// bytes; any other byte of `pattern` matches only itself, so a `*` in `subject` is matched
/// only by a `*` of `pattern`. With `subject` a name this is the route test; with `subject` a
/// later route's pattern it says whether `pattern` matches every name that one matches.
pub(crate) fn matches(pattern: &str, subject: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), subject.as_bytes());
    let (mut i, mut j) = (0, 0);
    // The last `*` of `pattern` seen, and where in `subject` it started absorbing.
    let mut star: Option<(usize, usize)> = None;
    while j < s.len() {
        if i < p.len() && p[i] == b'*' {
            star = Some((i, j));
            i += 1;
        } else if i < p.len() && p[i] == s[j] {
            i += 1;
            j += 1;
        } else if let Some((si, sj)) = star {
            // Let the last `*` absorb one more byte and retry from there.
            i = si + 1;
            j = sj + 1;
            star = Some((si, sj + 1));
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn a_star_matches_any_run_and_literals_match_themselves() {
        assert!(matches("orders/*", "orders/42"));
        assert!(matches("orders/*", "orders/"));
        assert!(matches("orders/*", "orders/eu/42"));
        assert!(!matches("orders/*", "orders"));
        assert!(!matches("orders/*", "payments/1"));
        assert!(matches("*", ""));
        assert!(matches("*/refund", "payments/7/refund"));
        assert!(!matches("*/refund", "payments/7/refunds"));
        assert!(matches("a*b*c", "axxbyyc"));
        assert!(!matches("a*b*c", "axxbyy"));
        assert!(matches("exact", "exact"));
        assert!(!matches("exact", "exact2"));
    }

    #[test]
    fn a_pattern_covers_a_later_one_only_when_it_matches_all_it_matches() {
        assert!(matches("*", "orders/*"));
        assert!(matches("orders/*", "orders/*"));
        assert!(matches("orders/*", "orders/eu/*"));
        assert!(matches("*/*", "a/*/b"));
        // A literal never matches a later pattern's `*`: `orders/4*` matches `orders/5`.
        assert!(!matches("orders/4*", "orders/*"));
        assert!(!matches("orders/x", "orders/*"));
        assert!(!matches("a/*", "*"));
    }
}
