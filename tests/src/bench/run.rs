//! `tessera run -- true` start-up beside a bare start of `true`: with the
//! node's manager, with the session's private manager already running
//! (warm), and with none (cold: the run starts the private manager). Each
//! round measures a bare start and each case back to back, so a figure is
//! the median of paired differences as well as the median time: what the
//! run adds, with the box's load at that moment in both halves of a pair.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Table;
use crate::sim::SimNode;

/// The program that is `tessera`: the real binary beside this one when it
/// was built (`cargo build --release -p tessera-cli`), else this bench
/// itself, which answers `run` and `manager` as `tessera` does.
fn tessera() -> PathBuf {
    let me = std::env::current_exe().unwrap_or_default();
    let beside = me.with_file_name("tessera");
    if beside.is_file() { beside } else { me }
}

/// Times one run of `c` to its exit; it must succeed.
fn time(c: &mut Command) -> Result<f64, String> {
    let t0 = Instant::now();
    let out = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot start {c:?}: {e}"))?;
    let t = t0.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        return Err(format!(
            "{c:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(t)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Waits until the private manager of `dir` has gone: its socket removed
/// (it holds `users.lock` exclusively from before that), then the lock
/// free (it lets go of it last).
fn wait_private_gone(dir: &Path) -> Result<(), String> {
    if !dir.exists() {
        return Ok(()); // none ever started
    }
    let t0 = Instant::now();
    while dir.join("manager.sock").exists() {
        if t0.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "the private manager in {} never left",
                dir.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let f = tessera_manager::idle::open_users_lock(&dir.join(tessera_manager::idle::USERS_LOCK))
        .map_err(|e| e.to_string())?;
    let held = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e.to_string())?;
    drop(held);
    Ok(())
}

/// The table: `rounds` rounds of bare, system and warm; cold in the first
/// `cold` rounds (each waits for the last private manager to leave first).
pub fn table(rounds: usize, cold: usize) -> Result<Table, String> {
    let node = SimNode::e2e(1, 0x7e5);
    let dir = node.dir.path();
    let hook = crate::hook_library().ok_or("libtessera.so is not built")?;
    let prog = tessera();
    let nvml = crate::sim_nvml_library();

    // The node's manager.
    let sys_state = dir.join("system");
    let sys_sock = sys_state.join("manager.sock");
    let mut manager = node
        .command(&prog)
        .arg("manager")
        .arg("--state-dir")
        .arg(&sys_state)
        .arg("--socket")
        .arg(&sys_sock)
        .arg("--hook-library")
        .arg(&hook)
        .arg("--nvml-library")
        .arg(&nvml)
        .args(["--metrics-addr", "off"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the manager: {e}"))?;
    let t0 = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sys_sock).is_err() {
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = manager.kill();
            return Err("the manager never answered".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }

    let none = dir.join("no-manager.sock");
    let run = |socket: &Path, runtime: &Path, grace: &str| {
        let mut c = node.command(&prog);
        c.arg("run")
            .arg("--socket")
            .arg(socket)
            .arg("--hook-library")
            .arg(&hook)
            .args(["--gpu", "0", "--memory", "1Gi", "--private-grace", grace])
            .args(["--", "true"])
            .env("XDG_RUNTIME_DIR", runtime)
            .env(tessera_client::private::MANAGER_PROGRAM_ENV, &prog);
        c
    };
    let warm_rt = dir.join("warm");
    let cold_rt = dir.join("cold");
    for d in [&warm_rt, &cold_rt] {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    let bare = || {
        let mut c = Command::new("true");
        time(&mut c)
    };
    // The warm manager's first start is not measured; it stays 10 s after
    // the last run, and the rounds follow each other more closely.
    time(&mut run(&none, &warm_rt, "10s"))?;

    let mut rows: Vec<(&str, Vec<f64>, Vec<f64>)> = vec![
        ("bare true", vec![], vec![]),
        ("node's manager", vec![], vec![]),
        ("private manager, warm", vec![], vec![]),
        ("private manager, cold", vec![], vec![]),
    ];
    let result = (|| -> Result<(), String> {
        for r in 0..rounds {
            let b = bare()?;
            rows[0].1.push(b);
            let s = time(&mut run(&sys_sock, &warm_rt, "10s"))?;
            rows[1].1.push(s);
            rows[1].2.push(s - b);
            let w = time(&mut run(&none, &warm_rt, "10s"))?;
            rows[2].1.push(w);
            rows[2].2.push(w - b);
            if r < cold {
                wait_private_gone(&cold_rt.join("tessera"))?;
                let b = bare()?;
                let c = time(&mut run(&none, &cold_rt, "0s"))?;
                rows[3].1.push(c);
                rows[3].2.push(c - b);
            }
        }
        Ok(())
    })();
    let _ = manager.kill();
    let _ = manager.wait();
    result?;
    wait_private_gone(&cold_rt.join("tessera"))?;

    let mut t = Table {
        title: "tessera run -- true: start-up beside a bare start".into(),
        columns: ["case", "runs", "median ms", "added ms (paired median)", "target ms"]
            .map(String::from)
            .to_vec(),
        rows: vec![],
        notes: vec![
            format!(
                "{} (the `tessera` binary: {}); one GPU of the simulated node, --memory 1Gi; \
                 each round: a bare `true`, then each case, so that a pair shares the load of \
                 its moment; cold: no manager runs, the run starts the private manager (which \
                 leaves at once, --private-grace 0s, and is waited out before the next round)",
                // The binary beside the bench was built in the bench's profile.
                match (prog.ends_with("tessera"), cfg!(debug_assertions)) {
                    (true, true) => "debug build",
                    (true, false) => "release build",
                    (false, _) => "bench binary",
                },
                prog.display()
            ),
            "targets (issue 26): node's manager <= 10 ms, warm private manager <= 20 ms; the cold figure is stated, not judged".into(),
        ],
    };
    let targets = ["", "10", "20", ""];
    for ((name, times, added), target) in rows.into_iter().zip(targets) {
        if times.is_empty() {
            continue;
        }
        let n = times.len();
        t.rows.push(vec![
            name.to_owned(),
            n.to_string(),
            format!("{:.1}", median(times)),
            if added.is_empty() {
                "-".into()
            } else {
                format!("{:.1}", median(added))
            },
            target.to_owned(),
        ]);
    }
    Ok(t)
}
