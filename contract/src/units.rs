//! Quantities: memory sizes, percentages and durations. One parser each,
//! used by every flag, environment variable and configuration file, with
//! one syntax:
//!
//! | quantity   | syntax | examples |
//! |------------|--------|----------|
//! | size       | a number of bytes, or a number with a unit: `Ki Mi Gi Ti Pi` (powers of 1024) or `k`/`K` `M G T P` (powers of 1000), as Kubernetes quantities are written; a fraction is allowed with a unit and rounded down to a whole byte | `4096`, `4K`, `512Mi`, `1.5Gi`, `0.1Gi` |
//! | percentage | a number followed by `%`, at most four decimals; a bare number is refused (it reads as 30 to some and 0.3 to others) | `30%`, `12.5%`, `100%` |
//! | duration   | a number with a unit: `ns`, `us` (or `µs`), `ms`, `s`, `m`, `h`; fractions allowed; a bare number is refused (seconds to some, milliseconds to others) | `500ms`, `1.5s`, `2m` |
//! | fine duration | a duration, or a number of picoseconds (`ps`), for costs below a nanosecond (the simulator's per-thread kernel time) | `5ps`, `0.5ns`, `2us` |
//!
//! Sizes and percentages are computed in integers, so `1.5Gi` and `12.5%`
//! are exact. Each error names the input and shows what would have parsed.

use std::time::Duration;

/// A quantity that does not parse, with what would have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error(
        "bad memory size {0:?}: use bytes or a number with a unit, Ki Mi Gi Ti Pi (powers of \
         1024) or K M G T P (powers of 1000), e.g. 4Gi or 512Mi"
    )]
    Size(String),
    #[error("bad percentage {0:?}: use a number from 0 to 100 followed by %, e.g. 30% or 12.5%")]
    Percent(String),
    #[error("bad compute share {0:?}: use a percentage in (0%, 100%], e.g. 30% or 12.5%")]
    Share(String),
    #[error(
        "bad duration {0:?}: use a number with a unit, ns us ms s m or h, e.g. 500ms, 2s or 5m"
    )]
    Duration(String),
    #[error(
        "bad duration {0:?}: use a number with a unit, ps ns us ms s m or h, e.g. 5ps, 2us or 1ms"
    )]
    FineDuration(String),
}

/// A decimal number split into its integer digits and fraction digits;
/// `None` unless it is digits with at most one point and a digit somewhere.
fn decimal(num: &str) -> Option<(&str, &str)> {
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if (int.is_empty() && frac.is_empty()) || !digits(int) || !digits(frac) {
        return None;
    }
    Some((int, frac))
}

/// Splits `text` (trimmed) into its leading number and the unit after it.
fn split_unit(text: &str) -> (&str, &str) {
    let t = text.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    t.split_at(end)
}

/// `int.frac × mult / div`, rounded down, in integers; `None` on overflow.
fn scaled(int: &str, frac: &str, mult: u128, div: u128) -> Option<u128> {
    // More than 30 fraction digits cannot change the result and would
    // overflow the scale.
    let frac = &frac[..frac.len().min(30)];
    let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let scale = 10u128.checked_pow(u32::try_from(frac.len()).ok()?)?;
    let whole = int.checked_mul(scale)?.checked_add(frac_value)?;
    Some(whole.checked_mul(mult)? / scale / div)
}

/// Parses a memory size: `4096`, `4K`, `512Mi`, `1.5Gi`, `2G`.
pub fn parse_size(text: &str) -> Result<u64, UnitError> {
    let bad = || UnitError::Size(text.to_owned());
    let (num, unit) = split_unit(text);
    let (int, frac) = decimal(num).ok_or_else(bad)?;
    let mult: u128 = match unit {
        "" if frac.is_empty() => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return Err(bad()),
    };
    let bytes = scaled(int, frac, mult, 1).ok_or_else(bad)?;
    u64::try_from(bytes).map_err(|_| bad())
}

/// One GPU's whole compute time, in parts per million: the unit of every
/// compute share (control files, the manager's API, the node config).
pub const FULL_COMPUTE_PPM: u32 = 1_000_000;

