//! The manager in-process over a scripted driver (`FakeGpu`), driven over
//! its real unix socket and metrics port: allocations, owners, health,
//! the reaper, restarts, the backstop and start-up errors.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tessera_client as client;
use tessera_manager::arbiter::NoArbiter;
use tessera_manager::gpu::fake::FakeGpu;
use tessera_manager::gpu::{GpuEvent, GpuProcess, GpuSample};
use tessera_manager::{Config, Manager, ManagerError};
use tessera_proto::manager::v1 as pb;
use tessera_shm::{LocalLiveness, Member, ProcIdentity, State};
use tonic::Code;

const GI: u64 = 1 << 30;

struct Running {
    core: Arc<tessera_manager::core::Core>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), ManagerError>>,
    socket: std::path::PathBuf,
    metrics: std::net::SocketAddr,
}

impl Running {
    /// Waits until a reaper pass that began after this call has completed,
    /// so whatever the reaper does to the state as it is now has been done.
    async fn reaper_pass(&self) {
        let passes = self.core.passes();
        // The pass running now may have read the state before the call:
        // the next one began after it.
        let seen = passes.reaper() + 1;
        let done = eventually(async || passes.reaper() > seen).await;
        assert!(done.is_some(), "no reaper pass completed");
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await.unwrap().unwrap();
    }
}

/// The tests' hold-off after a critical XID (`config`).
const XID_RECOVERY: Duration = Duration::from_millis(500);

fn config(dir: &Path) -> Config {
    let mut c = Config::for_state_dir(dir);
    c.metrics_addr = Some("127.0.0.1:0".parse().unwrap());
    c.sample_interval = Duration::from_millis(100);
    c.reap_interval = Duration::from_millis(50);
    c.xid_recovery = XID_RECOVERY;
    c.hostname = "test-node".into();
    c.slices_per_gpu = 8;
    c
}

async fn start(c: Config, gpu: Arc<FakeGpu>) -> Running {
    let m = Manager::start(c, gpu, Arc::new(NoArbiter)).await.unwrap();
    let socket = m.socket().to_owned();
    let metrics = m.metrics_addr().unwrap();
    let core = m.core().clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(m.serve(async move {
        let _ = rx.await;
    }));
    Running {
        core,
        stop: Some(tx),
        task,
        socket,
        metrics,
    }
}

type Client = pb::manager_client::ManagerClient<tonic::transport::Channel>;

/// The common start: a manager over `gpus` fake 16 GiB GPUs with the tests'
/// `config` in a fresh state directory, and a client connected to it.
async fn start_fake(gpus: u32) -> (tempfile::TempDir, Arc<FakeGpu>, Running, Client) {
    let dir = tempfile::tempdir().unwrap();
    let gpu = Arc::new(FakeGpu::new(gpus, 16 * GI));
    let m = start(config(dir.path()), gpu.clone()).await;
    let c = client::connect(&m.socket).await.unwrap();
    (dir, gpu, m, c)
}

/// A one-GPU request (see `CreateAllocationRequest::one_device`).
fn request(id: &str, uuid: &str, mem: u64, ppm: u32) -> pb::CreateAllocationRequest {
    pb::CreateAllocationRequest::one_device(id, uuid, mem, ppm)
}

/// Creates the one-GPU allocation, which must succeed.
async fn create(c: &mut Client, id: &str, uuid: &str, mem: u64, ppm: u32) -> pb::Allocation {
    c.create_allocation(request(id, uuid, mem, ppm))
        .await
        .unwrap()
        .into_inner()
}

/// Asks for the one-GPU allocation, which must be refused; the error.
async fn refused(c: &mut Client, id: &str, uuid: &str, mem: u64, ppm: u32) -> tonic::Status {
    c.create_allocation(request(id, uuid, mem, ppm))
        .await
        .unwrap_err()
}

/// Every allocation the manager lists.
async fn list(c: &mut Client) -> Vec<pb::Allocation> {
    c.list_allocations(pb::ListAllocationsRequest {})
        .await
        .unwrap()
        .into_inner()
        .allocations
}

