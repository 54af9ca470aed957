//! A hostile tenant against the manager's backstop, end to end on the simulated node
//! with the manager's defaults (enforcement on): the tenant writes its state file (it is
//! mapped read-write into its container) to get a neighbour killed, zeroes its own usage
//! counters to allocate past its limit, and runs processes without the shim in its
//! container (a mount namespace with the control file at the fixed path) to keep more
//! than its limit. The backstop must judge processes by what the kernel says
//! (`manager/src/identity.rs`), never by the state file's words, and allow an allocation
//! its limit plus one fixed tolerance whatever its processes: the neighbour lives, the
//! cheats are stopped in the pass of the sample that shows them and what is left fits,
//! and honest work at its limit (a context with a caching allocator, a process that forks
//! workers, 256 governed processes) is left alone. Every stop is counted in
//! `tessera_backstop_stops_total`, labelled with the GPU, the reason and the owner the
//! manager's record names.
//!
//! Waiting is by the manager's own count of completed passes
//! (`tessera_backstop_passes_total`), never by sleeping: "a minute" of honest work is
//! [`MINUTE`] completed passes, what a minute is at the default 1 s sample interval (the
//! tests sample every 100 ms). Figures are printed (`-- --nocapture`) and quoted in
//! docs/security.md.

mod manager_support;

use std::ffi::CString;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use manager_support::*;
use tessera_e2e::{ProbeChild, SimNode, strip_ansi};
use tessera_proto::manager::v1 as pb;
use tessera_shm::State;

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;
/// How long a probe may take to answer one command: a hang guard, generous for a
/// loaded box.
const T: Duration = Duration::from_secs(60);

role_test!();

fn node(devices: u32) -> SimNode {
    SimNode::e2e(devices, 0xa77)
}

/// The stops counted for the series whose labels include `want`, waiting for the count
/// to reach `at_least` (the counter is bumped just after the kill). The wait is a hang
/// guard ([`DEADLINE`]): under load the pass that counts it can come late.
fn stops(m: &ManagerProc, want: &[(&str, &str)], at_least: f64) -> Option<f64> {
    let mut last = None;
    eventually(DEADLINE, || {
        let e = parse_exposition(&scrape(m.metrics)).expect("a valid exposition");
        last = e.get("tessera_backstop_stops_total", want);
        last.is_some_and(|n| n >= at_least)
    });
    last
}

fn alive(p: &mut ProbeChild) -> bool {
    p.child.try_wait().expect("poll").is_none()
}

/// What a context holds on the simulated node: the simulator's default, what an H200's
/// held (the manager measures it at start-up and the shim charges it).
const CONTEXT: u64 = tessera_sim::node::DEFAULT_CONTEXT_MEMORY;

/// The tolerance the tests' manager runs with (the default).
const TOLERANCE: u64 = tessera_manager::config::DEFAULT_BACKSTOP_TOLERANCE;

/// "A minute" of honest work, in completed backstop passes: a minute at the default
/// 1 s sample interval.
const MINUTE: f64 = 60.0;

/// Backstop passes the manager has completed.
fn passes(m: &ManagerProc) -> f64 {
    let e = parse_exposition(&scrape(m.metrics)).expect("a valid exposition");
    e.get("tessera_backstop_passes_total", &[])
        .expect("tessera_backstop_passes_total is always exposed")
}

/// Waits until the manager has completed `n` passes (generous deadline: the passes come
/// every sample interval whatever the load, each one a little later under it).
fn wait_passes(m: &ManagerProc, n: f64) {
    exposition_at_passes(m, n);
}

/// Waits until the manager has completed `n` passes and returns the exposition that
/// showed it: one consistent snapshot, so what it counts was done by the end of pass `n`
/// (a stop is counted before its pass is).
fn exposition_at_passes(m: &ManagerProc, n: f64) -> Exposition {
    // Up to 3 s a pass (256 processes under four busy ones took 1.5 s); polled once a
    // sample interval, so the scrapes do not load the manager they wait on.
    let deadline = Duration::from_secs(120 + 3 * n as u64);
    let t0 = Instant::now();
    loop {
        let e = parse_exposition(&scrape(m.metrics)).expect("a valid exposition");
        let done = e
            .get("tessera_backstop_passes_total", &[])
            .expect("tessera_backstop_passes_total is always exposed");
        if done >= n {
            return e;
        }
        assert!(
            t0.elapsed() < deadline,
            "the manager did not complete {n} passes in {deadline:?} (at {done}):\n{}",
            m.log()
        );
        std::thread::sleep(SAMPLE);
    }
}