/// Parses a percentage into parts per million: `30%` → 300 000. From 0%
/// to 100%, at most four decimals (the resolution of a ppm).
pub fn parse_percent(text: &str) -> Result<u32, UnitError> {
    let bad = || UnitError::Percent(text.to_owned());
    let (num, unit) = split_unit(text);
    if unit != "%" {
        return Err(bad());
    }
    let (int, frac) = decimal(num).ok_or_else(bad)?;
    if frac.len() > 4 {
        return Err(bad());
    }
    let ppm = scaled(int, frac, 10_000, 1).ok_or_else(bad)?;
    if ppm > u128::from(FULL_COMPUTE_PPM) {
        return Err(bad());
    }
    Ok(ppm as u32)
}

/// Parses a compute share: a percentage above 0% (`30%`, `12.5%`, `100%`),
/// in parts per million.
pub fn parse_share_ppm(text: &str) -> Result<u32, UnitError> {
    match parse_percent(text) {
        Ok(ppm) if ppm > 0 => Ok(ppm),
        _ => Err(UnitError::Share(text.to_owned())),
    }
}

/// Nanoseconds in one of the duration units.
fn ns_per(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Parses a duration: `500ms`, `1s`, `1.5s`, `5m`, `2h`, `250us`.
pub fn parse_duration(text: &str) -> Result<Duration, UnitError> {
    let bad = || UnitError::Duration(text.to_owned());
    let (num, unit) = split_unit(text);
    let (int, frac) = decimal(num).ok_or_else(bad)?;
    let ns_per = ns_per(unit).ok_or_else(bad)?;
    let ns = scaled(int, frac, ns_per, 1).ok_or_else(bad)?;
    let secs = u64::try_from(ns / 1_000_000_000).map_err(|_| bad())?;
    Ok(Duration::new(secs, (ns % 1_000_000_000) as u32))
}

/// Parses a duration into picoseconds, rounded down: the units of [`parse_duration`]
/// and `ps` (`5ps`, `0.5ns`, `2us`). For costs below a nanosecond, which a
/// [`Duration`] cannot hold: the simulator's per-thread kernel time.
pub fn parse_duration_ps(text: &str) -> Result<u64, UnitError> {
    let bad = || UnitError::FineDuration(text.to_owned());
    let (num, unit) = split_unit(text);
    let (int, frac) = decimal(num).ok_or_else(bad)?;
    let ps_per = match unit {
        "ps" => 1,
        _ => ns_per(unit).ok_or_else(bad)? * 1_000,
    };
    let ps = scaled(int, frac, ps_per, 1).ok_or_else(bad)?;
    u64::try_from(ps).map_err(|_| bad())
}

/// [`parse_size`] with a `String` error, for clap's `value_parser`.
pub fn size_arg(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|e| e.to_string())
}

/// [`parse_duration`] with a `String` error, for clap's `value_parser`.
pub fn duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

/// [`parse_percent`] with a `String` error, for clap's `value_parser`.
pub fn percent_arg(text: &str) -> Result<u32, String> {
    parse_percent(text).map_err(|e| e.to_string())
}

/// Formats bytes with a binary unit and at most one decimal: `4Gi`, `1.5Gi`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["", "Ki", "Mi", "Gi", "Ti", "Pi"];
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

