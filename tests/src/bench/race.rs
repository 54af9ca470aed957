//! The `race` section of `tessera-bench`: N processes under the shim race
//! random allocations and frees against one memory limit for a few seconds,
//! coming and going, while the simulated device's ground truth is sampled.
//!
//! A sample must be an instant, not a scan (summing per-process counters
//! while processes run can count memory twice), so each sample stops every
//! racing process with SIGSTOP, reads the device and the allocation's
//! books, and lets them go on: the same method as `tests/hook_race.rs`,
//! whose sampling helpers live here.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_shm::{ControlSpec, DeviceSpec, Policy, State, create_allocation_files};

use super::Table;
use crate::paths::hook_library;
use crate::probe::{Mode, ProbeChild, probe_binary};
use crate::sim::SimNode;

const MI: u64 = 1 << 20;
/// The allocation's memory limit (the device holds four times as much, so
/// only the shim can keep the racers under it).
pub const LIMIT: u64 = 64 * MI;
const HANG: Duration = Duration::from_secs(30);
/// Every family, stream-ordered pools included (a pool keeps what it
/// hands back until it gives it to the device, and is charged until then).
const KINDS: [&str; 7] = ["plain", "managed", "pitch", "array", "vmm", "async", "pool"];

/// Whether every thread of `pid` is stopped (or the process is gone).
pub fn stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        let who = format!("{pid}/task/{}", t.file_name().to_string_lossy());
        match tessera_shm::process::stat_of(&who) {
            Some((state, _)) => matches!(state, 'T' | 't' | 'Z' | 'X'),
            None => true,
        }
    })
}

