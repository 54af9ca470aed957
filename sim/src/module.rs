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
//! Durations: the contract's duration syntax (`tessera_contract::units`: a number,
//! decimals allowed, with `ns`, `us`, `ms`, `s`, `m` or `h`), or a bare `0`; at most 1e6 s.
//!
//! Real kernels (from cubins, PTX and fat binaries, see [`crate::image`]) carry no
//! duration: they get [`KernelTime`]'s model, a fixed cost plus a cost per thread of the
//! launch, set by `TESSERA_SIM_KERNEL_TIME` (default `2us+5ps/thread`).

use std::collections::HashMap;

use tessera_contract::units;

/// How long one launch of a kernel occupies the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cost {
    /// The same for every launch.
    Fixed(u64),
    /// This many ns per block of the grid (`gridDimX * gridDimY * gridDimZ`).
    PerBlock(u64),
    /// A real kernel: the duration model of [`KernelTime`].
    Modelled(KernelTime),
}

impl Cost {
    /// Duration in ns of a launch with `blocks` blocks of
    /// [`ASSUMED_BLOCK_THREADS`] threads (for callers that do not know the block size).
    #[inline]
    pub fn duration(self, blocks: u64) -> u64 {
        self.launch(blocks, ASSUMED_BLOCK_THREADS)
    }

    /// Duration in ns of a launch of `blocks` blocks of `threads` threads each.
    #[inline]
    pub fn launch(self, blocks: u64, threads: u64) -> u64 {
        match self {
            Cost::Fixed(ns) => ns,
            Cost::PerBlock(ns) => ns.saturating_mul(blocks),
            Cost::Modelled(m) => m.duration(blocks.saturating_mul(threads)),
        }
    }
}

/// The block size [`Cost::duration`] assumes for modelled kernels.
pub const ASSUMED_BLOCK_THREADS: u64 = 256;

/// The variable that sets the duration model of real kernels.
pub const KERNEL_TIME_VAR: &str = "TESSERA_SIM_KERNEL_TIME";

/// The longest a modelled kernel runs: a huge grid must not stall a device for days.
pub const MAX_MODELLED_NS: u64 = 10_000_000_000;

/// How long a real kernel runs on the simulated device: `base + threads × per_thread`,
/// where `threads` is the whole launch (grid blocks × threads per block), at most
/// [`MAX_MODELLED_NS`]. Written `<base>+<per>/thread` (`2us+5ps/thread`, the default: a
/// few µs for a small kernel, ~7 µs for an elementwise kernel over a million elements,
/// about what an H100 takes), or just `<base>` or `<per>/thread`. Units `ps`, `ns`, `us`,
/// `ms`, `s`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelTime {
    pub base_ns: u64,
    pub per_thread_ps: u64,
}

impl Default for KernelTime {
    fn default() -> Self {
        KernelTime {
            base_ns: 2_000,
            per_thread_ps: 5,
        }
    }
}

impl KernelTime {
    /// Duration in ns of a launch of `threads` threads in all.
    #[inline]
    pub fn duration(self, threads: u64) -> u64 {
        let per = u128::from(threads) * u128::from(self.per_thread_ps) / 1000;
        (u128::from(self.base_ns) + per).min(u128::from(MAX_MODELLED_NS)) as u64
    }

    /// Parses `<base>+<per>/thread`, `<base>` or `<per>/thread`.
    pub fn parse(text: &str) -> Result<KernelTime, String> {
        let mut model = KernelTime {
            base_ns: 0,
            per_thread_ps: 0,
        };
        let text = text.trim();
        if text.is_empty() {
            return Err("empty kernel time".into());
        }
        for (i, part) in text.split('+').enumerate() {
            let part = part.trim();
            if let Some(per) = part.strip_suffix("/thread") {
                if model.per_thread_ps != 0 || i > 1 {
                    return Err(format!("{part:?}: one per-thread term at most"));
                }
                model.per_thread_ps = parse_ps(per).map_err(|e| format!("{part:?}: {e}"))?;
            } else if i == 0 {
                model.base_ns = parse_ps(part).map_err(|e| format!("{part:?}: {e}"))? / 1000;
            } else {
                return Err(format!(
                    "{part:?}: expected <base>+<per>/thread, e.g. 2us+5ps/thread"
                ));
            }
        }
        Ok(model)
    }

