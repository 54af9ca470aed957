//! A hostile tenant against the manager's backstop, end to end on the simulated node
//! with the manager's defaults (enforcement on): the tenant writes its state file (it is
//! mapped read-write into its container) to get a neighbour killed, and zeroes its own
//! usage counters to allocate past its limit. The backstop must judge processes by what
//! the kernel says (`manager/src/identity.rs`), never by the state file's words: the
//! neighbour lives, the cheat is stopped within a second of the sample that shows it, and
//! an honest tenant at its limit, with the driver's own per-context memory on top, is left
//! alone. Every stop is counted in `tessera_backstop_stops_total`, labelled with the GPU,
//! the reason and the owner the manager's record names. Figures are printed (`-- --nocapture`) and quoted in docs/security.md.

mod manager_support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use manager_support::*;
use tessera_e2e::{ProbeChild, SimNode};
use tessera_proto::manager::v1 as pb;
use tessera_shm::State;

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;
/// How long a probe may take to answer one command.
const T: Duration = Duration::from_secs(10);

role_test!();

fn node(devices: u32) -> SimNode {
    SimNode::e2e(devices, 0xa77)
}

/// The stops counted for the series whose labels include `want`, waiting up to 2 s for
/// the count to reach `at_least` (the counter is bumped just after the kill).
fn stops(m: &ManagerProc, want: &[(&str, &str)], at_least: f64) -> Option<f64> {
    let mut last = None;
    eventually(Duration::from_secs(2), || {
        let e = parse_exposition(&scrape(m.metrics)).expect("a valid exposition");
        last = e.get("tessera_backstop_stops_total", want);
        last.is_some_and(|n| n >= at_least)
    });
    last
}

fn alive(p: &mut ProbeChild) -> bool {
    p.child.try_wait().expect("poll").is_none()
}

/// `(pidns inode, start time)` of a process, as /proc shows them.
fn identity_of(pid: u32) -> (u64, u64) {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).expect("ns link");
    let ns = link
        .to_str()
        .and_then(|l| l.strip_prefix("pid:["))
        .and_then(|l| l.strip_suffix(']'))
        .and_then(|l| l.parse().ok())
        .expect("ns inode");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = &stat[stat.rfind(')').expect("comm") + 1..];
    let start = rest
        .split_ascii_whitespace()
        .nth(22 - 3)
        .and_then(|s| s.parse().ok())
        .expect("start time");
    (ns, start)
}

