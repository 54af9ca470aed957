//! The probe (`tests/probe/probe.c`): compiling it in its three modes, and reading what
//! it reports (`ok <cmd> key=value ...` / `err <cmd> <ERROR> key=value ...`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

use crate::paths::{sim_lib_dir, work_dir};

/// How the probe reaches the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Linked with `-lcuda -lnvidia-ml`.
    Link,
    /// `dlopen("libcuda.so.1")` and `dlsym` on that handle.
    Dlopen,
    /// Only `cuGetProcAddress_v2` is looked up; every other function comes through it.
    ProcAddr,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Link, Mode::Dlopen, Mode::ProcAddr];

    fn number(self) -> u32 {
        match self {
            Mode::Link => 1,
            Mode::Dlopen => 2,
            Mode::ProcAddr => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Link => "link",
            Mode::Dlopen => "dlopen",
            Mode::ProcAddr => "procaddr",
        }
    }
}

/// The probe's source.
pub fn probe_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("probe/probe.c")
}

/// The probe compiled in `mode` (with the machine's `cc`), built at most once per test
/// binary and reused across binaries while it is newer than its source.
///
/// # Panics
/// If `cc` fails; the panic message holds its output.
pub fn probe_binary(mode: Mode) -> &'static Path {
    static BUILT: [OnceLock<PathBuf>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    BUILT[mode.number() as usize - 1].get_or_init(|| build(mode))
}

fn build(mode: Mode) -> PathBuf {
    let src = probe_source();
    let out = work_dir().join(format!("probe-{}", mode.name()));
    let newer = |a: &Path, b: &Path| -> bool {
        let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        matches!((m(a), m(b)), (Some(x), Some(y)) if x > y)
    };
    let lib = sim_lib_dir();
    let header = src.with_file_name("cuda_abi.h");
    if newer(&out, &src) && newer(&out, &header) && newer(&out, &lib.cuda) {
        return out;
    }
    let define = format!("-DPROBE_MODE={}", mode.number());
    let libs = format!("-L{}", lib.dir.display());
    let mut args = vec!["-O2", define.as_str()];
    if mode == Mode::Link {
        args.extend([libs.as_str(), "-lcuda", "-lnvidia-ml"]);
    }
    args.push("-ldl");
    crate::cc::cc(&src, &out, &args).unwrap_or_else(|e| panic!("the probe ({}): {e}", mode.name()));
    out
}

/// Runs the linked probe on the node state file `state` with `vars` (the
/// `TESSERA_SIM_*` variables) added to its environment: the first process to
/// open `state` makes the node from its own variables, as a node made from the
/// environment is. An inherited `TESSERA_SIM_CONTEXT_MEMORY` is dropped, so the
/// node's context memory is only what `vars` say.
///
/// # Panics
/// If the probe cannot be started.
pub fn run_on_state(state: &Path, vars: &[(&str, &str)], script: &[&str]) -> ProbeOutput {
    let out = Command::new(probe_binary(Mode::Link))
        .env("LD_LIBRARY_PATH", &sim_lib_dir().dir)
        .env("TESSERA_SIM_STATE", state)
        .env_remove("TESSERA_SIM_CONTEXT_MEMORY")
        .env_remove("TESSERA_SIM_CONTEXT_TEARDOWN")
        .envs(vars.iter().copied())
        .args(script)
        .output()
        .expect("running the probe");
    ProbeOutput::from_output(out)
}

/// One reported line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub ok: bool,
    pub cmd: String,
    /// The error name of an `err` line (`CUDA_ERROR_OUT_OF_MEMORY`, ...).
    pub error: Option<String>,
    pub fields: BTreeMap<String, String>,
    pub raw: String,
}

impl Line {
    /// Asserts that the call was refused with `error` (`CUDA_ERROR_OUT_OF_MEMORY`, ...),
    /// showing the whole line when it was not.
    #[track_caller]
    pub fn assert_refused(&self, error: &str) {
        assert_eq!(self.error.as_deref(), Some(error), "{}", self.raw);
    }

