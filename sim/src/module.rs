//! The simulated module format: plain text declaring kernels and how long each occupies
//! the device.
//!
//! ```text
//! # comments and blank lines are ignored; `;` also ends a line
//! kernel noop 0
//! kernel step 50us
//! kernel train 20ms
//! kernel scaled 2us/block     # 2 µs per block of the launch grid
//! ```
//!
//! Durations: a number (decimals allowed) with `ns`, `us`, `ms` or `s`; a bare `0`.

use std::collections::HashMap;

/// How long one launch of a kernel occupies the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cost {
    /// The same for every launch.
    Fixed(u64),
    /// This many ns per block of the grid (`gridDimX * gridDimY * gridDimZ`).
    PerBlock(u64),
}

impl Cost {
    /// Duration in ns of a launch with `blocks` blocks.
    #[inline]
    pub fn duration(self, blocks: u64) -> u64 {
        match self {
            Cost::Fixed(ns) => ns,
            Cost::PerBlock(ns) => ns.saturating_mul(blocks),
        }
    }
}

/// A parsed module: kernel names and their costs, in declaration order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleSpec {
    pub kernels: Vec<(String, Cost)>,
}

impl ModuleSpec {
    pub fn get(&self, name: &str) -> Option<Cost> {
        self.kernels
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, c)| *c)
    }
}

/// Why a module text was rejected (the driver reports CUDA_ERROR_INVALID_IMAGE).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModuleError {
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
    #[error("module declares no kernel")]
    Empty,
}

/// Parses a module text.
pub fn parse_module(text: &str) -> Result<ModuleSpec, ModuleError> {
    let mut kernels: Vec<(String, Cost)> = Vec::new();
    let mut seen = HashMap::new();
    for (i, raw) in text.split(['\n', ';']).enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let err = |reason: String| ModuleError::Line {
            line: i + 1,
            reason,
        };
        let mut words = line.split_ascii_whitespace();
        match words.next() {
            Some("kernel") => {}
            Some(other) => return Err(err(format!("expected `kernel`, found {other:?}"))),
            None => continue,
        }
        let name = words
            .next()
            .ok_or_else(|| err("kernel needs a name and a duration".into()))?;
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'.')
        {
            return Err(err(format!("bad kernel name {name:?}")));
        }
        let cost_text = words
            .next()
            .ok_or_else(|| err(format!("kernel {name} needs a duration")))?;
        if let Some(extra) = words.next() {
            return Err(err(format!("unexpected {extra:?} after the duration")));
        }
        let cost = match cost_text.strip_suffix("/block") {
            Some(d) => Cost::PerBlock(parse_duration(d).map_err(|r| err(r.to_string()))?),
            None => Cost::Fixed(parse_duration(cost_text).map_err(|r| err(r.to_string()))?),
        };
        if seen.insert(name.to_string(), ()).is_some() {
            return Err(err(format!("kernel {name} declared twice")));
        }
        kernels.push((name.to_string(), cost));
    }
    if kernels.is_empty() {
        return Err(ModuleError::Empty);
    }
    Ok(ModuleSpec { kernels })
}

/// Parses `0`, `500ns`, `50us`, `1.5ms`, `2s` into ns.
pub fn parse_duration(text: &str) -> Result<u64, &'static str> {
    if text == "0" {
        return Ok(0);
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or("duration needs a unit (ns, us, ms, s)")?;
    let (number, unit) = text.split_at(split);
    let scale: f64 = match unit {
        "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        _ => return Err("unknown duration unit (use ns, us, ms or s)"),
    };
    if number.is_empty() || number.matches('.').count() > 1 {
        return Err("bad duration number");
    }
    let value: f64 = number.parse().map_err(|_| "bad duration number")?;
    let ns = (value * scale).round();
    if !(0.0..=1e15).contains(&ns) {
        return Err("duration out of range (at most 1e6 s)");
    }
    Ok(ns as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernels_and_costs() {
        let m = parse_module(
            "# demo\nkernel noop 0\nkernel step 50us  # comment\n\nkernel big 1.5ms; kernel grid 2us/block\n",
        )
        .expect("valid");
        assert_eq!(m.get("noop"), Some(Cost::Fixed(0)));
        assert_eq!(m.get("step"), Some(Cost::Fixed(50_000)));
        assert_eq!(m.get("big"), Some(Cost::Fixed(1_500_000)));
        assert_eq!(m.get("grid"), Some(Cost::PerBlock(2_000)));
        assert_eq!(m.get("grid").map(|c| c.duration(10)), Some(20_000));
        assert_eq!(m.get("missing"), None);
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0"), Ok(0));
        assert_eq!(parse_duration("7ns"), Ok(7));
        assert_eq!(parse_duration("2s"), Ok(2_000_000_000));
        for bad in [
            "",
            "5",
            "ms",
            "1.2.3ms",
            "5h",
            "-1ms",
            "1e3ms",
            "99999999999s",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn bad_modules_are_rejected_with_the_line() {
        for (text, line) in [
            ("kernel a 1ms\nfunc b 1ms", 2),
            ("kernel", 1),
            ("kernel a", 1),
            ("kernel a 1ms extra", 1),
            ("kernel a 5parsecs", 1),
            ("kernel a 1ms\nkernel a 2ms", 2),
            ("kernel a-b 1ms", 1),
            ("\u{7f}ELF\u{2}\u{1}", 1),
        ] {
            match parse_module(text) {
                Err(ModuleError::Line { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?} gave {other:?}"),
            }
        }
        assert_eq!(parse_module("# nothing\n\n"), Err(ModuleError::Empty));
    }
}
