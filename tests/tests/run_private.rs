//! `tessera run` without a system manager, end to end on the simulated
//! node: the first run starts the session's private manager (state under
//! `$XDG_RUNTIME_DIR/tessera`) and says so in one line, limits hold as
//! under a system manager, a second run shares the manager, and the manager
//! stops when the last run ends. Prints the start-up times with a system
//! manager, with a private one started cold, and with one already running.

mod manager_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

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
}

impl Session {
    fn new(n: &SimNode) -> Session {
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
        Session { runtime, program }
    }

    fn socket(&self) -> PathBuf {
        self.runtime.join("tessera/manager.sock")
    }

    fn run(&self, n: &SimNode, args: &[&str]) -> Command {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut c = role_command("cli", &args);
        c.envs(n.env())
            .env("XDG_RUNTIME_DIR", &self.runtime)
            .env(tessera_client::private::MANAGER_PROGRAM_ENV, &self.program)
            .stdin(Stdio::null());
        c
    }

    fn output(&self, n: &SimNode, args: &[&str]) -> Output {
        self.run(n, args).output().expect("run the client")
    }
}

fn answers(socket: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(socket).is_ok()
}

#[test]
fn run_starts_a_private_manager_shares_it_and_stops_it_at_the_end() {
    let n = node();
    let s = Session::new(&n);
    let none = n.dir.path().join("no-manager.sock");
    let none = none.to_str().unwrap();
    let hook = hook().display().to_string();
    let probe = probe_path().display().to_string();
    let half = (GI / 2).to_string();
    let base = [
        "run",
        "--socket",
        none,
        "--hook-library",
        &hook,
        "--gpu",
        "0",
        "--memory",
        "1Gi",
        "--compute",
        "30%",
        "--",
    ];

    // Alone: started, limits enforced, stopped when the run ends.
    let mut args = base.to_vec();
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
        notice[0].contains("no manager on") && notice[0].contains("started this session's"),
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
        !answers(&s.socket()),
        "the private manager outlived its last run"
    );
    assert!(
        s.runtime.join("tessera/state").is_dir(),
        "state not in the runtime dir"
    );

    // Two runs: the second shares the first's manager, which stays until
    // the first ends too.
    let mut args = base.to_vec();
    args.extend([probe.as_str(), "init", "ctx", "pid", "sleep 60000"]);
    let mut first = s
        .run(&n, &args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = lines(&mut first);
    let pid: i32 = field(&read_until(&mut out, |l| l.starts_with("ok pid")), "pid")
        .unwrap()
        .parse()
        .unwrap();
    assert!(answers(&s.socket()));
    let st = node_status(&s.socket());
    assert_eq!(st.allocations.len(), 1);
    let mut args = base.to_vec();
    args.extend(["true"]);
    let t0 = Instant::now();
    let o = s.output(&n, &args);
    let warm = t0.elapsed();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("using this session's private manager"),
        "{}",
        stderr(&o)
    );
    assert!(answers(&s.socket()), "stopped while another run used it");
    assert_eq!(node_status(&s.socket()).allocations.len(), 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert_eq!(first.wait().unwrap().code(), Some(137));
    assert!(
        !answers(&s.socket()),
        "the private manager outlived its last run"
    );

    // Start-up: `tessera run -- true` end to end, cold (starts and stops
    // the private manager) and with a system manager.
    let t0 = Instant::now();
    let o = s.output(&n, &args);
    let cold = t0.elapsed();
    assert!(o.status.success(), "{}", stderr(&o));
    let m = ManagerProc::on(&n);
    let sock = m.socket.to_str().unwrap().to_owned();
    let mut sys_args = args.clone();
    sys_args[2] = &sock;
    let t0 = Instant::now();
    let o = s.output(&n, &sys_args);
    let system = t0.elapsed();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("private manager"), "{}", stderr(&o));
    m.stop();
    println!(
        "tessera run -- true (debug test binary): system manager {system:?}; private manager \
         already running {warm:?}; private manager started and stopped {cold:?}"
    );
}