/// The tenant (allocation `a`, GPU 1) rewrites its slot's pid words to its neighbour's
/// (allocation `b`, GPU 0) in a loop. Judged by those words, the neighbour would be a
/// process of `a` on a GPU `a` does not have (`other_gpu`) and be killed; it must live.
#[test]
fn a_forged_host_pid_does_not_get_a_neighbour_killed() {
    let _serial = serial();
    let n = node(2);
    let m = ManagerProc::on(&n);
    let uuid0 = n.node().device_info(0).unwrap().uuid;
    let uuid1 = n.node().device_info(1).unwrap().uuid;
    let a = create(&m.socket, "tenant", &uuid1, 4 * GI, 1_000_000);
    let b = create(&m.socket, "neighbour", &uuid0, 4 * GI, 1_000_000);

    let mut neighbour = governed_probe(&n, &b.control_path, &b.state_path);
    for cmd in ["init", "ctx", "alloc 268435456"] {
        let l = neighbour.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    let victim = neighbour.pid();
    let mut tenant = governed_probe(&n, &a.control_path, &a.state_path);
    let l = tenant.cmd("init", T);
    assert!(l.ok, "{}", l.raw);

    let state = State::open(std::path::Path::new(&a.state_path), "tenant").expect("state");
    let slot = eventually(T, || !state.processes(1).is_empty()).map(|_| state.processes(1)[0].slot);
    let slot = slot.expect("the tenant joined");
    let (ns, start) = identity_of(victim);
    let forge_for = Duration::from_secs(3);
    let t0 = Instant::now();
    let mut writes = 0u64;
    while t0.elapsed() < forge_for {
        let s = state.slot(slot);
        s.host_pid.store(victim, Ordering::Release);
        s.pid.store(victim, Ordering::Release);
        s.pidns.store(ns, Ordering::Release);
        s.start_time.store(start, Ordering::Release);
        writes += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        alive(&mut neighbour),
        "the neighbour was killed:\n{}",
        m.log()
    );
    let l = neighbour.cmd("meminfo", T);
    assert!(l.ok, "the neighbour still works: {}", l.raw);
    assert!(
        alive(&mut tenant),
        "the tenant did nothing over its limit:\n{}",
        m.log()
    );
    let log = strip_ansi(&m.log());
    assert!(!log.contains("stopped the process"), "{log}");
    eprintln!(
        "FIGURE backstop forged pid: {writes} forging writes over {:.1} s at a 100 ms sample \
         interval (~30 samples), neighbour alive",
        forge_for.as_secs_f64()
    );
    neighbour.kill();
    tenant.kill();
    m.stop();
}

/// The log without terminal colour codes.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Zeroes the allocation's usage counters, as the tenant can.
fn zero_counters(state: &State, slots: &[usize]) {
    state.raw().devices[0].reserved.store(0, Ordering::Release);
    for &s in slots {
        state.slot(s).devices[0].usage.store(0, Ordering::Release);
    }
}

/// The sample interval the tests' manager runs at (`manager_args`).
const SAMPLE: Duration = Duration::from_millis(100);

/// The tenant zeroes its counters before each allocation, so the shim admits past the
/// limit; by the driver's own accounting it is over limit + slack, and it is stopped
/// within 1 s of the sample that shows it.
#[test]
fn a_tenant_that_zeroes_its_counters_is_stopped_within_a_second() {
    let _serial = serial();
    let n = node(1);
    // The driver's own memory per context, as a GPU has it.
    n.node().set_context_memory(300 * MI);
    let m = ManagerProc::on(&n);
    let uuid0 = n.node().device_info(0).unwrap().uuid;
    let limit = GI;
    let a = create(&m.socket, "cheat", &uuid0, limit, 1_000_000);
    let owner = pb::SetAllocationOwnerRequest {
        id: "cheat".into(),
        namespace: "team-a".into(),
        pod: "trainer-0".into(),
        container: "main".into(),
        ..Default::default()
    };
    with_client(&m.socket, async |c| c.set_allocation_owner(owner).await).expect("owner");
    // Nothing stopped yet: no series, and so no family.
    assert!(!scrape(m.metrics).contains("tessera_backstop_stops_total"));
    let mut tenant = governed_probe(&n, &a.control_path, &a.state_path);
    for cmd in ["init", "ctx"] {
        let l = tenant.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    let state = State::open(std::path::Path::new(&a.state_path), "cheat").expect("state");
    let slots: Vec<usize> = state.processes(1).iter().map(|p| p.slot).collect();
    let slack = tessera_manager::config::DEFAULT_BACKSTOP_SLACK;
    let chunk = 768 * MI;
    let mut over_at = None;
    let mut admitted = 0u64;
    for _ in 0..8 {
        zero_counters(&state, &slots);
        tenant.send(&format!("alloc {chunk}"));
        let l = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tenant.next(T))) {
            Ok(l) => l,
            Err(_) => break, // killed while allocating
        };
        assert!(
            l.ok,
            "the shim admitted nothing past the zeroed counters: {}",
            l.raw
        );
        admitted += chunk;
        if over_at.is_none() && admitted + 300 * MI > limit + slack {
            over_at = Some(Instant::now());
            break;
        }
    }
    let over_at = over_at.expect("the tenant got over its limit + slack");
    let died = eventually(Duration::from_secs(5), || !alive(&mut tenant));
    let log = strip_ansi(&m.log());
    let died = died.unwrap_or_else(|| panic!("the cheat was not stopped in 5 s:\n{log}"));
    let after_over = over_at.elapsed().min(died);
    let after_sample: f64 = log
        .lines()
        .find(|l| l.contains("stopped the process"))
        .and_then(|l| field(l, "after_sample_ms"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no stop line naming the delay:\n{log}"));
    assert!(
        log.contains("reason=over_limit") || log.contains("over_limit"),
        "{log}"
    );
    // Counted once, under the owner the manager's record names.
    let labels = [
        ("gpu", "0"),
        ("reason", "over_limit"),
        ("allocation", "cheat"),
        ("namespace", "team-a"),
        ("pod", "trainer-0"),
        ("container", "main"),
    ];
    assert_eq!(stops(&m, &labels, 1.0), Some(1.0), "{log}");
    let e = parse_exposition(&scrape(m.metrics)).unwrap();
    assert_eq!(
        e.types
            .get("tessera_backstop_stops_total")
            .map(String::as_str),
        Some("counter")
    );
    // The stop log line names the pod and container.
    assert!(
        log.lines()
            .any(|l| l.contains("stopped the process") && l.contains("team-a/trainer-0/main")),
        "{log}"
    );
    // The guarantee: stopped within 1 s of the sample that showed it.
    assert!(
        after_sample < 1000.0,
        "stopped {after_sample} ms after the sample"
    );
    // And so within a sample interval and a second of getting over.
    assert!(
        after_over < SAMPLE + Duration::from_secs(1),
        "stopped {after_over:?} after going over"
    );
    eprintln!(
        "FIGURE backstop over limit: {:.2} GiB admitted past zeroed counters under a 1 GiB \
         limit (slack {:.0} MiB, context 300 MiB); stopped {after_sample:.1} ms after the \
         sample that showed it, {:.0} ms after the allocation that went over (sample \
         interval {} ms)",
        admitted as f64 / GI as f64,
        slack as f64 / MI as f64,
        after_over.as_secs_f64() * 1e3,
        SAMPLE.as_millis()
    );
    m.stop();
}

/// An honest tenant at exactly its limit, with the driver's per-context memory on top in
/// NVML's view, is within the default slack: left alone over many samples.
#[test]
fn an_honest_tenant_at_its_limit_is_left_alone() {
    let _serial = serial();
    let n = node(1);
    n.node().set_context_memory(300 * MI);
    let m = ManagerProc::on(&n);
    let uuid0 = n.node().device_info(0).unwrap().uuid;
    let a = create(&m.socket, "honest", &uuid0, GI, 1_000_000);
    let mut tenant = governed_probe(&n, &a.control_path, &a.state_path);
    for cmd in ["init", "ctx"] {
        let l = tenant.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    // Everything the shim lets it have (the manager may charge contexts itself).
    let mi = tenant.cmd("meminfo", T);
    let free: u64 = field(&mi.raw, "free")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{}", mi.raw));
    let l = tenant.cmd(&format!("alloc {free}"), T);
    assert!(l.ok, "{}", l.raw);
    let truth = n.node().memory_used(0);
    std::thread::sleep(SAMPLE * 15);
    assert!(
        alive(&mut tenant),
        "an honest tenant was stopped:\n{}",
        m.log()
    );
    let l = tenant.cmd("alloc 1", T);
    assert!(!l.ok, "the shim still holds the limit: {}", l.raw);
    eprintln!(
        "FIGURE backstop slack: an honest tenant at its 1 GiB limit holds {:.0} MiB by the \
         driver's accounting ({:.0} MiB allocated through the shim); default slack {:.0} MiB",
        truth as f64 / MI as f64,
        free as f64 / MI as f64,
        tessera_manager::config::DEFAULT_BACKSTOP_SLACK as f64 / MI as f64,
    );
    tenant.kill();
    m.stop();
}

/// A process outside every allocation (no shim, no mount) on a GPU Tessera shares takes
/// from the tenants there and is stopped; on a GPU no allocation uses (a whole GPU
/// handed out by another device plugin) it is only reported.
#[test]
fn a_process_outside_every_allocation_is_stopped_only_on_a_shared_gpu() {
    let _serial = serial();
    let n = node(2);
    let m = ManagerProc::on(&n);
    let uuid0 = n.node().device_info(0).unwrap().uuid;
    create(&m.socket, "shared", &uuid0, 4 * GI, 1_000_000);
    let stray = |device: &str| {
        let mut c = n.probe(tessera_e2e::Mode::Dlopen, &[]);
        c.env("CUDA_VISIBLE_DEVICES", device);
        let mut p = ProbeChild::start(c);
        for cmd in ["init", "ctx", "alloc 1048576"] {
            let l = p.cmd(cmd, T);
            assert!(l.ok, "{}", l.raw);
        }
        p
    };
    let mut on_shared = stray("0");
    let mut on_whole = stray("1");
    let stopped = eventually(Duration::from_secs(3), || !alive(&mut on_shared));
    assert!(
        stopped.is_some(),
        "not stopped on the shared GPU:\n{}",
        m.log()
    );
    std::thread::sleep(SAMPLE * 10);
    assert!(
        alive(&mut on_whole),
        "stopped on an unshared GPU:\n{}",
        m.log()
    );
    let log = strip_ansi(&m.log());
    assert!(
        log.contains("no_shim"),
        "the unshared GPU's process is still reported:\n{log}"
    );
    // The stop is counted on the shared GPU, with no owner; nothing on the other.
    let stray = [("gpu", "0"), ("reason", "no_shim"), ("allocation", "")];
    assert_eq!(stops(&m, &stray, 1.0), Some(1.0), "{log}");
    let e = parse_exposition(&scrape(m.metrics)).unwrap();
    assert_eq!(
        e.get("tessera_backstop_stops_total", &[("gpu", "1")]),
        None,
        "{:?}",
        e.samples
    );
    on_whole.kill();
    m.stop();
}
