//! A rolling update of a node under load, and an uninstall and reinstall: workloads in
//! three allocations keep allocating and freeing while the shim is replaced (`tessera
//! install-hook`) and the manager is replaced twice (once stopped cleanly, once
//! SIGKILLed), then removed for a while and installed again, and finally the device
//! plugin is replaced. Through all of it every workload keeps running and stays within
//! its limit (the driver's own count), the manager serves exactly the allocations made
//! (none lost, none duplicated), each with its processes, and the capacity they hold is
//! never re-sold. The device plugin (the real one, in-process, between the real manager
//! and a fake kubelet) runs through the manager's replacements and its absence: its
//! slices turn unhealthy while the manager is gone and healthy again once it is back,
//! with no operator; the plugin that replaces it registers again and serves a new pod,
//! whose workload then runs beside the others within its own limit. (The webhook only
//! acts when a pod is admitted; its restarts are in `webhook/tests`.)

mod manager_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use manager_support::*;
use tessera_device_plugin::testing::FakeKubelet;
use tessera_device_plugin::{Options, allocate::host_env, run};
use tessera_e2e::{Mode, ProbeChild, SimNode, probe_binary};
use tessera_proto::deviceplugin::v1beta1 as dp;
use tessera_proto::manager::v1 as pb;
use tokio::sync::oneshot;

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;
const T: Duration = Duration::from_secs(30);

role_test!();

/// A workload: a governed probe in its own thread allocating and freeing 64 MiB blocks,
/// holding up to `blocks` of them; counts its rounds, and stops at the first failure
/// other than out-of-memory at its limit.
struct Workload {
    pid: u32,
    rounds: Arc<AtomicU64>,
    /// Why it stopped, if it did.
    failed: Arc<std::sync::Mutex<String>>,
    thread: std::thread::JoinHandle<Result<ProbeChild, String>>,
}

fn workload(
    n: &SimNode,
    lib: &std::path::Path,
    a: &pb::Allocation,
    stop: &Arc<AtomicBool>,
) -> Workload {
    let mut c = n.command(probe_binary(Mode::Dlopen));
    c.env("LD_PRELOAD", lib)
        .env("TESSERA_CONTROL", &a.control_path)
        .env("TESSERA_STATE", &a.state_path);
    workload_of(c, stop)
}

