//! A burst of honest processes under one `tessera run`, as on the first real GPU (an H200,
//! where the manager stopped 29 of 32 such processes as `no_shim` and a 10 GiB burst took
//! the device 6.4 GiB over its limit): the run's shell starts 32 probes at once, each under
//! the shim retaining a primary context and allocating 64 MiB, on a simulated node whose
//! contexts hold what an H200's did (the simulator's default, 518 MiB) and whose driver
//! tears exited processes down one at a time (docs/simulator.md, "Exited processes"). The
//! manager runs with its defaults: the backstop on, with kill.
//!
//! - In a 20 GiB allocation all 32 run and none is stopped, also while they have exited and
//!   the driver still lists them with their memory (docs/security.md, "Processes that
//!   exit").
//! - In a 10 GiB allocation the device never holds more than the limit, by an NVML reader
//!   without the shim sampling every 5 ms: each context is charged what the manager
//!   measured a context to hold on this GPU before the driver sees the call.
//!
//! On the GPU the window in which an exited process is still listed lies inside its exit
//! (the kernel has taken its address space, the driver is still freeing its memory); the
//! simulator cannot hold a process there, so here the probes stay zombies (their parent,
//! the run's process, does not reap them) while the driver tears them down. The manager
//! sees the same in both: a listed pid with memory and no address space.
//!
//! The run's processes are placed in its allocation by their descent from the run's
//! process too (docs/security.md): a child that drops the shim counts in full there and
//! is stopped first once the allocation is over its limit plus the tolerance, and a
//! process that has exited and is still listed past the grace counts again.
//!
//! Waiting is on events (each probe's report, the probes seen as zombies, the manager's
//! completed passes, a process seen stopped), never on time; deadlines are for hangs.

mod manager_support;

use std::fs::File;
use std::io::{BufReader, Write};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use manager_support::*;
use tessera_e2e::{SimNode, sim_nvml_library, strip_ansi};

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;
/// Processes in the burst, as on the H200.
const PROCS: usize = 32;
/// What each allocates once its context exists.
const ALLOC: u64 = 64 * MI;
/// How long the simulated driver takes to tear down each exited process: 32 of them
/// take 3.2 s, so the manager's passes (every 100 ms) see them listed after their exit.
const TEARDOWN_NS: u64 = 100_000_000;
/// Deadline for what must happen (a probe reporting, a pass completing): only a hang
/// reaches it.
const HANG: Duration = Duration::from_secs(180);
/// Names the reader role ([`nvml_reader`]) and the NVML it loads.
const READER_ENV: &str = "TESSERA_E2E_NVML_READER";

role_test!();

