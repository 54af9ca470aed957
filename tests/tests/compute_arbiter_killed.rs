//! No manager, no hang: the arbiter runs in a process of its own, is
//! SIGKILLed while two capped allocations share a simulated GPU, and every
//! workload goes on (its gate opens after the gate timeout, once, with a
//! log line) and is still running at the end; a new arbiter then takes the
//! allocations over again and their caps hold once more.
//!
//! The arbiter process is this test executable itself, re-run with only its
//! ignored `role` test selected and `TESSERA_E2E_ROLE=arbiter`; it prints
//! each allocation's longest hold, which bounds how far a measured share
//! can be off.
//!
//! Like `compute_shares`, it asserts what holds whatever the CPU load
//! (caps, progress, the gates opening once and rejoining), not how close a
//! share comes to its target.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_e2e::SimNode;
use tessera_e2e::bench::compute::{
    AllocFiles, AllocSpec, BusyMeter, Scenario, Workload, create_allocation,
};
use tessera_manager::arbiter::{Arbiter, ArbiterConfig, OpenFiles};

const ROLE_ENV: &str = "TESSERA_E2E_ROLE";
const ARGS_ENV: &str = "TESSERA_E2E_ARGS";

/// The arbiter child: arbitrates the allocations whose control and state
/// paths it is given (alternating, separated by newlines), says so, and
/// runs until killed, printing `hold <allocation> <longest hold ns>` lines.
#[test]
#[ignore = "entry point of the arbiter child process that the other test starts"]
fn role() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("arbiter") {
        return;
    }
    let args = std::env::var(ARGS_ENV).unwrap_or_default();
    let paths: Vec<&str> = args.lines().collect();
    let arbiter = Arbiter::new(ArbiterConfig::default()).expect("default configuration");
    for pair in paths.chunks(2) {
        let files = OpenFiles::open(pair[0].as_ref(), pair[1].as_ref()).expect("allocation files");
        arbiter
            .add_allocation(Arc::new(files), 0)
            .expect("arbitrating the allocation");
    }
    println!("arbitrating");
    loop {
        std::thread::sleep(Duration::from_millis(100));
        for s in arbiter.stats() {
            println!("hold {} {}", s.alloc_id, s.longest_hold_ns);
        }
    }
}

/// The arbiter child's latest report: the longest hold per allocation.
type Holds = Arc<Mutex<HashMap<String, u64>>>;

fn start_arbiter(files: &[AllocFiles]) -> (Child, Holds) {
    let args: Vec<String> = files
        .iter()
        .flat_map(|f| {
            [
                f.control.display().to_string(),
                f.state.display().to_string(),
            ]
        })
        .collect();
    let mut child = Command::new(std::env::current_exe().expect("own executable"))
        .args([
            "role",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_ENV, "arbiter")
        .env(ARGS_ENV, args.join("\n"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting the arbiter process");
    let out = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(out).lines();
    let ready = lines.any(|l| l.is_ok_and(|l| l.contains("arbitrating")));
    assert!(ready, "the arbiter process did not start");
    // Keep reading its output, so it never blocks on a full pipe.
    let holds = Holds::default();
    let seen = Arc::clone(&holds);
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            let mut f = l.split(' ');
            if let (Some("hold"), Some(id), Some(ns)) = (f.next(), f.next(), f.next())
                && let Ok(ns) = ns.parse()
            {
                seen.lock().unwrap().insert(id.to_string(), ns);
            }
        }
    });
    (child, holds)
}

/// Each allocation's share (%) of a window ran at most its 30% cap, give or
/// take what a window can cut: the cap's catch-up allowance and a hold at
/// each end (the derivation is `compute_shares`'s `cap_slack_pp`). Every
/// allocation also ran: none was starved.
fn capped(what: &str, got: &[f64], window: Duration, files: &[AllocFiles], holds: &Holds) {
    let catch_up = ArbiterConfig::default().catch_up.as_secs_f64();
    for (i, got) in got.iter().enumerate() {
        let longest = *holds
            .lock()
            .unwrap()
            .get(&files[i].id)
            .expect("the arbiter reports every allocation");
        let slack = (0.3 * catch_up + 2.0 * longest as f64 / 1e9) / window.as_secs_f64() * 100.0;
        assert!(
            *got <= 30.0 + slack,
            "allocation {i} {what}: {got:.2}%, above its 30% cap (+{slack:.2} pp)"
        );
        assert!(*got > 0.0, "allocation {i} {what}: starved");
    }
}

/// How long the test waits for what must happen: a deadline for a hang.
const DEADLINE: Duration = Duration::from_secs(60);

