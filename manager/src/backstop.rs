//! The backstop: the driver's own view of who uses each GPU, checked
//! against the allocations. A process with a context on a GPU that no
//! allocation of its own covers ran without the shim (or escaped it); an
//! allocation whose processes hold more than its limit escaped the shim's
//! accounting. Both are stopped (SIGKILL) in the pass of the sample that
//! shows them, unless `backstopKill` is off; either way they are logged once
//! (naming the allocation's pod and container) and counted in
//! `tessera_ungoverned_processes`.
//!
//! The rule for an allocation on a GPU (docs/security.md says why): what its
//! proven processes hold there by the driver's count counts in full, and the
//! only tolerance is `backstopTolerance`, one fixed amount per allocation and
//! GPU, so nothing a tenant controls (how many processes it starts, whether
//! they load the shim) makes it larger. Over limit + tolerance, every member
//! that does not run the shim is a violation (`over_limit_no_shim`: the shim
//! admits its own processes against the limit, so these are what took the
//! allocation over); then, while the rest is still over, the largest
//! governed processes (`over_limit`). What is left once they are stopped is
//! within limit + tolerance. A process stopped for one GPU is stopped for
//! all: its memory on the GPUs judged after counts as gone.
//!
//! The pass over the node is [`crate::enforce`]; this module is pure (no
//! manager state). Which allocation a process is in comes only from [`crate::identity`]
//! (the kernel's view: the allocation's files mapped or mounted), never from
//! the state file's pid words, which the tenant can write: a tenant cannot
//! get a neighbour judged as its own. A process is stopped only after it is
//! pinned with a pidfd and, so pinned, still on the GPU's process list and
//! still judged the same (a pid reused since the sample is another process).
//!
//! A process that has exited is never stopped (there is nothing left to
//! stop; a signal frees nothing): the kernel takes its address space before
//! it closes its device files, and the driver frees its memory only then, one
//! process at a time, so NVML lists it with its memory for a while after it
//! can run no code. For [`EXIT_GRACE`] it is not judged at all; a process the
//! driver still lists after that (its memory kept by descriptors another
//! process holds, or a driver that is stuck) counts again against the
//! allocation it was placed in, so an allocation cannot keep memory through
//! processes that have exited beyond the grace: its live members are stopped
//! as for any excess (docs/security.md, "Processes that exit").
//!
//! [`judge`] is pure; [`Backstop`] remembers what was reported, so each
//! finding is logged once, and where each process was placed and since when
//! it has been seen exited.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::gpu::GpuProcess;

/// How long a process that has exited may be listed by the driver with its
/// memory before that memory counts again. On the H200 the driver was still
/// tearing 29 processes of a 32-process burst down in one pass after they had
/// all exited; ten seconds leaves a burst of hundreds its teardown (the
/// driver frees one process at a time) while bounding what a tenant can keep
/// through processes that have exited.
pub const EXIT_GRACE: Duration = Duration::from_secs(10);

/// Which allocation a host process belongs to, from the manager's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub alloc_id: String,
    /// The allocation's memory limit on the GPU being checked; `None` when
    /// the allocation does not include that GPU.
    pub limit_on_gpu: Option<u64>,
    /// The process has the allocation's files mapped (the shim maps them
    /// before it touches the driver); `false` for a member proven only by
    /// the control file mounted in its root (a static binary, a child
    /// without `LD_PRELOAD`). A tenant can map its own files without the
    /// shim: that only changes the order of stops within its allocation,
    /// never how much the allocation keeps.
    pub governed: bool,
}

/// Why a process is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// In no allocation: it runs without the shim.
    NoShim,
    /// In an allocation that does not include this GPU.
    OtherGpu,
    /// A governed member of an allocation still over its limit plus the
    /// tolerance once its ungoverned members are counted out (the largest
    /// first).
    OverLimit,
    /// A member that does not run the shim, of an allocation over its limit
    /// plus the tolerance.
    OverLimitNoShim,
}

impl Reason {
    /// Every reason, in the order metrics list them.
    pub const ALL: [Reason; 4] = [
        Reason::NoShim,
        Reason::OtherGpu,
        Reason::OverLimit,
        Reason::OverLimitNoShim,
    ];

    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Reason::NoShim => "no_shim",
            Reason::OtherGpu => "other_gpu",
            Reason::OverLimit => "over_limit",
            Reason::OverLimitNoShim => "over_limit_no_shim",
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
    /// The process has exited and the driver still lists it past
    /// [`EXIT_GRACE`]: reported, never signalled.
    pub exited: bool,
}

