//! Sixteen processes race random allocations and frees of every family
//! (stream-ordered pools included) against one limit for several seconds, coming
//! and going (some exit holding memory), while the test samples the
//! simulated device's ground truth continuously: it never exceeds the limit
//! by a single byte.
//!
//! A sample must be an instant, not a scan: summing the device's per-process
//! counters while processes run can count memory one process freed and
//! another then allocated twice. So each sample stops every racing process
//! (SIGSTOP, wherever it is, mid-operation included), reads the device and
//! the allocation's books, and lets them go on.

mod hook_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use hook_support::*;
use tessera_e2e::Mode;
use tessera_e2e::bench::race::frozen;
use tessera_shm::LocalLiveness;

const LIMIT: u64 = 64 * MI;
const PROCESSES: usize = 16;
const DURATION: Duration = Duration::from_secs(4);
/// How long a race may go on past `DURATION` to do what its assertions need.
const CAP: Duration = Duration::from_secs(90);
const HANG: Duration = Duration::from_secs(20);
// Every family: stream-ordered allocations from the default pool and from a
// pool of the process's own included (freed with cuMemFreeAsync and a
// synchronisation, after which a pool with the default threshold gives the
// memory back; until then it is charged).
const KINDS: [&str; 7] = ["plain", "managed", "pitch", "array", "vmm", "async", "pool"];

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    oom: AtomicU64,
    frees: AtomicU64,
    processes: AtomicU64,
}

