//! The backstop: the driver's own view of who uses each GPU, checked
//! against the allocations. A process with a context on a GPU that no
//! allocation of its own covers ran without the shim (or escaped it); an
//! allocation whose processes hold more than its limit escaped the shim's
//! accounting. Both are stopped (SIGKILL) in the pass of the sample that
//! shows them, unless `backstopKill` is off; either way they are logged once
//! (naming the allocation's pod and container) and counted in
//! `tessera_ungoverned_processes`.
//!
//! The pass over the node is [`crate::enforce`]; this module is pure (no
//! manager state). Which allocation a process is in comes only from [`crate::identity`]
//! (the kernel's view: the allocation's files mapped or mounted), never from
//! the state file's pid words, which the tenant can write: a tenant cannot
//! get a neighbour judged as its own. A process is stopped only after it is
//! pinned with a pidfd and, so pinned, still on the GPU's process list and
//! still judged the same (a pid reused since the sample is another process).
//!
//! [`check`] is pure; [`Backstop`] remembers what was reported, so each
//! finding is logged once.

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

/// One series of `tessera_backstop_stops_total`: the GPU, why, and whose
/// process was stopped (empty owner for a process in no allocation).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct StopKey {
    pub gpu_uuid: String,
    pub reason: Reason,
    pub alloc_id: String,
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// What was reported in the last round, so each finding is logged once.
#[derive(Debug, Default)]
pub struct Backstop {
    reported: HashSet<(String, u32, Reason)>,
}

impl Backstop {
    /// Feeds one round's findings (all GPUs); returns them and, among them,
    /// those not reported in the previous round. Identity is proven, not
    /// guessed, so there is no second sighting to wait for.
    pub fn round(&mut self, findings: Vec<Finding>) -> (Vec<Finding>, Vec<Finding>) {
        let new = findings
            .iter()
            .filter(|f| {
                !self
                    .reported
                    .contains(&(f.gpu_uuid.clone(), f.pid, f.reason))
            })
            .cloned()
            .collect();
        self.reported = findings
            .iter()
            .map(|f| (f.gpu_uuid.clone(), f.pid, f.reason))
            .collect();
        (findings, new)
    }
}

/// SIGKILLs `pid` if `still_judged` holds once the process is pinned by a
/// pidfd (so the check and the signal are about one process, whatever pid
/// reuse happens in between). `Ok(false)`: gone or no longer judged so.
pub(crate) fn stop(pid: u32, still_judged: impl FnOnce() -> bool) -> Result<bool, std::io::Error> {
    let Ok(raw) = i32::try_from(pid) else {
        return Ok(false);
    };
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; no memory is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw, 0) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ESRCH) => Ok(false),
            _ => Err(e),
        };
    }
    // SAFETY: a descriptor pidfd_open just returned, owned here alone.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    if !still_judged() {
        return Ok(false);
    }
    // SAFETY: signals the process the descriptor pins; no memory is passed
    // (a null siginfo means "as kill(2) would").
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ESRCH) => Ok(false),
            _ => Err(e),
        };
    }
    Ok(true)
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
    fn findings_count_at_once_and_are_new_once() {
        let mut b = Backstop::default();
        let f = || check("g", &[p(99, 5)], &owners(), 0);
        let (c, n) = b.round(f());
        assert_eq!((c.len(), n.len()), (1, 1));
        let (c, n) = b.round(f());
        assert_eq!((c.len(), n.len()), (1, 0));
        // Gone for a round: new again when it comes back.
        let (c, _) = b.round(vec![]);
        assert!(c.is_empty());
        let (_, n) = b.round(f());
        assert_eq!(n.len(), 1);
    }

    #[test]
    fn stop_kills_only_what_is_still_judged_so() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(!stop(pid, || false).unwrap(), "not judged so: left alone");
        assert!(child.try_wait().unwrap().is_none());
        assert!(stop(pid, || true).unwrap());
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        // Reaped: no such process any more.
        assert!(!stop(pid, || true).unwrap());
    }
}
