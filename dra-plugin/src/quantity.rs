//! Kubernetes quantities (`5Gi`, `512M`, `30`, `1.5Gi`, `250m`, `1e9`) as
//! whole numbers, rounded up as the API server rounds a quantity's integer
//! value: what a claim's consumed capacity and a device's capacities are
//! written in.

/// Why a quantity cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a Kubernetes quantity")]
    Syntax(String),
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("{0:?} is too large")]
    TooLarge(String),
}

/// The quantity's value, rounded up to a whole number.
pub fn parse(text: &str) -> Result<u64, QuantityError> {
    let syntax = || QuantityError::Syntax(text.to_owned());
    let s = text.trim();
    let s = match s.strip_prefix('+') {
        Some(r) => r,
        None if s.starts_with('-') => return Err(QuantityError::Negative(text.to_owned())),
        None => s,
    };
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(num_end);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(syntax());
    }
    // value = digits × 2^bin × 10^(dec − frac digits), rounded up.
    let (bin, dec): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        e if e.starts_with(['e', 'E']) => {
            let exp: i32 = e[1..].parse().map_err(|_| syntax())?;
            (0, exp)
        }
        _ => return Err(syntax()),
    };
    let too_large = || QuantityError::TooLarge(text.to_owned());
    let mut digits: u128 = 0;
    for c in int.chars().chain(frac.chars()) {
        digits = digits
            .checked_mul(10)
            .and_then(|d| d.checked_add(u128::from(c as u8 - b'0')))
            .ok_or_else(too_large)?;
    }
    let mut value = digits.checked_shl(bin).ok_or_else(too_large)?;
    if value >> bin != digits {
        return Err(too_large());
    }
    let exp = dec - i32::try_from(frac.len()).map_err(|_| syntax())?;
    if exp >= 0 {
        for _ in 0..exp {
            value = value.checked_mul(10).ok_or_else(too_large)?;
        }
    } else {
        let div = 10u128
            .checked_pow(exp.unsigned_abs())
            .ok_or_else(too_large)?;
        value = value.div_ceil(div);
    }
    u64::try_from(value).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_suffix_and_rounds_up() {
        assert_eq!(parse("5Gi"), Ok(5 << 30));
        assert_eq!(parse("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse("512M"), Ok(512_000_000));
        assert_eq!(parse("30"), Ok(30));
        assert_eq!(parse("30.2"), Ok(31));
        assert_eq!(parse("250m"), Ok(1));
        assert_eq!(parse("1e9"), Ok(1_000_000_000));
        assert_eq!(parse("+2k"), Ok(2000));
        assert_eq!(parse("0.1Gi"), Ok(107_374_183));
        assert_eq!(parse(".5Ki"), Ok(512));
        assert!(matches!(parse("-1Gi"), Err(QuantityError::Negative(_))));
        for bad in ["", "Gi", "5 Gi", "5GB", "five", "1e", "1.2.3"] {
            assert!(matches!(parse(bad), Err(QuantityError::Syntax(_))), "{bad}");
        }
        assert!(matches!(parse("100Ei"), Err(QuantityError::TooLarge(_))));
    }
}
