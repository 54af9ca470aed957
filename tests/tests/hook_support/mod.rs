//! Helpers for the `hook_*` tests, over the shared ones of `tessera-e2e`:
//! an allocation's files on a simulated node, the probe governed by it
//! under `LD_PRELOAD=libtessera.so`, and small C programs compiled at test
//! time.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tessera_e2e::{Mode, ProbeChild, ProbeOutput, SimNode, hook_library, probe_binary};
use tessera_shm::{ControlSpec, DeviceSpec, Policy, State, create_allocation_files};

pub use tessera_e2e::Line;

pub const MI: u64 = 1 << 20;
/// The unit the simulated device holds memory in, as a real one does (2 MiB).
pub const PAGE: u64 = 2 * MI;

/// `bytes` in whole device pages: what the device holds, and the shim charges, for them.
pub fn pages(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE) * PAGE
}
pub const ALLOC_ID: &str = "hook-test";

/// The shim cargo built alongside this test.
pub fn hook_lib() -> PathBuf {
    hook_library().expect("libtessera.so is built with the tests (tessera-hook is a dependency)")
}

/// Compiles C source `src` into `out` with `cc -O1`, panicking with the
/// compiler's output on failure.
pub fn cc(src: &str, out: &Path, args: &[&str]) {
    let args: Vec<&str> = std::iter::once("-O1").chain(args.iter().copied()).collect();
    tessera_e2e::cc_text(src, out, &args).unwrap_or_else(|e| panic!("{e}"));
}

/// stdout of a finished process, as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr of a finished process, as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A simulated node of the test's own with one allocation on it.
pub struct Sim {
    pub node: SimNode,
    pub control: PathBuf,
    pub state_path: PathBuf,
}

impl Sim {
    /// A node of `devices` GPUs of `memory` bytes each.
    pub fn new(devices: u32, memory: u64) -> Sim {
        let node = SimNode::builder()
            .devices(devices)
            .memory(&memory.to_string())
            .build();
        let dir = node.dir.path().join("alloc");
        Sim {
            control: dir.join("control"),
            state_path: dir.join("state"),
            node,
        }
    }

    /// A node of one GPU of `memory` bytes with an allocation of `limit`
    /// bytes on it ([`Sim::allocate`]).
    pub fn one_gpu(memory: u64, limit: u64) -> Sim {
        let sim = Sim::new(1, memory);
        sim.allocate(limit);
        sim
    }

    /// The UUID of simulated device `i`.
    pub fn uuid(&self, i: u32) -> String {
        self.node.node().device_info(i).expect("device").uuid
    }

    /// (Re)writes the allocation: `(node device, limit)` in control-file
    /// order, with this context overhead.
    pub fn allocate_with(&self, devices: &[(u32, u64)], context_overhead: u64) {
        let mut spec = ControlSpec::new(
            ALLOC_ID,
            devices
                .iter()
                .map(|&(i, limit)| DeviceSpec {
                    uuid: self.uuid(i),
                    memory_limit_bytes: limit,
                    compute_share_ppm: 1_000_000,
                    policy: Policy::Burst,
                })
                .collect(),
        );
        spec.context_overhead_bytes = context_overhead;
        create_allocation_files(self.control.parent().expect("alloc dir"), &spec)
            .expect("allocation files");
    }

    /// An allocation of `limit` bytes on device 0, no context overhead.
    pub fn allocate(&self, limit: u64) {
        self.allocate_with(&[(0, limit)], 0);
    }

    /// The allocation's state file, opened as the manager would.
    pub fn state(&self) -> State {
        State::open(&self.state_path, ALLOC_ID).expect("state file")
    }

    /// Ground truth: bytes the simulated device holds.
    pub fn used(&self, device: usize) -> u64 {
        self.node.node().memory_used(device)
    }

