//! Sizes on the command line.

pub use llfree::FRAME_SIZE;

/// Bytes per huge (2 MiB) frame; zones are whole multiples of it.
pub const HUGE_SIZE: usize = FRAME_SIZE << llfree::HUGE_ORDER;

/// Parses a size like `8G`, `512M`, `64MiB` or `4096` (binary units) that is a non-zero multiple
/// of 2 MiB.
pub fn parse_zone(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let number_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(number_end);
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(format!("unknown unit in size {text:?}")),
    };
    let bytes = number
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("invalid size {text:?}"))?;
    if bytes == 0 || bytes % HUGE_SIZE != 0 {
        return Err(format!("size {text:?} is not a non-zero multiple of 2 MiB"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_units() {
        assert_eq!(parse_zone("8G"), Ok(8 << 30));
        assert_eq!(parse_zone("64MiB"), Ok(64 << 20));
        assert_eq!(parse_zone("2097152"), Ok(2 << 20));
        assert_eq!(parse_zone("1t"), Ok(1 << 40));
    }

    #[test]
    fn rejects_bad_sizes() {
        for bad in [
            "",
            "G",
            "0",
            "1M",
            "3X",
            "-2G",
            "99999999999999999999G",
            "1.5G",
        ] {
            assert!(parse_zone(bad).is_err(), "{bad}");
        }
    }
}
