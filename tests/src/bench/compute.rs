//! Compute-time slices end to end: allocations on a simulated node, workload
//! processes under the shim keeping a GPU busy with kernels of a known
//! duration, an arbiter, and what each allocation really got by the node's
//! ground truth (its engine timeline). Shared by the `compute_*` tests and
//! the bench.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use tessera_manager::arbiter::{Arbiter, HandoverSpan, OpenFiles, percentile};
use tessera_shm::{ControlSpec, DeviceSpec, Policy, create_allocation_files};
use tessera_sim::layout::{DEVICE_BUCKET_NS, PROC_BUCKET_NS};

// Whole process buckets are whole device buckets too.
const _: () = assert!(PROC_BUCKET_NS.is_multiple_of(DEVICE_BUCKET_NS));

use crate::paths::{hook_library, sim_lib_dir, work_dir};
use crate::sim::SimNode;

/// The workload: a CUDA driver-API client linked with `-lcuda`, keeping at
/// most `depth` kernels in flight (as a real framework's queue does) for a
/// given time; or, with `sync_every` > 0, synchronising its context after
/// every `sync_every` launches and then sleeping `gap_us` (a training step:
/// its kernels, a `loss.item()`, the host's part). It prints `ready`, then `done launches=<n> elapsed_ns=<from ready to the end>`; a failed call
/// prints `err <call> <code>` and exits 1.
const WORKLOAD_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_abi.h"

CUresult cuDeviceGetUuid(CUuuid *, CUdevice);

#define CK(call)                                                  \
    do {                                                          \
        CUresult r_ = (call);                                     \
        if (r_) {                                                 \
            printf("err %s %d\n", #call, r_);                     \
            fflush(stdout);                                       \
            return 1;                                             \
        }                                                         \
    } while (0)

/* `uuid`: prints the UUID of CUDA device 0 as NVML spells it (the real
   mode's allocation files name the GPU by it). */
static int print_uuid(void) {
    CUdevice dev;
    CUuuid u;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDeviceGetUuid(&u, dev));
    const unsigned char *b = (const unsigned char *)u.bytes;
    printf("GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    return 0;
}

/* With TESSERA_BENCH_PTX naming a PTX file, its kernel `spin(u64 ns)` is
   loaded and launched with the kernel length as its argument (the real
   mode: a kernel that occupies a real GPU for that long); otherwise the
   simulator's image of a kernel that lasts that long. */
static char *read_file(const char *path) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = 0;
    return buf;
}

/* With TESSERA_BENCH_WANTS naming a file, the stretches this program
   wanted the GPU are written there as it ends, pairs of u64 ns on
   CLOCK_MONOTONIC: from a step's first launch call (blocked at the gate or
   not) to the return of the wait that ends the step, or the whole run when
   it never waits. The bench's ground truth for "wanting the GPU". */
static unsigned long long *wants;
static size_t n_wants, cap_wants;
static int keep_wants;
static void wanted(double from, double to) {
    if (!keep_wants) return;
    if (n_wants == cap_wants) {
        cap_wants = cap_wants ? 2 * cap_wants : 4096;
        wants = realloc(wants, cap_wants * 2 * sizeof *wants);
        if (!wants) {
            printf("err out of memory for the wants\n");
            fflush(stdout);
            exit(1);
        }
    }
    wants[2 * n_wants] = (unsigned long long)from;
    wants[2 * n_wants + 1] = (unsigned long long)to;
    n_wants++;
}
static int write_wants(void) {
    const char *path = getenv("TESSERA_BENCH_WANTS");
    if (!path || !*path) return 0;
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(wants, 2 * sizeof *wants, n_wants, fp) != n_wants || fclose(fp)) {
        printf("err writing %s\n", path);
        fflush(stdout);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "uuid")) return print_uuid();
    keep_wants = getenv("TESSERA_BENCH_WANTS") && *getenv("TESSERA_BENCH_WANTS");
    if (argc != 8) {
        fprintf(stderr, "usage: %s <device> <kernel_us> <seconds> <depth> <kernel|ex|coop|graph> <sync_every> <gap_us>\n",
                argv[0]);
        return 2;
    }
    int ordinal = atoi(argv[1]);
    long kernel_us = atol(argv[2]);
    double seconds = atof(argv[3]);
    int depth = atoi(argv[4]);
    const char *how = argv[5];
    long sync_every = atol(argv[6]);
    long gap_us = atol(argv[7]);
    struct timespec gap = {gap_us / 1000000, (gap_us % 1000000) * 1000};
    if (depth < 1 || depth > 256) {
        fprintf(stderr, "depth must be 1..256\n");
        return 2;
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, ordinal));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    const char *ptx_path = getenv("TESSERA_BENCH_PTX");
    unsigned long long spin_ns = (unsigned long long)kernel_us * 1000ULL;
    void *spin_args[] = {&spin_ns, NULL};
    void **args = NULL;
    if (ptx_path && *ptx_path) {
        const char *ptx = read_file(ptx_path);
        if (!ptx) {
            printf("err reading %s\n", ptx_path);
            fflush(stdout);
            return 1;
        }
        CK(cuModuleLoadData(&mod, ptx));
        CK(cuModuleGetFunction(&f, mod, "spin"));
        args = spin_args;
    } else {
        char image[64];
        snprintf(image, sizeof image, "kernel work %ldus\n", kernel_us);
        CK(cuModuleLoadData(&mod, image));
        CK(cuModuleGetFunction(&f, mod, "work"));
    }
    CUevent ev[256];
    for (int i = 0; i < depth; i++) CK(cuEventCreate(&ev[i], 0));
    CUgraphExec exec = NULL;
    if (!strcmp(how, "graph")) {
        CUgraph g;
        CUgraphNode node;
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.func = f;
        p.kernelParams = args;
        p.gridDimX = p.gridDimY = p.gridDimZ = p.blockDimX = p.blockDimY = p.blockDimZ = 1;
        CK(cuGraphCreate(&g, 0));
        CK(cuGraphAddKernelNode_v2(&node, g, NULL, 0, &p));
        CK(cuGraphInstantiateWithFlags(&exec, g, 0ULL));
    }
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
    printf("ready\n");
    fflush(stdout);
    double start = now_ns();
    double end = start + seconds * 1e9;
    long n = 0;
    double step_from = -1;
    while (now_ns() < end) {
        if (step_from < 0) step_from = now_ns();
        if (n >= depth) CK(cuEventSynchronize(ev[n % depth]));
        if (exec) CK(cuGraphLaunch(exec, NULL));
        else if (!strcmp(how, "ex")) CK(cuLaunchKernelEx(&cfg, f, args, NULL));
        else if (!strcmp(how, "coop")) CK(cuLaunchCooperativeKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args));
        else CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
        CK(cuEventRecord(ev[n % depth], NULL));
        n++;
        /* A training step: wait for the step's kernels (loss.item(), a
           copy back), then the host's own part of the step. */
        if (sync_every > 0 && n % sync_every == 0) {
            CK(cuCtxSynchronize());
            wanted(step_from, now_ns());
            step_from = -1;
            if (gap_us > 0) nanosleep(&gap, NULL);
        }
    }
    CK(cuCtxSynchronize());
    if (step_from >= 0) wanted(step_from, now_ns());
    if (write_wants()) return 1;
    printf("done launches=%ld elapsed_ns=%.0f\n", n, now_ns() - start);
    fflush(stdout);
    return 0;
}
"#;

/// The workload, compiled with `cc` once per test process (written by an
/// atomic rename, so processes building it at once do not collide).
///
/// # Panics
/// If `cc` fails; the message holds its output.
pub fn workload_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let lib = format!("-L{}", sim_lib_dir().dir.display());
        let out = work_dir().join("compute-workload");
        crate::cc::cc_text(WORKLOAD_C, &out, &["-O2", &lib, "-lcuda"])
            .unwrap_or_else(|e| panic!("the compute workload: {e}"));
        out
    })
}

/// How a workload submits its kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launch {
    Kernel,
    Ex,
    Coop,
    Graph,
}

impl Launch {
    pub fn name(self) -> &'static str {
        match self {
            Launch::Kernel => "kernel",
            Launch::Ex => "ex",
            Launch::Coop => "coop",
            Launch::Graph => "graph",
        }
    }
}

/// One allocation of a scenario.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllocSpec {
    pub share_ppm: u32,
    pub policy: Policy,
}

impl AllocSpec {
    pub fn guaranteed(percent: u32) -> Self {
        AllocSpec {
            share_ppm: percent * 10_000,
            policy: Policy::Guaranteed,
        }
    }
    pub fn burst(percent: u32) -> Self {
        AllocSpec {
            share_ppm: percent * 10_000,
            policy: Policy::Burst,
        }
    }
}

/// Allocations saturating one GPU with one workload process each.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub name: String,
    pub allocs: Vec<AllocSpec>,
    pub kernel: Duration,
    /// Kernels in flight per workload.
    pub depth: u32,
    pub launch: Launch,
    /// Synchronise the context after every this many launches (0: never,
    /// keep `depth` kernels in flight).
    pub sync_every: u32,
    /// Host time after each synchronisation (the step's CPU part, slept).
    pub gap: Duration,
    /// Before measuring: the workloads start and the shares settle.
    pub warmup: Duration,
    /// The measured window.
    pub measure: Duration,
    /// Workload processes per allocation (each the same program).
    pub processes: u32,
}

impl Scenario {
    pub fn new(name: &str, allocs: Vec<AllocSpec>, kernel: Duration, measure: Duration) -> Self {
        // About 4 ms of queued work, at least two kernels: as a framework
        // queues ahead, so that a few ms of CPU scheduling delay on a
        // loaded machine do not leave the GPU idle while it is held.
        let depth = (4_000 / kernel.as_micros().max(1)).clamp(2, 256) as u32;
        Scenario {
            name: name.into(),
            allocs,
            kernel,
            depth,
            launch: Launch::Kernel,
            sync_every: 0,
            gap: Duration::ZERO,
            warmup: Duration::from_millis(700),
            measure,
            processes: 1,
        }
    }
}