    /// `program` against this node with the shim preloaded, governed by
    /// the allocation when `governed`.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>, governed: bool) -> Command {
        let mut c = self.node.command(program);
        c.env("LD_PRELOAD", hook_lib())
            .env_remove("TESSERA_CONTROL")
            .env_remove("TESSERA_STATE")
            .env_remove("TESSERA_LOG");
        if governed {
            c.env("TESSERA_CONTROL", &self.control);
        }
        c
    }

    /// The probe in `mode` (see [`Sim::command`]).
    pub fn probe(&self, mode: Mode, governed: bool) -> Command {
        self.command(probe_binary(mode), governed)
    }

    /// Runs the probe with `script` (one command per argument).
    pub fn run(&self, mode: Mode, governed: bool, script: &[&str]) -> ProbeOutput {
        let mut c = self.probe(mode, governed);
        c.args(script);
        ProbeOutput::from_output(c.output().expect("running the probe"))
    }

    /// Starts the probe reading commands from stdin.
    pub fn spawn(&self, mode: Mode, governed: bool) -> ProbeChild {
        ProbeChild::start(self.probe(mode, governed))
    }
}

/// The raw lines of a probe's output, for whole-line comparisons.
pub fn raw(o: &ProbeOutput) -> Vec<&str> {
    o.lines.iter().map(|l| l.raw.as_str()).collect()
}

/// Every client style of a governed process on `sim`, whose allocation files
/// the test has spoiled, fails closed: CUDA and NVML initialisation refuse,
/// no context or allocation is made, the process carries on, and exactly one
/// line on stderr names `file` and contains each of `reasons`. Nothing
/// reaches the device. `case` names the spoiling in failure messages.
pub fn assert_fails_closed(sim: &Sim, file: &Path, reasons: &[&str], case: &str) {
    for mode in Mode::ALL {
        let o = sim.run(
            mode,
            true,
            &["init", "ctx", "alloc 1024", "meminfo", "nvml-init", "pid"],
        );
        let ctx = format!("{mode:?}, {case}:\n{}{}", o.stdout, o.stderr);
        assert!(o.status.success(), "the process carries on: {ctx}");
        let l = raw(&o);
        assert_eq!(l[0], "err init CUDA_ERROR_NOT_INITIALIZED", "{ctx}");
        assert!(l[1].starts_with("err ctx "), "{ctx}");
        assert!(l[2].starts_with("err alloc "), "never unlimited: {ctx}");
        assert!(l[3].starts_with("err meminfo "), "{ctx}");
        assert_eq!(l[4], "err nvml-init NVML_ERROR_UNINITIALIZED", "{ctx}");
        assert!(l[5].starts_with("ok pid"), "{ctx}");
        let err: Vec<&str> = o.stderr.lines().collect();
        assert_eq!(err.len(), 1, "exactly one line: {ctx}");
        assert!(err[0].starts_with("tessera: "), "{ctx}");
        assert!(
            err[0].contains(&file.display().to_string()),
            "names the file: {ctx}"
        );
        for reason in reasons {
            assert!(err[0].contains(reason), "says why ({reason}): {ctx}");
        }
    }
    assert_eq!(sim.used(0), 0, "nothing reached the device ({case})");
}

