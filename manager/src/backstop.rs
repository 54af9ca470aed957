//! The backstop: the driver's own view of who uses each GPU, checked
//! against the allocations. A process with a context on a GPU that no
//! allocation of its own covers ran without the shim (or escaped it); an
//! allocation whose processes hold more than its limit escaped the shim's
//! accounting. Both are reported; killing is the admin's choice.
//!
//! [`check`] is pure; [`Backstop`] only remembers the last round, so that a
//! process is reported after two consecutive sightings (a process that just
//! started may not have been matched to its allocation yet).

use std::collections::{HashMap, HashSet};

use crate::gpu::GpuProcess;

/// Which allocation a host process belongs to, from the manager's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub alloc_id: String,
    /// The allocation's memory limit on the GPU being checked; `None` when
    /// the allocation does not include that GPU.
    pub limit_on_gpu: Option<u64>,
}

/// Why a process is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// In no allocation: it runs without the shim.
    NoShim,
    /// In an allocation that does not include this GPU.
    OtherGpu,
    /// Its allocation holds more of this GPU than its limit.
    OverLimit,
}

impl Reason {
    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Reason::NoShim => "no_shim",
            Reason::OtherGpu => "other_gpu",
            Reason::OverLimit => "over_limit",
        }
    }
}

/// One process the backstop reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub gpu_uuid: String,
    pub pid: u32,
    pub used_bytes: u64,
    pub reason: Reason,
    pub alloc_id: Option<String>,
}

/// Checks one GPU's processes. `slack` is what each process may hold
/// beyond the allocation's limit in the driver's view (its context).
/// Over a limit, the largest users are reported until the rest fit.
pub fn check(
    gpu_uuid: &str,
    procs: &[GpuProcess],
    owners: &HashMap<u32, Owner>,
    slack: u64,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut by_alloc: HashMap<&str, (u64, Vec<GpuProcess>)> = HashMap::new();
    for p in procs {
        match owners.get(&p.pid) {
            None => out.push(Finding {
                gpu_uuid: gpu_uuid.to_owned(),
                pid: p.pid,
                used_bytes: p.used_bytes,
                reason: Reason::NoShim,
                alloc_id: None,
            }),
            Some(Owner {
                alloc_id,
                limit_on_gpu: None,
            }) => out.push(Finding {
                gpu_uuid: gpu_uuid.to_owned(),
                pid: p.pid,
                used_bytes: p.used_bytes,
                reason: Reason::OtherGpu,
                alloc_id: Some(alloc_id.clone()),
            }),
            Some(Owner {
                alloc_id,
                limit_on_gpu: Some(limit),
            }) => by_alloc
                .entry(alloc_id)
                .or_insert_with(|| (*limit, Vec::new()))
                .1
                .push(*p),
        }
    }
    let mut allocs: Vec<_> = by_alloc.into_iter().collect();
    allocs.sort_by(|a, b| a.0.cmp(b.0));
    for (alloc_id, (limit, mut ps)) in allocs {
        let allowed = limit.saturating_add(slack.saturating_mul(ps.len() as u64));
        let mut total: u64 = ps.iter().map(|p| p.used_bytes).sum();
        ps.sort_by(|a, b| b.used_bytes.cmp(&a.used_bytes).then(a.pid.cmp(&b.pid)));
        for p in ps {
            if total <= allowed {
                break;
            }
            total -= p.used_bytes;
            out.push(Finding {
                gpu_uuid: gpu_uuid.to_owned(),
                pid: p.pid,
                used_bytes: p.used_bytes,
                reason: Reason::OverLimit,
                alloc_id: Some(alloc_id.to_owned()),
            });
        }
    }
    out
}

/// Findings confirmed over two rounds.
#[derive(Debug, Default)]
pub struct Backstop {
    seen: HashSet<(String, u32, Reason)>,
    reported: HashSet<(String, u32, Reason)>,
}

impl Backstop {
    /// Feeds one round's findings (all GPUs); returns the confirmed ones
    /// and, among them, those confirmed for the first time.
    pub fn round(&mut self, findings: Vec<Finding>) -> (Vec<Finding>, Vec<Finding>) {
        let now: HashSet<_> = findings
            .iter()
            .map(|f| (f.gpu_uuid.clone(), f.pid, f.reason))
            .collect();
        let mut confirmed = Vec::new();
        let mut new = Vec::new();
        for f in findings {
            let key = (f.gpu_uuid.clone(), f.pid, f.reason);
            if self.seen.contains(&key) {
                if !self.reported.contains(&key) {
                    new.push(f.clone());
                }
                confirmed.push(f);
            }
        }
        self.reported = confirmed
            .iter()
            .map(|f| (f.gpu_uuid.clone(), f.pid, f.reason))
            .collect();
        self.seen = now;
        (confirmed, new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: u32, used: u64) -> GpuProcess {
        GpuProcess {
            pid,
            used_bytes: used,
        }
    }

    fn owners() -> HashMap<u32, Owner> {
        let mut m = HashMap::new();
        for pid in [10, 11] {
            m.insert(
                pid,
                Owner {
                    alloc_id: "a".into(),
                    limit_on_gpu: Some(100),
                },
            );
        }
        m.insert(
            20,
            Owner {
                alloc_id: "b".into(),
                limit_on_gpu: None,
            },
        );
        m
    }

    #[test]
    fn governed_processes_within_their_limit_pass() {
        assert!(check("g", &[p(10, 60), p(11, 40)], &owners(), 0).is_empty());
    }

    #[test]
    fn unknown_and_misplaced_processes_are_reported() {
        let f = check("g", &[p(99, 5), p(20, 7)], &owners(), 0);
        assert_eq!(f.len(), 2);
        assert_eq!((f[0].pid, f[0].reason), (99, Reason::NoShim));
        assert_eq!((f[1].pid, f[1].reason), (20, Reason::OtherGpu));
        assert_eq!(f[1].alloc_id.as_deref(), Some("b"));
    }

    #[test]
    fn over_the_limit_the_largest_users_are_reported_until_the_rest_fit() {
        let f = check("g", &[p(10, 90), p(11, 30)], &owners(), 0);
        assert_eq!(f.len(), 1);
        assert_eq!((f[0].pid, f[0].reason), (10, Reason::OverLimit));
        // Slack per process absorbs the driver's own memory.
        assert!(check("g", &[p(10, 90), p(11, 30)], &owners(), 10).is_empty());
    }

    #[test]
    fn findings_are_confirmed_on_the_second_sighting_and_new_once() {
        let mut b = Backstop::default();
        let f = || check("g", &[p(99, 5)], &owners(), 0);
        let (c, n) = b.round(f());
        assert!(c.is_empty() && n.is_empty());
        let (c, n) = b.round(f());
        assert_eq!((c.len(), n.len()), (1, 1));
        let (c, n) = b.round(f());
        assert_eq!((c.len(), n.len()), (1, 0));
        // Gone for a round: forgotten.
        b.round(vec![]);
        let (c, _) = b.round(f());
        assert!(c.is_empty());
    }
}