/// What one allocation's proven processes hold on one GPU at one pass, by
/// the driver's count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    pub gpu_uuid: String,
    pub alloc_id: String,
    pub limit: u64,
    /// Everything its processes hold there, before any stop.
    pub held: u64,
    /// What is left once this pass's findings are stopped (on this GPU and
    /// the GPUs judged before it).
    pub after: u64,
    /// Its processes on the GPU, and how many of them do not run the shim.
    pub processes: u32,
    pub ungoverned: u32,
    /// Of `held`, what processes that have exited (past the grace) hold:
    /// counted, never stopped.
    pub exited_bytes: u64,
    /// The processes this pass reports for it on this GPU.
    pub stopping: Vec<u32>,
}

impl Standing {
    /// How far over its limit the allocation was before any stop (0 within).
    pub fn over_by(&self) -> u64 {
        self.held.saturating_sub(self.limit)
    }
}

/// One pass's verdict over the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judgement {
    pub findings: Vec<Finding>,
    /// One per allocation and GPU with a process on it, in GPU order, then
    /// by allocation id.
    pub standings: Vec<Standing>,
}

/// One GPU's processes as the driver listed them, with the owners proven for
/// them (a process absent from `owners` is in no allocation).
#[derive(Debug, Clone, Copy)]
pub struct GpuView<'a> {
    pub uuid: &'a str,
    pub procs: &'a [GpuProcess],
    pub owners: &'a HashMap<u32, Owner>,
    /// Processes among `procs` that have exited (past the grace): counted
    /// where they are placed, never stopped.
    pub exited: &'a HashSet<u32>,
}

/// Judges every GPU in turn. `tolerance` is what an allocation may hold
/// beyond its limit on a GPU by the driver's count, whatever its processes.
pub fn judge(gpus: &[GpuView<'_>], tolerance: u64) -> Judgement {
    let mut out = Judgement::default();
    // Processes already reported on an earlier GPU: stopped, they free what
    // they hold on every GPU.
    let mut gone: HashSet<u32> = HashSet::new();
    for g in gpus {
        let j = check(g.uuid, g.procs, g.owners, g.exited, tolerance, &gone);
        gone.extend(j.findings.iter().map(|f| f.pid));
        out.findings.extend(j.findings);
        out.standings.extend(j.standings);
    }
    out
}

/// Checks one GPU's processes; those in `gone` (reported on another GPU)
/// count as stopped; those in `exited` count where they are placed and are
/// never chosen to stop.
pub fn check(
    gpu_uuid: &str,
    procs: &[GpuProcess],
    owners: &HashMap<u32, Owner>,
    exited: &HashSet<u32>,
    tolerance: u64,
    gone: &HashSet<u32>,
) -> Judgement {
    let mut out = Judgement::default();
    let finding = |p: &GpuProcess, reason, alloc_id: Option<&str>| Finding {
        gpu_uuid: gpu_uuid.to_owned(),
        pid: p.pid,
        used_bytes: p.used_bytes,
        reason,
        alloc_id: alloc_id.map(str::to_owned),
        exited: exited.contains(&p.pid),
    };
    // Per allocation: its limit here, and its processes with whether each
    // is governed.
    type Members = (u64, Vec<(GpuProcess, bool)>);
    let mut by_alloc: HashMap<&str, Members> = HashMap::new();
    for p in procs {
        match owners.get(&p.pid) {
            None => out.findings.push(finding(p, Reason::NoShim, None)),
            Some(Owner {
                alloc_id,
                limit_on_gpu: None,
                ..
            }) => out
                .findings
                .push(finding(p, Reason::OtherGpu, Some(alloc_id))),
            Some(Owner {
                alloc_id,
                limit_on_gpu: Some(limit),
                governed,
            }) => by_alloc
                .entry(alloc_id)
                .or_insert_with(|| (*limit, Vec::new()))
                .1
                .push((*p, *governed)),
        }
    }
    let mut allocs: Vec<_> = by_alloc.into_iter().collect();
    allocs.sort_by(|a, b| a.0.cmp(b.0));
    for (alloc_id, (limit, mut ps)) in allocs {
        let allowed = limit.saturating_add(tolerance);
        let held: u64 = ps.iter().map(|(p, _)| p.used_bytes).sum();
        let mut left: u64 = ps
            .iter()
            .filter(|(p, _)| !gone.contains(&p.pid))
            .map(|(p, _)| p.used_bytes)
            .sum();
        let mut stopping = Vec::new();
        if left > allowed {
            // Ungoverned first (all of them), then the largest governed
            // until the rest fits; ties by pid, so a pass is repeatable.
            ps.sort_by(|(a, ga), (b, gb)| {
                ga.cmp(gb)
                    .then(b.used_bytes.cmp(&a.used_bytes))
                    .then(a.pid.cmp(&b.pid))
            });
            for (p, governed) in &ps {
                // Gone already, or exited: stopping it frees nothing (an
                // exited process's memory is the driver's to free).
                if gone.contains(&p.pid) || exited.contains(&p.pid) {
                    continue;
                }
                if *governed && left <= allowed {
                    break;
                }
                left -= p.used_bytes;
                let reason = if *governed {
                    Reason::OverLimit
                } else {
                    Reason::OverLimitNoShim
                };
                stopping.push(p.pid);
                out.findings.push(finding(p, reason, Some(alloc_id)));
            }
        }
        out.standings.push(Standing {
            gpu_uuid: gpu_uuid.to_owned(),
            alloc_id: alloc_id.to_owned(),
            limit,
            held,
            after: left,
            processes: ps.len() as u32,
            ungoverned: ps.iter().filter(|(_, g)| !g).count() as u32,
            exited_bytes: ps
                .iter()
                .filter(|(p, _)| exited.contains(&p.pid))
                .map(|(p, _)| p.used_bytes)
                .sum(),
            stopping,
        });
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

/// What one series of `tessera_backstop_stops_total` and
/// `tessera_backstop_stopped_bytes_total` has counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StopCount {
    pub stops: u64,
    /// What the stopped processes held on the GPU at the sample.
    pub bytes: u64,
}

/// What the backstop has done since the manager started, and where each
/// allocation stood at the last pass (for metrics).
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Passes completed (`tessera_backstop_passes_total`).
    pub passes: u64,
    pub stops: std::collections::BTreeMap<StopKey, StopCount>,
    /// The last pass's standings.
    pub standings: Vec<Standing>,
}

/// Where a process was placed in an earlier pass, while it ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// Its start time, so a reused pid is not mistaken for it.
    pub start_time: u64,
    pub alloc_id: String,
    pub governed: bool,
}

