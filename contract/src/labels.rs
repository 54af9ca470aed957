//! Labels an allocation carries, read back by the manager.

use std::collections::BTreeMap;

/// `source` label value of an allocation `tessera run` created.
pub const SOURCE: &str = "source";
/// The value of [`SOURCE`] for `tessera run`.
pub const SOURCE_CLI: &str = "cli";
/// The `tessera run` process's pid.
pub const CLI_PID: &str = "cli-pid";
/// The inode of its pid namespace.
pub const CLI_PIDNS: &str = "cli-pidns";
/// Its start time (clock ticks since boot), so a reused pid is not mistaken.
pub const CLI_START: &str = "cli-start";

/// The `tessera run` process behind an allocation, from its labels, so
/// the manager can delete the allocation should that process die without
/// doing so itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOwner {
    pub pid: u32,
    pub pidns: u64,
    pub start_time: u64,
}

impl RunOwner {
    /// Labels: `source=cli`, `cli-pid`, `cli-pidns`, `cli-start`.
    pub fn labels(&self) -> [(String, String); 4] {
        [
            (SOURCE.into(), SOURCE_CLI.into()),
            (CLI_PID.into(), self.pid.to_string()),
            (CLI_PIDNS.into(), self.pidns.to_string()),
            (CLI_START.into(), self.start_time.to_string()),
        ]
    }

    /// The owner, when the labels are a `tessera run`'s and well formed.
    pub fn from_labels(labels: &BTreeMap<String, String>) -> Option<Self> {
        if labels.get(SOURCE).map(String::as_str) != Some(SOURCE_CLI) {
            return None;
        }
        Some(RunOwner {
            pid: labels.get(CLI_PID)?.parse().ok()?,
            pidns: labels.get(CLI_PIDNS)?.parse().ok()?,
            start_time: labels.get(CLI_START)?.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_owner_round_trips_and_ignores_other_sources() {
        let me = RunOwner {
            pid: 42,
            pidns: 4026531836,
            start_time: 777,
        };
        let labels: BTreeMap<String, String> = me.labels().into_iter().collect();
        assert_eq!(RunOwner::from_labels(&labels), Some(me));
        let mut other = labels.clone();
        other.insert(SOURCE.into(), "kubelet".into());
        assert_eq!(RunOwner::from_labels(&other), None);
        let mut broken = labels;
        broken.insert(CLI_PID.into(), "x".into());
        assert_eq!(RunOwner::from_labels(&broken), None);
    }
}
