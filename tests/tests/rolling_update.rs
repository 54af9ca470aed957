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
//! whose workload then runs beside the others within its own limit.
//!
//! The webhook runs as the chart runs it, a process serving HTTPS from mounted
//! certificate files, and admits pods asking for `tessera.dev/vgpu` all along (a client
//! that retries a connection refused or lost, as the API server does). It is replaced
//! last: a review half-sent when it gets SIGTERM is still answered by it, the requests
//! that fall in the gap before its successor listens are retried, and every admission,
//! before, during and after, gets the same correct patch; none is lost.

// Its `role_test!` is not used: this file's `role` runs the webhook too.
#[allow(unused_macros, unused_imports)]
mod manager_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use clap::Parser as _;
use serde_json::{Value, json};
use tessera_tls::testing::{RequestError, connect, request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

/// The body of this executable when a test re-runs it as the manager, a client command
/// or the webhook (see `manager_support::role_main`); ignored, so a plain run skips it.
#[test]
#[ignore = "helper: the manager, client or webhook process the test starts"]
fn role() {
    if std::env::var(ROLE_ENV).as_deref() == Ok("webhook") {
        std::process::exit(webhook_role());
    }
    role_main();
}

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

    // The webhook, admitting pods all along.
    let wh_dir = n.dir.path().join("webhook");
    std::fs::create_dir_all(&wh_dir).unwrap();
    let bundle = webhook_certs(&wh_dir);
    let patch = expected_patch();
    let webhook = WebhookProc::start(&wh_dir, "webhook-1", "127.0.0.1:0");
    let adm = admissions(webhook.addr, bundle.clone(), patch.clone());
    adm.progress(5);

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
    // The kubelet's list may still be the old plugin's (a real kubelet keeps
    // it too): the new plugin must serve this Allocate even before its own
    // first inventory from the manager has arrived.
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

    // 7. The webhook replaced, admissions going on: the old one answers what reached it
    //    before SIGTERM, the ones in the gap are retried, the new one answers the rest,
    //    each with the same patch.
    adm.progress(5);
    let webhook = replace_webhook(&rt, webhook, &wh_dir, &bundle, &patch);
    adm.progress(20);
    all_progress(&ws);
    check(&n, Some(&m), &with_pids, &uuid);
    let (answered, retried) = adm.finish();
    eprintln!("admissions: {answered} answered with the patch, {retried} attempts retried");
    webhook.sigterm();
    webhook.wait_exit();
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

// ---------------------------------------------------------------- the webhook

/// The name of the webhook's Service, which its certificate is for.
const WEBHOOK_DNS: &str = "tessera-webhook.tessera-system.svc";
/// Where the webhook role writes the address it listens on, once it does.
const READY_ENV: &str = "TESSERA_E2E_WEBHOOK_READY";

#[derive(clap::Parser)]
#[command(name = "webhook")]
struct WebhookCli {
    #[command(flatten)]
    args: tessera_webhook::run::WebhookArgs,
}

/// `tessera webhook` with its flags from the role's arguments, stopped by SIGTERM.
fn webhook_role() -> i32 {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .try_init();
    let argv = std::iter::once("webhook".to_owned()).chain(role_args());
    let cli = match WebhookCli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    let Some(ready) = std::env::var_os(READY_ENV).map(PathBuf::from) else {
        eprintln!("{READY_ENV} is not set");
        return 2;
    };
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let result = rt.block_on(async {
        // Installed before the webhook says it is ready: a SIGTERM after that is its cue.
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        let ready = move |addr: SocketAddr| {
            let tmp = ready.with_extension("tmp");
            let _ = std::fs::write(&tmp, addr.to_string());
            let _ = std::fs::rename(&tmp, &ready);
        };
        tessera_webhook::run::run_with(cli.args.options(), ready, async move {
            term.recv().await;
        })
        .await
    });
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {e}");
            1
        }
    }
}

