//! The manager against the simulated node, end to end: the manager, the
//! clients and the workloads are separate processes; workloads run the
//! probe under the real shim; the simulated driver is the ground truth.

mod manager_support;

use std::time::{Duration, Instant};

use manager_support::*;
use tessera_e2e::{Mode, SimNode};
use tessera_proto::manager::v1 as pb;

const GI: u64 = 1 << 30;

role_test!();

/// How long a probe may take to answer one command.
const T: Duration = Duration::from_secs(10);

fn node(devices: u32) -> SimNode {
    SimNode::e2e(devices, 0xe2e)
}

#[test]
fn the_inventory_is_the_simulated_configuration() {
    let _serial = serial();
    let n = node(3);
    let m = ManagerProc::on(&n);
    let st = node_status(&m.socket);
    assert_eq!(st.hostname, "e2e-node");
    assert!(!st.driver_version.is_empty());
    assert_eq!(st.gpus.len(), 3);
    for (i, g) in st.gpus.iter().enumerate() {
        let want = n.node().device_info(i as u32).unwrap();
        assert_eq!(g.index, i as u32);
        assert_eq!(g.uuid, want.uuid);
        assert_eq!(g.name, "E2E Simulated GPU");
        assert_eq!(g.memory_total_bytes, 16 * GI);
        assert_eq!(g.pci_bus_id, want.pci_bus_id());
        assert_eq!(g.sm_count, 100, "from the CUDA driver beside NVML");
        assert_eq!(
            (g.compute_capability_major, g.compute_capability_minor),
            (8, 6)
        );
        assert!(g.healthy, "{}", g.unhealthy_reason);
    }

    // The same through `tessera status`, as JSON and as a table.
    let out = client(
        &n,
        &["status", "--socket", m.socket.to_str().unwrap(), "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&role_stdout(&out)).expect("status JSON");
    assert_eq!(v["gpus"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["gpus"][2]["uuid"], st.gpus[2].uuid);
    assert_eq!(v["gpus"][2]["compute_capability"], "8.6");
    let out = client(&n, &["status", "--socket", m.socket.to_str().unwrap()]);
    let table = role_stdout(&out);
    assert!(table.contains("Tessera on e2e-node"), "{table}");
    assert_eq!(
        table
            .lines()
            .filter(|l| l.contains("E2E Simulated GPU"))
            .count(),
        3,
        "{table}"
    );
    m.stop();
}

#[test]
fn allocations_usage_and_metrics_after_known_work() {
    let _serial = serial();
    let n = node(2);
    // Report only: this test reads the backstop's metric for a stray it leaves running.
    let m = ManagerProc::start(&n, &n.dir.path().join("m"), &["--backstop-kill", "false"]);
    let uuid0 = n.node().device_info(0).unwrap().uuid;
    // The node's slice count, as the device plugin publishes it beside the socket.
    std::fs::write(
        m.socket.with_file_name("slices.json"),
        format!(r#"{{"gpus": {{"{uuid0}": 4}}}}"#),
    )
    .unwrap();
    let a = create(&m.socket, "work", &uuid0, 4 * GI, 500_000);

    // A governed workload takes 1 GiB and holds it.
    let mut w = governed_probe(&n, &a.control_path, &a.state_path);
    for cmd in ["init", "ctx", &format!("alloc {GI}")] {
        let l = w.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    let pid = w.pid();

    let seen = eventually(DEADLINE, || {
        let st = node_status(&m.socket);
        let al = &st.allocations[0];
        al.devices[0].memory_used_bytes == GI
            && al.processes.len() == 1
            && al.processes[0].host_pid == pid
    });
    assert!(seen.is_some(), "{:?}", node_status(&m.socket).allocations);

    // A workload without the shim: the backstop reports it.
    let mut stray = n.spawn(
        Mode::Dlopen,
        &["init", "ctx", "alloc 1048576", "pid", "sleep 60000"],
    );
    stray.wait_for("pid", T);

    let mut text = String::new();
    let reported = eventually(DEADLINE, || {
        text = scrape(m.metrics);
        let e = parse_exposition(&text).expect("valid exposition");
        e.get(
            "tessera_ungoverned_processes",
            &[("gpu", "0"), ("reason", "no_shim")],
        ) == Some(1.0)
    });
    assert!(reported.is_some(), "stray process not reported:\n{text}");
    let e = parse_exposition(&text).unwrap();
    for (name, kind) in [
        ("tessera_gpu_memory_used_bytes", "gauge"),
        ("tessera_allocation_wait_seconds_total", "counter"),
        ("tessera_allocation_oom_refused_total", "counter"),
    ] {
        assert_eq!(e.types.get(name).map(String::as_str), Some(kind), "{name}");
    }
    let g0 = [
        ("gpu", "0"),
        ("Hostname", "e2e-node"),
        ("UUID", uuid0.as_str()),
    ];
    assert_eq!(
        e.get("tessera_gpu_memory_total_bytes", &g0),
        Some((16 * GI) as f64)
    );
    // The simulated driver counts both workloads' memory.
    let used = e.get("tessera_gpu_memory_used_bytes", &g0).unwrap();
    let truth = n.node().device_usage(0).unwrap().memory_used as f64;
    assert!(used >= (GI + (1 << 20)) as f64, "{used}");
    assert!(used <= truth, "{used} > {truth}");
    assert_eq!(e.get("tessera_gpu_healthy", &g0), Some(1.0));
    assert_eq!(e.get("tessera_gpu_slices", &g0), Some(4.0));
    // 4 GiB of 16 and 50% of the time at 4 slices per GPU: 2 slices.
    assert_eq!(e.get("tessera_gpu_slices_allocated", &g0), Some(2.0));
    let al = [("allocation", "work"), ("gpu", "0")];
    assert_eq!(
        e.get("tessera_allocation_memory_used_bytes", &al),
        Some(GI as f64)
    );
    assert_eq!(
        e.get("tessera_allocation_memory_limit_bytes", &al),
        Some((4 * GI) as f64)
    );
    assert_eq!(
        e.get("tessera_allocation_compute_share_ratio", &al),
        Some(0.5)
    );
    assert_eq!(e.get("tessera_allocation_processes", &al), Some(1.0));
    assert_eq!(
        e.get("tessera_allocation_oom_refused_total", &al),
        Some(0.0)
    );
    assert_eq!(
        e.get(
            "tessera_ungoverned_processes",
            &[("gpu", "0"), ("reason", "over_limit")]
        ),
        Some(0.0),
        "the governed workload is within its limit"
    );

    // Over the limit: refused by the shim, counted by the manager.
    let refused = w.cmd(&format!("alloc {}", 4 * GI), T);
    assert_eq!(
        refused.error.as_deref(),
        Some("CUDA_ERROR_OUT_OF_MEMORY"),
        "{}",
        refused.raw
    );
    let counted = eventually(DEADLINE, || {
        let e = parse_exposition(&scrape(m.metrics)).unwrap();
        e.get("tessera_allocation_oom_refused_total", &al) == Some(1.0)
    });
    assert!(counted.is_some());

    stray.kill();
    w.kill();
    with_client(&m.socket, async |c| {
        c.delete_allocation(pb::DeleteAllocationRequest { id: "work".into() })
            .await
    })
    .expect("DeleteAllocation");
    let st = node_status(&m.socket);
    assert!(st.allocations.is_empty());
    assert!(!std::path::Path::new(&a.control_path).exists());
    m.stop();
}

#[test]
fn a_restarted_manager_keeps_allocations_and_running_processes() {
    let _serial = serial();
    let n = node(1);
    let dir = n.dir.path().join("m");
    let m = ManagerProc::start(&n, &dir, &[]);
    let uuid0 = n.node().device_info(0).unwrap().uuid;
    let a = create(&m.socket, "keep", &uuid0, 4 * GI, 1_000_000);
    let mut w = governed_probe(&n, &a.control_path, &a.state_path);
    for cmd in ["init", "ctx", &format!("alloc {GI}")] {
        assert!(w.cmd(cmd, T).ok);
    }
    m.stop();

    // No manager: the workload goes on.
    let l = w.cmd(&format!("alloc {GI}"), T);
    assert!(l.ok, "{}", l.raw);

    let m = ManagerProc::start(&n, &dir, &[]);
    let st = node_status(&m.socket);
    assert_eq!(st.allocations.len(), 1);
    let al = &st.allocations[0];
    assert_eq!(al.allocation.as_ref().unwrap().id, "keep");
    assert_eq!(al.allocation.as_ref().unwrap().state_path, a.state_path);
    assert_eq!(al.devices[0].memory_used_bytes, 2 * GI);
    assert_eq!(al.processes.len(), 1);
    // And it goes on under the new manager, within its old limit.
    assert!(w.cmd(&format!("alloc {}", 2 * GI), T).ok);
    let over = w.cmd(&format!("alloc {GI}"), T);
    assert_eq!(
        over.error.as_deref(),
        Some("CUDA_ERROR_OUT_OF_MEMORY"),
        "{}",
        over.raw
    );

    // The new manager reaps it.
    w.kill();
    let reaped = eventually(DEADLINE, || {
        node_status(&m.socket).allocations[0].devices[0].memory_used_bytes == 0
    });
    assert!(reaped.is_some(), "{}", m.log());
    m.stop();
}

#[test]
fn an_injected_xid_makes_a_gpu_unhealthy_until_it_recovers() {
    let _serial = serial();
    let n = node(2);
    // First, what an unhealthy GPU looks like, under a hold-off no test
    // outlives: however slowly the checks below run, the GPU cannot
    // recover in the middle of them.
    let m = ManagerProc::start(&n, &n.dir.path().join("m-hold"), &["--xid-recovery", "24h"]);
    let healthy = |m: &ManagerProc, i: usize| node_status(&m.socket).gpus[i].healthy;

    // An event reaches only a watcher registered when it happens.
    m.events_registered();
    assert!(
        m.log().contains("GPU event watcher registered"),
        "{}",
        m.log()
    );

    // An application's fault: the GPU stays healthy once the manager has
    // handled the event.
    let events = m.passes("gpu_event");
    n.node().inject_xid(1, 13).unwrap();
    let handled = eventually(DEADLINE, || m.passes("gpu_event") > events);
    assert!(handled.is_some(), "XID 13 never handled:\n{}", m.log());
    assert!(healthy(&m, 1));

    n.node().inject_xid(1, 48).unwrap();
    let down = eventually(DEADLINE, || !healthy(&m, 1));
    assert!(down.is_some(), "XID 48 ignored:\n{}", m.log());
    let st = node_status(&m.socket);
    assert_eq!(st.gpus[1].unhealthy_reason, "critical XID 48");
    assert!(st.gpus[0].healthy, "only GPU 1 had the XID");
    let e = parse_exposition(&scrape(m.metrics)).unwrap();
    assert_eq!(e.get("tessera_gpu_healthy", &[("gpu", "1")]), Some(0.0));
    assert_eq!(e.get("tessera_gpu_healthy", &[("gpu", "0")]), Some(1.0));
    m.stop();

    // Then recovery, with the usual 1 s hold-off. The GPU is lost while
    // the XID arrives (a lost GPU's queries fail, so nothing clears the
    // XID) and answers again only once the manager has handled it: what is
    // asserted holds however long each step takes.
    let m = ManagerProc::on(&n);
    m.events_registered();
    // A lost GPU is unhealthy while lost; losing it also sends XID 79.
    let events = m.passes("gpu_event");
    n.node().set_lost(1, true).unwrap();
    let lost = eventually(DEADLINE, || !healthy(&m, 1));
    assert!(lost.is_some(), "lost GPU not noticed:\n{}", m.log());
    let t0 = Instant::now();
    n.node().inject_xid(1, 48).unwrap();
    let handled = eventually(DEADLINE, || m.passes("gpu_event") >= events + 2);
    assert!(
        handled.is_some(),
        "XIDs 79 and 48 never handled:\n{}",
        m.log()
    );
    n.node().set_lost(1, false).unwrap();
    let up = eventually(DEADLINE, || healthy(&m, 1));
    assert!(up.is_some(), "GPU 1 never recovered:\n{}", m.log());
    // A lower bound only: healthy again no sooner than the hold-off after
    // the XID (how much later depends on the machine's load).
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "recovered before the hold-off"
    );
    assert!(healthy(&m, 0), "only GPU 1 was lost");
    m.stop();
}

#[test]
fn a_process_killed_inside_tessera_run_has_its_memory_reclaimed_by_the_next_reaper_pass() {
    let _serial = serial();
    let n = node(1);
    let m = ManagerProc::on(&n);
    let probe = probe_path().display().to_string();
    // Two workers in one `tessera run`; one is killed, the other goes on.
    let script = format!(
        "\"{probe}\" init ctx 'alloc {GI}' pid 'sleep 60000' & \
         \"{probe}\" init ctx 'alloc {GI}' pid 'sleep 60000' & wait"
    );
    let args = [
        "run",
        "--socket",
        m.socket.to_str().unwrap(),
        "--gpu",
        "0",
        "--memory",
        "3Gi",
        "--",
        "sh",
        "-c",
        &script,
    ];
    let mut run = client_spawn(&n, &args);
    let mut out = lines(&mut run);
    let p1: i32 = field(&read_until(&mut out, |l| l.starts_with("ok pid")), "pid")
        .unwrap()
        .parse()
        .unwrap();
    let p2: i32 = field(&read_until(&mut out, |l| l.starts_with("ok pid")), "pid")
        .unwrap()
        .parse()
        .unwrap();
    let st = node_status(&m.socket);
    assert_eq!(st.allocations.len(), 1);
    let alloc = st.allocations[0].allocation.clone().unwrap();
    assert_eq!(alloc.labels["source"], "cli");
    let state = tessera_shm::State::open(std::path::Path::new(&alloc.state_path), &alloc.id)
        .expect("the run's state file");
    assert!(
        eventually(DEADLINE, || state.reserved(0) == 2 * GI).is_some(),
        "workers never held their memory"
    );

    let kill = |pid: i32| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap()
    };
    kill(p1);
    wait_dead(p1);
    // The first reaper pass that begins after the death returns it (with
    // the default 1 s reap interval, within about a second).
    m.reaper_pass();
    assert_eq!(state.reserved(0), GI, "not reclaimed by a whole pass");
    assert_eq!(node_status(&m.socket).allocations[0].processes.len(), 1);

    // The last worker goes: the command ends, and with it the allocation
    // (the run exec'd the command: the reaper deletes it once it is gone).
    kill(p2);
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    m.all_reaped();
    m.stop();
}

#[test]
fn tessera_run_enforces_the_memory_limit_and_passes_the_exit_code() {
    let _serial = serial();
    let n = node(1);
    let m = ManagerProc::on(&n);
    let sock = m.socket.to_str().unwrap().to_owned();
    let probe = probe_path().display().to_string();
    let half = (GI / 2).to_string();
    // `tessera run` on GPU 0 with 1 GiB, then what each case adds.
    let run_1gi = ["run", "--socket", &sock, "--gpu", "0", "--memory", "1Gi"];
    let out = client(
        &n,
        &[
            &run_1gi[..],
            &[
                "--compute",
                "100%",
                "--",
                &probe,
                "init",
                "ctx",
                &format!("alloc {half}"),
                &format!("alloc {half}"),
                "alloc 1",
                "meminfo",
            ],
        ]
        .concat(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = role_stdout(&out);
    let allocs: Vec<&str> = text.lines().filter(|l| l.contains(" alloc")).collect();
    assert_eq!(allocs.len(), 3, "{text}");
    assert!(
        allocs[0].starts_with("ok alloc") && allocs[1].starts_with("ok alloc"),
        "{text}"
    );
    assert!(allocs[2].contains("CUDA_ERROR_OUT_OF_MEMORY"), "{text}");
    // The process sees its slice, not the GPU.
    let meminfo = text.lines().find(|l| l.starts_with("ok meminfo")).unwrap();
    assert_eq!(
        field(meminfo, "total").as_deref(),
        Some(GI.to_string().as_str()),
        "{meminfo}"
    );
    // The run exec'd the command: the reaper deletes the allocation once
    // it has gone.
    m.all_reaped();

    // Exit statuses are the command's own: its code, or the signal that
    // killed it (the command is the process `tessera run` was).
    let status = |cmd: &str| {
        let o = client(&n, &[&run_1gi[..], &["--", "sh", "-c", cmd]].concat());
        o.status
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status("exit 7").code(), Some(7));
    assert_eq!(status("kill -9 $$").signal(), Some(9));

    // SIGTERM to `tessera run` reaches the command, which decides how to end.
    let trap = "trap 'kill $!; exit 42' TERM; echo ready; sleep 60 & wait";
    let mut run = client_spawn(&n, &[&run_1gi[..], &["--", "sh", "-c", trap]].concat());
    assert_eq!(sigterm_once_ready(&mut run).code(), Some(42));
    m.all_reaped();
    m.stop();
}

#[test]
fn bad_config_and_bad_requests_get_clear_errors() {
    let _serial = serial();
    let n = node(1);
    let dir = n.dir.path().join("bad");
    let run_manager = |extra: &[&str]| {
        let args = with_flag(manager_args(&dir), extra[0], extra[1]);
        role_command("manager", &args)
            .envs(n.env())
            .output()
            .expect("run the manager")
    };
    let o = run_manager(&["--metrics-addr", "nowhere"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("metricsAddr: \"nowhere\""),
        "{}",
        stderr(&o)
    );
    let o = run_manager(&["--nvml-library", "/nonexistent/libnvidia-ml.so.1"]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("cannot load the GPU driver library") && e.contains("/nonexistent"),
        "{e}"
    );
    let cfg = n.dir.path().join("bad.yaml");
    std::fs::write(&cfg, "slicesPerGpu: lots\n").unwrap();
    let o = run_manager(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("bad.yaml"), "{}", stderr(&o));

    // No manager.
    let missing = n.dir.path().join("none.sock");
    let o = client(&n, &["status", "--socket", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not running")
            && stderr(&o).contains("start it with `tessera manager`"),
        "{}",
        stderr(&o)
    );

    let m = ManagerProc::on(&n);
    let sock = m.socket.to_str().unwrap().to_owned();
    let run = |extra: &[&str]| {
        let mut a = vec!["run", "--socket", &sock];
        a.extend_from_slice(extra);
        client(&n, &a)
    };
    // Each bad `tessera run` and the words its error must carry (all of them).
    let bad_runs: [(&[&str], &[&str]); 5] = [
        (
            &["--gpu", "0", "--memory", "4Gx"],
            &["bad memory size \"4Gx\""],
        ),
        (&["--gpu", "5", "--memory", "1Gi"], &["no GPU \"5\""]),
        (
            &["--gpu", "0", "--memory", "17Gi"],
            &["invalid request", "exceeds"],
        ),
        (
            &["--gpu", "0", "--memory", "1Gi", "--compute", "150%"],
            &["bad compute share \"150%\""],
        ),
        (
            &[
                "--gpu",
                "0",
                "--memory",
                "1Gi",
                "--",
                "/nonexistent/command",
            ],
            &["cannot start"],
        ),
    ];
    for (flags, words) in bad_runs {
        let mut args = flags.to_vec();
        if !args.contains(&"--") {
            args.extend(["--", "true"]);
        }
        let o = run(&args);
        let err = stderr(&o);
        assert!(words.iter().all(|w| err.contains(w)), "{flags:?}: {err}");
    }
    assert!(
        node_status(&m.socket).allocations.is_empty(),
        "failed runs leave nothing"
    );

    // `tessera top` without a terminal prints frames one after another.
    let o = client(
        &n,
        &["top", "--socket", &sock, "--interval", "200ms", "-n", "2"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let frames = role_stdout(&o);
    assert_eq!(frames.matches("Tessera on e2e-node").count(), 2, "{frames}");
    assert!(!frames.contains('\u{1b}'), "no terminal escapes in a pipe");

    // On a terminal, `q` quits `tessera top`, and the terminal is left in
    // the mode it was in.
    top_on_a_terminal_quits_with_q(&n, &sock);
    m.stop();
}

fn top_on_a_terminal_quits_with_q(n: &SimNode, sock: &str) {
    use nix::sys::termios::{LocalFlags, tcgetattr};
    use std::io::{Read, Write};
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let before = tcgetattr(&pty.slave).unwrap().local_flags;
    assert!(before.contains(LocalFlags::ICANON | LocalFlags::ECHO));
    let slave = std::fs::File::from(pty.slave);
    let args = owned(&["top", "--socket", sock, "--interval", "200ms"]);
    let mut child = role_command("cli", &args)
        .envs(n.env())
        .stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("spawn top");
    // Everything top writes, read as it comes (a full terminal buffer
    // would stall it).
    let mut master = std::fs::File::from(pty.master);
    let mut keys = master.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(&seen).contains("Tessera on e2e-node") {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(chunk) => seen.extend(chunk),
            Err(_) => panic!(
                "no frame on the terminal: {}",
                String::from_utf8_lossy(&seen)
            ),
        }
    }
    assert!(
        String::from_utf8_lossy(&seen).contains("\u{1b}[2J"),
        "a terminal gets frames drawn in place"
    );
    // Keys are read one by one: q alone, no Enter.
    keys.write_all(b"q").unwrap();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "top did not quit on q");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let after = tcgetattr(&slave).unwrap().local_flags;
    assert_eq!(after, before, "the terminal mode is restored");
}

#[test]
fn the_exposition_parser_is_strict() {
    let good = "# HELP a_b x y\n# TYPE a_b gauge\na_b{k=\"v\\\"q\\\\\\n\",l=\"\"} 1.5\na_b 2\n";
    let e = parse_exposition(good).unwrap();
    assert_eq!(e.get("a_b", &[("k", "v\"q\\\n")]), Some(1.5));
    assert_eq!(e.samples.len(), 2);
    for bad in [
        "a_b 1\n",                                    // no TYPE
        "# TYPE a_b gauge\na_b{k=v} 1\n",             // unquoted
        "# TYPE a_b gauge\na_b{k=\"v} 1\n",           // unterminated
        "# TYPE a_b gauge\na_b{k=\"\\x\"} 1\n",       // bad escape
        "# TYPE a_b gauge\na_b one\n",                // not a number
        "# TYPE a_b gauge\na_b 1\na_b 2\n",           // series twice
        "# TYPE a_b gauge\na_b{k=\"1\",k=\"2\"} 1\n", // label twice
        "# TYPE a_b weird\n",                         // unknown type
        "# TYPE 1ab gauge\n",                         // bad name
    ] {
        assert!(parse_exposition(bad).is_err(), "accepted {bad:?}");
    }
}

#[test]
fn the_arbiter_measures_what_a_shared_gpu_gives_an_allocation() {
    let _serial = serial();
    let n = node(1);
    let m = ManagerProc::on(&n);
    let uuid0 = n.node().device_info(0).unwrap().uuid;
    // Burst by default; the owner (the device plugin, from the pod's
    // annotation) tightens it to guaranteed, a hard cap even when alone.
    let a = create(&m.socket, "half", &uuid0, GI, 500_000);
    with_client(&m.socket, async |c| {
        c.set_allocation_owner(pb::SetAllocationOwnerRequest {
            id: "half".into(),
            namespace: "ml".into(),
            pod: "p".into(),
            container: "c".into(),
            policy: pb::ComputePolicy::Guaranteed as i32,
        })
        .await
    })
    .expect("SetAllocationOwner");
    // 300 ms of kernels, capped at half the GPU: about 600 ms of wall time,
    // half of it waiting for the grant.
    let mut w = governed_probe(&n, &a.control_path, &a.state_path);
    for cmd in ["init", "ctx", "load kernel k 1ms"] {
        let l = w.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    // Submitted over time, as a training loop does (work already queued
    // when a grant ends runs on and is charged as an overrun).
    let t0 = Instant::now();
    for _ in 0..30 {
        let l = w.cmd("launch k 10", T);
        assert!(l.ok, "{}", l.raw);
        assert!(w.cmd("sync", T).ok);
    }
    let elapsed = t0.elapsed();
    assert!(
        elapsed >= Duration::from_millis(450),
        "300 ms of work at a 50% cap took only {elapsed:?}\n{}",
        m.log()
    );

    // Whether those steps waited for the grant depends on how fast the
    // test's round trips ran (a step that comes back after its grant's
    // hold-off finds the GPU free). A backlog always does: the process
    // asks for far more than its cap allows, never waited for (it is
    // killed at the end), so its waits grow however slow the machine is.
    w.send("launch k 1000000");
    let al = [("allocation", "half"), ("gpu", "0"), ("pod", "p")];
    let mut e = None;
    let waited = eventually(DEADLINE, || {
        let scraped = parse_exposition(&scrape(m.metrics)).unwrap();
        let waited = scraped.get("tessera_allocation_wait_seconds_total", &al);
        e = Some(scraped);
        waited.is_some_and(|w| w > 0.01)
    });
    let e = e.expect("scraped");
    assert!(
        waited.is_some(),
        "a backlog at a 50% cap never waited: {:?}",
        e.get("tessera_allocation_wait_seconds_total", &al)
    );
    // The share over the arbiter's window: never above the cap (plus what
    // a short window's catch-up can add); above 0, as it ran, but how far
    // depends on how busy the test kept it.
    let achieved = e
        .get("tessera_allocation_compute_achieved_ratio", &al)
        .expect("an arbitrated allocation has an achieved share");
    assert!(achieved > 0.0 && achieved <= 0.65, "achieved {achieved}");
    let st = node_status(&m.socket);
    let d = &st.allocations[0].devices[0];
    assert_eq!(d.compute_share_ppm, 500_000);
    assert!(
        d.compute_achieved_ppm > 0 && d.wait_ns_total > 10_000_000,
        "{d:?}"
    );
    w.kill();
    m.stop();
}
