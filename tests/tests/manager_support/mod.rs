//! Helpers for the `manager_*` tests: the manager and the client commands
//! (`tessera status`, `top`, `run`) running in child processes against a
//! simulated node (`tessera_e2e::SimNode`), and a strict Prometheus text
//! parser.
//!
//! The child processes are this test executable itself, re-run with only
//! its ignored `role` test selected and the role in `TESSERA_E2E_ROLE`: the
//! same library entry points as the `tessera` binary, each in a process of
//! its own with its own environment (the simulated NVML reads its node from
//! the environment), without depending on the binary having been built.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use tessera_e2e::{Mode, ProbeChild, SimNode, hook_library, probe_binary, sim_nvml_library};

/// Names the role a re-run test executable plays.
pub const ROLE_ENV: &str = "TESSERA_E2E_ROLE";
/// The role's arguments, separated by ASCII unit separators.
pub const ARGS_ENV: &str = "TESSERA_E2E_ARGS";
/// Where the manager role writes its bound metrics address.
pub const METRICS_FILE: &str = "e2e-metrics-addr";

#[derive(Parser)]
#[command(name = "tessera-manager")]
struct ManagerCli {
    #[command(flatten)]
    args: tessera_manager::ManagerArgs,
}

/// The client subcommands, spelled as the `tessera` binary spells them.
#[derive(Parser)]
#[command(name = "tessera")]
enum ClientCli {
    Status(tessera_client::status::StatusArgs),
    Top(tessera_client::top::TopArgs),
    Run(tessera_client::run::RunArgs),
}

/// Defines the test executable's `role` test. Not a test: the body of this
/// executable when a test re-runs it as the manager or a client command
/// ([`role_main`]); ignored, so a plain run of the tests skips it.
macro_rules! role_test {
    () => {
        #[test]
        #[ignore = "helper: the manager or client process the other tests start"]
        fn role() {
            role_main();
        }
    };
}
pub(crate) use role_test;

/// The body of the `role` test: runs the role and exits, never returning
/// to the test harness. Does nothing when no role is set.
pub fn role_main() {
    let Ok(role) = std::env::var(ROLE_ENV) else {
        return;
    };
    let args = role_args();
    let code = match role.as_str() {
        "manager" => manager_role(args),
        "cli" => cli_role(args),
        other => {
            eprintln!("unknown role {other}");
            2
        }
    };
    std::process::exit(code);
}

/// The arguments a re-run test executable's role was given ([`role_command`]).
pub fn role_args() -> Vec<String> {
    std::env::var(ARGS_ENV)
        .unwrap_or_default()
        .split('\u{1f}')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn manager_role(args: Vec<String>) -> i32 {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .try_init();
    let cli = match ManagerCli::try_parse_from(std::iter::once("manager".to_owned()).chain(args)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let config = match tessera_manager::Config::load(&cli.args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("Error: {e}");
            return 1;
        }
    };
    let ready_file = config.state_dir.join(METRICS_FILE);
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let result = rt.block_on(tessera_manager::daemon::run_with(config, |m| {
        let addr = m.metrics_addr().map(|a| a.to_string()).unwrap_or_default();
        let _ = std::fs::write(&ready_file, addr);
    }));
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {e}");
            1
        }
    }
}

fn cli_role(args: Vec<String>) -> i32 {
    let cli = match ClientCli::try_parse_from(std::iter::once("tessera".to_owned()).chain(args)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let result = match cli {
        ClientCli::Status(a) => tessera_client::status::status(&a).map(|()| 0),
        ClientCli::Top(a) => tessera_client::top::top(&a).map(|()| 0),
        ClientCli::Run(a) => tessera_client::run::run(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e}");
            1
        }
    }
}