    /// Parses `ok <cmd> k=v ...` or `err <cmd> <ERROR> k=v ...`. A `name=` field takes the
    /// rest of the line (device names have spaces).
    pub fn parse(raw: &str) -> Option<Line> {
        let mut rest = raw.trim_end();
        let mut word = || -> Option<&str> {
            let t = rest.trim_start();
            let end = t.find(' ').unwrap_or(t.len());
            let (w, r) = t.split_at(end);
            rest = r;
            (!w.is_empty()).then_some(w)
        };
        let ok = match word()? {
            "ok" => true,
            "err" => false,
            _ => return None,
        };
        let cmd = word()?.to_string();
        let error = if ok { None } else { Some(word()?.to_string()) };
        let mut fields = BTreeMap::new();
        let mut tail = rest.trim_start();
        while !tail.is_empty() {
            if let Some(v) = tail.strip_prefix("name=") {
                fields.insert("name".to_string(), v.to_string());
                break;
            }
            let end = tail.find(' ').unwrap_or(tail.len());
            let (kv, r) = tail.split_at(end);
            if let Some((k, v)) = kv.split_once('=') {
                fields.insert(k.to_string(), v.to_string());
            }
            tail = r.trim_start();
        }
        Some(Line {
            ok,
            cmd,
            error,
            fields,
            raw: raw.to_string(),
        })
    }

    /// A field's text.
    ///
    /// # Panics
    /// If the line has no such field.
    pub fn str(&self, key: &str) -> &str {
        self.fields
            .get(key)
            .unwrap_or_else(|| panic!("no {key}= in {:?}", self.raw))
    }

    /// A numeric field (decimal or 0x-hex).
    ///
    /// # Panics
    /// If the line has no such field or it is not a number.
    pub fn u64(&self, key: &str) -> u64 {
        let v = self.str(key);
        let parsed = match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16),
            None => v.parse(),
        };
        parsed.unwrap_or_else(|_| panic!("{key}={v} is not a number in {:?}", self.raw))
    }

    /// A decimal field such as `ms=1.5`.
    ///
    /// # Panics
    /// If the line has no such field or it is not a number.
    pub fn f64(&self, key: &str) -> f64 {
        let v = self.str(key);
        v.parse()
            .unwrap_or_else(|_| panic!("{key}={v} is not a number in {:?}", self.raw))
    }
}

/// Everything a finished probe reported.
#[derive(Debug, Clone)]
pub struct ProbeOutput {
    pub lines: Vec<Line>,
    pub stdout: String,
    pub stderr: String,
    pub status: std::process::ExitStatus,
}

impl ProbeOutput {
    pub fn from_output(o: std::process::Output) -> ProbeOutput {
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        ProbeOutput {
            lines: stdout.lines().filter_map(Line::parse).collect(),
            stdout,
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
            status: o.status,
        }
    }

    /// The lines of one command, in order.
    pub fn all(&self, cmd: &str) -> Vec<&Line> {
        self.lines.iter().filter(|l| l.cmd == cmd).collect()
    }

    /// The text of field `key` on every line of `cmd`, in order.
    ///
    /// # Panics
    /// If one of those lines has no such field.
    pub fn fields(&self, cmd: &str, key: &str) -> Vec<&str> {
        self.lines
            .iter()
            .filter(|l| l.cmd == cmd)
            .map(|l| l.str(key))
            .collect()
    }

    /// The first line of `cmd`.
    ///
    /// # Panics
    /// If the command reported nothing.
    pub fn get(&self, cmd: &str) -> &Line {
        self.lines
            .iter()
            .find(|l| l.cmd == cmd)
            .unwrap_or_else(|| panic!("no {cmd} line in:\n{}{}", self.stdout, self.stderr))
    }