/// Waits until the arbiter child has reported on every allocation: it has
/// taken them all over and ticked.
fn wait_reports(holds: &Holds, files: &[AllocFiles]) {
    let t0 = Instant::now();
    while !files
        .iter()
        .all(|f| holds.lock().unwrap().contains_key(&f.id))
    {
        assert!(t0.elapsed() < DEADLINE, "the arbiter never reported");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Busy % per process and of the GPU over about `span`, and the window
/// they are shares of.
fn measure(node: &SimNode, pids: &[u32], span: Duration) -> (Vec<f64>, f64, Duration) {
    let mut meter = BusyMeter::start(node, 0, pids.to_vec());
    let (per, gpu) = meter.run_for(span);
    (per, gpu, meter.window())
}

#[test]
fn killing_the_arbiter_stops_no_workload_and_a_new_one_takes_over() {
    let node = SimNode::builder().devices(1).build();
    let files: Vec<AllocFiles> = (0..2)
        .map(|i| create_allocation(&node, 0, &format!("killed-{i}"), AllocSpec::guaranteed(30)))
        .collect();
    let (mut arbiter, holds) = start_arbiter(&files);

    let sc = Scenario::new(
        "killed",
        vec![AllocSpec::guaranteed(30); 2],
        Duration::from_millis(1),
        Duration::from_secs(2),
    );
    let log_dir = tempfile::tempdir().expect("a log directory");
    // The workloads outlive every phase of the test, however slowly the
    // machine runs them (a life that ended mid-test would read as
    // "starved"); they are checked to be still running and killed at the
    // end (and by their Drop should an assertion fail first).
    const LIFE_S: f64 = 3600.0;
    let mut workloads: Vec<Workload> = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            Workload::spawn_with(&node, f, 0, &sc, LIFE_S, |c| {
                c.env("TESSERA_LOG", "info").env(
                    "TESSERA_LOG_FILE",
                    log_dir.path().join(format!("hook-{i}.log")),
                );
            })
        })
        .collect();
    for w in &mut workloads {
        assert!(
            w.wait_line("ready", DEADLINE).is_some(),
            "workload did not start: {:?}",
            w.seen
        );
    }
    let pids: Vec<u32> = workloads.iter().map(Workload::pid).collect();

    // Governed: each is held to its 30%, once the arbiter has reported
    // on every allocation (it has ticked).
    wait_reports(&holds, &files);
    let (governed, _, window) = measure(&node, &pids, Duration::from_secs(2));
    capped("governed", &governed, window, &files, &holds);

    // The arbiter dies. After the gate timeout (2 s) the gates open: the
    // workloads run on, sharing the whole GPU. Windows are measured until
    // each allocation is seen to progress (the deadline is for a hang).
    arbiter.kill().expect("SIGKILL the arbiter");
    arbiter.wait().expect("reap the arbiter");
    let killed_at = Instant::now();
    let (free, gpu) = loop {
        let (free, gpu, _) = measure(&node, &pids, Duration::from_secs(2));
        if free.iter().all(|got| *got > 0.0) || killed_at.elapsed() > DEADLINE {
            break (free, gpu);
        }
    };
    let logs = || {
        (0..2)
            .map(|i| {
                std::fs::read_to_string(log_dir.path().join(format!("hook-{i}.log")))
                    .unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    // No hang: both go on without an arbiter (how busy they keep the GPU
    // depends on their getting the CPU; the bench measures it).
    eprintln!(
        "{:?} after the kill: GPU busy {gpu:.2}%, per allocation {free:?}",
        killed_at.elapsed()
    );
    for (i, got) in free.iter().enumerate() {
        assert!(
            *got > 0.0,
            "allocation {i} made no progress without an arbiter: {free:?}\n{}",
            logs()
        );
    }

    // A new arbiter takes the allocations over: the caps hold again.
    let (mut arbiter, holds) = start_arbiter(&files);
    wait_reports(&holds, &files);
    let (again, _, window) = measure(&node, &pids, Duration::from_secs(2));
    capped("rejoined", &again, window, &files, &holds);

    // A process that ran free says it rejoined when it next reaches its
    // gate; wait for that (the deadline is for a hang), then check that no
    // workload stopped along the way: each is still running, with no error.
    let log_of = |i: usize| std::fs::read_to_string(log_dir.path().join(format!("hook-{i}.log")));
    let rejoined_at = Instant::now();
    while !(0..2).all(|i| {
        let log = log_of(i).unwrap_or_default();
        log.matches("arbiter is back").count() >= log.matches("no arbiter heartbeat").count()
    }) && rejoined_at.elapsed() < DEADLINE
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    for (i, w) in workloads.iter_mut().enumerate() {
        let status = w.child.try_wait().expect("polling the workload");
        while w.wait_line("", Duration::ZERO).is_some() {}
        assert!(
            status.is_none(),
            "workload {i} stopped: {status:?}, output {:?}",
            w.seen
        );
        w.child.kill().expect("killing the workload");
        w.child.wait().expect("reaping the workload");
    }
    let _ = arbiter.kill();
    let _ = arbiter.wait();

    // Each process said once that it ran free, and once that it rejoined.
    for i in 0..2 {
        let log = log_of(i).unwrap_or_default();
        let free = log.matches("no arbiter heartbeat").count();
        let back = log.matches("arbiter is back").count();
        // The allocation that held the grant when the arbiter died never
        // waited, so it never needed to run free.
        assert!(free <= 1 && back == free, "process {i}: log\n{log}");
    }
    let total_free: usize = (0..2)
        .map(|i| {
            log_of(i)
                .unwrap_or_default()
                .matches("no arbiter heartbeat")
                .count()
        })
        .sum();
    assert!(total_free >= 1, "no process reported running free");
}