/// A command re-running this test executable in `role` with `args`.
pub fn role_command(role: &str, args: &[String]) -> Command {
    let exe = std::env::current_exe().expect("test executable");
    let mut c = Command::new(exe);
    c.args([
        "role",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    c.env(ROLE_ENV, role);
    c.env(ARGS_ENV, args.join("\u{1f}"));
    c
}

/// `args` as owned strings (what [`role_command`] takes).
pub fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// What a role wrote to stdout, without the harness's own preamble.
pub fn role_stdout(o: &Output) -> String {
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    strip_preamble(&text)
}

/// Drops what libtest prints before the `role` test's own output: a
/// blank line, "running 1 test" and "test role ... ".
pub fn strip_preamble(text: &str) -> String {
    let rest = match text.find("running 1 test\n") {
        Some(i) => &text[i + "running 1 test\n".len()..],
        None => text,
    };
    rest.strip_prefix("test role ... ")
        .unwrap_or(rest)
        .to_owned()
}

/// `args` with `flag`'s value replaced (clap refuses a flag given twice).
pub fn with_flag(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args[i + 1] = value.to_owned(),
        None => args.extend([flag.to_owned(), value.to_owned()]),
    }
    args
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The shim this build made.
pub fn hook() -> PathBuf {
    hook_library().expect("libtessera.so is built with the tests (tessera-hook is a dependency)")
}

/// The probe (dlopen mode: it finds the simulated driver by its soname).
pub fn probe_path() -> &'static Path {
    probe_binary(Mode::Dlopen)
}

/// The manager's own flags for `node`: its state directory, metrics on an
/// ephemeral port, the simulated NVML, fast sampling and reaping.
pub fn manager_args(state_dir: &Path) -> Vec<String> {
    [
        "--state-dir",
        &state_dir.display().to_string(),
        "--socket",
        &state_dir.join("manager.sock").display().to_string(),
        "--nvml-library",
        &sim_nvml_library().display().to_string(),
        "--hook-library",
        &hook().display().to_string(),
        "--metrics-addr",
        "127.0.0.1:0",
        "--hostname",
        "e2e-node",
        "--sample-interval",
        "100ms",
        "--reap-interval",
        "50ms",
        "--xid-recovery",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A probe under the shim in the allocation whose (host) files are given,
/// taking commands on stdin.
pub fn governed_probe(node: &SimNode, control: &str, state: &str) -> ProbeChild {
    let mut c = node.probe(Mode::Dlopen, &[]);
    c.env("LD_PRELOAD", hook())
        .env("TESSERA_CONTROL", control)
        .env("TESSERA_STATE", state);
    ProbeChild::start(c)
}

/// How long a manager may take to serve before a test calls it broken.
const START_DEADLINE: Duration = Duration::from_secs(120);

/// The manager running in a child process.
pub struct ManagerProc {
    pub child: Child,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    pub metrics: std::net::SocketAddr,
    stderr_log: PathBuf,
}

impl ManagerProc {
    /// Starts the manager for `node` with `state_dir` and `extra` flags and
    /// waits until it serves.
    pub fn start(node: &SimNode, state_dir: &Path, extra: &[&str]) -> ManagerProc {
        std::fs::create_dir_all(state_dir).expect("state dir");
        let _ = std::fs::remove_file(state_dir.join(METRICS_FILE));
        let mut args = manager_args(state_dir);
        for pair in extra.chunks(2) {
            args = with_flag(args, pair[0], pair.get(1).copied().unwrap_or_default());
        }
        let log = state_dir.with_extension("stderr.log");
        let child = role_command("manager", &args)
            .envs(node.env())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn the manager");
        let mut m = ManagerProc {
            child,
            state_dir: state_dir.to_owned(),
            socket: state_dir.join("manager.sock"),
            metrics: "0.0.0.0:0".parse().expect("placeholder address"),
            stderr_log: log,
        };
        let t0 = Instant::now();
        loop {
            if let Some(status) = m.child.try_wait().expect("poll the manager") {
                panic!("the manager exited ({status}) before serving:\n{}", m.log());
            }
            if let Ok(addr) = std::fs::read_to_string(state_dir.join(METRICS_FILE))
                && let Ok(addr) = addr.trim().parse()
                && std::os::unix::net::UnixStream::connect(&m.socket).is_ok()
            {
                m.metrics = addr;
                return m;
            }
            // A deadline only a broken manager reaches: at a load average of 44 on
            // two cores one start took over 30 s with nothing wrong.
            assert!(
                t0.elapsed() < START_DEADLINE,
                "the manager did not start in {} s:\n{}",
                START_DEADLINE.as_secs(),
                m.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the manager for `node` the usual way: its state in the node's
    /// directory (`m`), no extra flags.
    pub fn on(node: &SimNode) -> ManagerProc {
        Self::start(node, &node.dir.path().join("m"), &[])
    }

    /// Background passes of kind `pass` (`reaper`, `gpu_event`,
    /// `gpu_event_wait`) the
    /// manager has completed, from its metrics.
    pub fn passes(&self, pass: &str) -> u64 {
        let e = parse_exposition(&scrape(self.metrics)).expect("exposition");
        e.get("tessera_manager_passes_total", &[("pass", pass)])
            .unwrap_or(0.0) as u64
    }

    /// Waits until the manager's GPU event watcher is registered (its
    /// first wait came back, `gpu_event_wait` above 0): the driver delivers
    /// an event only to a watcher that exists when it happens, so a test
    /// injects one only after this.
    pub fn events_registered(&self) {
        let ok = eventually(DEADLINE, || self.passes("gpu_event_wait") > 0);
        assert!(
            ok.is_some(),
            "GPU event watcher never registered:\n{}",
            self.log()
        );
    }

    /// Waits until a wait of the GPU event watcher that began after this
    /// call has come back, so every event injected before the call has been
    /// handled (or, if none was pending, nothing was).
    pub fn event_pass(&self) {
        // The wait running now may have come back before the call's event
        // was queued: the next one began after the call.
        let seen = self.passes("gpu_event_wait") + 1;
        let done = eventually(DEADLINE, || self.passes("gpu_event_wait") > seen);
        assert!(
            done.is_some(),
            "no GPU event wait completed:\n{}",
            self.log()
        );
    }

    /// Waits until a reaper pass that began after this call has completed,
    /// so whatever the reaper does to the state as it is now has been done.
    pub fn reaper_pass(&self) {
        // The pass running now may have read the state before the call:
        // the next one began after it.
        let seen = self.passes("reaper") + 1;
        let done = eventually(DEADLINE, || self.passes("reaper") > seen);
        assert!(done.is_some(), "no reaper pass completed:\n{}", self.log());
    }

    /// What the manager logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }

    /// SIGTERM, and the manager must exit 0 within 10 s.
    pub fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let t0 = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the manager") {
                assert!(
                    status.success(),
                    "manager exited with {status}:\n{}",
                    self.log()
                );
                assert!(!self.socket.exists(), "socket left behind");
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "manager ignored SIGTERM:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ManagerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a client command (`status`, `top`, `run`) to completion.
pub fn client(node: &SimNode, args: &[&str]) -> Output {
    role_command("cli", &owned(args))
        .envs(node.env())
        .stdin(Stdio::null())
        .output()
        .expect("run the client")
}

/// Starts a client command with piped stdout, for reading as it goes. Its
/// stderr is the test's, so a client that fails says why.
pub fn client_spawn(node: &SimNode, args: &[&str]) -> Child {
    role_command("cli", &owned(args))
        .envs(node.env())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn the client")
}

/// Reads lines from `r` until one satisfies `want` (returned) or the
/// stream ends (panics with what was read).
pub fn read_until(r: &mut impl BufRead, want: impl Fn(&str) -> bool) -> String {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line).expect("read a line");
        assert!(
            n > 0,
            "stream ended before the expected line; read:\n{seen}"
        );
        if want(line.trim_end()) {
            return line.trim_end().to_owned();
        }
        seen.push_str(&line);
    }
}

/// The value of `key=` in a probe line.
pub fn field(line: &str, key: &str) -> Option<String> {
    line.split_ascii_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .map(str::to_owned)
}

/// Holds the tests of one executable that measure time (how soon memory is
/// reclaimed or a process stopped, shares of the GPU's time) to one at a
/// time, so they do not load each other's CPUs.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How long a test waits for what must happen: generous, it is a deadline
/// for a hang, never a measure of speed (the suite runs beside busy CPUs).
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Polls `f` every 10 ms until it holds; returns how long that took.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Waits until process `pid` (not necessarily our child) is dead: gone
/// from `/proc`, or a zombie. A signal is delivered asynchronously, so a
/// test that asserts what follows a death waits for the death first.
pub fn wait_dead(pid: i32) {
    let dead = || match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name, which ends at the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X'))),
    };
    assert!(
        eventually(DEADLINE, dead).is_some(),
        "process {pid} never died"
    );
}

/// Waits until some thread of process `pid` is blocked on the pause word
/// of the allocation whose control file is `control` (a futex wait on that
/// word, seen in `/proc/PID/task/*/syscall`): a call the pause holds is
/// then known to be held, not merely not yet read.
pub fn wait_held_by_pause(pid: u32, control: &Path) {
    let control = std::fs::canonicalize(control).expect("control file");
    let offset = std::mem::offset_of!(tessera_shm::layout::ControlHeader, paused) as u64;
    let held = || {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        // Where the control file is mapped from its start: `lo-hi perms
        // offset dev inode path`.
        let words: Vec<u64> = maps
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 6 && Path::new(f[5]) == control && f[2] == "00000000")
                    .then(|| f[0].split('-').next())
                    .flatten()
                    .and_then(|lo| u64::from_str_radix(lo, 16).ok())
                    .map(|lo| lo + offset)
            })
            .collect();
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        tasks.flatten().any(|t| {
            let sc = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
            let mut f = sc.split_whitespace();
            f.next().and_then(|n| n.parse::<i64>().ok()) == Some(libc::SYS_futex)
                && f.next()
                    .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
                    .is_some_and(|a| words.contains(&a))
        })
    };
    assert!(
        eventually(DEADLINE, held).is_some(),
        "process {pid} never blocked on the pause"
    );
}

/// Waits for `child`'s stdout to say `ready` (its command has set up its
/// signal handling), sends it SIGTERM and returns how it exited.
pub fn sigterm_once_ready(child: &mut Child) -> std::process::ExitStatus {
    let mut out = lines(child);
    read_until(&mut out, |l| l.ends_with("ready"));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    child.wait().expect("wait")
}

/// A line-buffered reader over a child's stdout.
pub fn lines(child: &mut Child) -> BufReader<std::process::ChildStdout> {
    BufReader::new(child.stdout.take().expect("piped stdout"))
}

/// One blocking HTTP GET of `/metrics`; the body.
pub fn scrape(addr: std::net::SocketAddr) -> String {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).expect("connect to metrics");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: e2e\r\n\r\n")
        .expect("send request");
    let mut out = String::new();
    c.read_to_string(&mut out).expect("read response");
    let (head, body) = out.split_once("\r\n\r\n").expect("HTTP response");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    // Header names are case-insensitive (hyper writes them in lower case).
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    body.to_owned()
}