async fn node_status(c: &mut Client) -> pb::NodeStatus {
    c.get_node_status(pb::NodeStatusRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// How long a test waits for what must happen: generous, it is a deadline
/// for a hang, never a measure of speed (the suite runs beside busy CPUs).
const DEADLINE: Duration = Duration::from_secs(60);

/// Polls `f` until it holds or [`DEADLINE`] passes; returns how long it took.
async fn eventually(mut f: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < DEADLINE {
        if f().await {
            return Some(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

async fn scrape(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).await.unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    body.to_owned()
}

/// The value of the one sample of `name` whose labels include all `want`.
fn metric(text: &str, name: &str, want: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .find(|l| {
            want.iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A sample's labels (some of them), as `metric` takes them.
type Labels<'a> = &'a [(&'a str, &'a str)];

/// Asserts the value of each `(name, labels, value)` in `text`.
fn assert_metrics(text: &str, want: &[(&str, Labels, f64)]) {
    for (name, labels, value) in want {
        assert_eq!(
            metric(text, name, labels),
            Some(*value),
            "{name} {labels:?}"
        );
    }
}

/// The ids of every allocation, sorted.
async fn ids(socket: &Path) -> Vec<String> {
    let mut c = client::connect(socket).await.unwrap();
    let mut v: Vec<String> = list(&mut c).await.into_iter().map(|a| a.id).collect();
    v.sort();
    v
}

/// A child process that sleeps, and its identity as a slot records it.
/// A process that really belongs to an allocation in the kernel's eyes: it has the
/// allocation's state file mapped (what the backstop's identity proof reads from
/// `/proc/<pid>/maps`), as the shim has in every governed process.
fn mapper(state: &Path) -> (std::process::Child, ProcIdentity) {
    let mut child = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import mmap, sys, time\n\
             f = open(sys.argv[1], 'r+b')\n\
             m = mmap.mmap(f.fileno(), 0)\n\
             print('mapped', flush=True)\n\
             time.sleep(60)\n",
        )
        .arg(state)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "mapped", "the mapping helper did not start");
    let id = identity_of(child.id());
    (child, id)
}

fn identity_of(pid: u32) -> ProcIdentity {
    let (_, start_time) = tessera_shm::process::stat_of(&pid.to_string()).unwrap();
    ProcIdentity {
        pid,
        pidns: tessera_shm::process::pidns_of("self").unwrap(),
        start_time,
    }
}

fn sleeper() -> (std::process::Child, ProcIdentity) {
    let child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let id = identity_of(child.id());
    (child, id)
}

/// SIGKILLs a child and reaps it.
fn kill(child: &mut std::process::Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The state file of allocation `a`, a sleeping child process and its slot
/// there (joined as the shim joins).
fn joined_sleeper(a: &pb::Allocation) -> (State, std::process::Child, Member) {
    let state = State::open(Path::new(&a.state_path), &a.id).unwrap();
    let (child, id) = sleeper();
    let member = state.join(&id, &LocalLiveness::quick()).unwrap();
    (state, child, member)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_list_delete_over_the_socket() {
    let (dir, gpu, m, mut c) = start_fake(2).await;
    let u0 = gpu.uuid(0);

    let a = create(&mut c, "a1", &u0, 4 * GI, 300_000).await;
    assert_eq!(a.id, "a1");
    assert_eq!(a.policy, pb::ComputePolicy::Burst as i32, "node default");
    assert!(Path::new(&a.control_path).exists() && Path::new(&a.state_path).exists());
    let mounts: Vec<_> = a
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/run/tessera/alloc/control", true),
            ("/run/tessera/alloc/state", false),
            ("/usr/local/lib/tessera/libtessera.so", true)
        ]
    );
    assert_eq!(a.env["TESSERA_CONTROL"], "/run/tessera/alloc/control");
    assert_eq!(a.env["TESSERA_STATE"], "/run/tessera/alloc/state");
    assert_eq!(a.env["TESSERA_ALLOCATION"], "a1");
    assert_eq!(a.env["NVIDIA_VISIBLE_DEVICES"], u0);
    // The control file says what was asked.
    let ctl = tessera_shm::Control::open(Path::new(&a.control_path)).unwrap();
    assert_eq!(ctl.memory_limit(0), 4 * GI);
    assert_eq!(ctl.compute_share_ppm(0), 300_000);

    // Same id and request: the same allocation back. Different: conflict.
    let again = create(&mut c, "a1", &u0, 4 * GI, 300_000).await;
    assert_eq!(again, a);
    let e = refused(&mut c, "a1", &u0, 5 * GI, 300_000).await;
    assert_eq!(e.code(), Code::AlreadyExists, "{e}");

    // An empty id gets one chosen.
    let b = create(&mut c, "", &u0, GI, 100_000).await;
    assert!(b.id.starts_with("alloc-"), "{}", b.id);

    let list = list(&mut c).await;
    let mut ids: Vec<_> = list.iter().map(|a| a.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, ["a1".to_owned(), b.id.clone()]);

    let st = node_status(&mut c).await;
    assert_eq!(st.gpus[0].memory_allocated_bytes, 5 * GI);
    assert_eq!(st.gpus[0].compute_allocated_ppm, 400_000);
    assert_eq!(st.gpus[1].memory_allocated_bytes, 0);

    c.delete_allocation(pb::DeleteAllocationRequest { id: "a1".into() })
        .await
        .unwrap();
    assert!(!Path::new(&a.control_path).exists());
    let e = c
        .delete_allocation(pb::DeleteAllocationRequest { id: "a1".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("no allocation \"a1\""), "{e}");
    m.stop().await;
    assert!(!dir.path().join("manager.sock").exists(), "socket removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_change_nothing() {
    let (dir, gpu, m, mut c) = start_fake(1).await;
    let u0 = gpu.uuid(0);
    let cases = [
        (
            request("x", "GPU-missing", GI, 1),
            Code::InvalidArgument,
            "no GPU",
        ),
        (
            request("x", &u0, 0, 1),
            Code::InvalidArgument,
            "memory_limit_bytes",
        ),
        (
            request("x", &u0, GI, 0),
            Code::InvalidArgument,
            "compute_share_ppm",
        ),
        (
            request("Bad!", &u0, GI, 1),
            Code::InvalidArgument,
            "allocation id",
        ),
        (
            request("x", &u0, 17 * GI, 1),
            Code::InvalidArgument,
            "exceeds",
        ),
    ];
    for (req, code, words) in cases {
        let e = c.create_allocation(req).await.unwrap_err();
        assert_eq!(e.code(), code, "{e}");
        assert!(e.message().contains(words), "{e}");
    }
    create(&mut c, "big", &u0, 12 * GI, 700_000).await;
    let e = refused(&mut c, "more", &u0, 5 * GI, 100_000).await;
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("memory unallocated"), "{e}");
    let e = refused(&mut c, "more", &u0, GI, 400_000).await;
    assert_eq!(e.code(), Code::ResourceExhausted);
    let list = list(&mut c).await;
    assert_eq!(list.len(), 1, "failed requests leave nothing behind");
    // The allocations directory holds the one allocation and the store's own
    // checksummed copies of the records (`.records/`), which hold its record only.
    let names = |p: std::path::PathBuf| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(p)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let allocations = dir.path().join("allocations");
    assert_eq!(names(allocations.clone()), [".records", "big"]);
    let records = names(allocations.join(".records"));
    assert!(
        !records.is_empty() && records.iter().all(|r| r.starts_with("big")),
        "records of failed requests left behind: {records:?}"
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_are_recorded_and_policies_only_tighten() {
    let (_dir, gpu, m, mut c) = start_fake(1).await;
    let u0 = gpu.uuid(0);
    let a = create(&mut c, "a1", &u0, GI, 100_000).await;
    let owned = c
        .set_allocation_owner(pb::SetAllocationOwnerRequest {
            id: "a1".into(),
            namespace: "ml".into(),
            pod: "trainer-0".into(),
            container: "main".into(),
            policy: pb::ComputePolicy::Guaranteed as i32,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (owned.namespace.as_str(), owned.pod.as_str()),
        ("ml", "trainer-0")
    );
    assert_eq!(owned.policy, pb::ComputePolicy::Guaranteed as i32);
    let ctl = tessera_shm::Control::open(Path::new(&a.control_path)).unwrap();
    assert_eq!(ctl.policy(0), tessera_shm::Policy::Guaranteed);

    let e = c
        .set_allocation_owner(pb::SetAllocationOwnerRequest {
            id: "a1".into(),
            policy: pb::ComputePolicy::Burst as i32,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("only become stricter"), "{e}");
    assert_eq!(ctl.policy(0), tessera_shm::Policy::Guaranteed);

    let text = scrape(m.metrics).await;
    assert_eq!(
        metric(
            &text,
            "tessera_allocation_memory_limit_bytes",
            &[
                ("allocation", "a1"),
                ("namespace", "ml"),
                ("pod", "trainer-0"),
                ("container", "main")
            ]
        ),
        Some(GI as f64)
    );
    let e = c
        .set_allocation_owner(pb::SetAllocationOwnerRequest {
            id: "zz".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xids_and_lost_gpus_make_a_gpu_unhealthy_until_it_recovers() {
    // First, what an unhealthy GPU looks like, under a hold-off no test
    // outlives: however slowly the checks below run, the GPU cannot
    // recover in the middle of them.
    let dir = tempfile::tempdir().unwrap();
    let gpu = Arc::new(FakeGpu::new(2, 16 * GI));
    let mut cfg = config(dir.path());
    cfg.xid_recovery = Duration::from_secs(24 * 3600);
    let m = start(cfg, gpu.clone()).await;
    let mut c = client::connect(&m.socket).await.unwrap();
    // The event watcher's first wait came back before the manager served:
    // an event happening from now on is not lost.
    assert!(m.core.passes().gpu_event_waits() > 0);
    let u1 = gpu.uuid(1);
    let mut watch = c
        // An interval no test outlives: every message after the first is
        // one a change sent.
        .watch_node_status(pb::WatchNodeStatusRequest {
            interval_ms: u32::MAX,
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert!(first.gpus.iter().all(|g| g.healthy));

    // An application's XID leaves the GPU healthy.
    gpu.push_event(GpuEvent::Xid {
        uuid: u1.clone(),
        xid: 13,
    });
    // A critical one does not; the watch stream hears of it when it
    // happens, not at its interval.
    gpu.push_event(GpuEvent::Xid {
        uuid: u1.clone(),
        xid: 79,
    });
    let unhealthy = tokio::time::timeout(DEADLINE, async {
        loop {
            let s = watch.message().await.unwrap().unwrap();
            if !s.gpus[1].healthy {
                break s;
            }
        }
    })
    .await
    .expect("the watch stream never sent the XID's change");
    assert_eq!(unhealthy.gpus[1].unhealthy_reason, "critical XID 79");
    assert!(unhealthy.gpus[0].healthy, "only the GPU with the XID");
    let e = refused(&mut c, "on-bad", &u1, GI, 1).await;
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("unhealthy"), "{e}");
    let text = scrape(m.metrics).await;
    assert_metrics(
        &text,
        &[
            ("tessera_gpu_healthy", &[("gpu", "1")], 0.0),
            ("tessera_gpu_healthy", &[("gpu", "0")], 1.0),
        ],
    );
    drop(watch);
    m.stop().await;

    // Then recovery, with the tests' short hold-off. The GPU is held lost
    // while the XID arrives (a lost GPU's queries fail, so nothing clears
    // the XID), and only once the XID was handled does it answer again:
    // what is asserted holds however long each step takes.
    let (_dir, gpu, m, mut c) = start_fake(2).await;
    let u1 = gpu.uuid(1);
    // A lost GPU is unhealthy until it answers again.
    gpu.set_lost(&u1, true);
    let lost = eventually(async || {
        let g = &node_status(&mut c).await.gpus[1];
        !g.healthy && g.unhealthy_reason.contains("lost")
    })
    .await;
    assert!(lost.is_some(), "a lost GPU was not noticed");
    let handled = m.core.passes().gpu_events();
    let pushed = Instant::now();
    gpu.push_event(GpuEvent::Xid {
        uuid: u1.clone(),
        xid: 79,
    });
    let seen = eventually(async || m.core.passes().gpu_events() > handled).await;
    assert!(seen.is_some(), "the XID was never handled");
    gpu.set_lost(&u1, false);
    let back = eventually(async || node_status(&mut c).await.gpus[1].healthy).await;
    assert!(
        back.is_some(),
        "a GPU that answers again stays unhealthy after its XID's hold-off"
    );
    // A lower bound only: healthy again no sooner than the hold-off after
    // the XID (how much later depends on the machine's load).
    let after = pushed.elapsed();
    assert!(
        after >= XID_RECOVERY,
        "healthy {after:?} after a critical XID, within its {XID_RECOVERY:?} hold-off"
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_has_its_memory_reclaimed_by_the_next_reaper_pass() {
    let (_dir, gpu, m, mut c) = start_fake(1).await;
    let u0 = gpu.uuid(0);
    let a = create(&mut c, "a1", &u0, 4 * GI, 1_000_000).await;
    let (state, mut child, member) = joined_sleeper(&a);
    state.reserve(member, 0, 3 * GI, 4 * GI).unwrap();

    // The manager finds the process's host pid.
    let found = eventually(async || {
        let s = node_status(&mut c).await;
        s.allocations[0].processes.first().map(|p| p.host_pid) == Some(child.id())
    })
    .await;
    assert!(found.is_some(), "host pid never resolved");
    assert_eq!(state.reserved(0), 3 * GI);

    kill(&mut child);
    // The first reaper pass that begins after the death returns it all
    // (with the product's 1 s reap interval, within about a second).
    m.reaper_pass().await;
    assert_eq!(state.reserved(0), 0, "not reclaimed by a whole pass");
    assert!(state.processes(1).is_empty());
    state.audit().unwrap();
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_manager_keeps_allocations_and_processes() {
    let (dir, gpu, m, mut c) = start_fake(1).await;
    let u0 = gpu.uuid(0);
    let a = create(&mut c, "keep", &u0, 4 * GI, 500_000).await;
    c.set_allocation_owner(pb::SetAllocationOwnerRequest {
        id: "keep".into(),
        namespace: "ns".into(),
        pod: "p".into(),
        container: "c".into(),
        policy: 0,
    })
    .await
    .unwrap();
    let (state, mut child, member) = joined_sleeper(&a);
    state.reserve(member, 0, GI, 4 * GI).unwrap();
    drop(c);
    m.stop().await;

    // The process runs on while no manager is up, and after.
    let m = start(config(dir.path()), gpu).await;
    let mut c = client::connect(&m.socket).await.unwrap();
    let st = node_status(&mut c).await;
    assert_eq!(st.allocations.len(), 1);
    let al = &st.allocations[0];
    let rec = al.allocation.as_ref().unwrap();
    assert_eq!((rec.id.as_str(), rec.pod.as_str()), ("keep", "p"));
    assert_eq!(al.devices[0].memory_used_bytes, GI);
    assert_eq!(al.processes.len(), 1);
    assert_eq!(al.processes[0].container_pid, child.id());
    // The same files, not new ones: the process's mapping still counts.
    assert_eq!(rec.state_path, a.state_path);
    state.reserve(member, 0, GI, 4 * GI).unwrap();
    let used = node_status(&mut c).await.allocations[0].devices[0].memory_used_bytes;
    assert_eq!(used, 2 * GI);
    // Capacity accounting survived too.
    let e = refused(&mut c, "more", &u0, 13 * GI, 100_000).await;
    assert_eq!(e.code(), Code::ResourceExhausted);
    kill(&mut child);
    let took = eventually(async || state.reserved(0) == 0).await;
    assert!(took.is_some(), "the restarted manager does not reap");
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_gpus_allocations_and_ungoverned_processes() {
    let dir = tempfile::tempdir().unwrap();
    let gpu = Arc::new(FakeGpu::new(2, 16 * GI));
    let u0 = gpu.uuid(0);
    gpu.set_sample(
        &u0,
        GpuSample {
            memory_used_bytes: 3 * GI,
            utilization_percent: 42,
            temperature_c: 55,
            power_mw: 150_500,
        },
    );
    // Killing off: this test watches what is reported, and keeps its processes.
    let mut cfg = config(dir.path());
    cfg.backstop_kill = false;
    let cfg_tolerance = cfg.backstop_tolerance_bytes;
    let m = start(cfg, gpu.clone()).await;
    let mut c = client::connect(&m.socket).await.unwrap();
    let a = create(&mut c, "a1", &u0, 4 * GI, 250_000).await;
    let state = State::open(Path::new(&a.state_path), "a1").unwrap();
    let (mut child, id) = mapper(Path::new(&a.state_path));
    // A live process on the GPU in no allocation (a pid that does not exist is
    // not reported: the backstop judges only processes it can see).
    let (mut stranger, _) = sleeper();
    let member = state.join(&id, &LocalLiveness::quick()).unwrap();
    state.reserve(member, 0, 2 * GI, 4 * GI).unwrap();
    assert!(state.reserve(member, 0, 3 * GI, 4 * GI).is_err());
    // The driver sees our process within its limit, and a stranger.
    gpu.set_processes(
        &u0,
        vec![
            GpuProcess {
                pid: child.id(),
                used_bytes: 2 * GI,
            },
            GpuProcess {
                pid: stranger.id(),
                used_bytes: GI,
            },
        ],
    );
    let g0 = [("gpu", "0"), ("Hostname", "test-node")];
    let mut text = String::new();
    let seen = eventually(async || {
        text = scrape(m.metrics).await;
        metric(
            &text,
            "tessera_ungoverned_processes",
            &[("gpu", "0"), ("reason", "no_shim")],
        ) == Some(1.0)
    })
    .await;
    assert!(seen.is_some(), "stranger not reported:\n{text}");
    let a1 = [("allocation", "a1"), ("gpu", "0")];
    let over_limit = [("gpu", "0"), ("reason", "over_limit")];
    assert_metrics(
        &text,
        &[
            ("tessera_gpu_memory_used_bytes", &g0, 3.0 * GI as f64),
            ("tessera_gpu_memory_total_bytes", &g0, 16.0 * GI as f64),
            ("tessera_gpu_utilization_ratio", &g0, 0.42),
            ("tessera_gpu_temperature_celsius", &g0, 55.0),
            ("tessera_gpu_power_watts", &g0, 150.5),
            // 4 GiB of 16 at 8 slices per GPU: 2 slices; 25% of compute: 2 slices.
            ("tessera_gpu_slices_allocated", &g0, 2.0),
            ("tessera_gpu_slices", &g0, 8.0),
            ("tessera_gpu_slices_allocated", &[("gpu", "1")], 0.0),
            ("tessera_allocation_memory_used_bytes", &a1, 2.0 * GI as f64),
            (
                "tessera_allocation_memory_limit_bytes",
                &a1,
                4.0 * GI as f64,
            ),
            ("tessera_allocation_compute_share_ratio", &a1, 0.25),
            ("tessera_allocation_processes", &a1, 1.0),
            ("tessera_allocation_oom_refused_total", &a1, 1.0),
            ("tessera_allocation_wait_seconds_total", &a1, 0.0),
            ("tessera_ungoverned_processes", &over_limit, 0.0),
        ],
    );

    // Our process goes over its limit plus the tolerance in the
    // driver's view (it escaped the shim): reported, and not killed, since
    // killing is off.
    gpu.set_processes(
        &u0,
        vec![GpuProcess {
            pid: child.id(),
            used_bytes: 4 * GI + cfg_tolerance + 1,
        }],
    );
    let over = eventually(async || {
        let t = scrape(m.metrics).await;
        metric(
            &t,
            "tessera_ungoverned_processes",
            &[("gpu", "0"), ("reason", "over_limit")],
        ) == Some(1.0)
    })
    .await;
    assert!(over.is_some(), "over-limit process not reported");
    assert!(
        child.try_wait().unwrap().is_none(),
        "killed although killing is off"
    );
    kill(&mut child);
    kill(&mut stranger);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backstop_kills_only_when_told_to() {
    let dir = tempfile::tempdir().unwrap();
    let gpu = Arc::new(FakeGpu::new(1, 16 * GI));
    let u0 = gpu.uuid(0);
    let mut cfg = config(dir.path());
    cfg.backstop_kill = true;
    let m = start(cfg, gpu.clone()).await;
    // The GPU is shared (an allocation lives on it): a process in no allocation
    // there is stopped. (On a GPU no allocation uses, it is only reported:
    // tests/tests/attack_backstop.rs.)
    let mut c = client::connect(&m.socket).await.unwrap();
    create(&mut c, "a1", &u0, 4 * GI, 250_000).await;
    let mut stranger = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    gpu.set_processes(
        &u0,
        vec![GpuProcess {
            pid: stranger.id(),
            used_bytes: GI,
        }],
    );
    let died = eventually(async || stranger.try_wait().unwrap().is_some()).await;
    assert!(
        died.is_some(),
        "an ungoverned process survived with kill on"
    );
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let gpu = Arc::new(FakeGpu::new(1, 16 * GI));
    let m = start(config(dir.path()), gpu.clone()).await;

    // A second manager on the same state directory.
    let e = Manager::start(config(dir.path()), gpu.clone(), Arc::new(NoArbiter))
        .await
        .unwrap_err();
    assert!(matches!(e, ManagerError::Locked(_)), "{e}");
    assert!(e.to_string().contains("another manager is running"), "{e}");

    // Another state directory, the same socket.
    let other = tempfile::tempdir().unwrap();
    let mut c = config(other.path());
    c.socket = m.socket.clone();
    let e = Manager::start(c, gpu.clone(), Arc::new(NoArbiter))
        .await
        .unwrap_err();
    assert!(matches!(e, ManagerError::SocketInUse(_)), "{e}");
    assert!(e.to_string().contains("already serving"), "{e}");

    // The metrics port taken.
    let mut c = config(other.path());
    c.metrics_addr = Some(m.metrics);
    let e = Manager::start(c, gpu.clone(), Arc::new(NoArbiter))
        .await
        .unwrap_err();
    assert!(matches!(e, ManagerError::Metrics { .. }), "{e}");
    assert!(e.to_string().contains("--metrics-addr"), "{e}");
    assert!(
        !other.path().join("manager.sock").exists(),
        "a failed start leaves no socket behind"
    );

    // A state directory that cannot be made.
    let file = other.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let e = Manager::start(config(&file.join("sub")), gpu.clone(), Arc::new(NoArbiter))
        .await
        .unwrap_err();
    assert!(matches!(e, ManagerError::StateDir { .. }), "{e}");
    m.stop().await;

    // A stale socket left by a dead manager is taken over.
    let stale = tempfile::tempdir().unwrap();
    drop(std::os::unix::net::UnixListener::bind(stale.path().join("manager.sock")).unwrap());
    let m = start(config(stale.path()), gpu).await;
    client::connect(&m.socket).await.unwrap();
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allocation_of_a_run_that_died_is_deleted_once_its_processes_are_gone() {
    use tessera_contract::labels::RunOwner;
    let (_dir, gpu, m, mut c) = start_fake(1).await;
    let u0 = gpu.uuid(0);

    // A "tessera run" (a sleeper) with one process of its own joined.
    let (mut run, run_id) = sleeper();
    let owner = RunOwner {
        pid: run_id.pid,
        pidns: run_id.pidns,
        start_time: run_id.start_time,
    };
    let mut req = request("run-x", &u0, GI, 100_000);
    req.labels = owner.labels().into_iter().collect();
    // The run is bound to the peer the kernel names (here: as the service
    // would pass it), not to the labels a request carries.
    let peer = tessera_manager::core::Peer {
        uid: None,
        pid: Some(run_id.pid),
    };
    let a = m
        .core
        .create_for(tessera_manager::wire::create(&req).unwrap(), peer)
        .unwrap();
    assert_eq!(a.labels["cli-tracked"], "true");
    // A request naming the run in its labels over our own connection is
    // bound to us, alive: never collected when the run dies.
    let mut forged = request("run-forged", &u0, GI, 100_000);
    forged.labels = owner.labels().into_iter().collect();
    let f = c.create_allocation(forged).await.unwrap().into_inner();
    assert_eq!(f.labels["cli-pid"], std::process::id().to_string());
    // A device-plugin allocation with no process is never touched.
    create(&mut c, "pod-y", &u0, GI, 100_000).await;
    let state = State::open(Path::new(&a.state_path), "run-x").unwrap();
    let (mut worker, worker_id) = sleeper();
    state.join(&worker_id, &LocalLiveness::quick()).unwrap();

    kill(&mut run);
    // Two whole reaper passes after the run died (the first collects the
    // dead run if it ever would).
    m.reaper_pass().await;
    m.reaper_pass().await;
    assert_eq!(
        ids(&m.socket).await,
        ["pod-y", "run-forged", "run-x"],
        "kept while a process runs"
    );

    kill(&mut worker);
    let gone = eventually(async || ids(&m.socket).await == ["pod-y", "run-forged"]).await;
    assert!(
        gone.is_some(),
        "the orphaned run's allocation was never deleted"
    );
    m.stop().await;
}