    /// The model `TESSERA_SIM_KERNEL_TIME` sets (the default when it is unset).
    pub fn from_env() -> Result<KernelTime, String> {
        match std::env::var(KERNEL_TIME_VAR) {
            Err(std::env::VarError::NotPresent) => Ok(KernelTime::default()),
            Err(_) => Err(format!("{KERNEL_TIME_VAR} is not UTF-8")),
            Ok(v) => KernelTime::parse(&v).map_err(|e| format!("{KERNEL_TIME_VAR}={v}: {e}")),
        }
    }
}

/// Parses `0`, `5ps`, `1.5ns`, `2us`, ... into picoseconds: the contract's fine
/// duration syntax, or a bare `0`; at most 1e6 s.
fn parse_ps(text: &str) -> Result<u64, String> {
    if text == "0" {
        return Ok(0);
    }
    let ps = units::parse_duration_ps(text).map_err(|e| e.to_string())?;
    if ps > 1_000_000_000_000_000_000 {
        return Err("out of range (at most 1e6 s)".into());
    }
    Ok(ps)
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
            Some(d) => Cost::PerBlock(parse_duration(d).map_err(err)?),
            None => Cost::Fixed(parse_duration(cost_text).map_err(err)?),
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

/// Parses `0`, `500ns`, `50us`, `1.5ms`, `2s` into ns: the contract's duration syntax,
/// or a bare `0` (a kernel that takes no time); at most 1e6 s.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    if text == "0" {
        return Ok(0);
    }
    let ns = units::parse_duration(text)
        .map_err(|e| e.to_string())?
        .as_nanos();
    if ns > 1_000_000_000_000_000 {
        return Err("duration out of range (at most 1e6 s)".into());
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
    fn kernel_time_model() {
        let d = KernelTime::default();
        assert_eq!(d, KernelTime::parse("2us+5ps/thread").unwrap());
        // 2 µs + 1 Mi threads × 5 ps.
        assert_eq!(d.duration(1 << 20), 2_000 + 5_242);
        assert_eq!(Cost::Modelled(d).launch(4096, 256), 2_000 + 5_242);
        assert_eq!(Cost::Modelled(d).duration(4096), 2_000 + 5_242);
        assert_eq!(Cost::Fixed(7).launch(4096, 256), 7);
        assert_eq!(Cost::PerBlock(3).launch(10, 1024), 30);
        // A grid of 2^31 × 65535 × 65535 blocks of 1024 threads stops at the cap.
        let huge = (1u64 << 31) * 65535 * 65535;
        assert_eq!(Cost::Modelled(d).launch(huge, 1024), MAX_MODELLED_NS);
        for (text, base, per) in [
            ("1ms", 1_000_000, 0),
            ("0.5ns/thread", 0, 500),
            ("0+1ns/thread", 0, 1000),
            (" 3us + 2ps/thread ", 3_000, 2),
        ] {
            assert_eq!(
                KernelTime::parse(text),
                Ok(KernelTime {
                    base_ns: base,
                    per_thread_ps: per
                }),
                "{text}"
            );
        }
        for bad in [
            "",
            "fast",
            "1ms+2ms",
            "1ps/thread+1ps/thread",
            "2us+",
            "5/thread",
            "-1us",
            "1us/block",
        ] {
            assert!(KernelTime::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0"), Ok(0));
        assert_eq!(parse_duration("7ns"), Ok(7));
        assert_eq!(parse_duration("2s"), Ok(2_000_000_000));
        assert_eq!(parse_duration("1.5ms"), Ok(1_500_000));
        // The contract's units, minutes and hours included.
        assert_eq!(parse_duration("5h"), Ok(18_000_000_000_000));
        for bad in [
            "",
            "5",
            "ms",
            "1.2.3ms",
            "5ps",
            "300h",
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