/// What the backstop keeps between passes: what was reported in the last
/// round (so each finding is logged once), where each listed process was
/// placed while it ran, and since when each has been seen exited.
#[derive(Debug, Default)]
pub struct Backstop {
    reported: HashSet<(String, u32, Reason)>,
    placed: HashMap<u32, Placed>,
    exited_since: HashMap<u32, Instant>,
}

impl Backstop {
    /// Records where a running process was placed.
    pub fn remember(&mut self, pid: u32, placed: Placed) {
        self.exited_since.remove(&pid);
        self.placed.insert(pid, placed);
    }

    /// Where process `pid` was placed while it ran: the one with
    /// `start_time` when that is known, else the last process with that pid
    /// seen in an earlier pass (for one already gone from `/proc`).
    pub fn placement(&self, pid: u32, start_time: Option<u64>) -> Option<&Placed> {
        self.placed
            .get(&pid)
            .filter(|p| start_time.is_none_or(|s| s == p.start_time))
    }

    /// Notes that `pid` is seen exited at `now`; how long it has been.
    pub fn exited_for(&mut self, pid: u32, now: Instant) -> Duration {
        now.saturating_duration_since(*self.exited_since.entry(pid).or_insert(now))
    }

    /// Forgets every process not in `listed` (no GPU lists it any more).
    pub fn keep_only(&mut self, listed: &HashSet<u32>) {
        self.placed.retain(|pid, _| listed.contains(pid));
        self.exited_since.retain(|pid, _| listed.contains(pid));
    }

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

    const MI: u64 = 1 << 20;
    const GI: u64 = 1 << 30;

    fn p(pid: u32, used: u64) -> GpuProcess {
        GpuProcess {
            pid,
            used_bytes: used,
        }
    }

    fn member(alloc: &str, limit: Option<u64>, governed: bool) -> Owner {
        Owner {
            alloc_id: alloc.into(),
            limit_on_gpu: limit,
            governed,
        }
    }

    /// Allocation `a` (limit 100) has governed 10 and 11, ungoverned 12..=17;
    /// `b` has no share of this GPU (20).
    fn owners() -> HashMap<u32, Owner> {
        let mut m = HashMap::new();
        for pid in [10, 11] {
            m.insert(pid, member("a", Some(100), true));
        }
        for pid in 12..=17 {
            m.insert(pid, member("a", Some(100), false));
        }
        m.insert(20, member("b", None, true));
        m
    }

