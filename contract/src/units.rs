//! Human-friendly quantities: memory sizes (`4Gi`), compute shares (`30%`)
//! and durations (`500ms`), parsed strictly and printed compactly.

use std::time::Duration;

/// A quantity that does not parse, with what would have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error(
        "bad memory size {0:?}: use a number with an optional unit, Ki Mi Gi Ti (powers of 1024) \
         or K M G T (powers of 1000), e.g. 4Gi or 512Mi"
    )]
    Size(String),
    #[error("bad compute share {0:?}: use a percentage in (0, 100], e.g. 30% or 12.5%")]
    Share(String),
    #[error("bad duration {0:?}: use a number with a unit, us ms s m or h, e.g. 500ms or 5m")]
    Duration(String),
}

/// Splits `text` into its leading decimal number and the unit after it.
fn split_number(text: &str) -> Option<(f64, &str)> {
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (num, unit) = text.split_at(end);
    // "1." and ".5" are unusual but unambiguous; "" and "." are not numbers.
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return None;
    }
    num.parse::<f64>().ok().map(|n| (n, unit))
}

/// Parses a memory size: `4Gi`, `512Mi`, `1.5Gi`, `4G`, `1000000`, `4GiB`.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let bad = || UnitError::Size(text.to_owned());
    let t = text.trim();
    let (n, unit) = split_number(t).ok_or_else(bad)?;
    let unit = unit.trim();
    let unit = unit.strip_suffix('B').unwrap_or(unit);
    let mult: u64 = match unit {
        "" => 1,
        "K" | "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(bad()),
    };
    let bytes = n * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

/// Parses a compute share into parts per million: `30%`, `12.5%`, `100%`.
/// A bare number is read as a percentage too (`30` = 30%).
pub fn parse_share_ppm(text: &str) -> Result<u32, UnitError> {
    let bad = || UnitError::Share(text.to_owned());
    let t = text.trim();
    let (n, unit) = split_number(t).ok_or_else(bad)?;
    if !matches!(unit.trim(), "" | "%") {
        return Err(bad());
    }
    let ppm = (n * 10_000.0).round();
    if !(1.0..=1_000_000.0).contains(&ppm) {
        return Err(bad());
    }
    Ok(ppm as u32)
}

/// Parses a duration: `500ms`, `1s`, `1.5s`, `5m`, `2h`.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let bad = || UnitError::Duration(text.to_owned());
    let t = text.trim();
    let (n, unit) = split_number(t).ok_or_else(bad)?;
    let secs = match unit.trim() {
        "us" | "µs" => n / 1_000_000.0,
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(bad()),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| bad())
}

/// Formats bytes with a binary unit and at most one decimal: `4.0Gi`, `512Mi`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["", "Ki", "Mi", "Gi", "Ti"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes}")
    } else if v.fract() == 0.0 {
        format!("{v:.0}{}", UNITS[i])
    } else {
        format!("{v:.1}{}", UNITS[i])
    }
}

/// Formats parts per million as a percentage: `30%`, `12.5%`.
pub fn format_ppm(ppm: u32) -> String {
    let pct = f64::from(ppm) / 10_000.0;
    if pct.fract() == 0.0 {
        format!("{pct:.0}%")
    } else {
        format!("{pct:.1}%")
    }
}

/// Formats a duration as the parser reads it back.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !d.as_micros().is_multiple_of(1000) {
        format!("{}us", d.as_micros())
    } else if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else {
        format!("{}s", ms / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_every_unit() {
        assert_eq!(parse_size("4Gi"), Ok(4 << 30));
        assert_eq!(parse_size("512Mi"), Ok(512 << 20));
        assert_eq!(parse_size("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_size("4G"), Ok(4_000_000_000));
        assert_eq!(parse_size("4GiB"), Ok(4 << 30));
        assert_eq!(parse_size("123"), Ok(123));
        assert_eq!(parse_size(" 2Ti "), Ok(2 << 40));
        assert_eq!(parse_size("10k"), Ok(10_000));
    }

    #[test]
    fn bad_sizes_name_the_input_and_the_fix() {
        for bad in [
            "4Gx", "", "Gi", "-4Gi", "4 Gi Gi", "1.2.3Gi", "0.5", "1e9", "4gi",
        ] {
            let e = parse_size(bad).expect_err(bad);
            let msg = e.to_string();
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
            assert!(msg.contains("e.g. 4Gi"), "{msg}");
        }
    }

    #[test]
    fn shares() {
        assert_eq!(parse_share_ppm("30%"), Ok(300_000));
        assert_eq!(parse_share_ppm("12.5%"), Ok(125_000));
        assert_eq!(parse_share_ppm("100%"), Ok(1_000_000));
        assert_eq!(parse_share_ppm("30"), Ok(300_000));
        assert_eq!(parse_share_ppm("0.0001%"), Ok(1));
        for bad in ["0%", "101%", "30%%", "abc", "", "-5%", "30 percent"] {
            assert!(
                matches!(parse_share_ppm(bad), Err(UnitError::Share(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        for bad in ["5", "5x", "", "ms", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_duration(Duration::from_secs(300)), "300s");
        assert_eq!(format_duration(Duration::from_micros(250)), "250us");
    }

    #[test]
    fn formatting() {
        assert_eq!(format_bytes(4 << 30), "4Gi");
        assert_eq!(format_bytes(3 << 29), "1.5Gi");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(0), "0");
        assert_eq!(format_ppm(300_000), "30%");
        assert_eq!(format_ppm(125_000), "12.5%");
    }
}