impl Counts {
    /// Counts an allocation's answer: the handle kept when granted, else
    /// nothing but an out-of-memory refusal is allowed.
    fn allocated(&self, l: Line, live: &mut Vec<u64>) {
        if l.ok {
            live.push(l.u64("h"));
            self.ok.fetch_add(1, Ordering::Relaxed);
        } else {
            l.assert_refused("CUDA_ERROR_OUT_OF_MEMORY");
            self.oom.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Frees one of `live`, picked at random; the free must succeed.
    fn free_one(&self, p: &mut Conv, live: &mut Vec<u64>, rng: &mut Rng) {
        let h = live.swap_remove((rng.next() % live.len() as u64) as usize);
        let l = p.ask(&format!("free {h}"), HANG).unwrap();
        assert!(l.ok, "{}", l.raw);
        self.frees.fetch_add(1, Ordering::Relaxed);
    }
}

/// The racing processes alive now, for the sampler to stop.
type Racers = Mutex<Vec<i32>>;

/// When a race ends: not before `DURATION`, and not before it has done what its
/// assertions need to mean anything (enough samples, grants and refusals), however
/// slowly a loaded box runs it. A race that cannot get there ends at `CAP` and fails
/// on those assertions. The wall clock alone made the number of samples a measure of
/// the machine's speed (70 in a CI run, against the 100 asked).
struct Until {
    earliest: Instant,
    cap: Instant,
    samples: AtomicU64,
    /// (samples, grants, refusals) the race must exceed before it may end.
    need: (u64, u64, u64),
}

impl Until {
    fn new(need: (u64, u64, u64)) -> Arc<Until> {
        let now = Instant::now();
        Arc::new(Until {
            earliest: now + DURATION,
            cap: now + CAP,
            samples: AtomicU64::new(0),
            need,
        })
    }

    /// A sample was taken.
    fn sampled(&self) {
        self.samples.fetch_add(1, Ordering::Relaxed);
    }

    fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }

    /// Whether the racers should stop.
    fn over(&self, counts: &Counts) -> bool {
        let now = Instant::now();
        let (samples, ok, oom) = self.need;
        now >= self.cap
            || (now >= self.earliest
                && self.samples() > samples
                && counts.ok.load(Ordering::Relaxed) > ok
                && counts.oom.load(Ordering::Relaxed) > oom)
    }
}

fn worker(sim: &Sim, id: usize, seed: u64, until: &Until, counts: &Counts, racers: &Racers) {
    let mut rng = Rng(seed ^ (id as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let modes = Mode::ALL;
    while !until.over(counts) {
        let mode = modes[(id + counts.processes.load(Ordering::Relaxed) as usize) % 3];
        counts.processes.fetch_add(1, Ordering::Relaxed);
        let mut p = Conv::start(sim.probe(mode, true));
        let pid = p.pid() as i32;
        racers.lock().unwrap().push(pid);
        for c in ["init", "ctx"] {
            let l = p.ask(c, HANG).expect("probe alive");
            assert!(l.ok, "{mode:?}: {}", l.raw);
        }
        let mut live: Vec<u64> = Vec::new();
        // A process lives for a few hundred operations, then exits,
        // sometimes still holding memory.
        let ops = rng.range(50, 400);
        for _ in 0..ops {
            if until.over(counts) {
                break;
            }
            if live.is_empty() || rng.range(0, 100) < 55 {
                let bytes = rng.range(64 << 10, 12 * MI);
                let kind = rng.pick(&KINDS);
                let l = p.ask(&format!("alloc {bytes} {kind}"), HANG).unwrap();
                counts.allocated(l, &mut live);
            } else {
                counts.free_one(&mut p, &mut live, &mut rng);
            }
        }
        // From here on it only exits, which can only lower what it holds.
        racers.lock().unwrap().retain(|&r| r != pid);
        assert!(p.finish().success());
    }
}

/// The manager's reaper for a race: racers exit holding memory, and their quota returns
/// once the driver has let them go. It works under the racers' lock, so a sample (taken
/// under it) never sees a release between its reads of the device and the books.
fn stand_in(sim: &Arc<Sim>, racers: &Arc<Racers>) -> StandIn {
    let racers = racers.clone();
    StandIn::start(sim.clone(), move |s, st| {
        let _held = racers.lock().unwrap();
        reclaim_released(s, st);
    })
}

/// Runs `processes` racers, `race(id, &counts)` each on a thread of its own, until every
/// one has ended (a racer's panic fails the test); then stops the sampler (`done`) and
/// the reaper. What the racers counted.
fn race_to_the_end(
    processes: usize,
    done: &AtomicBool,
    reaper: StandIn,
    race: impl Fn(usize, &Counts) + Sync,
) -> Counts {
    let counts = Counts::default();
    std::thread::scope(|s| {
        for id in 0..processes {
            let (race, counts) = (&race, &counts);
            s.spawn(move || race(id, counts));
        }
    });
    done.store(true, Ordering::Relaxed);
    drop(reaper);
    counts
}

/// Stops every racer, waits until each of their threads is stopped (or
/// gone), returns the device's ground truth and the allocation's reserved
/// total at that instant, and lets them run again.
fn sample(sim: &Sim, racers: &Racers) -> (u64, u64) {
    let racers = racers.lock().unwrap();
    let (got, still) = frozen(&racers, || (sim.used(0), sim.state().reserved(0)));
    assert!(still, "a racer ran during the sample");
    got
}

#[test]
fn racing_processes_never_exceed_the_limit_on_the_device() {
    let seed = seed("racing_processes_never_exceed_the_limit_on_the_device");
    let sim = Arc::new(Sim::new(1, 4 * LIMIT));
    sim.allocate(LIMIT);
    let done = Arc::new(AtomicBool::new(false));
    let racers = Arc::new(Racers::default());
    let reaper = stand_in(&sim, &racers);
    let until = Until::new((100, 200, 20));
    let sampler = {
        let (sim, done, racers, until) = (sim.clone(), done.clone(), racers.clone(), until.clone());
        std::thread::spawn(move || {
            let (mut max, mut over) = (0u64, Vec::new());
            while !done.load(Ordering::Relaxed) {
                let (used, reserved) = sample(&sim, &racers);
                if used > LIMIT || used > reserved {
                    over.push((used, reserved));
                }
                max = max.max(used);
                until.sampled();
                std::thread::sleep(Duration::from_micros(200));
            }
            (max, over)
        })
    };
    let counts = race_to_the_end(PROCESSES, &done, reaper, |id, counts| {
        worker(&sim, id, seed, &until, counts, &racers)
    });
    let (max, over) = sampler.join().unwrap();
    let samples = until.samples();
    let ok = counts.ok.load(Ordering::Relaxed);
    let oom = counts.oom.load(Ordering::Relaxed);
    eprintln!(
        "{} processes, {ok} allocations, {oom} refused, {} frees; {samples} samples, peak {max} of {LIMIT}",
        counts.processes.load(Ordering::Relaxed),
        counts.frees.load(Ordering::Relaxed)
    );
    // Every instant: the device holds no more than the allocation reserved,
    // which is never more than the limit.
    assert!(over.is_empty(), "(device, reserved) over: {over:?}");
    assert!(max <= LIMIT, "the device held {max} bytes, over {LIMIT}");
    assert!(max > LIMIT / 2, "the limit was contended: peak {max}");
    assert!(ok > 200 && oom > 20, "{ok} allocations, {oom} refused");
    assert!(samples > 100, "{samples} samples");

    // Everyone is gone: what they still held comes back in full.
    let state = sim.state();
    state.reclaim_dead(&LocalLiveness::thorough(), None);
    state.audit().unwrap();
    assert_eq!(state.reserved(0), 0);
    assert!(state.processes(1).is_empty());
}

/// One racer of the pools-and-graphs race on `devices` devices: on each, a
/// stream, a pool of its own that keeps everything, the default pool and
/// graphs whose allocation nodes map memory at launch; plain memory on
/// device 0 (the current context's), all freed in random order, with
/// synchronisations and graph-memory trims now and then. Device 0's
/// context stays current whatever device a stream belongs to.
fn pool_worker(
    sim: &Sim,
    devices: u64,
    id: usize,
    seed: u64,
    until: &Until,
    counts: &Counts,
    racers: &Racers,
) {
    let mut rng = Rng(seed ^ (id as u64 + 7).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    while !until.over(counts) {
        counts.processes.fetch_add(1, Ordering::Relaxed);
        let mut c = sim.client(true);
        racers.lock().unwrap().push(c.pid() as i32);
        let pid = c.pid() as i32;
        let mut setup = vec!["init".to_owned()];
        for d in 0..devices {
            setup.push(format!("stream {d}"));
            setup.push(format!("pool {d} {}", u64::MAX));
        }
        for line in setup {
            let l = c.ask(&line, HANG).expect("client alive");
            assert!(l.ok, "{}", l.raw);
        }
        // Live allocations: (handle, the stream it is freed on, if any).
        let mut live: Vec<(u64, Option<u64>)> = Vec::new();
        for _ in 0..rng.range(30, 200) {
            if until.over(counts) {
                break;
            }
            let roll = rng.range(0, 100);
            let d = rng.range(0, devices);
            let line = if live.is_empty() || roll < 50 {
                let bytes = rng.range(64 << 10, 12 * MI);
                match rng.range(0, 4) {
                    0 => format!("from-pool {bytes} {d} {d}"),
                    1 => format!("async {bytes} {d}"),
                    2 => format!("alloc {bytes}"),
                    _ => format!("graph-node {bytes} {d}"),
                }
            } else if roll < 85 {
                let (h, stream) = live.swap_remove(rng.range(0, live.len() as u64) as usize);
                match stream {
                    Some(s) => format!("free-async {h} {s}"),
                    None => format!("free {h}"),
                }
            } else if roll < 95 {
                format!("sync-stream {d}")
            } else {
                format!("graph-trim {d}")
            };
            let l = c.ask(&line, HANG).expect("client alive");
            if !l.ok {
                assert_eq!(
                    l.error.as_deref(),
                    Some("CUDA_ERROR_OUT_OF_MEMORY"),
                    "{line}: {}",
                    l.raw
                );
                counts.oom.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            match l.cmd.as_str() {
                "graph-node" => {
                    let l2 = c.ask(&format!("launch {} {d}", l.u64("e")), HANG).unwrap();
                    if l2.ok {
                        live.push((l.u64("h"), Some(d)));
                        counts.ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        l2.assert_refused("CUDA_ERROR_OUT_OF_MEMORY");
                        counts.oom.fetch_add(1, Ordering::Relaxed);
                    }
                }
                "from-pool" | "async" => {
                    live.push((l.u64("h"), Some(d)));
                    counts.ok.fetch_add(1, Ordering::Relaxed);
                }
                "alloc" => {
                    live.push((l.u64("h"), None));
                    counts.ok.fetch_add(1, Ordering::Relaxed);
                }
                "free-async" | "free" => {
                    counts.frees.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        racers.lock().unwrap().retain(|&r| r != pid);
        assert!(c.finish().success());
    }
}

/// Races `PROCESSES / 2` pool workers on the devices with these limits;
/// returns per device (peak, samples over: (device, reserved)).
/// Per device: the peak the device held, and the samples that were over
/// (device, reserved); and the number of samples.
type PoolRace = (Vec<u64>, Vec<Vec<(u64, u64)>>, u64);

fn pool_race(name: &str, limits: &[u64]) -> PoolRace {
    let seed = seed(name);
    let sim = Arc::new(Sim::new(limits.len() as u32, 8 * LIMIT));
    let spec: Vec<(u32, u64)> = limits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    sim.allocate_with(&spec, 0);
    let limits = limits.to_vec();
    let n = limits.len();
    let done = Arc::new(AtomicBool::new(false));
    let racers = Arc::new(Racers::default());
    let reaper = stand_in(&sim, &racers);
    let until = Until::new((100, 100, 10));
    let sampler = {
        let (sim, done, racers, limits, until) = (
            sim.clone(),
            done.clone(),
            racers.clone(),
            limits.clone(),
            until.clone(),
        );
        std::thread::spawn(move || {
            let (mut max, mut over) = (vec![0u64; n], vec![Vec::new(); n]);
            while !done.load(Ordering::Relaxed) {
                let racers = racers.lock().unwrap();
                let (got, still) = frozen(&racers, || {
                    let state = sim.state();
                    (0..n)
                        .map(|d| (sim.used(d), state.reserved(d)))
                        .collect::<Vec<_>>()
                });
                drop(racers);
                assert!(still, "a racer ran during the sample");
                for (d, &(used, reserved)) in got.iter().enumerate() {
                    if used > limits[d] || used > reserved {
                        over[d].push((used, reserved));
                    }
                    max[d] = max[d].max(used);
                }
                until.sampled();
                std::thread::sleep(Duration::from_micros(200));
            }
            (max, over)
        })
    };
    let counts = race_to_the_end(PROCESSES / 2, &done, reaper, |id, counts| {
        pool_worker(&sim, n as u64, id, seed, &until, counts, &racers)
    });
    let (max, over) = sampler.join().unwrap();
    let samples = until.samples();
    let ok = counts.ok.load(Ordering::Relaxed);
    let oom = counts.oom.load(Ordering::Relaxed);
    eprintln!(
        "{} processes, {ok} allocations, {oom} refused, {} frees; {samples} samples, peaks {max:?} of {limits:?}",
        counts.processes.load(Ordering::Relaxed),
        counts.frees.load(Ordering::Relaxed)
    );
    assert!(ok > 100 && oom > 10, "{ok} allocations, {oom} refused");
    let state = sim.state();
    state.reclaim_dead(&LocalLiveness::thorough(), None);
    state.audit().unwrap();
    for d in 0..n {
        assert_eq!(state.reserved(d), 0);
    }
    (max, over, samples)
}

#[test]
fn racing_pools_that_keep_memory_and_graphs_never_exceed_the_limit() {
    let (max, over, samples) = pool_race(
        "racing_pools_that_keep_memory_and_graphs_never_exceed_the_limit",
        &[LIMIT],
    );
    assert!(over[0].is_empty(), "(device, reserved) over: {:?}", over[0]);
    assert!(
        max[0] <= LIMIT,
        "the device held {} bytes, over {LIMIT}",
        max[0]
    );
    assert!(
        max[0] > LIMIT / 2,
        "the limit was contended: peak {}",
        max[0]
    );
    assert!(samples > 100, "{samples} samples");
}

#[test]
fn racing_streams_and_pools_on_two_devices_stay_under_each_limit() {
    let limits = [LIMIT, LIMIT / 2];
    let (max, over, samples) = pool_race(
        "racing_streams_and_pools_on_two_devices_stay_under_each_limit",
        &limits,
    );
    for d in 0..2 {
        assert!(
            over[d].is_empty(),
            "device {d}: (device, reserved) over: {:?}",
            over[d]
        );
        assert!(
            max[d] <= limits[d],
            "device {d} held {}, over {}",
            max[d],
            limits[d]
        );
        assert!(max[d] > limits[d] / 2, "device {d}: peak {}", max[d]);
    }
    assert!(samples > 100, "{samples} samples");
}

/// The race of the first real-GPU run (an H200, where it took the device 339 MiB past a
/// 10 GiB limit): 16 processes in one 10 GiB allocation, each with a context that holds
/// what an H200's did (518 MiB, charged by the shim before the driver sees the call, as
/// the manager's measured figure in the control file says), allocating and freeing
/// `cuMemAlloc` memory of random sizes from 1 byte to 64 MiB, which the driver holds in
/// whole 2 MiB pages. Every sample of the device's ground truth (all racers stopped)
/// stays within the limit: 0 bytes over. The node frees an exited racer's memory at
/// once (the Rust API's nodes do); a driver that goes on holding it after the process is
/// reaped, while others still allocate, is `exit_window.rs`'s.
#[test]
fn sixteen_racers_of_1_byte_to_64_mib_never_pass_a_10_gib_limit() {
    const GIB10: u64 = 10 << 30;
    const OPS: u64 = 120;
    let seed = seed("sixteen_racers_of_1_byte_to_64_mib_never_pass_a_10_gib_limit");
    let sim = Arc::new(Sim::new(1, 64 << 30));
    let context = tessera_sim::node::DEFAULT_CONTEXT_MEMORY;
    sim.node.node().set_context_memory(context);
    sim.allocate_with(&[(0, GIB10)], context);
    let done = Arc::new(AtomicBool::new(false));
    let racers = Arc::new(Racers::default());
    let sampler = {
        let (sim, done, racers) = (sim.clone(), done.clone(), racers.clone());
        std::thread::spawn(move || {
            let (mut max, mut samples) = (0u64, 0u64);
            while !done.load(Ordering::Relaxed) {
                let (used, _) = sample(&sim, &racers);
                max = max.max(used);
                samples += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            (max, samples)
        })
    };
    let counts = Arc::new(Counts::default());
    // Two meeting points make the contention a property of the test, not of how the
    // racers happen to be scheduled (a loaded box can run them one after another):
    // every racer's context exists before any allocates, and then each asks for
    // FIRST at once, which 16 cannot all get beside 16 contexts (16 x 518 MiB +
    // 16 x 128 MiB > 10 GiB), whatever the interleaving.
    const FIRST: u64 = 128 * MI;
    let contexts_made = Arc::new(Barrier::new(PROCESSES));
    let first_asked = Arc::new(Barrier::new(PROCESSES));
    let workers: Vec<_> = (0..PROCESSES)
        .map(|id| {
            let (sim, counts, racers) = (sim.clone(), counts.clone(), racers.clone());
            let (contexts_made, first_asked) = (contexts_made.clone(), first_asked.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(seed ^ (id as u64 + 3).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                let mut p = Conv::start(sim.probe(Mode::Link, true));
                let pid = p.pid() as i32;
                racers.lock().unwrap().push(pid);
                // Answers are checked after the meeting point, so a failed racer
                // cannot leave the others waiting for it.
                let setup: Vec<_> = ["init", "ctx"]
                    .iter()
                    .map(|c| p.ask(c, HANG).map(|l| (l.ok, l.raw)))
                    .collect();
                contexts_made.wait();
                let first = p.ask(&format!("alloc {FIRST}"), HANG);
                first_asked.wait();
                for r in setup {
                    let (ok, raw) = r.expect("probe alive");
                    assert!(ok, "{raw}");
                }
                let mut live: Vec<u64> = Vec::new();
                counts.allocated(first.expect("probe alive"), &mut live);
                for _ in 0..OPS {
                    if live.is_empty() || rng.range(0, 100) < 60 {
                        let bytes = rng.range(1, 64 * MI + 1);
                        let l = p.ask(&format!("alloc {bytes}"), HANG).unwrap();
                        counts.allocated(l, &mut live);
                    } else {
                        counts.free_one(&mut p, &mut live, &mut rng);
                    }
                }
                racers.lock().unwrap().retain(|&r| r != pid);
                assert!(p.finish().success());
            })
        })
        .collect();
    for w in workers {
        w.join().expect("racer");
    }
    done.store(true, Ordering::Relaxed);
    let (max, samples) = sampler.join().unwrap();
    let (ok, oom) = (
        counts.ok.load(Ordering::Relaxed),
        counts.oom.load(Ordering::Relaxed),
    );
    eprintln!(
        "16 racers at 10 GiB: {ok} allocations, {oom} refused; {samples} samples, peak {} MiB of {} MiB, {} bytes over",
        max >> 20,
        GIB10 >> 20,
        max.saturating_sub(GIB10)
    );
    assert!(max <= GIB10, "the device held {max} bytes, over {GIB10}");
    // The contexts alone take 8 GiB of the 10, and all 16 asked for FIRST at once.
    assert!(
        oom > 0,
        "the limit was reached: {ok} allocations, none refused"
    );
    assert!(samples > 0, "the device was sampled");
}
