//! Byte sizes on the command line: a decimal number with an optional binary suffix, `K`, `M`,
//! `G` or `T` (powers of 1024; `KiB`, `MiB`, ... and lower case are accepted too).

/// Errors of parsing a size.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SizeError {
    /// The text is empty.
    #[error("empty size: expected a number with an optional K, M, G or T suffix (e.g. 512M)")]
    Empty,
    /// The text is not a number with a known suffix.
    #[error(
        "'{0}' is not a size: expected a number with an optional K, M, G or T suffix (e.g. 512M)"
    )]
    Malformed(String),
    /// The size does not fit in 64 bits.
    #[error("size '{0}' is too large")]
    Overflow(String),
}

/// Parses a size such as `4096`, `512M`, `1G` or `2GiB` into bytes.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    if text.is_empty() {
        return Err(SizeError::Empty);
    }
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(SizeError::Malformed(text.to_owned()));
    }
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        _ => return Err(SizeError::Malformed(text.to_owned())),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| SizeError::Overflow(text.to_owned()))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| SizeError::Overflow(text.to_owned()))
}

/// Formats `bytes` with the largest binary unit that divides it exactly ("1 GiB", "3 MiB",
/// "4097 bytes").
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    UNITS
        .iter()
        .find(|(shift, _)| bytes != 0 && bytes.is_multiple_of(1 << shift))
        .map(|(shift, unit)| format!("{} {unit}", bytes >> shift))
        .unwrap_or_else(|| format!("{bytes} bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_numbers_and_binary_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("8K"), Ok(8 << 10));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        assert_eq!(parse_size("100b"), Ok(100));
    }

    #[test]
    fn rejects_empty_malformed_and_overflowing_sizes() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        for bad in [
            "G", "1.5G", "-1G", " 1G", "1G ", "1X", "1GB", "0x10", "1 G", "+5",
        ] {
            assert_eq!(
                parse_size(bad),
                Err(SizeError::Malformed(bad.to_owned())),
                "{bad}"
            );
        }
        for big in [
            "18446744073709551616",
            "16777216T",
            "99999999999999999999999G",
        ] {
            assert_eq!(parse_size(big), Err(SizeError::Overflow(big.to_owned())));
        }
    }

    #[test]
    fn formats_with_the_largest_exact_unit() {
        assert_eq!(format_size(1 << 30), "1 GiB");
        assert_eq!(format_size(3 << 20), "3 MiB");
        assert_eq!(format_size((1 << 30) + (1 << 20)), "1025 MiB");
        assert_eq!(format_size(4097), "4097 bytes");
        assert_eq!(format_size(0), "0 bytes");
    }
}