/// A webhook process.
struct WebhookProc {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl WebhookProc {
    /// Starts `tessera webhook --listen <listen>` serving the certificate files in `dir`,
    /// and waits until it listens.
    fn start(dir: &Path, name: &str, listen: &str) -> WebhookProc {
        let ready = dir.join(format!("{name}.addr"));
        let log = dir.join(format!("{name}.stderr.log"));
        let args = [
            "--listen",
            listen,
            "--cert-file",
            &dir.join("tls.crt").display().to_string(),
            "--key-file",
            &dir.join("tls.key").display().to_string(),
        ];
        let child = role_command("webhook", &owned(&args))
            .env(READY_ENV, &ready)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn the webhook");
        let mut w = WebhookProc {
            child,
            addr: "0.0.0.0:0".parse().expect("placeholder"),
            log,
        };
        let t0 = Instant::now();
        loop {
            if let Some(status) = w.child.try_wait().expect("poll the webhook") {
                panic!("the webhook exited ({status}) before serving:\n{}", w.log());
            }
            if let Ok(addr) = std::fs::read_to_string(&ready)
                && let Ok(addr) = addr.parse()
            {
                w.addr = addr;
                return w;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "the webhook did not listen in 120 s:\n{}",
                w.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn sigterm(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    }

    /// Waits until it has exited, which must be cleanly.
    fn wait_exit(mut self) {
        let mut status = None;
        let exited = eventually(DEADLINE, || {
            status = self.child.try_wait().expect("poll the webhook");
            status.is_some()
        });
        assert!(exited.is_some(), "still running:\n{}", self.log());
        let status = status.expect("exited");
        assert!(status.success(), "webhook exited {status}:\n{}", self.log());
    }
}

impl Drop for WebhookProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CA and a serving certificate it signed for [`WEBHOOK_DNS`], written into `dir` as
/// cert-manager mounts them; returns the CA bundle a client trusts.
fn webhook_certs(dir: &Path) -> String {
    use tessera_tls::certs::{Authority, der_to_pem};
    let now = time::OffsetDateTime::now_utc();
    let ca = Authority::generate(Duration::from_secs(86_400), now).expect("ca");
    let cert = ca
        .issue(&[WEBHOOK_DNS.to_string()], Duration::from_secs(3600), now)
        .expect("serving certificate");
    let pem: String = cert.chain.iter().map(|d| der_to_pem(d)).collect();
    std::fs::write(dir.join("tls.crt"), pem).expect("write cert");
    std::fs::write(dir.join("tls.key"), cert.key_pem()).expect("write key");
    ca.material().cert_pem.clone()
}

/// An AdmissionReview, as the API server sends it, creating a pod whose container asks
/// for one slice.
fn review(uid: &str) -> Vec<u8> {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "ml"},
        "spec": {
            "containers": [{
                "name": "main", "image": "cuda:12",
                "resources": {"limits": {"tessera.dev/vgpu": "1"},
                              "requests": {"tessera.dev/vgpu": "1"}},
            }],
            "restartPolicy": "Never",
        },
    });
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
        }
    }))
    .expect("json")
}

/// The patch in an AdmissionReview answer to the review `uid`, or why it is not one.
fn patch_of(uid: &str, status: u16, body: &[u8]) -> Result<String, String> {
    let text = || String::from_utf8_lossy(body).into_owned();
    if status != 200 {
        return Err(format!("HTTP {status}: {}", text()));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("{e}: {}", text()))?;
    let r = &v["response"];
    if r["uid"] != uid || r["allowed"] != true || r["patchType"] != "JSONPatch" {
        return Err(format!("not the allowed, patched answer to {uid}: {v}"));
    }
    r["patch"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no patch: {v}"))
}

/// The patch the webhook must give [`review`]: the shim preloaded in the container.
fn expected_patch() -> String {
    let answer = tessera_webhook::review(&review("reference")).expect("review");
    let patch = patch_of("reference", 200, &answer).expect("a patch");
    let ops: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(&patch)
            .expect("base64"),
    )
    .expect("JSON patch");
    assert!(
        ops.to_string().contains("LD_PRELOAD")
            && ops
                .to_string()
                .contains(tessera_webhook::admission::HOOK_PATH),
        "the shim is not preloaded: {ops}"
    );
    patch
}

/// Admissions sent one after another, for as long as the test runs.
struct Admissions {
    stop: Arc<AtomicBool>,
    /// Admissions answered so far.
    answered: Arc<AtomicU64>,
    /// Requests that were retried (refused or lost connections).
    retries: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<Result<u64, String>>,
}