/// An allocation's files on the node.
#[derive(Debug, Clone)]
pub struct AllocFiles {
    pub id: String,
    pub control: PathBuf,
    pub state: PathBuf,
    pub spec: AllocSpec,
}

/// Creates an allocation of `spec` on device `device` of `node`.
///
/// # Panics
/// If the files cannot be written.
pub fn create_allocation(node: &SimNode, device: u32, id: &str, spec: AllocSpec) -> AllocFiles {
    let uuid = node
        .node()
        .device_info(device)
        .expect("the scenario's device exists")
        .uuid;
    let dir = node.dir.path().join(id);
    let (control, state) = create_allocation_files(
        &dir,
        &ControlSpec::new(
            id,
            vec![DeviceSpec {
                uuid,
                memory_limit_bytes: 1 << 30,
                compute_share_ppm: spec.share_ppm,
                policy: spec.policy,
            }],
        ),
    )
    .expect("creating the allocation's files");
    AllocFiles {
        id: id.into(),
        control,
        state,
        spec,
    }
}

/// A workload process and what it printed.
#[derive(Debug)]
pub struct Workload {
    pub child: Child,
    lines: Receiver<String>,
    pub seen: Vec<String>,
}

impl Workload {
    /// Starts a workload under the shim, governed by `files`, on CUDA
    /// ordinal `device` as the process sees it. A governed process sees only
    /// its allocation's GPUs, numbered from 0 (the shim pins
    /// `CUDA_VISIBLE_DEVICES` from the control file), so a one-GPU
    /// allocation's GPU is ordinal 0 whichever GPU of the node it is.
    ///
    /// # Panics
    /// If it cannot be started.
    pub fn spawn(
        node: &SimNode,
        files: &AllocFiles,
        device: u32,
        sc: &Scenario,
        seconds: f64,
    ) -> Workload {
        Self::spawn_with(node, files, device, sc, seconds, |_| {})
    }

    /// As [`Workload::spawn`], with `extra` adjusting the command (more
    /// environment, say).
    pub fn spawn_with(
        node: &SimNode,
        files: &AllocFiles,
        device: u32,
        sc: &Scenario,
        seconds: f64,
        extra: impl FnOnce(&mut Command),
    ) -> Workload {
        let mut cmd = node.command(workload_binary());
        extra(&mut cmd);
        Self::start(cmd, files, device, sc, seconds)
    }

    /// Starts `cmd`, the workload binary with its environment, under the
    /// shim, governed by `files` (see [`Workload::spawn`]).
    ///
    /// # Panics
    /// If it cannot be started.
    pub fn start(
        mut cmd: Command,
        files: &AllocFiles,
        device: u32,
        sc: &Scenario,
        seconds: f64,
    ) -> Workload {
        let hook = hook_library().expect("libtessera.so is built with the tests");
        cmd.env("LD_PRELOAD", hook)
            .env("TESSERA_CONTROL", &files.control)
            .env("TESSERA_STATE", &files.state)
            .arg(device.to_string())
            .arg(sc.kernel.as_micros().to_string())
            .arg(format!("{seconds:.3}"))
            .arg(sc.depth.to_string())
            .arg(sc.launch.name())
            .arg(sc.sync_every.to_string())
            .arg(sc.gap.as_micros().to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().expect("starting the compute workload");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Workload {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a line starting with `prefix`; `None` after `timeout` or
    /// at end of output.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return Some(l);
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Waits for the process to finish; its `done` line and exit status.
    pub fn finish(mut self, timeout: Duration) -> Result<String, String> {
        let done = self.wait_line("done", timeout);
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                _ => break None,
            }
        };
        match (done, status) {
            (Some(d), Some(s)) if s.success() => Ok(d),
            (d, s) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                Err(format!(
                    "workload {}: done line {d:?}, status {s:?}, output {:?}",
                    self.child.id(),
                    self.seen
                ))
            }
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Reads the node's ground truth: busy time per process and per device
/// over whole time buckets, accumulated in chunks (each process's history
/// spans a few seconds) while the processes live.
#[derive(Debug)]
pub struct BusyMeter<'a> {
    node: &'a SimNode,
    device: u32,
    pids: Vec<u32>,
    from: u64,
    next: u64,
    busy: Vec<u64>,
    device_busy: u64,
}

impl<'a> BusyMeter<'a> {
    /// Starts measuring at the next bucket boundary.
    pub fn start(node: &'a SimNode, device: u32, pids: Vec<u32>) -> Self {
        let now = tessera_sim::clock::now_ns();
        let from = now.div_ceil(PROC_BUCKET_NS) * PROC_BUCKET_NS;
        let n = pids.len();
        BusyMeter {
            node,
            device,
            pids,
            from,
            next: from,
            busy: vec![0; n],
            device_busy: 0,
        }
    }

    /// Adds the whole buckets that ended since the last call, up to `limit`.
    pub fn sample(&mut self, limit: u64) {
        let now = tessera_sim::clock::now_ns();
        let to = (now / PROC_BUCKET_NS * PROC_BUCKET_NS).min(limit);
        if to <= self.next {
            return;
        }
        let state = self.node.node().state();
        let procs = self.node.node().processes();
        let d = self.device as usize;
        for (i, pid) in self.pids.iter().enumerate() {
            if let Some(p) = procs.iter().find(|p| p.pid == *pid) {
                self.busy[i] += state.procs[p.slot].busy[d].busy_between(self.next, to);
            }
        }
        self.device_busy += state.devices[d].busy.busy_between(self.next, to);
        self.next = to;
    }

    /// Samples until `span` (rounded up to whole buckets) has been
    /// measured; returns (busy % per process, busy % of the device).
    pub fn run_for(&mut self, span: Duration) -> (Vec<f64>, f64) {
        self.run_for_with(span, || {})
    }

    /// [`BusyMeter::run_for`], calling `every` at least every 100 ms
    /// meanwhile (what keeps up with a ring of the recent past).
    pub fn run_for_with(&mut self, span: Duration, mut every: impl FnMut()) -> (Vec<f64>, f64) {
        let span = (span.as_nanos() as u64).div_ceil(PROC_BUCKET_NS) * PROC_BUCKET_NS;
        let end = self.from + span;
        while self.next < end {
            let left = end.saturating_sub(tessera_sim::clock::now_ns()) + PROC_BUCKET_NS / 10;
            std::thread::sleep(Duration::from_nanos(left.min(100_000_000)));
            self.sample(end);
            every();
        }
        self.result()
    }

    /// Where the measured window starts and ends (so far), CLOCK_MONOTONIC.
    pub fn span(&self) -> (u64, u64) {
        (self.from, self.next)
    }

    /// The time measured so far: whole buckets.
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.next.saturating_sub(self.from))
    }

    /// Busy percentages so far.
    pub fn result(&self) -> (Vec<f64>, f64) {
        let span = self.next.saturating_sub(self.from).max(1) as f64;
        (
            self.busy.iter().map(|&b| b as f64 / span * 100.0).collect(),
            self.device_busy as f64 / span * 100.0,
        )
    }
}

/// What one scenario achieved.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub name: String,
    pub allocs: Vec<AllocSpec>,
    /// Busy % of the GPU per allocation, by the node's ground truth.
    pub achieved: Vec<f64>,
    /// % of the time each allocation was charged for (held the grant,
    /// drains included), by the arbiter's own account.
    pub held: Vec<f64>,
    /// Each allocation's longest single hold (grant to drained): how far a
    /// window can cut a hold at each of its ends.
    pub longest_hold: Vec<Duration>,
    /// The ground truth's window (whole buckets), what `achieved` is a
    /// share of.
    pub window: Duration,
    /// Revoked grants whose work did not drain in time.
    pub drain_timeouts: u64,
    /// Busy % of the GPU in all.
    pub gpu_busy: f64,
    /// Grant hand-over latency (revocation → next grant), ns.
    pub handover_p50: Option<u64>,
    /// Hand-overs during the measured window.
    pub handovers_measured: usize,
    /// The measured window.
    pub measured: Duration,
    pub handover_p99: Option<u64>,
    /// The GPU's idle time per hand-over in the window, ns, by the node's
    /// ground truth ([`handover_idle`]); `None` without hand-overs, or
    /// when the idle log overran between two reads.
    pub handover_idle_ns: Option<f64>,
    /// Workloads that did not finish cleanly, with what they printed.
    pub failures: Vec<String>,
}