    fn one(procs: &[GpuProcess], owners: &HashMap<u32, Owner>, tolerance: u64) -> Judgement {
        check(
            "g",
            procs,
            owners,
            &HashSet::new(),
            tolerance,
            &HashSet::new(),
        )
    }

    fn pids(j: &Judgement) -> Vec<(u32, Reason)> {
        j.findings.iter().map(|f| (f.pid, f.reason)).collect()
    }

    #[test]
    fn governed_processes_within_their_limit_pass() {
        let j = one(&[p(10, 60), p(11, 40)], &owners(), 0);
        assert!(j.findings.is_empty());
        assert_eq!(j.standings.len(), 1);
        let s = &j.standings[0];
        assert_eq!((s.held, s.after, s.over_by()), (100, 100, 0));
        assert_eq!((s.processes, s.ungoverned), (2, 0));
    }

    #[test]
    fn unknown_and_misplaced_processes_are_reported() {
        let j = one(&[p(99, 5), p(20, 7)], &owners(), 0);
        assert_eq!(pids(&j), [(99, Reason::NoShim), (20, Reason::OtherGpu)]);
        assert_eq!(j.findings[1].alloc_id.as_deref(), Some("b"));
    }

    #[test]
    fn over_the_limit_the_largest_governed_are_reported_until_the_rest_fit() {
        let j = one(&[p(10, 90), p(11, 30)], &owners(), 0);
        assert_eq!(pids(&j), [(10, Reason::OverLimit)]);
        assert_eq!(j.standings[0].over_by(), 20);
        assert_eq!(j.standings[0].after, 30);
        // Within the tolerance: nothing.
        assert!(
            one(&[p(10, 90), p(11, 30)], &owners(), 20)
                .findings
                .is_empty()
        );
    }

    #[test]
    fn the_tolerance_does_not_grow_with_the_processes() {
        // Six processes without the shim at 90 each on a limit of 100 (the
        // per-process slack of old would have let all six keep theirs).
        let procs: Vec<_> = (12..=17).map(|pid| p(pid, 90)).collect();
        let j = one(&procs, &owners(), 10);
        assert_eq!(j.findings.len(), 6, "{j:?}");
        assert!(
            j.findings
                .iter()
                .all(|f| f.reason == Reason::OverLimitNoShim)
        );
        let s = &j.standings[0];
        assert_eq!((s.held, s.after, s.ungoverned), (540, 0, 6));
        // Just one of them fits: left alone (a member without the shim is a
        // violation only once the allocation is over).
        assert!(one(&procs[..1], &owners(), 10).findings.is_empty());
    }

    #[test]
    fn ungoverned_members_go_first_then_the_largest_governed() {
        // Governed 10 (80) and 11 (50), ungoverned 12 (5) and 13 (30): 165
        // on a limit of 100 + 10. Both ungoverned go (the small one too),
        // leaving 130; then the largest governed, leaving 50.
        let j = one(&[p(10, 80), p(11, 50), p(12, 5), p(13, 30)], &owners(), 10);
        assert_eq!(
            pids(&j),
            [
                (13, Reason::OverLimitNoShim),
                (12, Reason::OverLimitNoShim),
                (10, Reason::OverLimit),
            ]
        );
        let s = &j.standings[0];
        assert_eq!((s.held, s.after), (165, 50));
        assert_eq!(s.stopping, [13, 12, 10]);
        // Stopping the ungoverned is enough: the governed stay.
        let j = one(&[p(10, 60), p(11, 40), p(13, 30)], &owners(), 10);
        assert_eq!(pids(&j), [(13, Reason::OverLimitNoShim)]);
        assert_eq!(j.standings[0].after, 100);
    }

    #[test]
    fn after_a_pass_every_allocation_is_within_limit_and_tolerance() {
        // Any mix of sizes and kinds: what is left fits, and nothing is
        // stopped when everything fits.
        let tolerance = 64 * MI;
        let limit = GI;
        let mut owners = HashMap::new();
        for pid in 0..40u32 {
            owners.insert(pid, member("a", Some(limit), pid % 3 != 0));
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200 {
            let n = 1 + round % 40;
            let procs: Vec<_> = (0..n as u32)
                .map(|pid| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    p(pid, seed % (GI / 2))
                })
                .collect();
            let j = one(&procs, &owners, tolerance);
            let held: u64 = procs.iter().map(|p| p.used_bytes).sum();
            let stopped: u64 = j.findings.iter().map(|f| f.used_bytes).sum();
            assert!(held - stopped <= limit + tolerance, "round {round}");
            assert_eq!(j.standings[0].after, held - stopped);
            if held <= limit + tolerance {
                assert!(j.findings.is_empty(), "round {round}");
            }
        }
    }