/// Sends review after review to the webhook at `addr`, each retried, as the API server
/// does, while the connection is refused or lost; stops at the first wrong answer.
fn admissions(addr: SocketAddr, bundle: String, patch: String) -> Admissions {
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let (s, a, r) = (stop.clone(), answered.clone(), retries.clone());
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let mut n = 0u64;
            while !s.load(Ordering::Relaxed) {
                let uid = format!("roll-{n}");
                let t0 = Instant::now();
                let reply = loop {
                    match request(addr, WEBHOOK_DNS, &bundle, "POST", "/mutate", review(&uid)).await
                    {
                        Ok(reply) => break reply,
                        Err(RequestError::Connect(_) | RequestError::Lost(_))
                            if t0.elapsed() < Duration::from_secs(120) =>
                        {
                            r.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => return Err(format!("{uid}: {e}")),
                    }
                };
                let got = patch_of(&uid, reply.status, &reply.body)?;
                if got != patch {
                    return Err(format!("{uid}: patch {got}, not {patch}"));
                }
                n += 1;
                a.fetch_add(1, Ordering::Relaxed);
                // A steady trickle, not a flood: the workloads share the CPUs.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok(n)
        })
    });
    Admissions {
        stop,
        answered,
        retries,
        thread,
    }
}

impl Admissions {
    /// Waits until `more` admissions beyond those answered now are answered.
    fn progress(&self, more: u64) {
        let want = self.answered.load(Ordering::Relaxed) + more;
        let t0 = Instant::now();
        while self.answered.load(Ordering::Relaxed) < want {
            assert!(
                !self.thread.is_finished(),
                "the admissions stopped; see the result"
            );
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "admissions stalled"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Stops them; every admission sent was answered with the patch. Returns
    /// (answered, retried).
    fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let n = self
            .thread
            .join()
            .expect("admissions thread")
            .unwrap_or_else(|e| panic!("an admission went wrong: {e}"));
        assert_eq!(n, self.answered.load(Ordering::Relaxed));
        (n, self.retries.load(Ordering::Relaxed))
    }
}

/// Replaces the webhook `old` with a new process on the same address while admissions
/// go on: a review `old` is reading when it gets SIGTERM is answered by `old` after it
/// stopped listening; `old` exits cleanly; the new one serves.
fn replace_webhook(
    rt: &tokio::runtime::Runtime,
    old: WebhookProc,
    dir: &Path,
    bundle: &str,
    patch: &str,
) -> WebhookProc {
    let addr = old.addr;
    let body = review("in-flight");
    let mut conn = rt
        .block_on(connect(addr, WEBHOOK_DNS, bundle))
        .expect("connect to the old webhook");
    // `Expect: 100-continue`: the server says `100 Continue` once its handler reads the
    // body, so the review is in flight, by construction, before the SIGTERM.
    let head = format!(
        "POST /mutate HTTP/1.1\r\nhost: {WEBHOOK_DNS}\r\ncontent-type: application/json\r\n\
         expect: 100-continue\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let interim = rt
        .block_on(async {
            conn.write_all(head.as_bytes()).await?;
            conn.flush().await?;
            read_head(&mut conn).await
        })
        .expect("100 Continue");
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
    old.sigterm();
    // It has stopped listening (the event that shows it is shutting down) ...
    let t0 = Instant::now();
    while std::net::TcpStream::connect(addr).is_ok() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the webhook still listens 60 s after SIGTERM:\n{}",
            old.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // ... and still answers the review in flight.
    let (status, answer) = rt
        .block_on(async {
            conn.write_all(&body).await?;
            conn.flush().await?;
            read_answer(&mut conn).await
        })
        .unwrap_or_else(|e| panic!("no answer to the review in flight: {e}\n{}", old.log()));
    assert_eq!(
        patch_of("in-flight", status, &answer).as_deref(),
        Ok(patch),
        "{}",
        old.log()
    );
    old.wait_exit();
    WebhookProc::start(dir, "webhook-2", &addr.to_string())
}

/// Reads an HTTP/1.1 response head from `conn`, byte by byte (nothing after it is
/// consumed).
async fn read_head(conn: &mut (impl tokio::io::AsyncRead + Unpin)) -> std::io::Result<String> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        head.push(conn.read_u8().await?);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// Reads one HTTP/1.1 answer with a `content-length` from `conn`: (status, body).
async fn read_answer(
    conn: &mut (impl tokio::io::AsyncRead + Unpin),
) -> std::io::Result<(u16, Vec<u8>)> {
    let head = read_head(conn).await?.to_ascii_lowercase();
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, head.clone());
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(bad)?;
    let mut body = vec![0; len];
    conn.read_exact(&mut body).await?;
    Ok((status, body))
}
