//! `tessera run` end to end on the simulated node, as it starts fast: one
//! round trip, then the command in the run's place (`exec`).
//!
//! Without a manager the first run starts the session's private manager
//! (state under `$XDG_RUNTIME_DIR/tessera`, one line says so); limits hold
//! as under a system manager; a burst of runs starts exactly one; it leaves
//! no sooner than its grace period after the last run, and leaves nothing
//! behind; a run after that starts a new one. A command's exit status and
//! signals are its own. With a system manager, the allocation of a run
//! whose command was SIGKILLed is reclaimed by the manager.

mod manager_support;

use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use manager_support::*;
use tessera_e2e::SimNode;

const GI: u64 = 1 << 30;

role_test!();

fn node() -> SimNode {
    SimNode::e2e(1, 0x9e1)
}

/// The session: a runtime directory of its own, and the program the run
/// starts as `PROGRAM manager …`: a script that re-runs this test
/// executable in the manager role (the `tessera` binary itself otherwise).
struct Session {
    runtime: PathBuf,
    program: PathBuf,
    grace: &'static str,
}

impl Session {
    fn new(n: &SimNode, grace: &'static str) -> Session {
        let runtime = n.dir.path().join("xdg");
        std::fs::create_dir_all(&runtime).unwrap();
        let program = n.dir.path().join("private-manager.sh");
        let exe = std::env::current_exe().unwrap();
        std::fs::write(
            &program,
            format!(
                "#!/bin/sh\n[ \"$1\" = manager ] && shift\nIFS=$(printf '\\037')\n\
                 {ROLE_ENV}=manager {ARGS_ENV}=\"$*\" exec '{}' role --exact --ignored \
                 --nocapture --test-threads=1\n",
                exe.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        Session {
            runtime,
            program,
            grace,
        }
    }

    fn dir(&self) -> PathBuf {
        self.runtime.join("tessera")
    }

    fn socket(&self) -> PathBuf {
        self.dir().join("manager.sock")
    }

    fn run(&self, n: &SimNode, args: &[&str]) -> Command {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut c = role_command("cli", &args);
        c.envs(n.env())
            .env("XDG_RUNTIME_DIR", &self.runtime)
            .env(tessera_client::private::MANAGER_PROGRAM_ENV, &self.program)
            .env("TESSERA_PRIVATE_GRACE", self.grace)
            .stdin(Stdio::null());
        c
    }

    /// A run whose command waits on its input (`cat`): it holds its
    /// allocation until the test closes the run's stdin.
    fn spawn_held(&self, n: &SimNode, args: &[&str]) -> Child {
        self.run(n, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a run")
    }

    fn output(&self, n: &SimNode, args: &[&str]) -> Output {
        self.run(n, args).output().expect("run the client")
    }

    /// How many private managers have started: each logs one "manager
    /// serving" line to the session's log.
    fn starts(&self) -> usize {
        std::fs::read_to_string(self.dir().join("manager.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("manager serving"))
            .count()
    }

    /// The pid of the private manager: the process holding its state
    /// directory's lock open.
    fn manager_pid(&self) -> Option<i32> {
        let lock = std::fs::canonicalize(self.dir().join("state/manager.lock")).ok()?;
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let held = std::fs::read_dir(e.path().join("fd"))
                .ok()?
                .flatten()
                .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == lock));
            held.then_some(pid)
        })
    }

    /// Waits (with the tests' deadline) until the private manager has
    /// exited (no process holds its lock), then checks it left nothing: no
    /// socket, no allocation.
    fn wait_gone(&self) {
        assert!(
            eventually(DEADLINE, || self.manager_pid().is_none()).is_some(),
            "the private manager never left:\n{}",
            log(self)
        );
        assert!(!self.socket().exists(), "the socket outlived the manager");
        let left: Vec<String> = std::fs::read_dir(self.dir().join("state/allocations"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "allocations left behind: {left:?}");
    }
}

fn answers(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

/// `tessera run` flags for the session's private manager (no system one).
fn base<'a>(hook: &'a str, none: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--socket",
        none,
        "--hook-library",
        hook,
        "--gpu",
        "0",
        "--memory",
        "100Mi",
        "--compute",
        "1%",
        "--",
    ]
}

#[test]
fn run_starts_a_private_manager_whose_limits_hold() {
    let n = node();
    let s = Session::new(&n, "1s");
    let none = n.dir.path().join("no-manager.sock").display().to_string();
    let hook = hook().display().to_string();
    let probe = probe_path().display().to_string();
    let half = (GI / 2).to_string();
    let mut args = base(&hook, &none);
    args[8] = "1Gi";
    let (a1, a2) = (format!("alloc {half}"), format!("alloc {half}"));
    args.extend([probe.as_str(), "init", "ctx", &a1, &a2, "alloc 1"]);
    let o = s.output(&n, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let notice: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("private manager"))
        .collect();
    assert_eq!(notice.len(), 1, "{err}");
    assert!(
        notice[0].contains("no manager on")
            && notice[0].contains("started this session's")
            && notice[0].contains("stays 1s after the last run"),
        "{err}"
    );
    let text = role_stdout(&o);
    let allocs: Vec<&str> = text.lines().filter(|l| l.contains(" alloc")).collect();
    assert_eq!(allocs.len(), 3, "{text}");
    assert!(
        allocs[0].starts_with("ok") && allocs[1].starts_with("ok"),
        "{text}"
    );
    assert!(allocs[2].contains("CUDA_ERROR_OUT_OF_MEMORY"), "{text}");
    assert!(
        s.dir().join("state").is_dir(),
        "state not in the runtime dir"
    );
    s.wait_gone();
}

#[test]
fn a_burst_of_runs_starts_one_private_manager_which_leaves_after_its_grace() {
    let n = node();
    let grace = Duration::from_secs(1);
    let s = Session::new(&n, "1s");
    let none = n.dir.path().join("no-manager.sock").display().to_string();
    let hook = hook().display().to_string();
    // 50 runs at once, none finding a manager; each command (`cat`) ends
    // when its input closes, so all 50 are running together by
    // construction, whatever the load.
    let mut args = base(&hook, &none);
    args.push("cat");
    let mut runs: Vec<Child> = (0..50).map(|_| s.spawn_held(&n, &args)).collect();
    let all_in = eventually(DEADLINE, || {
        answers(&s.socket()) && node_status(&s.socket()).allocations.len() == 50
    });
    if all_in.is_none() {
        let have = answers(&s.socket()).then(|| node_status(&s.socket()).allocations.len());
        let mut why = String::new();
        for r in &mut runs {
            let _ = r.kill();
        }
        for r in runs {
            let o = r.wait_with_output().unwrap();
            why.push_str(&format!("{}: {}", o.status, stderr(&o)));
        }
        panic!(
            "50 runs never all had their allocation (the manager has {have:?}):\n{why}\n{}",
            log(&s)
        );
    }
    assert!(s.manager_pid().is_some(), "the private manager");
    // Every run's allocation exists until its command ends, after this.
    let closing = Instant::now();
    for r in &mut runs {
        let mut stdin = r.stdin.take().unwrap();
        let _ = stdin.flush();
    }
    let mut started = 0;
    for r in runs {
        let o = r.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        started += stderr(&o)
            .lines()
            .filter(|l| l.contains("started this session's private manager"))
            .count();
    }
    assert_eq!(started, 1, "runs that said they started a manager");
    assert_eq!(s.starts(), 1, "managers started:\n{}", log(&s));

    // The last run has ended: the manager stays at least its grace, then
    // goes, leaving nothing.
    s.wait_gone();
    assert!(
        closing.elapsed() >= grace,
        "the manager left {:?} after the runs were told to end, before its grace of {grace:?}",
        closing.elapsed()
    );

    // A run after that starts a new one.
    let mut args = base(&hook, &none);
    args.push("true");
    let o = s.output(&n, &args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("started this session's"),
        "{}",
        stderr(&o)
    );
    assert_eq!(s.starts(), 2, "{}", log(&s));
    s.wait_gone();
}

fn log(s: &Session) -> String {
    std::fs::read_to_string(s.dir().join("manager.log")).unwrap_or_default()
}

#[test]
fn a_commands_exit_status_and_signals_are_its_own() {
    let n = node();
    let s = Session::new(&n, "1s");
    let none = n.dir.path().join("no-manager.sock").display().to_string();
    let hook = hook().display().to_string();
    let status = |cmd: &str| {
        let mut args = base(&hook, &none);
        args.extend(["sh", "-c", cmd]);
        s.output(&n, &args).status
    };
    assert_eq!(status("exit 7").code(), Some(7));
    assert_eq!(status("exit 0").code(), Some(0));
    assert_eq!(status("kill -USR1 $$").signal(), Some(libc::SIGUSR1));
    assert_eq!(status("kill -9 $$").signal(), Some(9));

    // A signal to `tessera run` is a signal to the command: the same process.
    let mut args = base(&hook, &none);
    args.extend([
        "sh",
        "-c",
        "trap 'exit 42' TERM; echo ready; while :; do sleep 1; done",
    ]);
    let mut run = s.run(&n, &args).stdout(Stdio::piped()).spawn().unwrap();
    assert_eq!(sigterm_once_ready(&mut run).code(), Some(42));
    s.wait_gone();
}

#[test]
fn the_allocation_of_a_sigkilled_run_is_reclaimed() {
    let n = node();
    let m = ManagerProc::on(&n);
    let sock = m.socket.display().to_string();
    let probe = probe_path().display().to_string();
    let alloc = format!("alloc {GI}");
    let args = [
        "run",
        "--socket",
        &sock,
        "--gpu",
        "0",
        "--memory",
        "2Gi",
        "--",
        &probe,
        "init",
        "ctx",
        &alloc,
        "pid",
        "sleep 600000",
    ];
    let mut run = client_spawn(&n, &args);
    let mut out = lines(&mut run);
    let pid: u32 = field(&read_until(&mut out, |l| l.starts_with("ok pid")), "pid")
        .unwrap()
        .parse()
        .unwrap();
    // The command is the run: the same process.
    assert_eq!(pid, run.id());
    let st = node_status(&m.socket);
    assert_eq!(st.allocations.len(), 1);
    let a = st.allocations[0].allocation.clone().unwrap();
    // Bound by the kernel's word for who connected.
    assert_eq!(a.labels["cli-pid"], pid.to_string(), "{:?}", a.labels);
    assert_eq!(a.labels["cli-tracked"], "true");
    assert_eq!(n.node().process(pid).expect("on the node").memory[0], GI);

    run.kill().unwrap();
    assert_eq!(run.wait().unwrap().signal(), Some(9));
    // A whole reaper pass after the death reclaims the slot and deletes
    // the allocation.
    m.reaper_pass();
    assert!(
        node_status(&m.socket).allocations.is_empty(),
        "the killed run's allocation was not reclaimed:\n{}",
        m.log()
    );
    m.stop();
}

/// A logout removes `$XDG_RUNTIME_DIR` under a running private manager: once
/// its last run has ended it leaves all the same (nothing can reach it any
/// more), instead of lingering for good with an allocation it can no
/// longer delete from disk.
#[test]
fn a_private_manager_whose_directory_was_removed_leaves_after_its_runs() {
    let n = node();
    let s = Session::new(&n, "1s");
    let none = n.dir.path().join("no-manager.sock").display().to_string();
    let hook = hook().display().to_string();
    let mut args = base(&hook, &none);
    args.push("cat");
    let mut run = s.spawn_held(&n, &args);
    assert!(
        eventually(DEADLINE, || answers(&s.socket())
            && node_status(&s.socket()).allocations.len() == 1)
        .is_some(),
        "the run never had its allocation:\n{}",
        log(&s)
    );
    let pid = s.manager_pid().expect("the private manager");
    std::fs::remove_dir_all(s.dir()).unwrap();
    drop(run.stdin.take());
    let o = run.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
            st.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        })
    };
    assert!(
        eventually(DEADLINE, || !alive()).is_some(),
        "the private manager (pid {pid}) is still running with its directory gone"
    );
}
