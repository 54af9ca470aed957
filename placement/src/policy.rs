//! The placement policies and how each ranks a candidate (a node and the
//! GPUs a request would take there).

use std::fmt;
use std::str::FromStr;

/// A placement policy. The default, [`Policy::Defrag`], is what a node gets
/// when its config names none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Policy {
    /// Best fit: the node, then the GPU, with the least free left after.
    Binpack,
    /// The node with the most free GPU share left, the least busy GPU.
    Spread,
    /// The node config's load-aware rule: a GPU whose idle share is below
    /// the threshold is not chosen while a quieter one fits; then binpack.
    SharedThreshold(f64),
    /// Fragmentation gradient descent (Weng et al., ATC'23), as published:
    /// the candidate that grows the node's expected fragmentation least;
    /// remaining ties go to the first node.
    Fgd,
    /// Tessera's policy: FGD's fragmentation growth first, then best fit of
    /// the GPU, then the node whose free GPU share and CPU are least useful
    /// to what comes next (see docs/placement.md).
    #[default]
    Defrag,
}

/// The threshold `shared-threshold` takes when none is given (the node
/// config's default).
pub const DEFAULT_SHARED_THRESHOLD: f64 = 0.2;

/// A policy name that is not one.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PolicyError {
    #[error(
        "unknown placement policy {0:?} (binpack, spread, shared-threshold[:0..1], fgd, defrag)"
    )]
    Unknown(String),
    #[error("shared-threshold {0:?}: the threshold is a number from 0 to 1")]
    Threshold(String),
}

impl Policy {
    /// Every policy, the defaults of their parameters.
    pub const ALL: [Policy; 5] = [
        Policy::Defrag,
        Policy::Fgd,
        Policy::Binpack,
        Policy::Spread,
        Policy::SharedThreshold(DEFAULT_SHARED_THRESHOLD),
    ];

    /// Whether ranking needs the fragmentation measure.
    pub(crate) fn uses_fragmentation(self) -> bool {
        matches!(self, Policy::Fgd | Policy::Defrag)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Policy::Binpack => f.write_str("binpack"),
            Policy::Spread => f.write_str("spread"),
            Policy::SharedThreshold(t) if *t == DEFAULT_SHARED_THRESHOLD => {
                f.write_str("shared-threshold")
            }
            Policy::SharedThreshold(t) => write!(f, "shared-threshold:{t}"),
            Policy::Fgd => f.write_str("fgd"),
            Policy::Defrag => f.write_str("defrag"),
        }
    }
}

impl FromStr for Policy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Policy, PolicyError> {
        let s = s.trim();
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let p = match (name.to_ascii_lowercase().as_str(), arg) {
            ("binpack", None) => Policy::Binpack,
            ("spread", None) => Policy::Spread,
            ("fgd", None) => Policy::Fgd,
            ("defrag", None) => Policy::Defrag,
            ("shared-threshold" | "sharedthreshold", None) => {
                Policy::SharedThreshold(DEFAULT_SHARED_THRESHOLD)
            }
            ("shared-threshold" | "sharedthreshold", Some(a)) => match a.parse::<f64>() {
                Ok(t) if (0.0..=1.0).contains(&t) => Policy::SharedThreshold(t),
                _ => return Err(PolicyError::Threshold(a.to_owned())),
            },
            _ => return Err(PolicyError::Unknown(s.to_owned())),
        };
        Ok(p)
    }
}

/// What the policies rank a candidate by. Shares are thousandths of a GPU.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Candidate {
    /// Free GPU share of the node after placing.
    pub node_free_after: u64,
    /// Free share left on the (one) chosen GPU after placing; for whole GPUs
    /// and CPU-only requests, 0.
    pub gpu_free_after: u32,
    pub cpu_free_after: u64,
    /// Growth of the node's expected fragmentation (0 unless the policy
    /// uses it).
    pub frag_delta: f64,
    /// Utilization of the chosen GPUs (the highest; 0 when unmeasured).
    pub utilization: f32,
    /// One of the chosen GPUs is below the idle threshold.
    pub busy: bool,
}

/// A candidate's rank under `policy`: lower is better, compared
/// lexicographically; the engine breaks what remains by node index.
pub(crate) fn rank(policy: Policy, c: &Candidate) -> [f64; 4] {
    let node_free = c.node_free_after as f64;
    let gpu_free = f64::from(c.gpu_free_after);
    let cpu = c.cpu_free_after as f64;
    match policy {
        Policy::Binpack => [node_free, gpu_free, cpu, 0.0],
        Policy::Spread => [-node_free, f64::from(c.utilization), -gpu_free, -cpu],
        Policy::SharedThreshold(_) => [f64::from(u8::from(c.busy)), node_free, gpu_free, cpu],
        Policy::Fgd => [round(c.frag_delta), 0.0, 0.0, 0.0],
        Policy::Defrag => [round(c.frag_delta), gpu_free, node_free, cpu],
    }
}

/// Fragmentation sums weights of many types: equal growths must compare
/// equal whatever the order of the additions.
fn round(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_ones_are_refused() {
        for p in Policy::ALL {
            assert_eq!(p.to_string().parse::<Policy>(), Ok(p));
        }
        assert_eq!(
            "shared-threshold:0.5".parse::<Policy>(),
            Ok(Policy::SharedThreshold(0.5))
        );
        assert_eq!(Policy::default(), Policy::Defrag);
        assert!(matches!(
            "worst-fit".parse::<Policy>(),
            Err(PolicyError::Unknown(_))
        ));
        assert!(matches!(
            "shared-threshold:2".parse::<Policy>(),
            Err(PolicyError::Threshold(_))
        ));
        assert!(matches!(
            "binpack:1".parse::<Policy>(),
            Err(PolicyError::Unknown(_))
        ));
    }
}