    /// Asserts the probe exited 0 and every line is `ok`.
    ///
    /// # Panics
    /// Otherwise, with the whole output.
    pub fn expect_ok(&self) -> &Self {
        assert!(
            self.status.success() && self.lines.iter().all(|l| l.ok) && !self.lines.is_empty(),
            "probe failed ({}):\n{}{}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
}

/// A running probe: its lines arrive on a channel (so waits have timeouts), and with
/// `stdin` piped it can be fed one command at a time.
#[derive(Debug)]
pub struct ProbeChild {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl ProbeChild {
    /// Starts `cmd` with stdout piped (and stdin piped for `send`).
    ///
    /// # Panics
    /// If the process cannot be started.
    pub fn start(cmd: Command) -> ProbeChild {
        Self::start_with_stderr(cmd, Stdio::inherit())
    }

    /// [`ProbeChild::start`], its stderr going to `stderr`.
    ///
    /// # Panics
    /// If the process cannot be started.
    pub fn start_with_stderr(mut cmd: Command, stderr: Stdio) -> ProbeChild {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("starting the probe");
        let stdout = child.stdout.take().expect("probe stdout");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ProbeChild {
            stdin: child.stdin.take(),
            child,
            lines: rx,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one command line (for a probe started without script arguments).
    ///
    /// # Panics
    /// If stdin is closed.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("probe stdin is open");
        writeln!(stdin, "{line}").expect("writing to the probe");
        stdin.flush().expect("flushing the probe's stdin");
    }

    /// The next reported line, waiting up to `timeout`.
    ///
    /// # Panics
    /// On timeout or if the probe's output ended.
    pub fn next(&mut self, timeout: Duration) -> Line {
        loop {
            match self.lines.recv_timeout(timeout) {
                Ok(raw) => {
                    if let Some(l) = Line::parse(&raw) {
                        return l;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!("probe said nothing for {timeout:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("probe output ended"),
            }
        }
    }

    /// The next reported line, or `None` if none came within `timeout` or the output
    /// ended (for callers that report a hang rather than panic).
    pub fn try_next(&mut self, timeout: Duration) -> Option<Line> {
        let t0 = std::time::Instant::now();
        loop {
            let left = timeout.checked_sub(t0.elapsed())?;
            match self.lines.recv_timeout(left) {
                Ok(raw) => {
                    if let Some(l) = Line::parse(&raw) {
                        return Some(l);
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// The next reported line, or `None` once the probe's output has ended
    /// (it exited, or was killed: what a test that expects a stop waits for).
    ///
    /// # Panics
    /// On timeout.
    pub fn next_or_end(&mut self, timeout: Duration) -> Option<Line> {
        loop {
            match self.lines.recv_timeout(timeout) {
                Ok(raw) => {
                    if let Some(l) = Line::parse(&raw) {
                        return Some(l);
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!("probe said nothing for {timeout:?}"),
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Sends a command and returns its line, or `None` (see [`ProbeChild::try_next`]).
    pub fn cmd_within(&mut self, line: &str, timeout: Duration) -> Option<Line> {
        let stdin = self.stdin.as_mut()?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .ok()?;
        self.try_next(timeout)
    }

    /// Sends a command and returns its line.
    pub fn cmd(&mut self, line: &str, timeout: Duration) -> Line {
        self.send(line);
        self.next(timeout)
    }

    /// Waits for the line of `cmd` (earlier lines are skipped).
    pub fn wait_for(&mut self, cmd: &str, timeout: Duration) -> Line {
        loop {
            let l = self.next(timeout);
            if l.cmd == cmd {
                return l;
            }
        }
    }

    /// SIGKILLs the probe and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Closes stdin (the probe exits at end of input) and waits for it.
    pub fn finish(mut self) -> std::process::ExitStatus {
        drop(self.stdin.take());
        self.child.wait().expect("waiting for the probe")
    }
}

impl Drop for ProbeChild {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ok_and_err_lines() {
        let l = Line::parse("ok alloc h=3 kind=plain ptr=0x7f00 bytes=1024").expect("ok line");
        assert!(l.ok);
        assert_eq!(l.cmd, "alloc");
        assert_eq!(l.u64("h"), 3);
        assert_eq!(l.u64("ptr"), 0x7f00);
        assert_eq!(l.str("kind"), "plain");
        let e = Line::parse("err alloc CUDA_ERROR_OUT_OF_MEMORY").expect("err line");
        assert!(!e.ok);
        assert_eq!(e.error.as_deref(), Some("CUDA_ERROR_OUT_OF_MEMORY"));
        let n = Line::parse("ok name dev=0 name=Tessera Simulated GPU").expect("name");
        assert_eq!(n.str("name"), "Tessera Simulated GPU");
        assert_eq!(n.u64("dev"), 0);
        assert!(Line::parse("bad line").is_none());
        assert!(
            Line::parse("err alloc").is_none(),
            "err needs an error name"
        );
    }
}