/// Runs a scenario on device `device` of `node` under an in-process
/// arbiter (the allocations are added to it and removed afterwards).
///
/// # Panics
/// On set-up failures (files, processes), which are bugs of the test.
pub fn run_scenario(node: &SimNode, arbiter: &Arbiter, device: u32, sc: &Scenario) -> Outcome {
    let files: Vec<AllocFiles> = sc
        .allocs
        .iter()
        .enumerate()
        .map(|(i, &a)| {
            // Short (ids are at most 63 bytes) and unique on the node: one
            // scenario per device.
            let id = format!("compute-dev{device}-{i}");
            create_allocation(node, device, &id, a)
        })
        .collect();
    for f in &files {
        let opened = OpenFiles::open(&f.control, &f.state).expect("opening the allocation");
        arbiter
            .add_allocation(std::sync::Arc::new(opened), 0)
            .expect("adding the allocation to the arbiter");
    }
    let gpu_uuid = node.node().device_info(device).map(|i| i.uuid).ok();
    let gpu_of = || gpu_uuid.as_deref().and_then(|u| arbiter.gpu_stats_of(u));
    let before = gpu_of().map_or(0, |g| g.handover_ns.len());
    let seconds = (sc.warmup + sc.measure).as_secs_f64() + 0.5;
    let per = sc.processes.max(1) as usize;
    // Where each workload says when it wanted the GPU, by allocation.
    let wants: Vec<PathBuf> = (0..files.len() * per)
        .map(|i| work_dir().join(format!("wants-{}-dev{device}-{i}", std::process::id())))
        .collect();
    let mut workloads: Vec<Workload> = files
        .iter()
        .flat_map(|f| std::iter::repeat_n(f, per))
        .zip(&wants)
        // Ordinal 0: the allocation's one GPU, whichever of the node's it is.
        .map(|(f, w)| {
            Workload::spawn_with(node, f, 0, sc, seconds, |c| {
                c.env("TESSERA_BENCH_WANTS", w);
            })
        })
        .collect();
    for w in &mut workloads {
        if w.wait_line("ready", Duration::from_secs(20)).is_none() {
            panic!("workload {} did not start: {:?}", w.pid(), w.seen);
        }
    }
    std::thread::sleep(sc.warmup);
    let held_of = |arbiter: &Arbiter| -> Vec<(u64, u64, u64)> {
        let stats = arbiter.stats();
        files
            .iter()
            .map(|f| {
                stats
                    .iter()
                    .find(|s| s.alloc_id == f.id)
                    .map_or((0, 0, 0), |s| {
                        (s.held_ns, s.drain_timeouts, s.longest_hold_ns)
                    })
            })
            .collect()
    };
    let handovers_now = || gpu_of().map_or(0, |g| g.handover_ns.len());
    // The arbiter's account is read before the ground truth's window opens
    // and after it closes, so every hold that overlaps the window either
    // ends inside the account's span (charged) or is the one still running
    // at its end: whatever the CPU load, the two differ by at most that
    // hold plus the one cut at the window's start.
    let t0 = Instant::now();
    let held0 = held_of(arbiter);
    let n0 = handovers_now();
    let mut meter = BusyMeter::start(node, device, workloads.iter().map(Workload::pid).collect());
    let mut log = HandoverLog::new(node, device, arbiter, gpu_uuid.clone());
    let (per_process, gpu_busy) = meter.run_for_with(sc.measure, || log.collect());
    // An allocation's share is what all its processes ran.
    let achieved: Vec<f64> = per_process.chunks(per).map(|c| c.iter().sum()).collect();
    let held1 = held_of(arbiter);
    let handovers_measured = handovers_now().saturating_sub(n0);
    let measured = t0.elapsed();
    let span = t0.elapsed().as_nanos() as f64;
    let held = held0
        .iter()
        .zip(&held1)
        .map(|(a, b)| (b.0 - a.0) as f64 / span * 100.0)
        .collect();
    let drain_timeouts = held0.iter().zip(&held1).map(|(a, b)| b.1 - a.1).sum();
    let longest_hold = held1.iter().map(|h| Duration::from_nanos(h.2)).collect();
    let window = meter.window();
    // A stretch is logged when the work that ends it is queued: a moment
    // for the hand-overs at the window's end to see their next holder's
    // first kernel.
    std::thread::sleep(Duration::from_millis(50));
    log.collect();
    let handovers: Vec<u64> = gpu_of()
        // The measured window's hand-overs: not the start-up's, when the
        // workloads' first kernels run before their lengths are learned.
        .map(|g| g.handover_ns.into_iter().skip(n0.max(before)).collect())
        .unwrap_or_default();
    let failures: Vec<String> = workloads
        .into_iter()
        .filter_map(|w| w.finish(Duration::from_secs(30)).err())
        .collect();
    // Each allocation's wants, all its processes' together.
    let wanted: Option<std::collections::HashMap<String, Vec<(u64, u64)>>> = files
        .iter()
        .zip(wants.chunks(per))
        .map(|(f, paths)| {
            let mut all = Vec::new();
            for p in paths {
                all.extend(read_wants(p)?);
            }
            Some((f.id.clone(), merge(all)))
        })
        .collect();
    for p in &wants {
        let _ = std::fs::remove_file(p);
    }
    let handover_idle_ns = wanted
        .filter(|_| failures.is_empty())
        .and_then(|w| log.idle_per_handover(meter.span(), &w));
    for f in &files {
        let _ = arbiter.remove_allocation(&f.id);
    }
    Outcome {
        name: sc.name.clone(),
        allocs: sc.allocs.clone(),
        achieved,
        held,
        longest_hold,
        window,
        drain_timeouts,
        gpu_busy,
        handover_p50: percentile(&handovers, 50.0),
        handovers_measured,
        measured,
        handover_p99: percentile(&handovers, 99.0),
        handover_idle_ns,
        failures,
    }
}

/// The GPU's idle stretches and the arbiter's hand-overs, read while a
/// window runs: both keep only their recent past.
struct HandoverLog<'a> {
    node: &'a SimNode,
    device: u32,
    arbiter: &'a Arbiter,
    gpu_uuid: Option<String>,
    idle_next: u64,
    idle: Vec<(u64, u64)>,
    idle_lost: u64,
    spans: Vec<HandoverSpan>,
}

impl<'a> HandoverLog<'a> {
    fn new(node: &'a SimNode, device: u32, arbiter: &'a Arbiter, gpu_uuid: Option<String>) -> Self {
        let idle_next = node.node().idle_since(device, 0).map_or(0, |r| r.next);
        HandoverLog {
            node,
            device,
            arbiter,
            gpu_uuid,
            idle_next,
            idle: Vec::new(),
            idle_lost: 0,
            spans: Vec::new(),
        }
    }

    fn collect(&mut self) {
        if let Ok(r) = self.node.node().idle_since(self.device, self.idle_next) {
            self.idle.extend(r.stretches);
            self.idle_lost += r.lost;
            self.idle_next = r.next;
        }
        let last = self.spans.last().map_or(0, |s| s.revoked_at);
        let new = self
            .gpu_uuid
            .as_deref()
            .and_then(|u| self.arbiter.gpu_stats_of(u))
            .map(|g| g.handovers)
            .unwrap_or_default();
        // Revocations follow one another, so the new ones are those after
        // the last one kept.
        self.spans
            .extend(new.into_iter().filter(|s| s.revoked_at > last));
    }

    /// Mean idle per hand-over over the hand-overs wholly inside `window`
    /// ([`handover_idle`]).
    fn idle_per_handover(
        &self,
        (from, to): (u64, u64),
        wanted: &std::collections::HashMap<String, Vec<(u64, u64)>>,
    ) -> Option<f64> {
        // Alone, an allocation hands over to itself after waiting on its
        // cap: that idle is the cap's, not a switch's.
        if self.idle_lost > 0 || wanted.len() < 2 {
            return None;
        }
        let inside: Vec<HandoverSpan> = self
            .spans
            .iter()
            .filter(|s| s.revoked_at >= from && s.over_at < to)
            .cloned()
            .collect();
        if inside.is_empty() {
            return None;
        }
        let idle = handover_idle(&inside, &self.idle, wanted)?;
        Some(idle.iter().sum::<u64>() as f64 / idle.len() as f64)
    }
}

/// A workload's wants ([`WORKLOAD_C`]'s `TESSERA_BENCH_WANTS`): pairs of
/// u64 ns; `None` when missing or cut short.
fn read_wants(path: &Path) -> Option<Vec<(u64, u64)>> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.len() % 16 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(16)
            .map(|c| {
                let word = |b: &[u8]| u64::from_ne_bytes(b.try_into().expect("8 bytes"));
                (word(&c[..8]), word(&c[8..]))
            })
            .collect(),
    )
}

/// Sorted, non-overlapping stretches covering the same time as `v`.
fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(v.len());
    for (f, t) in v {
        match out.last_mut() {
            Some(last) if f <= last.1 => last.1 = last.1.max(t),
            _ => out.push((f, t)),
        }
    }
    out
}

/// Time `[from, to)` shares with the sorted, non-overlapping `set`.
fn overlap(set: &[(u64, u64)], from: u64, to: u64) -> u64 {
    let first = set.partition_point(|&(_, t)| t <= from);
    set[first..]
        .iter()
        .take_while(|&&(f, _)| f < to)
        .map(|&(f, t)| t.min(to).saturating_sub(f.max(from)))
        .sum()
}

/// The GPU's idle time in each hand-over, ns: the engine's idle stretches
/// (`idle`, `(from, to)` in order) from the revocation to the next
/// holder's first kernel (the end of the stretch the GPU stood idle in when
/// the next holder's time started, or that start if the GPU was busy then:
/// work queued ahead ran on), counted only while the next holder wanted the
/// GPU (`wanted`, its stretches by allocation, sorted and merged). So the
/// GPU idle before the next holder came back, which no one wanted, is not
/// the hand-over's; idle while it waited behind a drain's report, the
/// arbiter's wake-up or its own is. For a holder granted ahead of its
/// return the hand-over ends with the drain. `None` when a next holder's
/// wants are missing.
pub fn handover_idle(
    spans: &[HandoverSpan],
    idle: &[(u64, u64)],
    wanted: &std::collections::HashMap<String, Vec<(u64, u64)>>,
) -> Option<Vec<u64>> {
    // One engine's stretches never overlap and are logged in order.
    spans
        .iter()
        .map(|s| {
            let wants = wanted.get(&*s.to)?;
            let at = idle.partition_point(|&(f, _)| f <= s.over_at);
            let end = match at.checked_sub(1).map(|i| idle[i]) {
                Some((_, t)) if s.waiting && s.over_at < t => t,
                _ => s.over_at,
            };
            let first = idle.partition_point(|&(_, t)| t <= s.revoked_at);
            Some(
                idle[first..]
                    .iter()
                    .take_while(|&&(f, _)| f < end)
                    .map(|&(f, t)| overlap(wants, f.max(s.revoked_at), t.min(end)))
                    .sum(),
            )
        })
        .collect()
}

/// The scenarios the issue names, each with kernels of `kernel`.
pub fn standard_scenarios(kernel: Duration, measure: Duration) -> Vec<Scenario> {
    let us = kernel.as_micros();
    vec![
        Scenario::new(
            &format!("guaranteed 20/30/50, {us} us kernels"),
            vec![
                AllocSpec::guaranteed(20),
                AllocSpec::guaranteed(30),
                AllocSpec::guaranteed(50),
            ],
            kernel,
            measure,
        ),
        Scenario::new(
            &format!("guaranteed 30 alone, {us} us kernels"),
            vec![AllocSpec::guaranteed(30)],
            kernel,
            measure,
        ),
        Scenario::new(
            &format!("burst 25+25, {us} us kernels"),
            vec![AllocSpec::burst(25), AllocSpec::burst(25)],
            kernel,
            measure,
        ),
    ]
}

