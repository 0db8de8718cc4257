//! Sizes in and out: `16K`, `1.5G`, and back.

use crate::{usage, Result};

/// Parses a byte count with an optional binary suffix (K, M, G, T; an optional trailing `B`
/// or `iB` is accepted).
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let upper = t.to_ascii_uppercase();
    let stripped = upper.trim_end_matches("IB").trim_end_matches('B');
    let (num, mult) = match stripped.chars().last() {
        Some('K') => (&stripped[..stripped.len() - 1], 1u64 << 10),
        Some('M') => (&stripped[..stripped.len() - 1], 1 << 20),
        Some('G') => (&stripped[..stripped.len() - 1], 1 << 30),
        Some('T') => (&stripped[..stripped.len() - 1], 1 << 40),
        _ => (stripped, 1),
    };
    let bad = || {
        usage(format!(
            "invalid size '{s}': use a number with an optional K, M, G or T suffix"
        ))
    };
    if num.is_empty() {
        return Err(bad());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(bad);
    }
    let f: f64 = num.parse().map_err(|_| bad())?;
    if !(f.is_finite() && f >= 0.0) {
        return Err(bad());
    }
    let bytes = f * mult as f64;
    if bytes > u64::MAX as f64 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Sizes as every zeta command prints them (the engine's errors print them so too).
pub use zeta_core::dsl::human;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("16K").unwrap(), 16384);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert!(parse_size("abc").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1K").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(human(1536), "1.5K");
    }
}