/// A parsed exposition: family → (type, samples of label sets and values).
#[derive(Debug, Default)]
pub struct Exposition {
    pub types: HashMap<String, String>,
    pub samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Exposition {
    /// The value of the one sample of `name` whose labels include `want`.
    pub fn get(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<f64> = self
            .samples
            .iter()
            .filter(|(n, labels, _)| {
                n == name
                    && want
                        .iter()
                        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| *v)
            .collect();
        assert!(
            found.len() <= 1,
            "{name} {want:?} matches {} samples",
            found.len()
        );
        found.first().copied()
    }
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// Parses Prometheus text format 0.0.4 strictly: every sample's family has
/// a `# TYPE` before it, names and labels are well-formed, label values are
/// properly escaped, no series appears twice, every value is a number.
pub fn parse_exposition(text: &str) -> Result<Exposition, String> {
    let mut e = Exposition::default();
    let mut seen = std::collections::HashSet::new();
    for (no, line) in text.lines().enumerate() {
        let at = |m: &str| format!("line {}: {m}: {line:?}", no + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("HELP"), Some(name), _) if valid_name(name) => {}
                (Some("TYPE"), Some(name), Some(kind)) if valid_name(name) => {
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                        return Err(at("unknown type"));
                    }
                    if e.types.insert(name.to_owned(), kind.to_owned()).is_some() {
                        return Err(at("second TYPE"));
                    }
                }
                _ => return Err(at("bad comment")),
            }
            continue;
        }
        let cs: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < cs.len() && cs[i] != '{' && cs[i] != ' ' {
            i += 1;
        }
        let name: String = cs[..i].iter().collect();
        if !valid_name(&name) {
            return Err(at("bad metric name"));
        }
        if !e.types.contains_key(&name) {
            return Err(at("sample before its TYPE"));
        }
        let mut labels = BTreeMap::new();
        if cs.get(i) == Some(&'{') {
            i += 1;
            while cs.get(i) != Some(&'}') {
                let start = i;
                while i < cs.len() && cs[i] != '=' {
                    i += 1;
                }
                let key: String = cs[start..i].iter().collect();
                if !valid_name(&key) || key.contains(':') {
                    return Err(at("bad label name"));
                }
                if cs.get(i + 1) != Some(&'"') {
                    return Err(at("label value not quoted"));
                }
                i += 2;
                let mut value = String::new();
                loop {
                    match cs.get(i) {
                        Some('\\') => {
                            match cs.get(i + 1) {
                                Some('\\') => value.push('\\'),
                                Some('"') => value.push('"'),
                                Some('n') => value.push('\n'),
                                _ => return Err(at("bad escape")),
                            }
                            i += 2;
                        }
                        Some('"') => {
                            i += 1;
                            break;
                        }
                        Some(&c) => {
                            value.push(c);
                            i += 1;
                        }
                        None => return Err(at("unterminated label value")),
                    }
                }
                if labels.insert(key, value).is_some() {
                    return Err(at("label twice"));
                }
                match cs.get(i) {
                    Some(',') => i += 1,
                    Some('}') => {}
                    _ => return Err(at("expected , or }")),
                }
            }
            i += 1;
        }
        if cs.get(i) != Some(&' ') {
            return Err(at("no space before the value"));
        }
        let value: String = cs[i + 1..].iter().collect();
        let v: f64 = match value.as_str() {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().map_err(|_| at("value is not a number"))?,
        };
        let key = format!("{name}{labels:?}");
        if !seen.insert(key) {
            return Err(at("series twice"));
        }
        e.samples.push((name, labels, v));
    }
    Ok(e)
}

