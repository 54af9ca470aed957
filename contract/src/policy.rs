//! Compute policies: their names (configs, flags, annotations) and their
//! values in the control file.

use std::fmt;
use std::str::FromStr;

/// Compute policy values stored in the control file's per-device policy word.
pub const POLICY_GUARANTEED: u32 = 1;
/// See [`POLICY_GUARANTEED`].
pub const POLICY_BURST: u32 = 2;

/// Compute policy of one device of an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// The share is a hard cap, even on an idle GPU.
    Guaranteed,
    /// The share is a floor; idle time goes to whoever has work.
    Burst,
}

/// A policy name that is neither `guaranteed` nor `burst`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad compute policy {0:?}: use guaranteed or burst")]
pub struct PolicyError(pub String);

impl Policy {
    /// Every policy's name, as a pod or a flag may spell it.
    pub const NAMES: [&'static str; 2] = ["guaranteed", "burst"];

    /// Exactly `guaranteed` or `burst`: one spelling for flags, config
    /// files and pod annotations (Kubernetes values are case-sensitive).
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "guaranteed" => Some(Policy::Guaranteed),
            "burst" => Some(Policy::Burst),
            _ => None,
        }
    }

    /// The lower-case name, as configs and the CLI spell it.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Guaranteed => "guaranteed",
            Policy::Burst => "burst",
        }
    }

    pub fn to_raw(self) -> u32 {
        match self {
            Policy::Guaranteed => POLICY_GUARANTEED,
            Policy::Burst => POLICY_BURST,
        }
    }

    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            POLICY_GUARANTEED => Some(Policy::Guaranteed),
            POLICY_BURST => Some(Policy::Burst),
            _ => None,
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::parse(s).ok_or_else(|| PolicyError(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_bad_names_say_what_works() {
        for p in [Policy::Guaranteed, Policy::Burst] {
            assert_eq!(p.name().parse::<Policy>(), Ok(p));
            assert_eq!(Policy::from_raw(p.to_raw()), Some(p));
        }
        assert_eq!(Policy::parse("Burst"), None);
        assert_eq!(Policy::parse(" burst"), None);
        assert_eq!(Policy::from_raw(0), None);
        let e = "fast".parse::<Policy>().unwrap_err().to_string();
        assert!(
            e.contains("\"fast\"") && e.contains("guaranteed or burst"),
            "{e}"
        );
    }
}