/// [`workload`], for a process started with `c` (its environment already set).
fn workload_of(c: std::process::Command, stop: &Arc<AtomicBool>) -> Workload {
    let mut p = ProbeChild::start(c);
    for cmd in ["init", "ctx"] {
        let l = p.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    let pid = p.pid();
    let rounds = Arc::new(AtomicU64::new(0));
    let (stop, r) = (stop.clone(), rounds.clone());
    let failed = Arc::new(std::sync::Mutex::new(String::new()));
    let f = failed.clone();
    let thread = std::thread::spawn(move || {
        let fail = |why: String| {
            *f.lock().unwrap() = why.clone();
            Err(why)
        };
        // Fill the limit with 64 MiB blocks, then give two back: 128..192 MiB of room.
        let mut held = 0;
        loop {
            let l = p.cmd(&format!("alloc {}", 64 * MI), T);
            if l.ok {
                held += 1;
            } else if l.raw.contains("OUT_OF_MEMORY") && held >= 2 {
                break;
            } else {
                return fail(l.raw);
            }
        }
        for h in [held - 1, held - 2] {
            let f = p.cmd(&format!("free {h}"), T);
            if !f.ok {
                return fail(f.raw);
            }
        }
        while !stop.load(Ordering::Relaxed) {
            // Within the room: allocate and free (in the probe, no handle kept) ...
            let l = p.cmd(&format!("bench-alloc 2 {}", 64 * MI), T);
            if !l.ok {
                return fail(l.raw);
            }
            // ... and past it: refused, the limit still holds, manager or not.
            let l = p.cmd(&format!("alloc {}", 256 * MI), T);
            if l.ok || !l.raw.contains("OUT_OF_MEMORY") {
                return fail(format!("past the limit: {}", l.raw));
            }
            r.fetch_add(1, Ordering::Relaxed);
        }
        Ok(p)
    });
    Workload {
        pid,
        rounds,
        failed,
        thread,
    }
}

/// Waits until every workload has done 20 more rounds than `since`.
fn all_progress(ws: &[Workload]) {
    let since: Vec<u64> = ws
        .iter()
        .map(|w| w.rounds.load(Ordering::Relaxed))
        .collect();
    let t0 = Instant::now();
    while ws
        .iter()
        .zip(&since)
        .any(|(w, s)| w.rounds.load(Ordering::Relaxed) < s + 20)
    {
        for w in ws {
            assert!(
                !w.thread.is_finished(),
                "workload {} stopped: {}",
                w.pid,
                w.failed.lock().unwrap()
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "a workload stalled"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The node's promises: within limits by the driver's count, and (with a manager)
/// exactly these allocations served, with their processes, and their capacity held.
fn check(n: &SimNode, m: Option<&ManagerProc>, allocs: &[(pb::Allocation, u32)], uuid: &str) {
    for (a, pid) in allocs {
        let held = n.node().process(*pid).map(|p| p.memory[0]).unwrap_or(0);
        let limit = a.devices[0].memory_limit_bytes;
        assert!(held <= limit, "{}: the driver holds {held} > {limit}", a.id);
    }
    let Some(m) = m else { return };
    let st = node_status(&m.socket);
    let mut ids: Vec<&str> = st
        .allocations
        .iter()
        .map(|s| s.allocation.as_ref().unwrap().id.as_str())
        .collect();
    ids.sort();
    let mut want: Vec<&str> = allocs.iter().map(|(a, _)| a.id.as_str()).collect();
    want.sort();
    assert_eq!(ids, want, "{}", m.log());
    for (a, pid) in allocs {
        let s = status_of(&m.socket, &a.id);
        let pids: Vec<u32> = s.processes.iter().map(|p| p.container_pid).collect();
        let host: Vec<u32> = s.processes.iter().map(|p| p.host_pid).collect();
        assert!(
            pids.contains(pid) || host.contains(pid),
            "{}: process {pid} not adopted: {:?}",
            a.id,
            s.processes
        );
    }
    // 3 × 4 GiB (and the pod's 2 GiB) are held on the 16 GiB GPU: 5 GiB more never fits.
    let big = pb::CreateAllocationRequest::one_device("greedy", uuid, 5 * GI, 10_000);
    let e = with_client(&m.socket, async |c| c.create_allocation(big).await)
        .expect_err("capacity re-sold");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
}

/// The device plugin of the chart's DaemonSet, run in-process on `rt` until stopped.
struct Plugin {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tessera_device_plugin::Error>>,
}

/// The plugin's options on this node: the kubelet's dir, the manager's socket, 2 GiB
/// slices, and the lost-manager grace short enough to see within the test.
fn plugin_options(n: &SimNode, socket: &std::path::Path, lib: &std::path::Path) -> Options {
    let config = n.dir.path().join("slices.yaml");
    std::fs::write(&config, "default:\n  slice: {memory: 2Gi}\n").unwrap();
    let mut opts = Options::new("node-1");
    opts.device_plugin_dir = n.dir.path().join("dp");
    opts.manager_socket = socket.to_owned();
    opts.pod_resources_socket = None;
    opts.config_path = Some(config);
    opts.config_poll = Duration::from_millis(50);
    opts.kubelet_poll = Duration::from_millis(50);
    opts.status_interval = Duration::from_millis(200);
    opts.manager_grace = Duration::from_secs(1);
    opts.host.hook_library = lib.to_owned();
    opts.host.preload_file = n.dir.path().join("ld.so.preload");
    opts
}

fn start_plugin(rt: &tokio::runtime::Runtime, opts: &Options) -> Plugin {
    let (stop, rx) = oneshot::channel::<()>();
    let task = rt.spawn(run(opts.clone(), async {
        let _ = rx.await;
    }));
    Plugin { stop, task }
}

/// Stops it as SIGTERM does, and waits until it has.
fn stop_plugin(rt: &tokio::runtime::Runtime, p: Plugin) {
    let _ = p.stop.send(());
    rt.block_on(async { tokio::time::timeout(T, p.task).await })
        .expect("the plugin stops")
        .expect("join")
        .expect("the plugin ran cleanly");
}

/// Waits until the kubelet holds the GPU's 8 slices, `healthy` of them healthy.
fn wait_slices(rt: &tokio::runtime::Runtime, k: &mut FakeKubelet, healthy: usize, what: &str) {
    let got = rt.block_on(k.wait_devices(Duration::from_secs(60), |d| {
        d.len() == 8 && d.iter().filter(|x| x.health == dp::HEALTHY).count() == healthy
    }));
    assert!(got.is_some(), "{what}: the kubelet holds {:?}", k.devices());
}

#[test]
fn a_rolling_update_and_a_reinstall_leave_every_workload_running_within_its_limits() {
    let _serial = serial();
    let n = SimNode::e2e(1, 0x0011_7011);
    let uuid = n.node().device_info(0).unwrap().uuid;
    let dir = n.dir.path().join("m");
    let lib_dir = n.dir.path().join("node-lib");
    let lib = lib_dir.join("libtessera.so");
    tessera_client::install_hook::install(&hook(), &lib).unwrap();
    let m = ManagerProc::start(&n, &dir, &[]);
    let allocs: Vec<pb::Allocation> = ["roll-a", "roll-b", "roll-c"]
        .iter()
        .map(|id| create(&m.socket, id, &uuid, 4 * GI, 200_000))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let ws: Vec<Workload> = allocs
        .iter()
        .map(|a| workload(&n, &lib, a, &stop))
        .collect();
    let with_pids: Vec<(pb::Allocation, u32)> = allocs
        .iter()
        .cloned()
        .zip(ws.iter().map(|w| w.pid))
        .collect();
    all_progress(&ws);
    check(&n, Some(&m), &with_pids, &uuid);

    // The device plugin, registered with the kubelet and listing the GPU's slices.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    std::fs::create_dir_all(n.dir.path().join("dp")).unwrap();
    let mut kubelet = {
        let _in_rt = rt.enter();
        FakeKubelet::start(&n.dir.path().join("dp")).unwrap()
    };
    let opts = plugin_options(&n, &m.socket, &lib);
    let plugin = start_plugin(&rt, &opts);
    assert!(rt.block_on(kubelet.wait_registrations(1, T)).is_some());
    wait_slices(&rt, &mut kubelet, 8, "first plugin");

    // 1. The new shim, by install-hook (the init container of the new DaemonSet pod).
    let mut next = std::fs::read(hook()).unwrap();
    next.extend_from_slice(b"\0rolling-update: next build\0");
    let next_path = n.dir.path().join("libtessera-next.so");
    std::fs::write(&next_path, next).unwrap();
    tessera_client::install_hook::install(&next_path, &lib).unwrap();
    all_progress(&ws);

    // 2. The manager replaced: stopped cleanly, a new one started.
    m.stop();
    all_progress(&ws);
    check(&n, None, &with_pids, &uuid);
    let m = ManagerProc::start(&n, &dir, &[]);
    all_progress(&ws);
    check(&n, Some(&m), &with_pids, &uuid);

    // 3. Replaced again, this time killed (a crash, or a node agent OOM-killed).
    drop(m);
    all_progress(&ws);
    let m = ManagerProc::start(&n, &dir, &[]);
    all_progress(&ws);
    check(&n, Some(&m), &with_pids, &uuid);

    // 4. Uninstalled: no manager for a while. The workloads go on, under their last
    //    limits (each is pressing on its limit all along: check holds it there).
    m.stop();
    // It said so, once.
    let log = std::fs::read_to_string(dir.with_extension("stderr.log")).unwrap();
    let said = log
        .lines()
        .filter(|l| l.contains("manager stopped: running processes keep their last memory limits"))
        .count();
    assert_eq!(said, 1, "{log}");
    all_progress(&ws);
    // The plugin tells the kubelet that nothing can be allocated now.
    wait_slices(&rt, &mut kubelet, 0, "manager gone");
    all_progress(&ws);
    check(&n, None, &with_pids, &uuid);

    // 5. Reinstalled: the new manager adopts every running allocation and process, and
    //    the plugin finds it again by itself.
    let m = ManagerProc::start(&n, &dir, &[]);
    all_progress(&ws);
    check(&n, Some(&m), &with_pids, &uuid);
    wait_slices(&rt, &mut kubelet, 8, "manager back");

    // 6. The device plugin replaced: the old one stopped (its pod deleted), a new one
    //    started. The workloads never notice; the new plugin registers again and a new
    //    pod is served: its allocation is made and its workload runs within its limit.
    stop_plugin(&rt, plugin);
    all_progress(&ws);
    check(&n, Some(&m), &with_pids, &uuid);
    let plugin = start_plugin(&rt, &opts);
    assert!(rt.block_on(kubelet.wait_registrations(2, T)).is_some());
    wait_slices(&rt, &mut kubelet, 8, "second plugin");
    let slice = kubelet.devices()[0].id.clone();
    let resp = rt
        .block_on(async {
            let mut c = kubelet.plugin(&opts.socket_name).await?;
            let r = c
                .allocate(dp::AllocateRequest {
                    container_requests: vec![dp::ContainerAllocateRequest {
                        devices_ids: vec![slice.clone()],
                    }],
                })
                .await
                .map_err(|e| std::io::Error::other(e.to_string()));
            Ok::<_, tonic::transport::Error>(r)
        })
        .expect("dial the new plugin")
        .expect("the new plugin allocates")
        .into_inner();
    let env = host_env(&resp.container_responses[0]);
    let pod = status_of(&m.socket, &env["TESSERA_ALLOCATION"])
        .allocation
        .expect("the pod's allocation");
    assert_eq!(pod.devices[0].memory_limit_bytes, 2 * GI, "one 2 GiB slice");
    let mut c = n.command(probe_binary(Mode::Dlopen));
    c.env("LD_PRELOAD", &lib)
        .env("TESSERA_CONTROL", &env["TESSERA_CONTROL"])
        .env("TESSERA_STATE", &env["TESSERA_STATE"]);
    let mut ws = ws;
    let mut with_pids = with_pids;
    ws.push(workload_of(c, &stop));
    with_pids.push((pod, ws[3].pid));
    all_progress(&ws);
    check(&n, Some(&m), &with_pids, &uuid);
    stop_plugin(&rt, plugin);

    stop.store(true, Ordering::Relaxed);
    for w in ws {
        let mut p = w
            .thread
            .join()
            .expect("workload thread")
            .unwrap_or_else(|raw| panic!("a workload failed: {raw}"));
        p.kill();
    }
    m.stop();
}