/// The manager's status over its socket, synchronously.
pub fn node_status(socket: &Path) -> tessera_proto::manager::v1::NodeStatus {
    with_client(socket, async |c| {
        c.get_node_status(tessera_proto::manager::v1::NodeStatusRequest {})
            .await
            .expect("GetNodeStatus")
            .into_inner()
    })
}

/// Creates a one-GPU allocation over the manager's socket, which must
/// succeed (see `CreateAllocationRequest::one_device`).
pub fn create(
    socket: &Path,
    id: &str,
    uuid: &str,
    mem: u64,
    ppm: u32,
) -> tessera_proto::manager::v1::Allocation {
    let req = tessera_proto::manager::v1::CreateAllocationRequest::one_device(id, uuid, mem, ppm);
    with_client(socket, async |c| c.create_allocation(req).await)
        .expect("CreateAllocation")
        .into_inner()
}

/// Allocation `id` in the manager's status.
pub fn status_of(socket: &Path, id: &str) -> tessera_proto::manager::v1::AllocationStatus {
    node_status(socket)
        .allocations
        .into_iter()
        .find(|a| a.allocation.as_ref().is_some_and(|x| x.id == id))
        .expect("the allocation in the status")
}

/// Runs one async client call against the manager, synchronously.
pub fn with_client<T>(
    socket: &Path,
    f: impl AsyncFnOnce(
        &mut tessera_proto::manager::v1::manager_client::ManagerClient<tonic::transport::Channel>,
    ) -> T,
) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut c = tessera_client::connect(socket)
            .await
            .expect("connect to the manager");
        f(&mut c).await
    })
}