/// A guaranteed 30% allocation alone, submitting its 1 ms kernels with
/// `cuLaunchKernelEx`, cooperative launches and CUDA graphs: every way of
/// launching is held to the share as plain launches are.
pub fn launch_scenarios(measure: Duration) -> Vec<Scenario> {
    [Launch::Ex, Launch::Coop, Launch::Graph]
        .into_iter()
        .map(|how| {
            let mut sc = Scenario::new(
                &format!("guaranteed 30 alone, {} launches", how.name()),
                vec![AllocSpec::guaranteed(30)],
                Duration::from_millis(1),
                measure,
            );
            sc.launch = how;
            sc
        })
        .collect()
}

/// The shapes of issue 36 the other rounds leave out, each guaranteed
/// 30 + 70: two processes per allocation (1 ms kernels, streaming), 20 ms
/// kernels with a synchronisation after every second launch, and CUDA
/// graphs (1 ms kernels) shared by two allocations.
pub fn shape_scenarios(measure: Duration) -> Vec<Scenario> {
    let pair = || vec![AllocSpec::guaranteed(30), AllocSpec::guaranteed(70)];
    let ms = Duration::from_millis;
    let mut two = Scenario::new(
        "guaranteed 30+70, 2 processes each, 1000 us kernels",
        pair(),
        ms(1),
        measure,
    );
    two.processes = 2;
    let mut long = Scenario::new(
        "guaranteed 30+70, 20000 us kernels, sync every 2",
        pair(),
        ms(20),
        measure,
    );
    long.sync_every = 2;
    let mut graphs = Scenario::new(
        "guaranteed 30+70, graph launches, 1000 us kernels",
        pair(),
        ms(1),
        measure,
    );
    graphs.launch = Launch::Graph;
    vec![two, long, graphs]
}

/// The arbiter's idle release while another allocation waits, for the
/// rounds of this process (`--contested-idle-release`); 0: the default.
static CONTESTED_IDLE_RELEASE_NS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Sets the arbiter's contested idle release for every later round, so two
/// rules can be compared at one load (`tessera-bench --contested-idle-release`).
pub fn set_contested_idle_release(d: Duration) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    CONTESTED_IDLE_RELEASE_NS.store(ns, std::sync::atomic::Ordering::Relaxed);
}

/// How long ahead of its return from a host gap an allocation may be
/// granted, for the rounds of this process (`--grant-ahead`); `u64::MAX`:
/// the default.
static GRANT_AHEAD_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// Sets the arbiter's grant ahead for every later round (0: only at the
/// gate, the rule before), so the two can be compared at one load
/// (`tessera-bench --grant-ahead`).
pub fn set_grant_ahead(d: Duration) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1);
    GRANT_AHEAD_NS.store(ns, std::sync::atomic::Ordering::Relaxed);
}

/// How long before its quantum's end a holder is renewed, for the rounds of
/// this process (`--renew-ahead`); `u64::MAX`: the default.
static RENEW_AHEAD_NS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(u64::MAX);

/// Sets the arbiter's renewal ahead for every later round (0: at the
/// quantum's end, the rule before), so the two can be compared at one load
/// (`tessera-bench --renew-ahead`).
pub fn set_renew_ahead(d: Duration) {
    let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1);
    RENEW_AHEAD_NS.store(ns, std::sync::atomic::Ordering::Relaxed);
}