/// Not a test: the unshimmed NVML reader the burst tests start as a process of its own
/// (this executable re-run with only this test selected). It samples device 0's memory
/// in use every 5 ms until its stdin closes, then prints the largest figure seen.
#[test]
#[ignore = "helper: the NVML reader the burst tests start"]
fn nvml_reader() {
    let Ok(lib) = std::env::var(READER_ENV) else {
        return;
    };
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(std::ffi::OsStr::new(&lib))
        .init()
        .expect("the simulated NVML initialises");
    let dev = nvml.device_by_index(0).expect("device 0");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopper = stop.clone();
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        stopper.store(true, std::sync::atomic::Ordering::Release);
    });
    let (mut max, mut samples) = (0u64, 0u64);
    loop {
        let used = dev.memory_info().expect("memory info").used;
        max = max.max(used);
        samples += 1;
        if samples == 1 {
            println!("ready");
        }
        if stop.load(std::sync::atomic::Ordering::Acquire) {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("max={max} samples={samples}");
    std::process::exit(0);
}

/// The NVML reader, running.
struct Reader {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Reader {
    fn start(n: &SimNode) -> Reader {
        let exe = std::env::current_exe().expect("test executable");
        let mut child = std::process::Command::new(exe)
            .args([
                "nvml_reader",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .envs(n.env())
            .env(READER_ENV, sim_nvml_library())
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the NVML reader");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        read_until(&mut out, |l| l.ends_with("ready"));
        Reader { child, out }
    }

    /// Stops the reader: (largest device memory in use it saw, samples taken).
    fn finish(mut self) -> (u64, u64) {
        drop(self.child.stdin.take());
        let line = read_until(&mut self.out, |l| l.contains("max="));
        let _ = self.child.wait();
        let max = field(&line, "max").and_then(|v| v.parse().ok());
        let samples = field(&line, "samples").and_then(|v| v.parse().ok());
        (max.expect("max"), samples.expect("samples"))
    }
}

/// Backstop passes the manager has completed.
fn passes(m: &ManagerProc) -> f64 {
    let e = parse_exposition(&scrape(m.metrics)).expect("a valid exposition");
    e.get("tessera_backstop_passes_total", &[])
        .expect("tessera_backstop_passes_total is always exposed")
}

/// Waits until a pass that began after this call has completed.
fn wait_fresh_pass(m: &ManagerProc) {
    let p0 = passes(m);
    let done = eventually(HANG, || passes(m) >= p0 + 2.0);
    assert!(done.is_some(), "no backstop pass completed:\n{}", m.log());
}

/// Every stop the backstop counted, all reasons and owners.
fn stops(m: &ManagerProc) -> f64 {
    let e = parse_exposition(&scrape(m.metrics)).expect("a valid exposition");
    e.samples
        .iter()
        .filter(|(n, _, _)| n == "tessera_backstop_stops_total")
        .map(|(_, _, v)| v)
        .sum()
}

/// `/proc/<pid>/stat`'s state letter, `None` once the process is gone.
fn state_of(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// What one burst left: each probe's report, by probe.
struct Burst {
    reports: Vec<String>,
    pids: Vec<u32>,
    /// Largest device memory in use the unshimmed reader saw, and how many samples.
    device_max: u64,
    samples: u64,
    /// Probes the driver still listed after they exited, across a whole backstop pass.
    listed_after_exit: usize,
    stops: f64,
    log: String,
}

/// Runs the burst in an allocation of `limit` on a node whose contexts hold what an
/// H200's did.
fn burst(limit: &str) -> Burst {
    let _serial = serial();
    let n = SimNode::builder().devices(1).memory("64Gi").build();
    n.node()
        .set_context_memory(tessera_sim::node::DEFAULT_CONTEXT_MEMORY);
    n.node().set_context_teardown(TEARDOWN_NS);
    let m = ManagerProc::on(&n);
    let dir = n.dir.path().join("burst");
    std::fs::create_dir_all(&dir).expect("burst dir");
    // Each probe reads its script from a FIFO of its own, held open here (read-write, so
    // opening it never blocks): it runs the script as soon as it starts and exits when
    // the FIFO is closed, so every probe holds its context until all have reported.
    let fifos: Vec<File> = (0..PROCS)
        .map(|i| {
            let path = dir.join(format!("cmd{i}"));
            nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
                .expect("mkfifo");
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .expect("open the FIFO");
            writeln!(f, "init\ndevice 0\nctx\nalloc {ALLOC}\npid").expect("the script");
            f
        })
        .collect();
    let reader = Reader::start(&n);
    // The run's process starts the probes in the background, then becomes `cat`, which
    // never reaps them: each stays a zombie from its exit until the run ends.
    let script = format!(
        "for i in $(seq 0 {}); do \"$0\" < \"$1/cmd$i\" > \"$1/out$i\" 2>&1 & done; exec cat",
        PROCS - 1
    );
    let sock = m.socket.display().to_string();
    let probe = probe_path().display().to_string();
    let dir_s = dir.display().to_string();
    let mut run = role_command(
        "cli",
        &owned(&[
            "run", "--socket", &sock, "--gpu", "0", "--memory", limit, "--", "sh", "-c", &script,
            &probe, &dir_s,
        ]),
    )
    .envs(n.env())
    .stdin(Stdio::piped())
    .stdout(Stdio::null())
    .spawn()
    .expect("tessera run");
    let reports: Vec<String> = (0..PROCS)
        .map(|i| wait_report(&dir.join(format!("out{i}")), &m))
        .collect();
    let pids: Vec<u32> = reports
        .iter()
        .map(|r| {
            r.lines()
                .find_map(|l| field(l, "pid").filter(|_| l.starts_with("ok pid")))
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("no pid in {r}"))
        })
        .collect();
    // Every probe has its context (or was refused one); now they all exit at once.
    drop(fifos);
    let exited = eventually(HANG, || pids.iter().all(|&p| state_of(p) == Some('Z')));
    assert!(
        exited.is_some(),
        "the probes did not all exit: {:?}",
        pids.iter().map(|&p| (p, state_of(p))).collect::<Vec<_>>()
    );
    // The driver tears them down one at a time. A pass that began after they had all
    // exited and ended while some were still listed saw them so.
    let listed = |node: &tessera_sim::Node| {
        node.reap_dead();
        node.processes()
            .iter()
            .filter(|p| p.exiting && pids.contains(&p.pid))
            .count()
    };
    assert!(listed(n.node()) > 0, "nothing left to tear down");
    wait_fresh_pass(&m);
    let listed_after_exit = listed(n.node());
    // The run ends: `cat` reads end-of-file.
    drop(run.stdin.take());
    let status = wait_exit(&mut run);
    assert!(status.success(), "tessera run: {status}\n{}", m.log());
    let (device_max, samples) = reader.finish();
    Burst {
        reports,
        pids,
        device_max,
        samples,
        listed_after_exit,
        stops: stops(&m),
        log: m.log(),
    }
}

/// Waits until the probe writing `out` has reported its pid (its last command).
fn wait_report(out: &Path, m: &ManagerProc) -> String {
    let mut text = String::new();
    let done = eventually(HANG, || {
        text = std::fs::read_to_string(out).unwrap_or_default();
        text.lines().any(|l| l.starts_with("ok pid"))
    });
    assert!(
        done.is_some(),
        "{} never reported: {text}\n{}",
        out.display(),
        m.log()
    );
    text
}

fn wait_exit(c: &mut Child) -> std::process::ExitStatus {
    let mut status = None;
    let done = eventually(HANG, || {
        status = c.try_wait().expect("poll");
        status.is_some()
    });
    assert!(done.is_some(), "the run did not end");
    status.expect("exited")
}

/// The backstop neither reported nor stopped any of the burst's processes.
fn assert_none_reported(b: &Burst) {
    let about = lines_about(&b.log, &b.pids);
    assert!(
        about.is_empty() && b.stops == 0.0,
        "honest processes reported or stopped ({} stops):\n{}",
        b.stops,
        about.join("\n")
    );
}

/// The backstop's lines (findings, stops) that name one of `pids`.
fn lines_about(log: &str, pids: &[u32]) -> Vec<String> {
    strip_ansi(log)
        .lines()
        .filter(|l| l.contains("escapes its GPU allocation") || l.contains("backstop"))
        .filter(|l| {
            pids.iter()
                .any(|p| l.contains(&format!(" pid={p} ")) || l.ends_with(&format!(" pid={p}")))
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn thirty_two_at_once_in_20_gib_all_run_and_none_is_stopped() {
    let b = burst("20Gi");
    for (i, r) in b.reports.iter().enumerate() {
        assert!(
            r.lines().any(|l| l.starts_with("ok ctx"))
                && r.lines().any(|l| l.starts_with("ok alloc")),
            "probe {i} did not get its context and 64 MiB:\n{r}"
        );
    }
    assert!(
        b.listed_after_exit > 0,
        "the driver had torn every probe down before the manager looked: the test saw \
         nothing (raise TEARDOWN_NS)"
    );
    assert_none_reported(&b);
    assert!(
        b.device_max <= 20 * GI,
        "device held {} MiB",
        b.device_max / MI
    );
    eprintln!(
        "20 GiB burst: {PROCS} processes ran, none stopped; {} still listed by the driver \
         after their exit across a pass; device peak {} MiB ({} samples at 5 ms)",
        b.listed_after_exit,
        b.device_max / MI,
        b.samples
    );
}

#[test]
fn thirty_two_at_once_in_10_gib_never_take_the_device_past_the_limit() {
    let b = burst("10Gi");
    let context = tessera_sim::node::DEFAULT_CONTEXT_MEMORY;
    let with_context = b
        .reports
        .iter()
        .filter(|r| r.lines().any(|l| l.starts_with("ok ctx")))
        .count() as u64;
    let refused = b
        .reports
        .iter()
        .filter(|r| {
            r.lines()
                .any(|l| l.starts_with("err ctx CUDA_ERROR_OUT_OF_MEMORY"))
        })
        .count() as u64;
    assert_eq!(with_context + refused, PROCS as u64, "{:#?}", b.reports);
    assert!(
        (1..=10 * GI / context).contains(&with_context),
        "{with_context} contexts of {} MiB in 10 GiB",
        context / MI
    );
    assert!(
        b.device_max <= 10 * GI,
        "the device held {} MiB, {} MiB over the limit ({} samples at 5 ms)",
        b.device_max / MI,
        (b.device_max - 10 * GI) / MI,
        b.samples
    );
    assert_none_reported(&b);
    eprintln!(
        "10 GiB burst: {with_context} contexts, {refused} refused before the driver saw them; \
         device peak {} MiB of 10240 ({} samples at 5 ms)",
        b.device_max / MI,
        b.samples
    );
}

/// A few named probes under one `tessera run`, each reading commands from its own FIFO,
/// started by the run's shell (with the shim, or with `LD_PRELOAD` dropped), which then
/// becomes `cat` and reaps none of them.
struct RunProbes {
    dir: std::path::PathBuf,
    fifos: Vec<(String, File)>,
    run: Child,
}

impl RunProbes {
    fn start(n: &SimNode, m: &ManagerProc, limit: &str, probes: &[(&str, bool)]) -> RunProbes {
        let dir = n.dir.path().join("probes");
        std::fs::create_dir_all(&dir).expect("probe dir");
        let mut script = String::new();
        let mut fifos = Vec::new();
        for (name, shim) in probes {
            let path = dir.join(format!("cmd-{name}"));
            nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
                .expect("mkfifo");
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .expect("open the FIFO");
            fifos.push((name.to_string(), f));
            let env = if *shim { "" } else { "env -u LD_PRELOAD " };
            script.push_str(&format!(
                "{env}\"$0\" < \"$1/cmd-{name}\" > \"$1/out-{name}\" 2>&1 & "
            ));
        }
        script.push_str("exec cat");
        let sock = m.socket.display().to_string();
        let probe = probe_path().display().to_string();
        let dir_s = dir.display().to_string();
        let run = role_command(
            "cli",
            &owned(&[
                "run", "--socket", &sock, "--gpu", "0", "--memory", limit, "--", "sh", "-c",
                &script, &probe, &dir_s,
            ]),
        )
        .envs(n.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("tessera run");
        RunProbes { dir, fifos, run }
    }

    /// Sends `cmds` to probe `name` and waits for its reply to the last one; returns it.
    fn cmd(&mut self, name: &str, cmds: &[&str], m: &ManagerProc) -> String {
        let (_, f) = self
            .fifos
            .iter_mut()
            .find(|(n, _)| n == name)
            .expect("a probe of that name");
        let out = self.dir.join(format!("out-{name}"));
        let before = std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .count();
        for c in cmds {
            writeln!(f, "{c}").expect("send");
        }
        let want = before + cmds.len();
        let mut text = String::new();
        let done = eventually(HANG, || {
            text = std::fs::read_to_string(&out).unwrap_or_default();
            text.lines().count() >= want
        });
        assert!(
            done.is_some(),
            "{name} did not answer {cmds:?}: {text}\n{}",
            m.log()
        );
        text.lines().nth(want - 1).unwrap_or_default().to_owned()
    }

    fn pid(&mut self, name: &str, m: &ManagerProc) -> u32 {
        let l = self.cmd(name, &["pid"], m);
        field(&l, "pid")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{l}"))
    }

    /// Ends probe `name` (end of its script).
    fn close(&mut self, name: &str) {
        self.fifos.retain(|(n, _)| n != name);
    }

    /// Ends every probe and the run.
    fn finish(mut self) {
        self.fifos.clear();
        drop(self.run.stdin.take());
        let _ = wait_exit(&mut self.run);
    }
}

/// Stops counted for `reason` (any owner).
fn stops_for(m: &ManagerProc, reason: &str) -> f64 {
    let e = parse_exposition(&scrape(m.metrics)).expect("a valid exposition");
    e.samples
        .iter()
        .filter(|(n, labels, _)| {
            n == "tessera_backstop_stops_total"
                && labels.get("reason").map(String::as_str) == Some(reason)
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// A child of the run that drops the shim is in the run's allocation by its descent:
/// within the limit it is left alone (it is not `no_shim`); once the allocation holds
/// more than its limit plus the tolerance it is stopped first, and a governed neighbour
/// in the same allocation is not.
#[test]
fn a_run_child_without_the_shim_counts_in_the_run_and_is_stopped_first_when_over() {
    let _serial = serial();
    let n = SimNode::builder().devices(1).memory("16Gi").build();
    let m = ManagerProc::on(&n);
    let mut run = RunProbes::start(&n, &m, "1Gi", &[("gov", true), ("bare", false)]);
    for (name, bytes) in [("gov", 256 * MI), ("bare", 512 * MI)] {
        let l = run.cmd(
            name,
            &["init", "device 0", "ctx", &format!("alloc {bytes}")],
            &m,
        );
        assert!(l.starts_with("ok alloc"), "{name}: {l}");
    }
    let (gov, bare) = (run.pid("gov", &m), run.pid("bare", &m));
    wait_fresh_pass(&m);
    wait_fresh_pass(&m);
    assert_eq!(stops(&m), 0.0, "{}", m.log());
    assert!(
        lines_about(&m.log(), &[gov, bare]).is_empty(),
        "{}",
        m.log()
    );
    // 768 MiB + 1 GiB without the shim: over 1 GiB + 64 MiB. The one without the shim
    // goes; what is left (256 MiB) fits.
    let l = run.cmd("bare", &[&format!("alloc {}", GI)], &m);
    assert!(l.starts_with("ok alloc"), "{l}");
    let stopped = eventually(HANG, || {
        state_of(bare) != Some('S') && state_of(bare) != Some('R')
    });
    assert!(stopped.is_some(), "not stopped:\n{}", m.log());
    // The manager counts a stop once its signal is sent: the process can be seen
    // gone a moment before the counter moves (it did, beside four busy processes).
    let counted = eventually(HANG, || stops_for(&m, "over_limit_no_shim") >= 1.0);
    assert!(counted.is_some(), "stop not counted:\n{}", m.log());
    assert_eq!(stops_for(&m, "over_limit_no_shim"), 1.0, "{}", m.log());
    assert_eq!(stops(&m), 1.0, "{}", m.log());
    assert!(matches!(state_of(gov), Some('S' | 'R')), "{}", m.log());
    let l = run.cmd("gov", &["alloc 1048576"], &m);
    assert!(l.starts_with("ok alloc"), "the governed one works on: {l}");
    run.finish();
    m.stop();
}

/// A process of the run that has exited while the driver still lists it is not judged
/// for the grace; listed past it, what it holds counts against the run's allocation
/// again, so the allocation cannot keep more than its limit through it: its running
/// member without the shim is stopped, the exited one is never signalled.
#[test]
fn an_exited_process_still_listed_past_the_grace_counts_against_its_allocation() {
    let _serial = serial();
    let n = SimNode::builder().devices(1).memory("16Gi").build();
    // The driver keeps what the exited process held for ten minutes (as it would for a
    // process whose device files another process holds open).
    n.node().set_context_teardown(600_000_000_000);
    let m = ManagerProc::on(&n);
    let mut run = RunProbes::start(&n, &m, "1Gi", &[("gone", true), ("bare", false)]);
    let l = run.cmd(
        "gone",
        &["init", "device 0", "ctx", &format!("alloc {}", 700 * MI)],
        &m,
    );
    assert!(l.starts_with("ok alloc"), "{l}");
    let gone = run.pid("gone", &m);
    // It cannot exit before this: the grace starts no sooner.
    let t_exit = std::time::Instant::now();
    run.close("gone");
    let exited = eventually(HANG, || state_of(gone) == Some('Z'));
    assert!(exited.is_some(), "the probe did not exit");
    // 400 MiB without the shim beside it: within the limit while the exited one is not
    // judged, 1100 MiB over 1 GiB + 64 MiB once it counts again.
    let l = run.cmd(
        "bare",
        &["init", "device 0", "ctx", &format!("alloc {}", 400 * MI)],
        &m,
    );
    assert!(l.starts_with("ok alloc"), "{l}");
    let bare = run.pid("bare", &m);
    let listed = || {
        n.node().reap_dead();
        n.node().process(gone).is_some_and(|p| p.exiting)
    };
    assert!(listed(), "the driver lists the exited process");
    let stopped = eventually(HANG, || !matches!(state_of(bare), Some('S' | 'R')));
    assert!(stopped.is_some(), "not stopped:\n{}", m.log());
    let after = t_exit.elapsed();
    assert!(
        after >= tessera_manager::backstop::EXIT_GRACE,
        "stopped {after:?} after the other exited, within the grace:\n{}",
        m.log()
    );
    assert!(listed(), "still listed: its memory is the driver's");
    // Counted once the signal is sent, a moment after the process can be seen gone.
    let counted = eventually(HANG, || stops_for(&m, "over_limit_no_shim") >= 1.0);
    assert!(counted.is_some(), "stop not counted:\n{}", m.log());
    assert_eq!(stops_for(&m, "over_limit_no_shim"), 1.0, "{}", m.log());
    assert_eq!(
        stops(&m),
        1.0,
        "the exited one is never signalled:\n{}",
        m.log()
    );
    let log = strip_ansi(&m.log());
    assert!(
        log.lines().any(|l| l.contains("over its memory limit")
            && l.contains(&format!("exited_bytes={}", 700 * MI))),
        "{log}"
    );
    run.finish();
    m.stop();
}
