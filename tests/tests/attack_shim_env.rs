//! A tenant abusing the shim's environment against itself or its allocation: a FIFO
//! (or a device) where the control or state file should be must fail closed with the
//! one line, at once, never hang `cuInit`; `TESSERA_LOG_FILE` pointed at the allocation's
//! own files, at the application's stdout, or at a FIFO must not write there, and the
//! allocation keeps working for every process in it.

mod hook_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hook_support::*;
use tessera_e2e::{Mode, ProbeOutput};

/// Runs `c`, killing it if it is not done in 30 s (a hang is the bug under test).
fn run_bounded(mut c: Command) -> (ProbeOutput, Duration) {
    use std::process::Stdio;
    let start = Instant::now();
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if start.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the process hung for 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    let o = child.wait_with_output().expect("output");
    (ProbeOutput::from_output(o), took)
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().expect("utf-8")).expect("path");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// A governed probe whose `var` names `bad`: it fails closed at once with one line.
fn refused_without_hanging(var: &str, make_bad: impl Fn(&Sim) -> std::path::PathBuf) {
    let sim = Sim::new(1, 256 * MI);
    sim.allocate(64 * MI);
    let bad = make_bad(&sim);
    for mode in Mode::ALL {
        let mut c = sim.probe(mode, true);
        c.env(var, &bad)
            .args(["init", "alloc 1024", "nvml-init", "pid"]);
        let (o, took) = run_bounded(c);
        let ctx = format!(
            "{mode:?} ({:.2} s):\n{}{}",
            took.as_secs_f64(),
            o.stdout,
            o.stderr
        );
        assert!(o.status.success(), "the process carries on: {ctx}");
        let l = raw(&o);
        assert_eq!(l[0], "err init CUDA_ERROR_NOT_INITIALIZED", "{ctx}");
        assert!(l[1].starts_with("err alloc "), "{ctx}");
        assert_eq!(l[2], "err nvml-init NVML_ERROR_UNINITIALIZED", "{ctx}");
        let err: Vec<&str> = o.stderr.lines().collect();
        assert_eq!(err.len(), 1, "exactly one line: {ctx}");
        assert!(err[0].starts_with("tessera: GPU access refused: "), "{ctx}");
        assert!(
            err[0].contains(&bad.display().to_string()),
            "names the file: {ctx}"
        );
        assert!(err[0].contains("not a regular file"), "says why: {ctx}");
    }
    assert_eq!(sim.used(0), 0, "nothing reached the device");
}

#[test]
fn a_fifo_as_the_control_file_fails_closed_at_once() {
    refused_without_hanging("TESSERA_CONTROL", |s| {
        let p = s.node.dir.path().join("control-fifo");
        mkfifo(&p);
        p
    });
}

#[test]
fn a_fifo_as_the_state_file_fails_closed_at_once() {
    refused_without_hanging("TESSERA_STATE", |s| {
        let p = s.node.dir.path().join("state-fifo");
        mkfifo(&p);
        p
    });
}

#[test]
fn a_device_as_the_control_file_fails_closed() {
    refused_without_hanging("TESSERA_CONTROL", |_| "/dev/zero".into());
}

/// A probe that logs at debug into `log_file`, allocates, frees and exits.
fn logged_run(sim: &Sim, log_file: &Path) -> ProbeOutput {
    let mut c = sim.probe(Mode::Link, true);
    c.env("TESSERA_LOG", "debug")
        .env("TESSERA_LOG_FILE", log_file)
        .args(["init", "ctx", "alloc 4096", "free 0", "pid"]);
    run_bounded(c).0
}

fn works(o: &ProbeOutput) {
    let ctx = format!("{}{}", o.stdout, o.stderr);
    assert!(o.status.success(), "{ctx}");
    let l = raw(o);
    assert!(l[0].starts_with("ok init"), "{ctx}");
    assert!(l[1].starts_with("ok ctx"), "{ctx}");
    assert!(l[2].starts_with("ok alloc"), "{ctx}");
    assert!(l[3].starts_with("ok free"), "{ctx}");
    assert!(o.stderr.is_empty(), "nothing on stderr: {ctx}");
}

#[test]
fn logging_into_the_state_file_is_refused_and_the_allocation_keeps_working() {
    let sim = Sim::new(1, 256 * MI);
    sim.allocate(64 * MI);
    let before = std::fs::metadata(&sim.state_path).expect("state").len();
    works(&logged_run(&sim, &sim.state_path));
    assert_eq!(
        std::fs::metadata(&sim.state_path).expect("state").len(),
        before,
        "log lines were appended to the state file"
    );
    // The allocation is intact for the next process (and for the manager).
    let _ = sim.state();
    let mut c = sim.probe(Mode::Dlopen, true);
    c.args(["init", "ctx", "alloc 4096", "pid"]);
    let (o, _) = run_bounded(c);
    assert!(
        raw(&o)[0].starts_with("ok init"),
        "{}{}",
        o.stdout,
        o.stderr
    );
    assert!(raw(&o)[2].starts_with("ok alloc"), "{}", o.stdout);
}

#[test]
fn logging_into_the_control_file_is_refused() {
    let sim = Sim::new(1, 256 * MI);
    sim.allocate(64 * MI);
    let before = std::fs::read(&sim.control).expect("control");
    works(&logged_run(&sim, &sim.control));
    assert_eq!(std::fs::read(&sim.control).expect("control"), before);
}

#[test]
fn logging_into_stdout_or_a_fifo_is_refused_without_hanging() {
    let sim = Sim::new(1, 256 * MI);
    sim.allocate(64 * MI);
    // The application's own output stays its own: every stdout line is the probe's.
    let o = logged_run(&sim, Path::new("/dev/stdout"));
    works(&o);
    assert_eq!(
        o.stdout.lines().count(),
        o.lines.len(),
        "foreign lines on stdout: {}",
        o.stdout
    );
    assert!(!o.stdout.contains("tessera["), "{}", o.stdout);
    // A FIFO nobody reads: an ordinary open would block the first log line forever.
    let fifo = sim.node.dir.path().join("log-fifo");
    mkfifo(&fifo);
    works(&logged_run(&sim, &fifo));
}

#[test]
fn an_ordinary_log_file_still_gets_the_lines() {
    let sim = Sim::new(1, 256 * MI);
    sim.allocate(64 * MI);
    let log = sim.node.dir.path().join("hook.log");
    works(&logged_run(&sim, &log));
    let text = std::fs::read_to_string(&log).expect("log written");
    assert!(text.contains("tessera["), "{text}");
}
