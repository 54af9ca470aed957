//! Pause and resume (`tessera pause`/`resume`, the manager's
//! PauseAllocation/ResumeAllocation) against the simulated node: while
//! paused a running workload's launches and memory requests wait (they do
//! not fail), its ground-truth busy time does not grow and its memory stays
//! reserved; after resume the waiting calls complete. Paused state and time
//! show in the status and the metrics. Run for an arbitrated share (50 %)
//! and for a whole GPU (which has no arbiter: the shim alone holds it).

mod manager_support;

use std::time::{Duration, Instant};

use clap::Parser;
use manager_support::*;
use tessera_e2e::SimNode;

const GI: u64 = 1 << 30;
const T: Duration = Duration::from_secs(10);
/// How long the test holds a paused call (seen held) before resuming it, by
/// the pause's own count of paused time.
const HOLD: Duration = Duration::from_millis(300);

role_test!();

fn node() -> SimNode {
    SimNode::e2e(1, 0x9a5e)
}

/// Returns once allocation `id`'s paused time, by the manager's own count
/// (which includes the pause in progress), has grown by `hold` since the
/// call: what a held call is then asserted not to have done had that long
/// to happen, measured by the counter the pause keeps rather than by a
/// sleep of the test's.
fn stay_paused(socket: &std::path::Path, id: &str, hold: Duration) {
    let paused_ns = || status_of(socket, id).paused_ns_total;
    let until = paused_ns() + hold.as_nanos() as u64;
    let deadline = Instant::now() + T + hold;
    while paused_ns() < until {
        assert!(Instant::now() < deadline, "the pause's time did not grow");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `tessera pause ID` or `tessera resume ID`, in this process.
fn cli(socket: &std::path::Path, pause: bool, id: &str) -> Result<(), String> {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: tessera_client::pause::PauseArgs,
    }
    let cli = Cli::try_parse_from(["pause", "--socket", socket.to_str().unwrap(), id])
        .map_err(|e| e.to_string())?;
    tessera_client::pause::pause(&cli.args, pause).map_err(|e| e.to_string())
}

fn paused_workload_waits_and_finishes_after_resume(share_ppm: u32) {
    let n = node();
    let m = ManagerProc::on(&n);
    let uuid = n.node().device_info(0).unwrap().uuid;
    let a = create(&m.socket, "held", &uuid, 2 * GI, share_ppm);
    let mut w = governed_probe(&n, &a.control_path, &a.state_path);
    for cmd in ["init", "ctx", "load kernel k 1ms", &format!("alloc {GI}")] {
        let l = w.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    for _ in 0..3 {
        assert!(w.cmd("launch k 5", T).ok);
        assert!(w.cmd("sync", T).ok);
    }
    let pid = w.pid();
    let busy = || n.node().process(pid).expect("probe on the node").busy_ns[0];
    assert!(busy() >= 15_000_000, "the workload ran before the pause");

    // Paused: the next launch waits, the GPU does no work for it.
    let t0 = Instant::now();
    cli(&m.socket, true, "held").unwrap();
    let pause_took = t0.elapsed();
    cli(&m.socket, true, "held").unwrap(); // twice: no change, no error
    let before = busy();
    let sent = Instant::now();
    w.send("launch k 10");
    let control = std::path::Path::new(&a.control_path);
    wait_held_by_pause(pid, control);
    stay_paused(&m.socket, "held", HOLD);
    assert_eq!(busy(), before, "work ran while paused");
    let st = status_of(&m.socket, "held");
    assert!(st.paused);
    assert!(st.paused_ns_total >= HOLD.as_nanos() as u64, "{st:?}");
    assert_eq!(st.devices[0].memory_used_bytes, GI, "memory stays reserved");
    let e = parse_exposition(&scrape(m.metrics)).unwrap();
    let al = [("allocation", "held"), ("gpu", "0")];
    assert_eq!(e.get("tessera_allocation_paused", &al), Some(1.0));

    // Resumed: the launch that waited goes through and runs.
    let t1 = Instant::now();
    cli(&m.socket, false, "held").unwrap();
    let l = w.next(T);
    let resume_took = t1.elapsed();
    assert!(l.ok && l.cmd == "launch", "{}", l.raw);
    assert!(sent.elapsed() >= HOLD, "the launch did not wait");
    assert!(w.cmd("sync", T).ok);
    assert!(busy() >= before + 10_000_000, "the held launch never ran");

    // A memory request waits too, and is granted after the resume.
    cli(&m.socket, true, "held").unwrap();
    let sent = Instant::now();
    w.send("alloc 1048576");
    wait_held_by_pause(pid, control);
    stay_paused(&m.socket, "held", HOLD);
    assert_eq!(
        status_of(&m.socket, "held").devices[0].memory_used_bytes,
        GI
    );
    cli(&m.socket, false, "held").unwrap();
    let l = w.next(T);
    assert!(l.ok && l.cmd == "alloc", "{}", l.raw);
    assert!(sent.elapsed() >= HOLD, "the allocation did not wait");
    // 1 MiB is held (and charged) as a whole 2 MiB device page.
    assert_eq!(
        status_of(&m.socket, "held").devices[0].memory_used_bytes,
        GI + (2 << 20)
    );
    let st = status_of(&m.socket, "held");
    assert!(!st.paused);
    assert!(st.paused_ns_total >= 2 * HOLD.as_nanos() as u64, "{st:?}");
    let e = parse_exposition(&scrape(m.metrics)).unwrap();
    assert_eq!(e.get("tessera_allocation_paused", &al), Some(0.0));
    let secs = e
        .get("tessera_allocation_paused_seconds_total", &al)
        .unwrap();
    assert!(secs >= 2.0 * HOLD.as_secs_f64(), "{secs}");
    // And it goes on as before.
    assert!(w.cmd("launch k 5", T).ok);
    assert!(w.cmd("sync", T).ok);
    println!(
        "share {share_ppm} ppm: tessera pause returned in {pause_took:?}; from tessera resume \
         to the held launch returning {resume_took:?}"
    );

    let e = cli(&m.socket, true, "nope").unwrap_err();
    assert!(e.contains("no allocation"), "{e}");
    w.kill();
    m.stop();
}

#[test]
fn an_arbitrated_allocation_pauses_and_resumes() {
    paused_workload_waits_and_finishes_after_resume(500_000);
}

#[test]
fn a_whole_gpu_pauses_and_resumes() {
    paused_workload_waits_and_finishes_after_resume(1_000_000);
}