/// Stops every process of `pids` (our own unreaped children), waits until
/// each of their threads is stopped or gone, calls `read` at that instant,
/// and lets them run again. Also returns whether all were still stopped
/// after `read` (false would make the sample no instant).
pub fn frozen<T>(pids: &[i32], read: impl FnOnce() -> T) -> (T, bool) {
    for &pid in pids {
        // SAFETY: kill(2) on a pid the caller owns and has not reaped, so it
        // cannot name an unrelated process.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }
    for &pid in pids {
        while !stopped(pid) {
            std::thread::yield_now();
        }
    }
    let got = read();
    let still = pids.iter().all(|&pid| stopped(pid));
    for &pid in pids {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    (got, still)
}

/// A small deterministic generator (xorshift).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `lo..hi`.
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// What a race came to.
#[derive(Debug, Clone, Default)]
pub struct RaceResult {
    pub processes_started: u64,
    pub admitted: u64,
    pub refused: u64,
    pub frees: u64,
    pub samples: u64,
    /// Most bytes the device held for the racers at any sample.
    pub peak: u64,
    /// Most bytes the device held beyond the limit (0 unless the shim let
    /// an allocation through that it should have refused).
    pub over_limit: u64,
    /// Samples where the device held more than the allocation's books
    /// reserved, or where a racer ran during the sample.
    pub inconsistent: u64,
    pub limit: u64,
}

#[derive(Default)]
struct Counts {
    admitted: AtomicU64,
    refused: AtomicU64,
    frees: AtomicU64,
    processes: AtomicU64,
}

struct Race {
    node: SimNode,
    hook: std::path::PathBuf,
    control: std::path::PathBuf,
    state: State,
    /// The racing processes alive now, for the sampler to stop.
    racers: Mutex<Vec<i32>>,
    counts: Counts,
}

impl Race {
    fn probe(&self, mode: Mode) -> ProbeChild {
        let mut c = self.node.command(probe_binary(mode));
        c.env("LD_PRELOAD", &self.hook)
            .env("TESSERA_CONTROL", &self.control)
            .env_remove("TESSERA_STATE")
            .env_remove("TESSERA_LOG");
        ProbeChild::start(c)
    }

    /// One racer: processes one after another, each living a few hundred
    /// operations and sometimes exiting while holding memory.
    fn worker(&self, id: usize, seed: u64, end: Instant) -> Result<(), String> {
        let mut rng = Rng(seed ^ (id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        while Instant::now() < end {
            let n = self.counts.processes.fetch_add(1, Ordering::Relaxed) as usize;
            let mode = Mode::ALL[(id + n) % Mode::ALL.len()];
            let mut p = self.probe(mode);
            let pid = p.pid() as i32;
            self.racers.lock().map_err(|e| e.to_string())?.push(pid);
            for c in ["init", "ctx"] {
                let l = p.cmd(c, HANG);
                if !l.ok {
                    return Err(format!("{}: {}", mode.name(), l.raw));
                }
            }
            let mut live: Vec<u64> = Vec::new();
            for _ in 0..rng.range(50, 400) {
                if Instant::now() >= end {
                    break;
                }
                if live.is_empty() || rng.range(0, 100) < 55 {
                    let bytes = rng.range(64 << 10, 12 * MI);
                    let kind = KINDS[(rng.next() % KINDS.len() as u64) as usize];
                    let l = p.cmd(&format!("alloc {bytes} {kind}"), HANG);
                    if l.ok {
                        live.push(l.u64("h"));
                        self.counts.admitted.fetch_add(1, Ordering::Relaxed);
                    } else if l.error.as_deref() == Some("CUDA_ERROR_OUT_OF_MEMORY") {
                        self.counts.refused.fetch_add(1, Ordering::Relaxed);
                    } else {
                        return Err(format!("alloc failed otherwise: {}", l.raw));
                    }
                } else {
                    let h = live.swap_remove((rng.next() % live.len() as u64) as usize);
                    let l = p.cmd(&format!("free {h}"), HANG);
                    if !l.ok {
                        return Err(format!("free failed: {}", l.raw));
                    }
                    self.counts.frees.fetch_add(1, Ordering::Relaxed);
                }
            }
            // From here on it only exits, which can only lower what it holds.
            self.racers
                .lock()
                .map_err(|e| e.to_string())?
                .retain(|&r| r != pid);
            if !p.finish().success() {
                return Err(format!("racer {pid} exited with an error"));
            }
        }
        Ok(())
    }
}

/// Runs `processes` racers for `duration` against a limit of [`LIMIT`].
pub fn race(processes: usize, duration: Duration) -> Result<RaceResult, String> {
    let hook =
        hook_library().ok_or("libtessera.so not built: cargo build --release -p tessera-hook")?;
    let node = SimNode::builder()
        .devices(1)
        .memory(&(4 * LIMIT).to_string())
        .build();
    let uuid = node.node().device_info(0).map_err(|e| e.to_string())?.uuid;
    let spec = ControlSpec::new(
        "bench-race",
        vec![DeviceSpec {
            uuid,
            memory_limit_bytes: LIMIT,
            compute_share_ppm: 1_000_000,
            policy: Policy::Burst,
        }],
    );
    let dir = node.dir.path().join("alloc");
    let (control, state_path) = create_allocation_files(&dir, &spec).map_err(|e| e.to_string())?;
    let state = State::open(&state_path, "bench-race").map_err(|e| e.to_string())?;
    let race = Arc::new(Race {
        node,
        hook,
        control,
        state,
        racers: Mutex::default(),
        counts: Counts::default(),
    });
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (race, done) = (race.clone(), done.clone());
        std::thread::spawn(move || -> Result<RaceResult, String> {
            let mut r = RaceResult {
                limit: LIMIT,
                ..RaceResult::default()
            };
            while !done.load(Ordering::Relaxed) {
                let ((used, reserved), still) = {
                    let racers = race.racers.lock().map_err(|e| e.to_string())?;
                    frozen(&racers, || {
                        (race.node.node().memory_used(0), race.state.reserved(0))
                    })
                };
                r.peak = r.peak.max(used);
                r.over_limit = r.over_limit.max(used.saturating_sub(LIMIT));
                if used > reserved || !still {
                    r.inconsistent += 1;
                }
                r.samples += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
            Ok(r)
        })
    };
    let end = Instant::now() + duration;
    let workers: Vec<_> = (0..processes.max(1))
        .map(|id| {
            let race = race.clone();
            std::thread::spawn(move || race.worker(id, seed, end))
        })
        .collect();
    let mut failure = None;
    for w in workers {
        match w.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(_) => failure = failure.or(Some("a racer panicked".to_string())),
        }
    }
    done.store(true, Ordering::Relaxed);
    let mut r = sampler
        .join()
        .map_err(|_| "the sampler panicked".to_string())??;
    if let Some(e) = failure {
        return Err(e);
    }
    let c = &race.counts;
    r.processes_started = c.processes.load(Ordering::Relaxed);
    r.admitted = c.admitted.load(Ordering::Relaxed);
    r.refused = c.refused.load(Ordering::Relaxed);
    r.frees = c.frees.load(Ordering::Relaxed);
    Ok(r)
}

/// The section's table.
pub fn table(r: &RaceResult, processes: usize, duration: Duration) -> Table {
    let mib = |b: u64| format!("{:.2}", b as f64 / MI as f64);
    let row = |k: &str, v: String| vec![k.to_string(), v];
    Table {
        title: format!(
            "memory race: {processes} processes under the shim, {} s, one limit of {} MiB",
            duration.as_secs_f64(),
            mib(r.limit)
        ),
        columns: ["figure", "value"].map(String::from).to_vec(),
        rows: vec![
            row("processes started", r.processes_started.to_string()),
            row("allocations admitted", r.admitted.to_string()),
            row("allocations refused (OOM)", r.refused.to_string()),
            row("frees", r.frees.to_string()),
            row("samples (all racers stopped)", r.samples.to_string()),
            row("peak held on the device, MiB", mib(r.peak)),
            row("limit, MiB", mib(r.limit)),
            row("bytes over the limit (must be 0)", r.over_limit.to_string()),
            row(
                "samples with device > reserved",
                r.inconsistent.to_string(),
            ),
        ],
        notes: vec![
            "Each racer runs processes one after another (link, dlopen, procaddr in turn), each making 50-400 random allocations (64 KiB-12 MiB, plain/managed/pitch/array/vmm, default pool, own pool) and frees, some exiting while holding memory.".into(),
            "A sample SIGSTOPs every live racer, waits until all their threads are stopped, reads the simulated device's bytes in use (ground truth) and the allocation's reserved total, then SIGCONTs them.".into(),
        ],
    }
}
