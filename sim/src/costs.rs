//! What the simulated driver's calls cost in time, as a real driver's do: host latency per
//! launch, the round trip of a synchronisation, and the device's gap between kernels.
//!
//! The compute arbiter is only tested where it will run if launches are not free: with a
//! free launch a program keeps any queue full instantly, and a synchronisation that
//! returns the nanosecond its work ends hides the host round trip that a `.item()` pays
//! on a GPU. Each figure is read once per process (when the driver starts), from
//! `TESSERA_SIM_LAUNCH_COST`, `TESSERA_SIM_SYNC_LATENCY` and `TESSERA_SIM_KERNEL_GAP`;
//! see docs/simulator.md ("What calls cost") for where each default comes from.

use crate::clock::{now_ns, sleep_until};
use crate::config::{ConfigError, invalid};

/// Host time one kernel launch (and one graph launch) takes in the calling thread.
pub const ENV_LAUNCH_COST: &str = "TESSERA_SIM_LAUNCH_COST";
/// How long after its work ends a synchronisation returns.
pub const ENV_SYNC_LATENCY: &str = "TESSERA_SIM_SYNC_LATENCY";
/// Idle time on the device between one kernel's end and the next queued one's start.
pub const ENV_KERNEL_GAP: &str = "TESSERA_SIM_KERNEL_GAP";

/// 3.85 µs: `cuLaunchKernel` of an empty kernel on the H200 Tessera ran on (in a VM,
/// driver 580, CUDA 13.0; issue 36).
pub const DEFAULT_LAUNCH_COST_NS: u64 = 3_850;
/// 5 µs: assumed, not measured on the H200. A synchronisation that finds its work done
/// still crosses into the driver and reads the completion back; NVIDIA's default
/// (spinning) wait notices the end within a few µs. `tests/gpu/run.sh` is where to
/// measure it.
pub const DEFAULT_SYNC_LATENCY_NS: u64 = 5_000;
/// 1 µs: the idle time between back-to-back kernels of a stream on the device
/// (issue 36's figure; the order of magnitude NVIDIA quotes for dependent launches).
pub const DEFAULT_KERNEL_GAP_NS: u64 = 1_000;

/// The largest value any of the three accepts: a cost above this is a typo, not a driver.
const MAX_COST_NS: u64 = 100_000_000;

/// The three figures, in ns. `Default` is the real driver's; [`DriverCosts::FREE`] is
/// what the simulator charged before (every call instantaneous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverCosts {
    pub launch_ns: u64,
    pub sync_latency_ns: u64,
    pub kernel_gap_ns: u64,
}

impl Default for DriverCosts {
    fn default() -> Self {
        DriverCosts {
            launch_ns: DEFAULT_LAUNCH_COST_NS,
            sync_latency_ns: DEFAULT_SYNC_LATENCY_NS,
            kernel_gap_ns: DEFAULT_KERNEL_GAP_NS,
        }
    }
}

impl DriverCosts {
    /// No cost at all: launches, synchronisations and kernel successions are instant.
    pub const FREE: DriverCosts = DriverCosts {
        launch_ns: 0,
        sync_latency_ns: 0,
        kernel_gap_ns: 0,
    };