    #[test]
    fn a_process_stopped_for_one_gpu_counts_as_gone_on_the_next() {
        // Allocation `a` on two GPUs (limit 100 each). Process 10 is over on
        // GPU 0 alone; on GPU 1 it and 11 are over together, and stopping
        // 10 for GPU 0 already brings GPU 1 within: 11 stays.
        let mut o = HashMap::new();
        o.insert(10, member("a", Some(100), true));
        o.insert(11, member("a", Some(100), true));
        let g0 = [p(10, 150)];
        let g1 = [p(10, 70), p(11, 60)];
        let none = HashSet::new();
        let j = judge(
            &[
                GpuView {
                    uuid: "g0",
                    procs: &g0,
                    owners: &o,
                    exited: &none,
                },
                GpuView {
                    uuid: "g1",
                    procs: &g1,
                    owners: &o,
                    exited: &none,
                },
            ],
            0,
        );
        assert_eq!(pids(&j), [(10, Reason::OverLimit)]);
        assert_eq!(j.standings.len(), 2);
        assert_eq!((j.standings[1].held, j.standings[1].after), (130, 60));
        assert!(j.standings[1].stopping.is_empty());
    }

    #[test]
    fn other_allocations_on_the_gpu_are_judged_on_their_own() {
        let mut o = owners();
        o.insert(30, member("c", Some(100), true));
        let j = one(&[p(12, 500), p(30, 100)], &o, 0);
        assert_eq!(pids(&j), [(12, Reason::OverLimitNoShim)]);
        let c = j.standings.iter().find(|s| s.alloc_id == "c").unwrap();
        assert_eq!((c.held, c.after, c.over_by()), (100, 100, 0));
    }

    #[test]
    fn exited_processes_count_where_they_are_placed_and_are_never_chosen_to_stop() {
        // Allocation `a` (limit 100): governed 10 (50) and ungoverned 12 (30) run;
        // 11 (governed) and 13 (ungoverned) have exited and are still listed past the
        // grace, 40 each. 99 has exited in no allocation.
        let exited: HashSet<u32> = [11, 13, 99].into();
        let procs = [p(10, 50), p(11, 40), p(12, 30), p(13, 40), p(99, 7)];
        let j = check("g", &procs, &owners(), &exited, 0, &HashSet::new());
        // 160 held: the running ungoverned one goes first, then the governed one; the
        // exited ones cannot be stopped and stay counted (80 left over 100 is fine).
        assert_eq!(
            pids(&j),
            [
                (99, Reason::NoShim),
                (12, Reason::OverLimitNoShim),
                (10, Reason::OverLimit)
            ]
        );
        assert!(j.findings[0].exited && !j.findings[1].exited && !j.findings[2].exited);
        let s = &j.standings[0];
        assert_eq!((s.held, s.after, s.exited_bytes), (160, 80, 80));
        // Within the limit with them, nothing is found.
        let j = check(
            "g",
            &[p(10, 50), p(11, 40)],
            &owners(),
            &exited,
            0,
            &HashSet::new(),
        );
        assert!(j.findings.is_empty());
    }

    #[test]
    fn placements_and_exits_are_remembered_by_pid_and_start_time() {
        let mut b = Backstop::default();
        let placed = Placed {
            start_time: 77,
            alloc_id: "a".into(),
            governed: true,
        };
        b.remember(10, placed.clone());
        assert_eq!(b.placement(10, Some(77)), Some(&placed));
        assert_eq!(b.placement(10, None), Some(&placed), "gone from /proc");
        assert_eq!(b.placement(10, Some(78)), None, "a reused pid");
        let t0 = Instant::now();
        assert_eq!(b.exited_for(10, t0), Duration::ZERO);
        assert_eq!(
            b.exited_for(10, t0 + Duration::from_secs(3)),
            Duration::from_secs(3)
        );
        b.keep_only(&HashSet::new());
        assert_eq!(b.placement(10, None), None);
        assert_eq!(
            b.exited_for(10, t0 + Duration::from_secs(5)),
            Duration::ZERO,
            "forgotten once no GPU lists it"
        );
    }

    #[test]
    fn findings_count_at_once_and_are_new_once() {
        let mut b = Backstop::default();
        let f = || one(&[p(99, 5)], &owners(), 0).findings;
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
