//! Units on command lines: memory sizes as people write them.

/// A memory size from a command line: `24GiB`, `80G` (GiB), `16000MiB`, `512M`, `40GB` (10^9),
/// `1TiB`, or plain bytes.
///
/// # Errors
/// A message naming the value and the units accepted.
pub fn parse_memory_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || format!("{s:?} is not a memory size like 24GiB, 16000MiB or 40GB");
    let value: f64 = num.parse().map_err(|_| bad())?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(bad()),
    };
    let bytes = value * mult;
    // Up to 1 EiB: larger is a typo, and the float-to-int conversion must not saturate silently.
    if !bytes.is_finite() || bytes < 1.0 || bytes > (1u64 << 60) as f64 {
        return Err(format!("{s:?} is out of range (1 byte to 1 EiB)"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn memory_sizes_parse_with_their_units() {
        assert_eq!(parse_memory_size("24GiB"), Ok(24 * GIB));
        assert_eq!(parse_memory_size("80G"), Ok(80 * GIB));
        assert_eq!(parse_memory_size("16000MiB"), Ok(16000 << 20));
        assert_eq!(parse_memory_size("40GB"), Ok(40_000_000_000));
        assert_eq!(parse_memory_size("1.5GiB"), Ok(3 * GIB / 2));
        for bad in ["", "GiB", "24 parsecs", "-1GiB", "0", "1e400", "99999999999TiB", "1.2.3G"] {
            let e = parse_memory_size(bad).unwrap_err();
            assert!(e.contains(bad.trim()), "{bad:?}: {e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn memory_size_parsing_never_panics(s in "\\PC{0,24}") {
            let _ = parse_memory_size(&s);
        }

        #[test]
        fn whole_gib_round_trip(g in 1u64..1_000_000) {
            proptest::prop_assert_eq!(parse_memory_size(&format!("{g}GiB")), Ok(g * GIB));
        }
    }
}