/// Waits until a pass that began after this call has completed: one that saw whatever
/// was on the GPU when this was called.
fn wait_fresh_pass(m: &ManagerProc) {
    // Pass p0 + 1 may have sampled before the call; p0 + 2 begins after it ends.
    let p0 = passes(m);
    wait_passes(m, p0 + 2.0);
}

/// Every stop counted for series whose labels include `want` (all reasons summed).
fn stops_now(m: &ManagerProc, want: &[(&str, &str)]) -> f64 {
    let e = parse_exposition(&scrape(m.metrics)).expect("a valid exposition");
    e.samples
        .iter()
        .filter(|(n, labels, _)| {
            n == "tessera_backstop_stops_total"
                && want
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

/// A probe without the shim in a container of the allocation whose host files are
/// given: a mount namespace of its own, where the allocation's control and state files
/// are bind-mounted at the fixed paths as the device plugin mounts them (over a tmpfs on
/// `/run` of that namespace only: nothing on the host changes). It reaches the simulated
/// driver directly, as a static binary would.
fn container_probe(n: &SimNode, control: &str, state: &str) -> ProbeChild {
    use std::os::unix::process::CommandExt;
    let c = |s: &str| CString::new(s).expect("no NUL in a path");
    let fixed_control = tessera_manager::identity::CONTAINER_CONTROL;
    let fixed_state = std::path::Path::new(fixed_control).with_file_name("state");
    let binds = [
        (c(control), c(fixed_control)),
        (c(state), c(fixed_state.to_str().expect("UTF-8"))),
    ];
    let dirs = [c("/run/tessera"), c("/run/tessera/alloc")];
    let (run, root, tmpfs) = (c("/run"), c("/"), c("tmpfs"));
    // Not root: a user namespace of our own (mapping our ids to themselves) gives the
    // mount namespace its rights; the manager, same user, still reads /proc/<pid>/root.
    let as_root = nix::unistd::geteuid().is_root();
    let uid_map = format!("{0} {0} 1", nix::unistd::geteuid());
    let gid_map = format!("{0} {0} 1", nix::unistd::getegid());
    let files = [
        (c("/proc/self/setgroups"), "deny".to_owned()),
        (c("/proc/self/uid_map"), uid_map),
        (c("/proc/self/gid_map"), gid_map),
    ];
    let mut cmd = n.probe(tessera_e2e::Mode::Dlopen, &[]);
    let setup = move || -> std::io::Result<()> {
        let check = |r: libc::c_int| {
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        };
        let none = std::ptr::null::<libc::c_char>();
        // SAFETY: system calls on NUL-terminated strings made before the fork and owned
        // by this closure; nothing is allocated between fork and exec.
        unsafe {
            if as_root {
                check(libc::unshare(libc::CLONE_NEWNS))?;
            } else {
                check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS))?;
                for (path, text) in &files {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    check(fd)?;
                    let w = libc::write(fd, text.as_ptr().cast(), text.len());
                    libc::close(fd);
                    check(w as libc::c_int)?;
                }
            }
            // Our mounts stay in this namespace.
            check(libc::mount(
                none,
                root.as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                tmpfs.as_ptr(),
                run.as_ptr(),
                tmpfs.as_ptr(),
                0,
                std::ptr::null(),
            ))?;
            for d in &dirs {
                check(libc::mkdir(d.as_ptr(), 0o755))?;
            }
            for (host, fixed) in &binds {
                let fd = libc::open(
                    fixed.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                );
                check(fd)?;
                libc::close(fd);
                check(libc::mount(
                    host.as_ptr(),
                    fixed.as_ptr(),
                    none,
                    libc::MS_BIND,
                    std::ptr::null(),
                ))?;
            }
        }
        Ok(())
    };
    // SAFETY: the closure only makes system calls (above).
    unsafe { cmd.pre_exec(setup) };
    ProbeChild::start(cmd)
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
    // Forged through 30 complete passes (a pass that began before the first write
    // does not count).
    let until = passes(&m) + 31.0;
    let t0 = Instant::now();
    let mut writes = 0u64;
    while !writes.is_multiple_of(64) || passes(&m) < until {
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
        "FIGURE backstop forged pid: {writes} forging writes over {:.1} s (30 passes at a \
         100 ms sample interval), neighbour alive",
        t0.elapsed().as_secs_f64()
    );
    neighbour.kill();
    tenant.kill();
    m.stop();
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
/// limit; by the driver's own accounting it is over limit + slack, and it is stopped by
/// the first pass that samples it so: within two passes of getting over.
///
/// The guarantee is counted in passes, not milliseconds: on a loaded box one pass can
/// take well over a second, and the manager's promise is the pass, not the clock. The
/// delays are printed as figures.
#[test]
fn a_tenant_that_zeroes_its_counters_is_stopped_within_two_passes() {
    let _serial = serial();
    let n = node(1);
    // The driver's own memory per context, as a GPU has it.
    n.node().set_context_memory(CONTEXT);
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
    let slack = TOLERANCE;
    let chunk = 768 * MI;
    let mut over = false;
    let mut admitted = 0u64;
    for _ in 0..8 {
        zero_counters(&state, &slots);
        tenant.send(&format!("alloc {chunk}"));
        // No answer: stopped between the driver's allocation and the reply (a pass can
        // land there); the manager only stops it once the driver holds this chunk.
        let l = tenant.next_or_end(T);
        if let Some(l) = &l {
            assert!(
                l.ok,
                "the shim admitted nothing past the zeroed counters: {}",
                l.raw
            );
        }
        admitted += chunk;
        if admitted + CONTEXT > limit + slack {
            over = true;
            break;
        }
        assert!(
            l.is_some(),
            "the cheat was stopped before it got over its limit + slack:\n{}",
            m.log()
        );
    }
    assert!(over, "the tenant got over its limit + slack");
    let over_at = Instant::now();
    // Passes completed once it is over: pass p_over + 1 may have sampled before that,
    // pass p_over + 2 begins after it and must stop it.
    let p_over = passes(&m);
    let labels = [
        ("gpu", "0"),
        ("reason", "over_limit"),
        ("allocation", "cheat"),
        ("namespace", "team-a"),
        ("pod", "trainer-0"),
        ("container", "main"),
    ];
    // The guarantee: the snapshot that shows pass p_over + 2 done counts the stop (a
    // stop is counted before its pass is), under the owner the manager's record names.
    let e = exposition_at_passes(&m, p_over + 2.0);
    assert_eq!(
        e.get("tessera_backstop_stops_total", &labels),
        Some(1.0),
        "not stopped within two passes of going over (passes {p_over} -> {:?}):\n{}",
        e.get("tessera_backstop_passes_total", &[]),
        strip_ansi(&m.log())
    );
    assert_eq!(
        e.types
            .get("tessera_backstop_stops_total")
            .map(String::as_str),
        Some("counter")
    );
    // SIGKILLed, so it dies; the wait is a hang guard, not a measure.
    let died = eventually(DEADLINE, || !alive(&mut tenant));
    let after_over = over_at.elapsed();
    let p_dead = passes(&m);
    // The manager logs the stop once it has seen the process gone, which
    // under load can come after we saw it: wait for the line, not a moment.
    let _ = eventually(DEADLINE, || m.log().contains("stopped the process"));
    let log = strip_ansi(&m.log());
    assert!(
        died.is_some(),
        "the cheat was signalled but still runs after {DEADLINE:?}:\n{log}"
    );
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
    // Counted once, whatever came after.
    assert_eq!(stops(&m, &labels, 1.0), Some(1.0), "{log}");
    // The stop log line names the pod and container.
    assert!(
        log.lines()
            .any(|l| l.contains("stopped the process") && l.contains("team-a/trainer-0/main")),
        "{log}"
    );
    eprintln!(
        "FIGURE backstop over limit: {:.2} GiB admitted past zeroed counters under a 1 GiB \
         limit (tolerance {:.0} MiB, context {} MiB); stopped {after_sample:.1} ms after the \
         sample that showed it, seen dead {:.0} ms and {} pass(es) after the allocation \
         that went over (sample interval {} ms)",
        admitted as f64 / GI as f64,
        slack as f64 / MI as f64,
        CONTEXT / MI,
        after_over.as_secs_f64() * 1e3,
        p_dead - p_over,
        SAMPLE.as_millis()
    );
    m.stop();
}

/// An honest tenant at exactly its limit, its context charged inside it by the shim (what
/// the driver really holds for it), is within its limit by the driver's count: left alone
/// over many passes.
#[test]
fn an_honest_tenant_at_its_limit_is_left_alone() {
    let _serial = serial();
    let n = node(1);
    n.node().set_context_memory(CONTEXT);
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
    assert!(
        truth <= GI,
        "the driver holds {truth} for a 1 GiB allocation"
    );
    let p0 = passes(&m);
    wait_passes(&m, p0 + 16.0);
    assert!(
        alive(&mut tenant),
        "an honest tenant was stopped:\n{}",
        m.log()
    );
    let l = tenant.cmd("alloc 1", T);
    assert!(!l.ok, "the shim still holds the limit: {}", l.raw);
    eprintln!(
        "FIGURE backstop tolerance: an honest tenant at its 1 GiB limit holds {:.0} MiB by \
         the driver's accounting (context {} MiB charged by the shim + {:.0} MiB allocated); \
         default tolerance {:.0} MiB per allocation and GPU",
        truth as f64 / MI as f64,
        CONTEXT / MI,
        free as f64 / MI as f64,
        TOLERANCE as f64 / MI as f64,
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
    // A hang guard, not a measure: under load the pass that stops it can come late.
    let stopped = eventually(DEADLINE, || !alive(&mut on_shared));
    assert!(
        stopped.is_some(),
        "not stopped on the shared GPU:\n{}",
        m.log()
    );
    let p0 = passes(&m);
    wait_passes(&m, p0 + 11.0);
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
    // Each line says why the process could not be placed: what it maps, what its root
    // has at the fixed control path, its ancestry, the allocation it was compared with.
    let why = log
        .lines()
        .find(|l| l.contains("escapes its GPU allocation") && l.contains("no_shim"))
        .unwrap_or_else(|| panic!("no finding line:\n{log}"));
    for want in [
        "why=",
        "maps ",
        "no /run/tessera/alloc/control in its root",
        "ancestry ",
        "compared with 1 allocation(s): shared control ",
    ] {
        assert!(why.contains(want), "{want:?} not in {why}");
    }
    eprintln!("FIGURE backstop no_shim line: {why}");
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

/// Six processes without the shim in one container of a 1 GiB allocation (the control
/// file at its fixed path), each taking `each`: once the allocation is over its limit
/// plus the tolerance, every member without the shim is a violation, so after one sample
/// and the stop what is left holds at most limit + tolerance (the old per-process slack
/// let five of six keep 900 MiB each). A governed process of another allocation on the
/// same GPU keeps every byte.
fn six_without_the_shim(each: u64) {
    let _serial = serial();
    let n = node(1);
    let m = ManagerProc::on(&n);
    let uuid0 = n.node().device_info(0).unwrap().uuid;
    let limit = GI;
    let crowd = create(&m.socket, "crowd", &uuid0, limit, 500_000);
    let nb = create(&m.socket, "neighbour", &uuid0, 4 * GI, 500_000);
    let mut neighbour = governed_probe(&n, &nb.control_path, &nb.state_path);
    for cmd in ["init", "ctx", &format!("alloc {GI}")] {
        let l = neighbour.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    let neighbour_held = n
        .node()
        .process(neighbour.pid())
        .expect("on the GPU")
        .memory[0];

    let mut six: Vec<ProbeChild> = (0..6)
        .map(|_| container_probe(&n, &crowd.control_path, &crowd.state_path))
        .collect();
    // All six at once, as a tenant would start them.
    for p in &mut six {
        for cmd in ["init", "ctx", &format!("alloc {each}")] {
            p.send(cmd);
        }
    }
    // Each answers its allocation, or is stopped on the way.
    let mut allocated = 0;
    for p in &mut six {
        while let Some(l) = p.next_or_end(T) {
            if l.cmd == "alloc" {
                allocated += u32::from(l.ok);
                break;
            }
            assert!(l.ok, "{}", l.raw);
        }
    }
    // One sample after the last allocation, and its stops.
    wait_fresh_pass(&m);
    let crowd_stops = stops_now(&m, &[("allocation", "crowd")]);
    let log = || strip_ansi(&m.log());
    let dead = |six: &mut [ProbeChild]| {
        six.iter_mut()
            .filter_map(|p| (!alive(p)).then_some(()))
            .count() as f64
    };
    // The stopped are gone (SIGKILL is not instant), and only they.
    // A hang guard: a SIGKILLed process is reaped late on a loaded box.
    let settled = eventually(DEADLINE, || dead(&mut six) >= crowd_stops);
    assert!(
        settled.is_some(),
        "stopped processes still alive:\n{}",
        log()
    );
    assert_eq!(dead(&mut six), crowd_stops, "{}", log());
    let mut left = 0u64;
    let mut survivors = 0;
    for p in &mut six {
        if alive(p) {
            survivors += 1;
            left += n.node().process(p.pid()).map_or(0, |u| u.memory[0]);
        }
    }
    assert!(
        left <= limit + TOLERANCE,
        "{survivors} processes of a 1 GiB allocation still hold {left} bytes (tolerance \
         {TOLERANCE}):\n{}",
        log()
    );
    assert!(crowd_stops >= 1.0, "{}", log());
    // Those without the shim are stopped as such.
    let no_shim = [("allocation", "crowd"), ("reason", "over_limit_no_shim")];
    assert_eq!(stops_now(&m, &no_shim), crowd_stops, "{}", log());
    let e = parse_exposition(&scrape(m.metrics)).unwrap();
    let stopped_bytes: f64 = e
        .samples
        .iter()
        .filter(|(n, l, _)| {
            n == "tessera_backstop_stopped_bytes_total"
                && l.get("allocation").map(String::as_str) == Some("crowd")
        })
        .map(|(_, _, v)| v)
        .sum();
    assert!(
        stopped_bytes >= crowd_stops * each as f64,
        "{stopped_bytes}"
    );
    // The log says how far over the allocation was and what was stopped.
    let over_line = log()
        .lines()
        .find(|l| l.contains("allocation over its memory limit") && l.contains("crowd"))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no line for the allocation over its limit:\n{}", log()));
    let over_by: u64 = field(&over_line, "over_by_bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{over_line}"));
    assert!(over_by > TOLERANCE, "{over_line}");
    assert!(over_line.contains("stopping="), "{over_line}");

    // The neighbour: alive, every byte still its own, never stopped, within its limit.
    assert!(
        alive(&mut neighbour),
        "the neighbour was stopped:\n{}",
        log()
    );
    assert_eq!(
        n.node()
            .process(neighbour.pid())
            .expect("on the GPU")
            .memory[0],
        neighbour_held
    );
    assert_eq!(stops_now(&m, &[("allocation", "neighbour")]), 0.0);
    let l = neighbour.cmd("meminfo", T);
    assert!(l.ok, "the neighbour still works: {}", l.raw);
    let e = parse_exposition(&scrape(m.metrics)).unwrap();
    let nb_labels = [("allocation", "neighbour")];
    assert_eq!(
        e.get("tessera_backstop_over_limit_bytes", &nb_labels),
        Some(0.0)
    );
    assert_eq!(
        e.get("tessera_backstop_held_bytes", &nb_labels),
        Some(neighbour_held as f64)
    );
    eprintln!(
        "FIGURE backstop six without the shim: {} MiB each on a 1 GiB allocation; {allocated} \
         got their memory, {crowd_stops} stopped (the first pass that saw it {:.0} MiB over), \
         {survivors} left holding {:.0} MiB (limit + tolerance {:.0} MiB); neighbour kept \
         {:.0} MiB",
        each / MI,
        over_by as f64 / MI as f64,
        left as f64 / MI as f64,
        (limit + TOLERANCE) as f64 / MI as f64,
        neighbour_held as f64 / MI as f64,
    );
    neighbour.kill();
    m.stop();
}

#[test]
fn six_processes_without_the_shim_at_900_mib_keep_at_most_the_limit() {
    six_without_the_shim(900 * MI);
}

#[test]
fn six_processes_without_the_shim_at_1_5_gib_keep_at_most_the_limit() {
    six_without_the_shim(3 * GI / 2);
}

/// A training process as PyTorch runs one, under the shim: a context (the driver holds
/// [`CONTEXT`] for it; the shim charges it inside the limit), then a caching allocator that
/// takes 2 MiB blocks and 20 MiB segments until the limit refuses one, a cuBLAS-style
/// workspace from the stream-ordered pool, and frees and refills its segments all the
/// while. A minute of passes, never a stop.
#[test]
fn a_pytorch_style_process_at_its_limit_runs_a_minute_without_a_stop() {
    let _serial = serial();
    let n = node(1);
    n.node().set_context_memory(CONTEXT);
    let m = ManagerProc::on(&n);
    let uuid0 = n.node().device_info(0).unwrap().uuid;
    let a = create(&m.socket, "trainer", &uuid0, 2 * GI, 1_000_000);
    let mut p = governed_probe(&n, &a.control_path, &a.state_path);
    for cmd in ["init", "ctx", "alloc 33554432 async"] {
        let l = p.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    // The small pool: a few 2 MiB blocks.
    for _ in 0..8 {
        let l = p.cmd("alloc 2097152", T);
        assert!(l.ok, "{}", l.raw);
    }
    // Large segments until the limit refuses one (the allocator then frees its cache
    // and retries, as below).
    let mut segments = Vec::new();
    let fill = |p: &mut ProbeChild, segments: &mut Vec<u64>| loop {
        let l = p.cmd("alloc 20971520", T);
        if !l.ok {
            l.assert_refused("CUDA_ERROR_OUT_OF_MEMORY");
            return;
        }
        segments.push(l.u64("h"));
    };
    fill(&mut p, &mut segments);
    let at_limit = n.node().process(p.pid()).expect("on the GPU").memory[0];
    assert!(
        at_limit > 2 * GI - 20 * MI && at_limit <= 2 * GI,
        "the driver holds {at_limit} for a process at its 2 GiB limit"
    );
    let until = passes(&m) + MINUTE;
    let mut cycles = 0;
    // At most 600 cycles (the probe keeps 4096 handles), then the passes alone.
    while cycles < 600 && passes(&m) < until {
        // Free a few segments, refill to the limit.
        for h in segments.split_off(segments.len().saturating_sub(4)) {
            let l = p.cmd(&format!("free {h}"), T);
            assert!(l.ok, "{}", l.raw);
        }
        fill(&mut p, &mut segments);
        let l = p.cmd("sleep 20", T);
        assert!(l.ok, "{}", l.raw);
        cycles += 1;
        assert!(alive(&mut p), "stopped:\n{}", m.log());
    }
    wait_passes(&m, until);
    assert!(alive(&mut p), "stopped:\n{}", m.log());
    let log = strip_ansi(&m.log());
    assert!(!log.contains("stopped the process"), "{log}");
    assert_eq!(stops_now(&m, &[]), 0.0);
    eprintln!(
        "FIGURE backstop honest PyTorch-style process: {:.0} MiB by the driver's count at a \
         2 GiB limit (context {} MiB), {cycles} free/refill cycles over {MINUTE} passes, no stop",
        at_limit as f64 / MI as f64,
        CONTEXT / MI
    );
    p.kill();
    m.stop();
}

/// A launcher (no CUDA of its own) forks four GPU workers, each of which joins the
/// allocation with its own context and allocates until the limit refuses; each worker
/// then forks two data-loader children that inherit its context and the allocation's
/// mappings (they cannot use the context: the driver refuses a forked child). All twelve
/// run a minute of passes at the limit without a stop.
const FORKING: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <sys/wait.h>
#include "cuda_abi.h"
/* Blocks until the launcher's stdin (inherited by all) reaches its end. */
static void hold(void) {
    char c;
    while (read(0, &c, 1) > 0) {}
}
static void worker(int ready, int go) {
    CUcontext ctx;
    CUdeviceptr p;
    char c;
    int r = cuInit(0);
    if (!r) r = cuDevicePrimaryCtxRetain(&ctx, 0);
    if (!r) r = cuCtxSetCurrent(ctx);
    if (r) { printf("worker %d setup %d\n", getpid(), r); fflush(stdout); _exit(1); }
    /* Every worker has its context before any fills the limit. */
    if (write(ready, "r", 1) != 1) _exit(1);
    while (read(go, &c, 1) > 0) {}
    size_t got = 0;
    while (cuMemAlloc_v2(&p, 16 << 20) == 0) got += 16 << 20;
    for (int i = 0; i < 2; i++) {
        if (fork() == 0) {
            /* A data loader: the parent's context is not its own. */
            int a = cuMemAlloc_v2(&p, 1 << 20);
            printf("loader %d alloc %d\n", getpid(), a);
            fflush(stdout);
            hold();
            _exit(0);
        }
    }
    printf("worker %d bytes %zu\n", getpid(), got);
    fflush(stdout);
    hold();
    while (wait(NULL) > 0) {}
    _exit(0);
}
int main(void) {
    int ready[2], go[2];
    char c;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (pipe(ready) || pipe(go)) return 1;
    for (int i = 0; i < 4; i++) {
        if (fork() == 0) {
            close(go[1]);
            worker(ready[1], go[0]);
        }
    }
    for (int i = 0; i < 4; i++) {
        if (read(ready[0], &c, 1) != 1) return 1;
    }
    close(go[1]);
    printf("launcher %d\n", getpid());
    hold();
    while (wait(NULL) > 0) {}
    return 0;
}
"#;

/// `pid` exists and is not a zombie.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rfind(')')
            .and_then(|i| s[i + 1..].split_ascii_whitespace().next())
            .is_some_and(|st| st != "Z" && st != "X")
    })
}

#[test]
fn a_process_that_forks_workers_runs_a_minute_at_its_limit_without_a_stop() {
    let _serial = serial();
    let n = node(1);
    n.node().set_context_memory(CONTEXT);
    let m = ManagerProc::on(&n);
    let uuid0 = n.node().device_info(0).unwrap().uuid;
    // Four contexts and room for each worker to allocate.
    let limit = 4 * CONTEXT + 2 * GI;
    let a = create(&m.socket, "workers", &uuid0, limit, 1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("forking");
    let lib = format!("-L{}", tessera_e2e::sim_lib_dir().dir.display());
    tessera_e2e::cc_text(FORKING, &exe, &[&lib, "-lcuda"]).expect("compiles");
    let mut c = n.command(&exe);
    c.env("LD_PRELOAD", hook())
        .env("TESSERA_CONTROL", &a.control_path)
        .env("TESSERA_STATE", &a.state_path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut launcher = c.spawn().expect("start the launcher");
    let mut out = lines(&mut launcher);
    let (mut pids, mut workers, mut loaders, mut held) = (Vec::new(), 0, 0, 0u64);
    while workers < 4 || loaders < 8 || pids.len() < 13 {
        let l = read_until(&mut out, |_| true);
        let w: Vec<&str> = l.split_whitespace().collect();
        let pid: u32 = w[1].parse().expect("a pid");
        pids.push(pid);
        match w[0] {
            "worker" => {
                assert_eq!(w[2], "bytes", "{l}");
                held += w[3].parse::<u64>().unwrap();
                workers += 1;
            }
            // The driver refuses a forked child (CUDA_ERROR_NOT_INITIALIZED), and the
            // shim with it.
            "loader" => {
                assert_eq!(w[3], "3", "{l}");
                loaders += 1;
            }
            "launcher" => {}
            _ => panic!("{l}"),
        }
    }
    // Four contexts and what the workers took: within 16 MiB per worker of the limit.
    let truth = n.node().memory_used(0);
    assert!(
        truth <= limit && truth + 4 * 16 * MI > limit,
        "the driver holds {truth} for workers at a {limit} limit"
    );
    let p0 = passes(&m);
    wait_passes(&m, p0 + MINUTE);
    for pid in &pids {
        assert!(running(*pid), "{pid} was stopped:\n{}", m.log());
    }
    let log = strip_ansi(&m.log());
    assert!(!log.contains("stopped the process"), "{log}");
    assert_eq!(stops_now(&m, &[]), 0.0);
    eprintln!(
        "FIGURE backstop forking workers: 4 GPU workers ({:.0} MiB allocated + 4 contexts \
         of {} MiB = {:.0} MiB by the driver's count, limit {} MiB) and 8 forked loaders, \
         {MINUTE} passes, no stop",
        held as f64 / MI as f64,
        CONTEXT / MI,
        truth as f64 / MI as f64,
        limit / MI
    );
    drop(launcher.stdin.take());
    let status = launcher.wait().expect("the launcher ends");
    assert!(status.success(), "{status}");
    m.stop();
}

/// 256 governed processes of one allocation, each with its context (8 MiB on this node,
/// charged as such) and 4 MiB, fill its 3 GiB limit exactly; a minute of passes, never
/// a stop, and by the driver's count the allocation holds exactly its limit.
#[test]
fn two_hundred_fifty_six_governed_processes_at_their_limit_run_a_minute_without_a_stop() {
    let _serial = serial();
    const N: usize = 256;
    let ctx = 8 * MI;
    let each = 4 * MI;
    let n = node(1);
    n.node().set_context_memory(ctx);
    let m = ManagerProc::start(&n, &n.dir.path().join("m"), &["--context-overhead", "8Mi"]);
    let uuid0 = n.node().device_info(0).unwrap().uuid;
    let limit = N as u64 * (ctx + each);
    let a = create(&m.socket, "many", &uuid0, limit, 1_000_000);
    let mut procs: Vec<ProbeChild> = Vec::with_capacity(N);
    for _ in 0..N {
        let mut p = governed_probe(&n, &a.control_path, &a.state_path);
        for cmd in ["init", "ctx", &format!("alloc {each}")] {
            p.send(cmd);
        }
        procs.push(p);
    }
    for p in &mut procs {
        for cmd in ["init", "ctx", "alloc"] {
            let l = p.wait_for(cmd, Duration::from_secs(60));
            assert!(l.ok, "{}", l.raw);
        }
    }
    assert_eq!(n.node().memory_used(0), limit);
    let l = procs[0].cmd("alloc 1", T);
    assert!(!l.ok, "at the limit: {}", l.raw);
    let p0 = passes(&m);
    let t0 = Instant::now();
    wait_passes(&m, p0 + MINUTE);
    let took = t0.elapsed();
    for p in &mut procs {
        assert!(alive(p), "{} was stopped:\n{}", p.pid(), m.log());
    }
    let log = strip_ansi(&m.log());
    assert!(!log.contains("stopped the process"), "{log}");
    assert_eq!(stops_now(&m, &[]), 0.0);
    let e = parse_exposition(&scrape(m.metrics)).unwrap();
    let al = [("allocation", "many")];
    assert_eq!(
        e.get("tessera_backstop_held_bytes", &al),
        Some(limit as f64)
    );
    assert_eq!(e.get("tessera_backstop_over_limit_bytes", &al), Some(0.0));
    eprintln!(
        "FIGURE backstop 256 governed processes: {:.0} MiB held = the limit, {MINUTE} passes \
         in {:.1} s, no stop",
        limit as f64 / MI as f64,
        took.as_secs_f64()
    );
    for p in &mut procs {
        p.kill();
    }
    m.stop();
}
