//! Byte sizes as people write them: a decimal number with an optional binary suffix, `K`, `M`,
//! `G` or `T`, one syntax for every flag, subcommand and setting. Every suffix is a power of
//! 1024, however it is spelt: `1G`, `1g`, `1GiB` and `1GB` are all 2^30 bytes (as in QEMU,
//! Cloud Hypervisor and Firecracker's `mem_size_mib`, memory sizes are binary).

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
    /// A size that must be whole MiB is not.
    #[error("'{0}' is not a whole number of MiB")]
    NotWholeMib(String),
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
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        _ => return Err(SizeError::Malformed(text.to_owned())),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| SizeError::Overflow(text.to_owned()))?;
    value
        .checked_mul(1 << shift)
        .ok_or_else(|| SizeError::Overflow(text.to_owned()))
}

/// Parses a balloon size: a size as [`parse_size`] takes it, where a bare number counts MiB
/// (the API's `amount_mib`); it must be a whole number of MiB.
pub fn parse_mib(text: &str) -> Result<u64, SizeError> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map_err(|_| SizeError::Overflow(text.to_owned()));
    }
    let bytes = parse_size(text)?;
    if !bytes.is_multiple_of(1 << 20) {
        return Err(SizeError::NotWholeMib(text.to_owned()));
    }
    Ok(bytes >> 20)
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

/// `bytes` with one decimal in the largest binary unit it reaches ("1.5 GiB"), for progress.
pub fn format_size_approx(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    UNITS
        .iter()
        .find(|(shift, _)| bytes >= 1 << shift)
        .map(|(shift, unit)| format!("{:.1} {unit}", bytes as f64 / (1u64 << shift) as f64))
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
        assert_eq!(parse_size("1GB"), Ok(1 << 30));
        assert_eq!(parse_size("256MB"), Ok(256 << 20));
        assert_eq!(parse_size("4kb"), Ok(4 << 10));
    }

    #[test]
    fn rejects_empty_malformed_and_overflowing_sizes() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        for bad in [
            "G", "1.5G", "-1G", " 1G", "1G ", "1X", "1GBB", "0x10", "1 G", "+5", "1iB",
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
    fn balloon_sizes_take_suffixes_and_bare_mib() {
        assert_eq!(parse_mib("256"), Ok(256));
        assert_eq!(parse_mib("256M"), Ok(256));
        assert_eq!(parse_mib("1G"), Ok(1024));
        assert_eq!(parse_mib("1GB"), Ok(1024));
        assert_eq!(parse_mib("4K"), Err(SizeError::NotWholeMib("4K".into())));
        assert_eq!(parse_mib("-5"), Err(SizeError::Malformed("-5".into())));
    }

    #[test]
    fn formats_with_the_largest_exact_unit() {
        assert_eq!(format_size(1 << 30), "1 GiB");
        assert_eq!(format_size(3 << 20), "3 MiB");
        assert_eq!(format_size((1 << 30) + (1 << 20)), "1025 MiB");
        assert_eq!(format_size(4097), "4097 bytes");
        assert_eq!(format_size(0), "0 bytes");
    }

    #[test]
    fn approximate_sizes_have_one_decimal() {
        assert_eq!(format_size_approx(3 << 29), "1.5 GiB");
        assert_eq!(format_size_approx(1 << 30), "1.0 GiB");
        assert_eq!(format_size_approx(700 << 20), "700.0 MiB");
        assert_eq!(format_size_approx(100), "100 bytes");
    }
}