/// Formats a duration as [`parse_duration`] reads it back.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !d.subsec_nanos().is_multiple_of(1000) {
        format!("{}ns", d.as_nanos())
    } else if !d.as_micros().is_multiple_of(1000) {
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

    const GI: u64 = 1 << 30;

    #[test]
    fn sizes_in_every_unit() {
        assert_eq!(parse_size("4Gi"), Ok(4 * GI));
        assert_eq!(parse_size("512Mi"), Ok(512 << 20));
        assert_eq!(parse_size("1.5Gi"), Ok(3 * GI / 2));
        assert_eq!(parse_size("4G"), Ok(4_000_000_000));
        assert_eq!(parse_size("4K"), Ok(4_000));
        assert_eq!(parse_size("10k"), Ok(10_000));
        assert_eq!(parse_size("123"), Ok(123));
        assert_eq!(parse_size(" 2Ti "), Ok(2 << 40));
        assert_eq!(parse_size("1Pi"), Ok(1 << 50));
        assert_eq!(parse_size("0"), Ok(0));
        // A fraction with a unit is rounded down to a byte, never refused.
        assert_eq!(parse_size("0.1Gi"), Ok(107_374_182));
        assert_eq!(parse_size(".5Ki"), Ok(512));
    }

    #[test]
    fn bad_sizes_name_the_input_and_the_fix() {
        for bad in [
            "4Gx",
            "",
            "Gi",
            "-4Gi",
            "4 Gi Gi",
            "1.2.3Gi",
            "0.5",
            "1e9",
            "4gi",
            "4GiB",
            "4GB",
            ".",
            "99999999999999999999Ti",
        ] {
            let e = parse_size(bad).expect_err(bad);
            let msg = e.to_string();
            assert!(msg.contains(&format!("{bad:?}")), "{msg}");
            assert!(msg.contains("e.g. 4Gi"), "{msg}");
        }
    }

    #[test]
    fn percentages_need_their_sign() {
        assert_eq!(parse_percent("30%"), Ok(300_000));
        assert_eq!(parse_percent("12.5%"), Ok(125_000));
        assert_eq!(parse_percent("100%"), Ok(1_000_000));
        assert_eq!(parse_percent("0%"), Ok(0));
        assert_eq!(parse_percent("0.0001%"), Ok(1));
        for bad in [
            "30",
            "0.3",
            "101%",
            "30%%",
            "abc",
            "",
            "-5%",
            "%",
            "0.00001%",
            "30 percent",
        ] {
            let e = parse_percent(bad).expect_err(bad).to_string();
            assert!(
                e.contains(&format!("{bad:?}")) && e.contains("e.g. 30%"),
                "{e}"
            );
        }
    }

    #[test]
    fn shares_are_percentages_above_zero() {
        assert_eq!(parse_share_ppm("30%"), Ok(300_000));
        assert_eq!(parse_share_ppm("100%"), Ok(1_000_000));
        for bad in ["0%", "150%", "30", ""] {
            let e = parse_share_ppm(bad).expect_err(bad).to_string();
            assert!(e.starts_with(&format!("bad compute share {bad:?}")), "{e}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("250µs"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("10ns"), Ok(Duration::from_nanos(10)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["5", "5x", "", "ms", "-1s", "1.2.3s", "5 s s"] {
            let e = parse_duration(bad).expect_err(bad).to_string();
            assert!(
                e.contains(&format!("{bad:?}")) && e.contains("e.g. 500ms"),
                "{e}"
            );
        }
    }

    #[test]
    fn fine_durations_add_picoseconds() {
        assert_eq!(parse_duration_ps("5ps"), Ok(5));
        assert_eq!(parse_duration_ps("0.5ns"), Ok(500));
        assert_eq!(parse_duration_ps("2us"), Ok(2_000_000));
        assert_eq!(parse_duration_ps("2µs"), Ok(2_000_000));
        assert_eq!(parse_duration_ps("1.5s"), Ok(1_500_000_000_000));
        assert_eq!(parse_duration_ps("2h"), Ok(7_200_000_000_000_000));
        assert_eq!(parse_duration_ps(" 0ps "), Ok(0));
        // Below a picosecond rounds down, as sizes round down to a byte.
        assert_eq!(parse_duration_ps("1.9ps"), Ok(1));
        for bad in [
            "5", "5x", "", "ps", "-1ps", "1.2.3ns", "5 ps ps", "1e3ps", "9999999h",
        ] {
            let e = parse_duration_ps(bad).expect_err(bad).to_string();
            assert!(
                e.contains(&format!("{bad:?}")) && e.contains("e.g. 5ps"),
                "{e}"
            );
        }
        // The coarse parser keeps refusing picoseconds: a Duration cannot hold them.
        assert!(parse_duration("5ps").is_err());
    }

    #[test]
    fn formatting_reads_back() {
        assert_eq!(format_bytes(4 * GI), "4Gi");
        assert_eq!(format_bytes(3 * GI / 2), "1.5Gi");
        assert_eq!(format_bytes(1000), "1000");
        assert_eq!(format_bytes(0), "0");
        assert_eq!(format_ppm(300_000), "30%");
        assert_eq!(format_ppm(125_000), "12.5%");
        for d in [
            Duration::from_millis(500),
            Duration::from_secs(300),
            Duration::from_micros(250),
            Duration::from_nanos(10),
        ] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
        assert_eq!(format_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(format_duration(Duration::from_secs(300)), "300s");
    }

    #[test]
    fn clap_parsers_carry_the_same_message() {
        assert_eq!(size_arg("4K"), Ok(4000));
        assert_eq!(duration_arg("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(percent_arg("5%"), Ok(50_000));
        assert_eq!(
            size_arg("4x").unwrap_err(),
            UnitError::Size("4x".into()).to_string()
        );
    }
}