/// Whether a holder's time starts at its first launch (the default) for the
/// rounds of this process.
static LATE_START: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// `false`: a holder's time starts at its grant for every later round, the
/// rule before the late start, so the two can be compared at one load
/// (`tessera-bench --charge-from-grant`).
pub fn set_late_start(on: bool) {
    LATE_START.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether a holder cut off as it leaves is away in its host gap (on by
/// default, as the arbiter's own default) for the rounds of this process.
static CUT_OFF_AWAY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// `false`: a holder cut off at its quantum while its processes yield is
/// expected back only after an idle revocation, the rule before, for
/// every later round (`tessera-bench --no-cut-off-away`;
/// `ArbiterConfig::cut_off_away`).
pub fn set_cut_off_away(on: bool) {
    CUT_OFF_AWAY.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The nice value of the arbiter's threads for the rounds of this process;
/// `i32::MIN`: the default.
static ARBITER_NICE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(i32::MIN);

/// Sets the nice value of the in-process arbiter's threads for every later
/// round (0: the bench's own, the rule before), so the two can be compared
/// at one load (`tessera-bench --arbiter-nice`; `ArbiterConfig::nice`). The
/// bench raises them only where it runs with `CAP_SYS_NICE`, as the
/// manager does.
pub fn set_arbiter_nice(nice: i32) {
    ARBITER_NICE.store(nice, std::sync::atomic::Ordering::Relaxed);
}

/// The arbiter's configuration the shapes run under: the default, but for
/// [`set_contested_idle_release`], [`set_grant_ahead`], [`set_renew_ahead`],
/// [`set_late_start`], [`set_cut_off_away`] and [`set_arbiter_nice`].
fn arbiter_config() -> tessera_manager::arbiter::ArbiterConfig {
    let mut cfg = tessera_manager::arbiter::ArbiterConfig::default();
    let contested = CONTESTED_IDLE_RELEASE_NS.load(std::sync::atomic::Ordering::Relaxed);
    if contested != 0 {
        cfg.contested_idle_release = Duration::from_nanos(contested);
    }
    let ahead = GRANT_AHEAD_NS.load(std::sync::atomic::Ordering::Relaxed);
    if ahead != u64::MAX {
        cfg.grant_ahead = Duration::from_nanos(ahead);
    }
    // Never ahead by more than the contested release (the arbiter's rule).
    cfg.grant_ahead = cfg.grant_ahead.min(cfg.contested_idle_release);
    let renew = RENEW_AHEAD_NS.load(std::sync::atomic::Ordering::Relaxed);
    if renew != u64::MAX {
        cfg.renew_ahead = Duration::from_nanos(renew);
    }
    cfg.late_start = LATE_START.load(std::sync::atomic::Ordering::Relaxed);
    cfg.cut_off_away = CUT_OFF_AWAY.load(std::sync::atomic::Ordering::Relaxed);
    let nice = ARBITER_NICE.load(std::sync::atomic::Ordering::Relaxed);
    if nice != i32::MIN {
        cfg.nice = nice;
    }
    cfg
}

/// Runs `scenarios` at once, scenario `i` on device `i` of a fresh node,
/// under one in-process arbiter with the default configuration (but for
/// [`set_contested_idle_release`]).
///
/// # Errors
/// When the arbiter cannot start or a scenario panicked (set-up failures).
pub fn run_round(scenarios: &[Scenario]) -> Result<Vec<Outcome>, String> {
    let node = SimNode::builder().devices(scenarios.len() as u32).build();
    let arbiter = Arbiter::new(arbiter_config()).map_err(|e| e.to_string())?;
    std::thread::scope(|s| {
        let runs: Vec<_> = scenarios
            .iter()
            .enumerate()
            .map(|(dev, sc)| {
                let (node, arbiter) = (&node, &arbiter);
                s.spawn(move || run_scenario(node, arbiter, dev as u32, sc))
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().map_err(|_| "a scenario panicked".to_string()))
            .collect()
    })
}

/// The bench's `compute-detail` section (and `all`'s): every scenario of the issue (three
/// guaranteed 20/30/50, one guaranteed 30 alone, two burst 25+25) with
/// 50 µs, 1 ms and 20 ms kernels, measured for `measure` each (the three
/// kernel sizes at once, on three GPUs of one node), and the three other
/// ways of launching ([`launch_scenarios`]); then the gate's own cost.
///
/// These are the accuracy figures: the `compute_*` tests assert only what
/// holds whatever the CPU load (caps, no starvation, work conservation);
/// how close to its target each share comes is measured here.
///
/// # Panics
/// On set-up failures (files, processes, `cc`).
pub fn tables(measure: Duration) -> Result<Vec<crate::bench::Table>, String> {
    let kernels = [
        Duration::from_micros(50),
        Duration::from_millis(1),
        Duration::from_millis(20),
    ];
    let per_kernel: Vec<Vec<Scenario>> = kernels
        .iter()
        .map(|&k| standard_scenarios(k, measure))
        .collect();
    // One round per scenario, its three kernel sizes at once on three GPUs;
    // then the three ways of launching at once.
    let mut rounds: Vec<Vec<Scenario>> = (0..per_kernel[0].len())
        .map(|i| per_kernel.iter().map(|scs| scs[i].clone()).collect())
        .collect();
    rounds.push(launch_scenarios(measure));
    rounds.push(shape_scenarios(measure));
    let (rows, failures) = share_rows(&rounds)?;
    let mut notes = vec![
        format!(
            "{} s per scenario; achieved = the allocation's busy time on the simulated GPU's engine (ground truth); held = what the arbiter charged it (grant to drained).",
            measure.as_secs_f64()
        ),
        "Targets: guaranteed within 1 pp of its share (alone, whatever the launch call: between 1 pp below its share and the share); burst pair: GPU >= 95% busy, split 50/50 within 2 pp.".into(),
        "Hand-over: from revoking a grant to granting the next waiting allocation, the drain of the work in flight included (the shim's pacer keeps it to the kernel running at the quantum's end); none when the GPU idles in between; over the measured window, not the start-up.".into(),
        "Idle per hand-over: the GPU's idle time in the window divided by the hand-overs in it (saturated scenarios only): the real cost of switching.".into(),
    ];
    notes.extend(failures.into_iter().map(|f| format!("FAILED: {f}")));
    let shares = crate::bench::Table {
        title: "Compute-time slices: target vs achieved share (quantum 10 ms)".into(),
        columns: SHARE_COLUMNS.map(String::from).to_vec(),
        rows,
        notes,
    };
    Ok(vec![
        shares,
        sync_table(measure)?,
        sync_rule_table(measure)?,
        prearm_table(measure)?,
        no_arbiter(measure)?,
        gate_cost()?,
    ])
}

/// Runs each round ([`run_round`]) and makes the share table's rows: one
/// per allocation; the failures of workloads that did not finish cleanly.
fn share_rows(rounds: &[Vec<Scenario>]) -> Result<(Vec<Vec<String>>, Vec<String>), String> {
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for round in rounds {
        for o in run_round(round)? {
            failures.extend(o.failures.iter().cloned());
            let ms =
                |ns: Option<u64>| ns.map_or("-".to_string(), |v| format!("{:.2}", v as f64 / 1e6));
            for (j, a) in o.allocs.iter().enumerate() {
                let first = j == 0;
                let once = |v: String| if first { v } else { String::new() };
                rows.push(vec![
                    once(o.name.clone()),
                    format!(
                        "{} {}%",
                        match a.policy {
                            Policy::Guaranteed => "guaranteed",
                            Policy::Burst => "burst",
                        },
                        a.share_ppm / 10_000
                    ),
                    format!("{:.2}", o.held[j]),
                    format!("{:.2}", o.achieved[j]),
                    once(format!("{:.2}", o.gpu_busy)),
                    once(ms(o.handover_p50)),
                    once(ms(o.handover_p99)),
                    once(idle_per_handover(&o)),
                ]);
            }
        }
    }
    Ok((rows, failures))
}

const SHARE_COLUMNS: [&str; 8] = [
    "scenario",
    "allocation",
    "held %",
    "achieved %",
    "GPU busy %",
    "hand-over p50 ms",
    "p99 ms",
    "idle per hand-over us",
];

/// Allocations whose workloads synchronise, as training and inference loops
/// do: with 1 ms and 50 µs kernels, a `cuCtxSynchronize` after every 2 or
/// every launch, and a host gap (slept) after each synchronisation.
/// Returned as rounds: the two kernel sizes of a scenario at once.
pub fn sync_scenarios(measure: Duration) -> Vec<Vec<Scenario>> {
    let kernels = [Duration::from_millis(1), Duration::from_micros(50)];
    let g = AllocSpec::guaranteed;
    // (allocations, sync every, host gap per kernel size)
    let shapes: [(Vec<AllocSpec>, u32, [u64; 2]); 6] = [
        (vec![g(30)], 2, [0, 0]),
        (vec![g(30), g(70)], 2, [0, 0]),
        (vec![g(20), g(30), g(50)], 2, [0, 0]),
        (vec![g(30)], 1, [0, 0]),
        (vec![g(30), g(70)], 1, [0, 0]),
        (vec![g(30), g(70)], 2, [200, 20]),
    ];
    shapes
        .into_iter()
        .map(|(allocs, every, gaps)| {
            kernels
                .iter()
                .zip(gaps)
                .map(|(&k, gap_us)| {
                    let shares: Vec<String> = allocs
                        .iter()
                        .map(|a| (a.share_ppm / 10_000).to_string())
                        .collect();
                    let gap = if gap_us > 0 {
                        format!(", {gap_us} us host gap")
                    } else {
                        String::new()
                    };
                    let mut sc = Scenario::new(
                        &format!(
                            "guaranteed {}, {} us kernels, sync every {every}{gap}",
                            shares.join("+"),
                            k.as_micros()
                        ),
                        allocs.clone(),
                        k,
                        measure,
                    );
                    sc.sync_every = every;
                    sc.gap = Duration::from_micros(gap_us);
                    sc
                })
                .collect()
        })
        .collect()
}

/// The arbiter's rule for a holder in a synchronisation, both ways at
/// once on one node (so at the same CPU load): guaranteed 30 alone and
/// 30 + 70, 1 ms kernels, a synchronisation after every second launch,
/// under an arbiter that counts a holder seen synchronising as active (the
/// default) and under one that counts launches only (the rule before).
///
/// # Errors
/// When an arbiter cannot start or a scenario panicked.
pub fn sync_rule_table(measure: Duration) -> Result<crate::bench::Table, String> {
    use tessera_manager::arbiter::ArbiterConfig;
    let g = AllocSpec::guaranteed;
    let scs: Vec<Scenario> = [vec![g(30)], vec![g(30), g(70)]]
        .into_iter()
        .map(|allocs| {
            let mut sc = Scenario::new("sync rule", allocs, Duration::from_millis(1), measure);
            sc.sync_every = 2;
            sc
        })
        .collect();
    let node = SimNode::builder().devices(4).build();
    let on = Arbiter::new(ArbiterConfig::default()).map_err(|e| e.to_string())?;
    let off = Arbiter::new(ArbiterConfig {
        sync_is_activity: false,
        ..ArbiterConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let outcomes: Vec<(bool, Outcome)> = std::thread::scope(|s| {
        let runs: Vec<_> = [(true, &on), (false, &off)]
            .into_iter()
            .flat_map(|(rule, arbiter)| scs.iter().map(move |sc| (rule, arbiter, sc)))
            .enumerate()
            .map(|(dev, (rule, arbiter, sc))| {
                let node = &node;
                s.spawn(move || (rule, run_scenario(node, arbiter, dev as u32, sc)))
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().map_err(|_| "a scenario panicked".to_string()))
            .collect::<Result<_, _>>()
    })?;
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (rule, o) in &outcomes {
        failures.extend(o.failures.iter().cloned());
        let shares: Vec<String> = o
            .allocs
            .iter()
            .map(|a| (a.share_ppm / 10_000).to_string())
            .collect();
        let fmt = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        rows.push(vec![
            format!("guaranteed {}", shares.join("+")),
            if *rule {
                "syncing is activity (now)"
            } else {
                "launches only (before)"
            }
            .into(),
            fmt(&o.held),
            fmt(&o.achieved),
            format!("{:.2}", o.gpu_busy),
        ]);
    }
    let mut notes = vec![format!(
        "{} s, the four at once on four GPUs of one node (same CPU load); 1 ms kernels, cuCtxSynchronize after every second launch.",
        measure.as_secs_f64()
    )];
    notes.extend(failures.into_iter().map(|f| format!("FAILED: {f}")));
    Ok(crate::bench::Table {
        title: "Compute-time slices: a holder in a synchronisation, the two rules side by side"
            .into(),
        columns: [
            "scenario",
            "arbiter's rule",
            "held %",
            "achieved %",
            "GPU busy %",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        notes,
    })
}

/// The hand-over both ways at once on one node (so at the same CPU load):
/// guaranteed 30 + 70 streaming with 1 ms and 20 ms kernels, and with 1 ms
/// kernels synchronising every second launch, under an arbiter that grants
/// the next holder at the revocation (pre-armed, the default) and under one
/// that grants only after the drain (the rule before).
///
/// # Errors
/// When an arbiter cannot start or a scenario panicked.
pub fn prearm_table(measure: Duration) -> Result<crate::bench::Table, String> {
    use tessera_manager::arbiter::ArbiterConfig;
    let pair = || vec![AllocSpec::guaranteed(30), AllocSpec::guaranteed(70)];
    let ms = Duration::from_millis;
    let mut sync = Scenario::new(
        "guaranteed 30+70, 1000 us kernels, sync every 2",
        pair(),
        ms(1),
        measure,
    );
    sync.sync_every = 2;
    let scs = [
        Scenario::new("guaranteed 30+70, 1000 us kernels", pair(), ms(1), measure),
        Scenario::new(
            "guaranteed 30+70, 20000 us kernels",
            pair(),
            ms(20),
            measure,
        ),
        sync,
    ];
    let node = SimNode::builder().devices(2 * scs.len() as u32).build();
    let on = Arbiter::new(ArbiterConfig::default()).map_err(|e| e.to_string())?;
    let off = Arbiter::new(ArbiterConfig {
        prearm: false,
        ..ArbiterConfig::default()
    })
    .map_err(|e| e.to_string())?;
    let outcomes: Vec<(bool, Outcome)> = std::thread::scope(|s| {
        let runs: Vec<_> = [(true, &on), (false, &off)]
            .into_iter()
            .flat_map(|(rule, arbiter)| scs.iter().map(move |sc| (rule, arbiter, sc)))
            .enumerate()
            .map(|(dev, (rule, arbiter, sc))| {
                let node = &node;
                s.spawn(move || (rule, run_scenario(node, arbiter, dev as u32, sc)))
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().map_err(|_| "a scenario panicked".to_string()))
            .collect::<Result<_, _>>()
    })?;
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let ms = |ns: Option<u64>| ns.map_or("-".to_string(), |v| format!("{:.2}", v as f64 / 1e6));
    for (rule, o) in &outcomes {
        failures.extend(o.failures.iter().cloned());
        let fmt = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        rows.push(vec![
            o.name.clone(),
            if *rule {
                "pre-armed (now)"
            } else {
                "after the drain (before)"
            }
            .into(),
            fmt(&o.held),
            fmt(&o.achieved),
            format!("{:.2}", o.gpu_busy),
            ms(o.handover_p50),
            ms(o.handover_p99),
            idle_per_handover(o),
        ]);
    }
    let mut notes = vec![format!(
        "{} s, the six at once on six GPUs of one node (same CPU load); achieved = ground truth, held = charged; hand-over = revocation to the start of the next holder's time.",
        measure.as_secs_f64()
    )];
    notes.extend(failures.into_iter().map(|f| format!("FAILED: {f}")));
    Ok(crate::bench::Table {
        title: "Compute-time slices: the hand-over, pre-armed and after the drain, side by side"
            .into(),
        columns: [
            "scenario",
            "arbiter's rule",
            "held %",
            "achieved %",
            "GPU busy %",
            "hand-over p50 ms",
            "p99 ms",
            "idle per hand-over us",
        ]
        .map(String::from)
        .to_vec(),
        rows,
        notes,
    })
}

/// The share table of [`sync_scenarios`].
///
/// # Errors
/// When the arbiter cannot start or a scenario panicked.
pub fn sync_table(measure: Duration) -> Result<crate::bench::Table, String> {
    let (rows, failures) = share_rows(&sync_scenarios(measure))?;
    let mut notes = vec![
        format!(
            "{} s per scenario, the two kernel sizes of a scenario at once on two GPUs; one workload per allocation launches kernels one after another and calls cuCtxSynchronize after every 1 or 2 launches, then sleeps the host gap; achieved = ground truth (the engine timeline), held = charged by the arbiter.",
            measure.as_secs_f64()
        ),
        "Targets: guaranteed 30 alone between 1 pp below its share and the share; guaranteed pairs and triples each within 1 pp and GPU >= 97% busy (1 ms kernels, sync every 2). A workload that leaves the GPU idle between its own steps (host gaps, 50 us kernels with a sync each) cannot use all of its share: its grants are charged, the idle time inside them included.".into(),
    ];
    notes.extend(failures.into_iter().map(|f| format!("FAILED: {f}")));
    Ok(crate::bench::Table {
        title: "Compute-time slices, programs that synchronise (quantum 10 ms)".into(),
        columns: SHARE_COLUMNS.map(String::from).to_vec(),
        rows,
        notes,
    })
}

/// Two guaranteed 30% allocations on one GPU (1 ms kernels), measured for
/// `measure` under an arbiter, with none (it shut down, which opens the
/// gates, as the gate timeout does when one is killed), and under a new
/// one: the figures `compute_arbiter_killed` leaves to the bench.
fn no_arbiter(measure: Duration) -> Result<crate::bench::Table, String> {
    use tessera_manager::arbiter::ArbiterConfig;
    let node = SimNode::builder().devices(1).build();
    let spec = AllocSpec::guaranteed(30);
    let files: Vec<AllocFiles> = (0..2)
        .map(|i| create_allocation(&node, 0, &format!("bench-no-arbiter-{i}"), spec))
        .collect();
    let add = |arbiter: &Arbiter| -> Result<(), String> {
        for f in &files {
            let opened = OpenFiles::open(&f.control, &f.state).map_err(|e| e.to_string())?;
            arbiter
                .add_allocation(std::sync::Arc::new(opened), 0)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    let sc = Scenario::new(
        "no arbiter",
        vec![spec; 2],
        Duration::from_millis(1),
        measure,
    );
    let first = Arbiter::new(ArbiterConfig::default()).map_err(|e| e.to_string())?;
    add(&first)?;
    let seconds = 3.0 * (sc.warmup + measure).as_secs_f64() + 3.0;
    let mut workloads: Vec<Workload> = files
        .iter()
        .map(|f| Workload::spawn(&node, f, 0, &sc, seconds))
        .collect();
    for w in &mut workloads {
        if w.wait_line("ready", Duration::from_secs(20)).is_none() {
            return Err(format!("workload {} did not start: {:?}", w.pid(), w.seen));
        }
    }
    let pids: Vec<u32> = workloads.iter().map(Workload::pid).collect();
    let phase = || {
        std::thread::sleep(sc.warmup);
        BusyMeter::start(&node, 0, pids.clone()).run_for(measure)
    };
    let governed = phase();
    first.shutdown();
    let free = phase();
    let second = Arbiter::new(ArbiterConfig::default()).map_err(|e| e.to_string())?;
    add(&second)?;
    let rejoined = phase();
    second.shutdown();
    let failures: Vec<String> = workloads
        .into_iter()
        .filter_map(|w| w.finish(Duration::from_secs(30)).err())
        .collect();
    let rows = [
        ("under an arbiter", governed, "each 30% +- 1 pp"),
        ("no arbiter (gates open)", free, "GPU >= 90%"),
        ("under a new arbiter", rejoined, "each 30% +- 1 pp"),
    ]
    .into_iter()
    .map(|(name, (per, gpu), target)| {
        vec![
            name.to_string(),
            per.iter()
                .map(|p| format!("{p:.2}"))
                .collect::<Vec<_>>()
                .join(" / "),
            format!("{gpu:.2}"),
            target.to_string(),
        ]
    })
    .collect();
    let mut notes = vec![format!(
        "Two guaranteed 30% allocations, one workload each (1 ms kernels), {} s per phase; achieved = ground truth.",
        measure.as_secs_f64()
    )];
    notes.extend(failures.into_iter().map(|f| format!("FAILED: {f}")));
    Ok(crate::bench::Table {
        title: "Compute-time slices without an arbiter".into(),
        columns: ["phase", "achieved % per allocation", "GPU busy %", "target"]
            .map(String::from)
            .to_vec(),
        rows,
        notes,
    })
}

/// The GPU's idle time per hand-over, in µs, when the allocations kept it
/// saturated (every scenario with a hand-over does).
fn idle_per_handover(o: &Outcome) -> String {
    // Alone, the GPU idles by the cap, not by switching.
    if o.handovers_measured == 0 || o.allocs.len() < 2 {
        return "-".into();
    }
    let idle_us = (100.0 - o.gpu_busy).max(0.0) / 100.0 * o.measured.as_secs_f64() * 1e6;
    format!("{:.0}", idle_us / o.handovers_measured as f64)
}

/// The gate's hot path in-process: a submission while the allocation holds
/// the grant, and one on a whole-GPU (open) allocation.
fn gate_cost() -> Result<crate::bench::Table, String> {
    use tessera_shm::gate::{Drain, Gate, GateEvent};
    use tessera_shm::layout::grant;
    use tessera_shm::{Control, LocalLiveness, ProcIdentity, State};

    struct NoWork;
    impl Drain for NoWork {
        fn drain(&self, _dev: usize) {}
    }
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for (name, share) in [("granted", 300_000), ("whole GPU (open)", 1_000_000)] {
        let sub = dir.path().join(format!("{share}"));
        let (c, s) = create_allocation_files(
            &sub,
            &ControlSpec::new(
                "bench",
                vec![DeviceSpec {
                    uuid: "GPU-00000000-0000-0000-0000-00000000beef".into(),
                    memory_limit_bytes: 1 << 30,
                    compute_share_ppm: share,
                    policy: Policy::Guaranteed,
                }],
            ),
        )
        .map_err(|e| e.to_string())?;
        let arbiter_view = Control::open_rw(&c).map_err(|e| e.to_string())?;
        let control: &'static Control =
            Box::leak(Box::new(Control::open(&c).map_err(|e| e.to_string())?));
        let state: &'static State = Box::leak(Box::new(
            State::open(&s, "bench").map_err(|e| e.to_string())?,
        ));
        let member = state
            .join(&ProcIdentity::current(), &LocalLiveness::quick())
            .map_err(|e| e.to_string())?;
        let gate = Gate::new(
            control,
            state,
            member,
            std::sync::Arc::new(NoWork),
            std::sync::Arc::new(|_: &GateEvent| {}),
        )
        .map_err(|e| e.to_string())?;
        if share < 1_000_000 {
            arbiter_view
                .publish_grant(0, grant::GRANTED)
                .map_err(|e| e.to_string())?;
        }
        gate.before_submit(0); // first submission of the epoch
        let n = 20_000_000u64;
        let t0 = Instant::now();
        for _ in 0..n {
            gate.before_submit(std::hint::black_box(0));
        }
        let ns = t0.elapsed().as_nanos() as f64 / n as f64;
        gate.stop();
        rows.push(vec![name.to_string(), n.to_string(), format!("{ns:.2}")]);
    }
    Ok(crate::bench::Table {
        title: "Compute gate: cost of a submission's check (in-process)".into(),
        columns: ["grant", "calls", "ns per call"].map(String::from).to_vec(),
        rows,
        notes: vec![
            "One atomic load of the grant word and the process's own launch counter; the shim's added cost per launch, gate included, is in the hook table.".into(),
        ],
    })
}

/// One way a program uses the GPU (issue 36's shapes): its kernels' length,
/// how it waits for them, how it launches and how many processes of it an
/// allocation runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub name: String,
    pub kernel: Duration,
    /// Synchronise after every this many launches (0: stream, `depth`
    /// kernels in flight).
    pub sync_every: u32,
    /// Host time after each synchronisation.
    pub gap: Duration,
    pub launch: Launch,
    pub processes: u32,
}

impl Shape {
    fn new(kernel: Duration, sync_every: u32, gap: Duration) -> Shape {
        let us = kernel.as_micros();
        let how = match (sync_every, gap.is_zero()) {
            (0, _) => "streaming".to_string(),
            (1, true) => "sync every launch".into(),
            (n, true) => format!("sync every {n}"),
            (n, false) => format!("sync every {n}, {} us host gap", gap.as_micros()),
        };
        Shape {
            name: format!("{us} us, {how}"),
            kernel,
            sync_every,
            gap,
            launch: Launch::Kernel,
            processes: 1,
        }
    }

    /// Whether the program waits on the host between its kernels, so it
    /// may want less of the GPU than its share.
    pub fn waits(&self) -> bool {
        self.sync_every > 0
    }

    /// Whether the program's host gaps are long enough that the arbiter
    /// takes its grant back at each (longer than the idle release while
    /// another allocation waits): they are then not in its GPU time. Shorter
    /// waits (a synchronisation's round trip, a 100 µs gap) are held.
    pub fn released_at_gaps(&self) -> bool {
        self.sync_every > 0 && self.gap >= arbiter_config().contested_idle_release
    }

    /// The scenario of this shape for `allocs`, named `<shape>, <label>`.
    pub fn scenario(&self, label: &str, allocs: Vec<AllocSpec>, measure: Duration) -> Scenario {
        let mut sc = Scenario::new(
            &format!("{}, {label}", self.name),
            allocs,
            self.kernel,
            measure,
        );
        sc.sync_every = self.sync_every;
        sc.gap = self.gap;
        sc.launch = self.launch;
        sc.processes = self.processes;
        sc
    }
}

/// Every shape issue 36 names: streaming, a synchronisation after every
/// launch and after every second one, and host gaps between steps (twice
/// the step's kernel time, so the program wants about half the GPU), each
/// with 50 µs, 1 ms and 20 ms kernels; CUDA graphs and two processes per
/// allocation with 1 ms kernels, streaming.
pub fn shapes() -> Vec<Shape> {
    let mut out = Vec::new();
    for k in [
        Duration::from_micros(50),
        Duration::from_millis(1),
        Duration::from_millis(20),
    ] {
        out.push(Shape::new(k, 0, Duration::ZERO));
        out.push(Shape::new(k, 1, Duration::ZERO));
        out.push(Shape::new(k, 2, Duration::ZERO));
        out.push(Shape::new(k, 2, 2 * k));
    }
    let ms = Duration::from_millis(1);
    let mut graphs = Shape::new(ms, 0, Duration::ZERO);
    graphs.launch = Launch::Graph;
    graphs.name = "1000 us, streaming, CUDA graphs".into();
    out.push(graphs);
    let mut two = Shape::new(ms, 0, Duration::ZERO);
    two.processes = 2;
    two.name = "1000 us, streaming, 2 processes per allocation".into();
    out.push(two);
    out
}

/// The allocations each shape runs under: guaranteed 30% alone and next to
/// a guaranteed 70%, a burst 30 + 70 pair; for streaming and for 1 ms
/// kernels synchronising every second launch, also guaranteed 75% alone
/// and next to a guaranteed 25% (issue 34's share).
pub fn mixes(shape: &Shape) -> Vec<(&'static str, Vec<AllocSpec>)> {
    let (g, b) = (AllocSpec::guaranteed, AllocSpec::burst);
    let mut out = vec![
        ("guaranteed 30 alone", vec![g(30)]),
        ("guaranteed 30+70", vec![g(30), g(70)]),
        ("burst 30+70", vec![b(30), b(70)]),
    ];
    let plain = shape.launch == Launch::Kernel && shape.processes == 1 && shape.gap.is_zero();
    if plain && (shape.sync_every == 0 || (shape.sync_every == 2 && shape.kernel.as_millis() == 1))
    {
        out.push(("guaranteed 75 alone", vec![g(75)]));
        out.push(("guaranteed 75+25", vec![g(75), g(25)]));
    }
    out
}

/// What each allocation should get, in busy % of the GPU. `bare` is the
/// busy % the same program reaches alone on a GPU it has to itself (its
/// own rate: below 100 for one that synchronises, and for 50 µs kernels,
/// which the device's kernel-to-kernel gap keeps about 2% idle).
///
/// A share is a share of GPU time, and in its time a program runs at its
/// own rate: a guaranteed share `s` is `s` % of the GPU's time, so
/// `s × bare / 100` busy (its throughput is `s` % of its bare
/// throughput); a burst one gets at least its share, and what the others
/// leave. Where the program waits on the host for longer than the arbiter's
/// idle release (`released`), those waits are not in its GPU time (the
/// grant goes back at each): it gets its share of the GPU's busy time, or
/// what it wants (`bare`) when that is less.
pub fn targets(allocs: &[AllocSpec], bare: f64, released: bool) -> Vec<f64> {
    let share = |a: &AllocSpec| f64::from(a.share_ppm) / 10_000.0;
    // What each allocation asks of the GPU: its share of the time, or,
    // where its gaps are released, of the busy time up to what it wants.
    let ask = |a: &AllocSpec| {
        if released {
            share(a).min(bare)
        } else {
            share(a)
        }
    };
    allocs
        .iter()
        .map(|a| {
            let time = match a.policy {
                Policy::Guaranteed => ask(a),
                Policy::Burst => {
                    let others: f64 = allocs
                        .iter()
                        .filter(|o| !std::ptr::eq(*o, a))
                        .map(ask)
                        .sum();
                    share(a).max(100.0 - others)
                }
            };
            if released {
                time.min(bare)
            } else {
                time.min(100.0) * bare / 100.0
            }
        })
        .collect()
}

/// How far each allocation missed, pp: how far it fell short of its
/// target, or, for a `guaranteed` one, how far it went past its cap (its
/// share of the GPU's time). More than the target is no miss below the cap:
/// the target is the share at the program's rate alone on a GPU, and a
/// program that sleeps through the others' turns gets the host's CPU
/// sooner when it runs than the same program never sleeping (with 50 µs
/// kernels on a busy host, a guaranteed 30% ran at 116% of that rate); a
/// burst allocation is owed at least its target, and whatever the others
/// leave.
pub fn misses(allocs: &[AllocSpec], targets: &[f64], achieved: &[f64]) -> Vec<f64> {
    allocs
        .iter()
        .zip(targets)
        .zip(achieved)
        .map(|((a, t), got)| {
            let over_cap = match a.policy {
                Policy::Guaranteed => got - f64::from(a.share_ppm) / 10_000.0,
                Policy::Burst => 0.0,
            };
            (t - got).max(over_cap).max(0.0)
        })
        .collect()
}

/// One row of the shape table.
#[derive(Debug, Clone)]
pub struct ShapeRow {
    pub shape: String,
    pub mix: String,
    /// Busy % of the GPU each allocation should get ([`targets`]).
    pub targets: Vec<f64>,
    /// The busy % the same program reaches alone on a whole GPU, measured
    /// in the same round.
    pub bare: f64,
    /// Whether the program's host gaps are outside its GPU time
    /// ([`Shape::released_at_gaps`]).
    pub released: bool,
    pub outcome: Outcome,
}

impl ShapeRow {
    /// The largest miss of an allocation, pp ([`misses`]).
    pub fn worst_pp(&self) -> f64 {
        misses(&self.outcome.allocs, &self.targets, &self.outcome.achieved)
            .into_iter()
            .fold(0.0, f64::max)
    }

    /// Each allocation's throughput as a % of the same program's alone on
    /// a whole GPU.
    pub fn of_bare(&self) -> Vec<f64> {
        self.outcome
            .achieved
            .iter()
            .map(|a| {
                if self.bare > 0.0 {
                    a / self.bare * 100.0
                } else {
                    0.0
                }
            })
            .collect()
    }

    /// The busy time the allocations fell short of their targets together,
    /// per hand-over, in µs (pairs that hand over; `None` otherwise): what
    /// switching cost beyond the programs' own idle time at their own rate.
    pub fn lost_per_handover_us(&self) -> Option<f64> {
        let o = &self.outcome;
        if o.handovers_measured == 0 || o.allocs.len() < 2 {
            return None;
        }
        let want: f64 = self.targets.iter().sum::<f64>().min(100.0);
        let short = (want - o.gpu_busy).max(0.0) / 100.0 * o.measured.as_secs_f64() * 1e6;
        Some(short / o.handovers_measured as f64)
    }
}

/// Whether [`run_shapes`] runs a shape's mixes at once (`--together`)
/// rather than one mix at a time.
static MIXES_TOGETHER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Runs a shape's mixes at once in [`run_shapes`] (`tessera-bench
/// --together`): up to ten workload processes then share the host's cores,
/// which is a load, not an idle box.
pub fn set_mixes_together(on: bool) {
    MIXES_TOGETHER.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Set by [`set_ungoverned`]; read by [`run_shapes`], whose programs'
/// kernels then reach the GPU's queue as they come.
static UNGOVERNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Runs each mix's programs with no gate at all from now on (`tessera-bench
/// --ungoverned`): every allocation a whole-GPU one, all on the one GPU. A
/// reference against the governed targets, not a rule.
pub fn set_ungoverned(on: bool) {
    UNGOVERNED.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Runs every shape under every mix ([`shapes`], [`mixes`]) whose name
/// (`<shape>, <mix>`) contains `only` (any case; all when `None`): one
/// round per mix (per shape with [`set_mixes_together`]), on GPUs of one
/// node, beside the same program alone on a GPU of its own (a whole-GPU
/// allocation: neither gated nor paced), which measures its own rate
/// (`bare`) at the same load.
///
/// # Errors
/// When the arbiter cannot start or a scenario panicked.
pub fn run_shapes(measure: Duration, only: Option<&str>) -> Result<Vec<ShapeRow>, String> {
    let only = only.map(str::to_lowercase);
    let together = MIXES_TOGETHER.load(std::sync::atomic::Ordering::Relaxed);
    let mut rows = Vec::new();
    for shape in shapes() {
        let chosen: Vec<(String, Scenario)> = mixes(&shape)
            .into_iter()
            .map(|(label, allocs)| (label.to_string(), shape.scenario(label, allocs, measure)))
            .filter(|(_, sc)| {
                only.as_ref()
                    .is_none_or(|o| sc.name.to_lowercase().contains(o.as_str()))
            })
            .collect();
        let rounds: Vec<Vec<(String, Scenario)>> = if together {
            vec![chosen]
        } else {
            chosen.into_iter().map(|m| vec![m]).collect()
        };
        for round in rounds.into_iter().filter(|r| !r.is_empty()) {
            rows.extend(run_shape_round(&shape, round, measure)?);
        }
    }
    Ok(rows)
}

/// One round of [`run_shapes`]: `round`'s scenarios at once, beside the
/// program alone on a whole GPU.
fn run_shape_round(
    shape: &Shape,
    mut round: Vec<(String, Scenario)>,
    measure: Duration,
) -> Result<Vec<ShapeRow>, String> {
    // The same program alone on a whole GPU, at the same time: its own
    // rate, what a share of GPU time is a share of.
    round.push((
        "bare".into(),
        shape.scenario(
            "alone on a whole GPU",
            vec![AllocSpec::guaranteed(100)],
            measure,
        ),
    ));
    let ungoverned = UNGOVERNED.load(std::sync::atomic::Ordering::Relaxed);
    let scs: Vec<Scenario> = round
        .iter()
        .map(|(label, sc)| {
            let mut sc = sc.clone();
            if ungoverned && label != "bare" {
                // The targets stay the governed mix's (`round` keeps it).
                sc.allocs = vec![AllocSpec::guaranteed(100); sc.allocs.len()];
            }
            sc
        })
        .collect();
    let mut outcomes = run_round(&scs)?;
    round.pop();
    let bare = outcomes.pop().map_or(100.0, |o| {
        o.achieved.first().copied().unwrap_or(0.0).min(100.0)
    });
    let released = shape.released_at_gaps();
    Ok(round
        .into_iter()
        .zip(outcomes)
        .map(|((label, sc), outcome)| ShapeRow {
            shape: shape.name.clone(),
            mix: label,
            targets: targets(&sc.allocs, bare, released),
            bare,
            released,
            outcome,
        })
        .collect())
}

/// The columns of [`shape_table`].
pub const SHAPE_COLUMNS: [&str; 10] = [
    "shape",
    "allocations",
    "target → achieved busy %",
    "bare %",
    "of bare %",
    "GPU busy %",
    "hand-over p50 / p99 ms",
    "lost per hand-over µs",
    "hand-over idle µs",
    "worst miss pp",
];

/// The shape table: one row per shape and mix ([`run_shapes`]).
///
/// # Errors
/// When the arbiter cannot start or a scenario panicked.
pub fn shape_table(measure: Duration, only: Option<&str>) -> Result<crate::bench::Table, String> {
    let rows = run_shapes(measure, only)?;
    let ms = |ns: Option<u64>| ns.map_or("-".to_string(), |v| format!("{:.2}", v as f64 / 1e6));
    let mut failures = Vec::new();
    let cells = rows
        .iter()
        .map(|r| {
            let o = &r.outcome;
            failures.extend(o.failures.iter().cloned());
            let pairs = o
                .allocs
                .iter()
                .zip(&r.targets)
                .zip(&o.achieved)
                .map(|((_, t), got)| format!("{t:.2} → {got:.2}"))
                .collect::<Vec<_>>()
                .join(" / ");
            let of_bare = r
                .of_bare()
                .iter()
                .map(|v| format!("{v:.1}"))
                .collect::<Vec<_>>()
                .join(" / ");
            vec![
                r.shape.clone(),
                r.mix.clone(),
                pairs,
                format!(
                    "{:.1}{}",
                    r.bare,
                    if r.released { " (gaps released)" } else { "" }
                ),
                of_bare,
                format!("{:.2}", o.gpu_busy),
                if o.handover_p50.is_some() {
                    format!("{} / {}", ms(o.handover_p50), ms(o.handover_p99))
                } else {
                    "-".into()
                },
                r.lost_per_handover_us()
                    .map_or("-".into(), |v| format!("{v:.0}")),
                o.handover_idle_ns
                    .map_or("-".into(), |v| format!("{:.0}", v / 1e3)),
                format!("{:.2}", r.worst_pp()),
            ]
        })
        .collect();
    let mut notes = vec![
        format!(
            "{} s per scenario after 0.7 s of warm-up; {} on GPUs of one simulated node (real-driver costs, docs/simulator.md), beside the same program alone on a GPU of its own, quantum 10 ms; achieved = the allocation's busy time on the GPU's engine (ground truth), all its processes together.",
            measure.as_secs_f64(),
            if MIXES_TOGETHER.load(std::sync::atomic::Ordering::Relaxed) {
                "a shape's allocation mixes at once (--together)"
            } else {
                "one allocation mix at a time"
            }
        ),
        "Bare: the busy % the same program reaches at the same time alone on a GPU of its own (a whole-GPU allocation: neither gated nor paced), its own rate (below 100 where it synchronises, and with 50 us kernels, which the device's 1 us kernel-to-kernel gap keeps 2% idle); of bare: achieved / bare, the allocation's throughput as a share of the program's own alone.".into(),
        "Target (busy %): a share is a share of GPU time, used at the program's own rate: guaranteed s -> s x bare / 100; burst: at least its share, and what the other leaves. Where the program waits on the host longer than the arbiter's idle release (gaps released), the waits are not in its GPU time: its share of the GPU's busy time, or bare when that is less.".into(),
        "Hand-over: revocation to the next holder's time starting; lost per hand-over: the busy time the pair fell short of its targets together, over the hand-overs in the window (pairs only), the programs' own jitter included; hand-over idle: the GPU's idle from each revocation to the next holder's first kernel (to the drain's end for one granted ahead of its return) while the next holder wanted the GPU, averaged over the hand-overs in the window; idle by the engine's own timeline, wanting by the workload's own record (from a step's first launch call to the return of the wait that ends it).".into(),
        "Worst miss: the most an allocation fell short of its target, or a guaranteed one went past its cap (its share of the GPU's time); more than the target is no miss below the cap (a program that sleeps through others' turns gets the host's CPU sooner than the same program never sleeping).".into(),
    ];
    if UNGOVERNED.load(std::sync::atomic::Ordering::Relaxed) {
        notes.insert(
            0,
            "UNGOVERNED (--ungoverned): no gate and no arbiter; each mix's programs run on one GPU as whole-GPU allocations, their kernels queued as they come. The targets (and caps) are the governed mix's: a reference for what the programs get with nothing between them.".into(),
        );
    }
    notes.extend(failures.into_iter().map(|f| format!("FAILED: {f}")));
    Ok(crate::bench::Table {
        title: "Compute-time slices: every shape, target vs achieved share".into(),
        columns: SHAPE_COLUMNS.map(String::from).to_vec(),
        rows: cells,
        notes,
    })
}

/// The compute section's tables after the shapes': two capped allocations
/// with and without an arbiter, and the gate's own cost.
///
/// # Errors
/// When an arbiter cannot start or a workload does not start.
pub fn other_tables(measure: Duration) -> Result<Vec<crate::bench::Table>, String> {
    Ok(vec![no_arbiter(measure)?, gate_cost()?])
}

#[cfg(test)]
mod tests {
    use super::{AllocSpec, HandoverSpan, handover_idle, merge, misses, overlap, targets};

    #[test]
    fn a_handovers_idle_runs_from_the_revocation_to_the_next_holders_first_kernel() {
        let span = |to: &str, revoked_at, over_at, waiting| HandoverSpan {
            to: to.into(),
            revoked_at,
            over_at,
            waiting,
        };
        // Idle 90..100 (before the revocation at 95), busy to 120, idle
        // 120..130 (the drain's report), busy, idle 140..200 with the next
        // holder's time starting at 150 and its first kernel at 200.
        let idle = [(90, 100), (120, 130), (140, 200), (300, 400)];
        let always = vec![(0, 1_000)];
        let wanted = std::collections::HashMap::from([
            ("a".to_string(), always.clone()),
            // Back from its host gap at 125, and again at 320.
            (
                "b".to_string(),
                merge(vec![(125, 260), (320, 500), (330, 340)]),
            ),
        ]);
        let got = handover_idle(
            &[
                // Waiting: everything idle from 95 to its first kernel, 200.
                span("a", 95, 150, true),
                // The same granted ahead: up to the drain's end only.
                span("a", 95, 150, false),
                // Its time started while queued work still ran: 0 idle.
                span("a", 210, 250, true),
                // Revoked inside the idle stretch: counted from there.
                span("a", 350, 360, true),
                // Only while the next holder wanted it: from 125 on.
                span("b", 95, 150, true),
                span("b", 300, 360, true),
            ],
            &idle,
            &wanted,
        )
        .expect("every holder's wants");
        assert_eq!(got, vec![5 + 10 + 60, 5 + 10 + 10, 0, 50, 5 + 60, 80]);
        // A holder whose wants are missing: no figure, rather than a wrong one.
        assert_eq!(
            handover_idle(&[span("c", 95, 150, true)], &idle, &wanted),
            None
        );
    }

    #[test]
    fn merged_wants_cover_the_same_time_once() {
        assert_eq!(
            merge(vec![(5, 9), (1, 3), (2, 4), (9, 10), (12, 13)]),
            vec![(1, 4), (5, 10), (12, 13)]
        );
        assert_eq!(overlap(&[(1, 4), (5, 10), (12, 13)], 3, 12), 1 + 5);
    }

    fn near(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-9, "{got:?} != {want:?}");
        }
    }

    /// A share of the GPU's time at the program's own rate; where the
    /// program's gaps are released, a share of the busy time up to what it
    /// wants.
    #[test]
    fn targets_are_shares_of_time_at_the_programs_own_rate() {
        let (g, b) = (AllocSpec::guaranteed, AllocSpec::burst);
        near(&targets(&[g(30), g(70)], 95.0, false), &[28.5, 66.5]);
        near(&targets(&[g(30)], 100.0, false), &[30.0]);
        // Burst: its share, or what the other leaves.
        near(&targets(&[b(30), b(70)], 90.0, false), &[27.0, 63.0]);
        near(&targets(&[g(30), b(10)], 100.0, false), &[30.0, 70.0]);
        // Released gaps: what it wants caps it, and a burst one gets what
        // a capped other leaves, up to that.
        near(&targets(&[g(30), g(70)], 48.0, true), &[30.0, 48.0]);
        near(&targets(&[b(30), b(70)], 48.0, true), &[48.0, 48.0]);
        near(&targets(&[g(30), b(70)], 60.0, true), &[30.0, 60.0]);
    }

    /// Short of the target is a miss; past a guaranteed cap is one; more
    /// than the target below the cap, or for a burst share, is not.
    #[test]
    fn a_miss_is_short_of_the_target_or_past_the_cap() {
        let (g, b) = (AllocSpec::guaranteed, AllocSpec::burst);
        near(
            &misses(&[g(30), g(70)], &[27.0, 63.0], &[25.5, 64.0]),
            &[1.5, 0.0],
        );
        near(&misses(&[g(30)], &[27.0], &[31.25]), &[1.25]);
        near(
            &misses(&[b(30), b(70)], &[27.0, 63.0], &[27.5, 70.0]),
            &[0.0, 0.0],
        );
    }
}