/// A conversation with a probe that may die at any moment (killed by the
/// test): every answer waits at most a timeout, and a dead probe is an
/// answer of its own rather than a panic.
pub struct Conv {
    pub child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

/// Why a conversation step got no line.
#[derive(Debug, PartialEq, Eq)]
pub enum NoAnswer {
    /// The probe's output ended: it exited or was killed.
    Ended,
}

impl Conv {
    pub fn start(mut c: Command) -> Conv {
        use std::io::BufRead;
        let mut child = c
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn probe");
        let out = child.stdout.take().expect("probe stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Conv {
            stdin: child.stdin.take(),
            child,
            lines: rx,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a command and waits for its line. Panics if the probe is alive
    /// but silent for `hang` (a hang is what these tests look for).
    pub fn ask(&mut self, line: &str, hang: std::time::Duration) -> Result<Line, NoAnswer> {
        use std::io::Write;
        let stdin = self.stdin.as_mut().ok_or(NoAnswer::Ended)?;
        if writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .is_err()
        {
            return Err(NoAnswer::Ended);
        }
        loop {
            match self.lines.recv_timeout(hang) {
                Ok(raw) => match Line::parse(&raw) {
                    Some(l) => return Ok(l),
                    None => continue,
                },
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(NoAnswer::Ended);
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!("probe {} silent for {hang:?} after {line:?}", self.pid())
                }
            }
        }
    }

    /// Sends a command without waiting for its answer (a test that kills
    /// the probe while the command runs).
    pub fn send(&mut self, line: &str) -> Result<(), NoAnswer> {
        use std::io::Write;
        let stdin = self.stdin.as_mut().ok_or(NoAnswer::Ended)?;
        writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .map_err(|_| NoAnswer::Ended)
    }

    /// Closes stdin and reaps the probe.
    pub fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("wait probe")
    }
}

/// A small deterministic generator (xorshift), so a failing run can be
/// replayed from the seed it prints.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

/// A seed from the clock, printed so a failure can be replayed.
pub fn seed(name: &str) -> u64 {
    let s = std::env::var("HOOK_TEST_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    eprintln!("{name}: HOOK_TEST_SEED={s}");
    s
}

/// `memclient` (hook_support/memclient.c): a small driver client for the
/// memory-isolation tests, linked with `-lcuda`, compiled once per build.
pub fn memclient() -> &'static Path {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let src = include_str!("memclient.c");
        let dir = tessera_e2e::paths::work_dir();
        // One binary per source text: a changed client is rebuilt.
        let out = dir.join(format!("memclient-{}", tessera_e2e::fingerprint(src)));
        if !out.is_file() {
            let tmp = dir.join(format!(".memclient-{}", std::process::id()));
            let lib = tessera_e2e::paths::sim_lib_dir();
            cc(
                src,
                &tmp,
                &[&format!("-L{}", lib.dir.display()), "-lcuda", "-lnvidia-ml"],
            );
            std::fs::rename(&tmp, &out).expect("moving memclient into place");
        }
        out
    })
}

impl Sim {
    /// `memclient` against this node with the shim, governed when `governed`.
    pub fn client(&self, governed: bool) -> Conv {
        Conv::start(self.command(memclient(), governed))
    }

    /// [`Sim::client`] after an `init` that must succeed (the driver
    /// initialised, device 0's primary context current).
    pub fn client_init(&self, governed: bool) -> Conv {
        let mut c = self.client(governed);
        ok(&mut c, "init");
        c
    }
}

/// Sends `line` and returns its answer, panicking if the client died.
pub fn ask(c: &mut Conv, line: &str) -> Line {
    c.ask(line, std::time::Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{line}: client gone ({e:?})"))
}

/// Sends `line` and returns its answer, which must be `ok`.
pub fn ok(c: &mut Conv, line: &str) -> Line {
    let l = ask(c, line);
    assert!(l.ok, "{line}: {}", l.raw);
    l
}

/// Sends `line`; its answer must be the error `error`.
pub fn refused(c: &mut Conv, line: &str, error: &str) {
    let l = ask(c, line);
    assert_eq!(l.error.as_deref(), Some(error), "{line}: {}", l.raw);
}

/// One pass of the manager's reaper over the allocation, for tests that run no manager
/// (see [`tessera_e2e::sim::reclaim_released`]). Returns how many slots were reclaimed.
pub fn reclaim_released(sim: &Sim, state: &State) -> usize {
    tessera_e2e::sim::reclaim_released(sim.node.node(), state)
}

/// The manager's reaper standing in for a test that runs no manager: a thread that runs
/// `pass` (usually [`reclaim_released`]) every millisecond until dropped. The shim never
/// returns a dead process's quota itself; without this, what processes that died
/// holding memory were charged would stay charged.
pub struct StandIn {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StandIn {
    pub fn start(sim: std::sync::Arc<Sim>, pass: impl Fn(&Sim, &State) + Send + 'static) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let state = sim.state();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                pass(&sim, &state);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        });
        StandIn {
            stop,
            thread: Some(thread),
        }
    }

    /// The stand-in for an allocation whose only reader is this test.
    pub fn reaper(sim: std::sync::Arc<Sim>) -> Self {
        Self::start(sim, |s, st| {
            reclaim_released(s, st);
        })
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