    /// The defaults overridden by this process's environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|v| std::env::var(v).ok())
    }

    /// The defaults overridden by what `lookup` returns for each variable: a duration
    /// (`3.85us`, `0.5ms`) or `0`, at most 100 ms.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut c = DriverCosts::default();
        for (var, field) in [
            (ENV_LAUNCH_COST, &mut c.launch_ns),
            (ENV_SYNC_LATENCY, &mut c.sync_latency_ns),
            (ENV_KERNEL_GAP, &mut c.kernel_gap_ns),
        ] {
            if let Some(v) = lookup(var) {
                *field = parse_cost(var, &v)?;
            }
        }
        Ok(c)
    }

    /// Spends a launch's host time in the calling thread. A spin, not a sleep: the real
    /// driver's time is CPU work (building and writing the launch into the push buffer),
    /// and a sleep of a few µs would overshoot by tens.
    #[inline]
    pub fn pay_launch(&self) {
        if self.launch_ns > 0 {
            spin_until(now_ns().saturating_add(self.launch_ns));
        }
    }

    /// Waits as a synchronisation on work ending at `end_ns` does: until the work has
    /// ended and the round trip is over, `sync_latency` after the later of the work's end
    /// and the call (a synchronisation on finished work still crosses into the driver).
    /// The sleep ends at the work's end; the latency is spun, so a thread that woke late
    /// (a loaded CPU) pays no more than the latency in all.
    pub fn wait_for(&self, end_ns: u64) {
        let called = now_ns();
        sleep_until(end_ns);
        if self.sync_latency_ns > 0 {
            spin_until(end_ns.max(called).saturating_add(self.sync_latency_ns));
        }
    }
}

/// Busy-waits until CLOCK_MONOTONIC reaches `deadline_ns`.
#[inline]
pub fn spin_until(deadline_ns: u64) {
    while now_ns() < deadline_ns {
        std::hint::spin_loop();
    }
}

fn parse_cost(var: &'static str, value: &str) -> Result<u64, ConfigError> {
    let t = value.trim();
    let ns = if t == "0" {
        0
    } else {
        tessera_contract::units::parse_duration(t)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .map_err(|e| invalid(var, value, e))?
    };
    if ns > MAX_COST_NS {
        return Err(invalid(var, value, "must be at most 100ms"));
    }
    Ok(ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Result<DriverCosts, ConfigError> {
        let map: HashMap<&str, &str> = pairs.iter().copied().collect();
        DriverCosts::from_lookup(|k| map.get(k).map(|v| v.to_string()))
    }

    #[test]
    fn defaults_are_the_real_drivers() {
        let c = with(&[]).expect("defaults");
        assert_eq!(c.launch_ns, 3_850);
        assert_eq!(c.sync_latency_ns, 5_000);
        assert_eq!(c.kernel_gap_ns, 1_000);
    }

    #[test]
    fn overrides_parse_durations_and_zero() {
        let c = with(&[
            (ENV_LAUNCH_COST, "10.9us"),
            (ENV_SYNC_LATENCY, "0"),
            (ENV_KERNEL_GAP, "2us"),
        ])
        .expect("valid");
        assert_eq!(
            c,
            DriverCosts {
                launch_ns: 10_900,
                sync_latency_ns: 0,
                kernel_gap_ns: 2_000
            }
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (var, value) in [
            (ENV_LAUNCH_COST, "fast"),
            (ENV_SYNC_LATENCY, "-1us"),
            (ENV_KERNEL_GAP, "1s"),
            (ENV_KERNEL_GAP, "5"),
        ] {
            match with(&[(var, value)]) {
                Err(ConfigError::Invalid {
                    var: v, value: got, ..
                }) => {
                    assert_eq!((v, got.as_str()), (var, value));
                }
                Ok(c) => panic!("{var}={value} accepted: {c:?}"),
            }
        }
    }

    #[test]
    fn a_launch_costs_at_least_its_figure() {
        let c = DriverCosts {
            launch_ns: 200_000,
            ..DriverCosts::FREE
        };
        let t0 = now_ns();
        c.pay_launch();
        assert!(now_ns() - t0 >= 200_000);
    }

    #[test]
    fn a_synchronisation_returns_no_earlier_than_its_latency_after_the_end() {
        let c = DriverCosts {
            sync_latency_ns: 300_000,
            ..DriverCosts::FREE
        };
        // Work already over: the round trip is still paid.
        let t0 = now_ns();
        c.wait_for(0);
        assert!(now_ns() - t0 >= 300_000);
        // Work still running: its end plus the latency.
        let end = now_ns() + 1_000_000;
        c.wait_for(end);
        assert!(now_ns() >= end + 300_000);
    }
}
