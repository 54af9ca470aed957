//! Upgrading the manager over the previous release's on-disk state: the allocations
//! directory as the manager of release 0.1.0 (layout version 1) wrote it, kept in
//! `tests/fixtures/state-v1/` — records, checksummed copies, control and state files, one
//! of them with the slot of a process that held memory when the manager was killed —
//! is read by this manager with nothing lost: every record field, every limit and share,
//! the capacity it holds, and the processes that join it after are governed by it.
//!
//! The fixture is made by `generate_fixture` (ignored; run by hand on the release whose
//! state it freezes, see docs/upgrade.md) on the simulated node below: its GPU UUIDs come
//! from the node's seed, so the test's node has the same GPUs.

mod manager_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use manager_support::*;
use tessera_e2e::SimNode;
use tessera_proto::manager::v1 as pb;

const GI: u64 = 1 << 30;
const T: Duration = Duration::from_secs(20);
const SEED: u64 = 0x0f17_0001;

role_test!();

fn node() -> SimNode {
    SimNode::e2e(2, SEED)
}

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/state-v1/allocations")
}

/// What the fixture holds, as the generator asked for it: (id, [(gpu, bytes, ppm)],
/// policy, device ids, labels, owner).
struct Expected {
    id: &'static str,
    devices: &'static [(u32, u64, u32)],
    policy: pb::ComputePolicy,
    device_ids: &'static [&'static str],
    labels: &'static [(&'static str, &'static str)],
    owner: Option<(&'static str, &'static str, &'static str)>,
}

const EXPECTED: &[Expected] = &[
    Expected {
        id: "fixture-held",
        devices: &[(0, 6 * GI, 250_000)],
        policy: pb::ComputePolicy::Burst,
        device_ids: &[],
        labels: &[("source", "cli")],
        owner: None,
    },
    Expected {
        id: "fixture-pod",
        devices: &[(0, 4 * GI, 125_000), (1, 8 * GI, 500_000)],
        policy: pb::ComputePolicy::Guaranteed,
        device_ids: &["dev-0::1", "dev-1::0"],
        labels: &[("source", "device-plugin")],
        owner: Some(("team-a", "trainer-0", "main")),
    },
    Expected {
        id: "fixture-idle",
        devices: &[(1, 2 * GI, 100_000)],
        policy: pb::ComputePolicy::Burst,
        device_ids: &[],
        labels: &[],
        owner: None,
    },
];

/// `dev-<i>::<n>` in the table stands for the GPU's own UUID.
fn device_id(n: &SimNode, short: &str) -> String {
    let (dev, slice) = short.split_once("::").expect("dev-i::n");
    let i: u32 = dev.trim_start_matches("dev-").parse().expect("device");
    format!("{}::{slice}", n.node().device_info(i).unwrap().uuid)
}

fn request(n: &SimNode, e: &Expected) -> pb::CreateAllocationRequest {
    pb::CreateAllocationRequest {
        id: e.id.into(),
        devices: e
            .devices
            .iter()
            .map(|&(gpu, bytes, ppm)| pb::DeviceRequest {
                gpu_uuid: n.node().device_info(gpu).unwrap().uuid,
                memory_limit_bytes: bytes,
                compute_share_ppm: ppm,
                slices: 0,
            })
            .collect(),
        policy: e.policy as i32,
        device_ids: e.device_ids.iter().map(|d| device_id(n, d)).collect(),
        labels: e
            .labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}

/// Makes the fixture with this build's manager. Run by hand, with the release whose
/// state is to be frozen checked out:
/// `TESSERA_FIXTURE_OUT=$PWD/tests/fixtures/state-v1 cargo test -p tessera-e2e --test upgrade generate_fixture -- --ignored`
#[test]
#[ignore = "generates the fixture by hand (TESSERA_FIXTURE_OUT)"]
fn generate_fixture() {
    let Some(out) = std::env::var_os("TESSERA_FIXTURE_OUT") else {
        panic!("set TESSERA_FIXTURE_OUT to the fixture directory");
    };
    let n = node();
    let dir = n.dir.path().join("m");
    let m = ManagerProc::start(&n, &dir, &[]);
    for e in EXPECTED {
        let req = request(&n, e);
        with_client(&m.socket, async |c| c.create_allocation(req).await).expect("create");
        if let Some((ns, pod, container)) = e.owner {
            let req = pb::SetAllocationOwnerRequest {
                id: e.id.into(),
                namespace: ns.into(),
                pod: pod.into(),
                container: container.into(),
                policy: 0,
            };
            with_client(&m.socket, async |c| c.set_allocation_owner(req).await).expect("owner");
        }
    }
    // A process holds 3 GiB of fixture-held when the manager is killed (a crash, not a
    // stop), then dies itself: its slot is in the fixture, for the next manager to reclaim.
    let held = status_of(&m.socket, "fixture-held");
    let a = held.allocation.unwrap();
    let mut w = governed_probe(&n, &a.control_path, &a.state_path);
    for cmd in ["init", "ctx", &format!("alloc {}", 3 * GI)] {
        let l = w.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    drop(m);
    w.kill();
    let out = PathBuf::from(out);
    let _ = std::fs::remove_dir_all(&out);
    copy_tree(&dir.join("allocations"), &out.join("allocations"));
}

#[test]
fn the_previous_releases_state_is_read_with_nothing_lost() {
    let _serial = serial();
    let n = node();
    let dir = n.dir.path().join("m");
    copy_tree(&fixture_dir(), &dir.join("allocations"));
    // The fixture's dead process held 3 GiB when its manager was killed.
    let held_state = dir.join("allocations/fixture-held/state");
    let before = tessera_shm::State::open(&held_state, "fixture-held").expect("v1 state");
    assert_eq!(before.reserved(0), 3 * GI);
    let dead = before.processes(1);
    assert_eq!(dead.len(), 1);
    // The fixture was made on another machine: its process's pid namespace is moved to
    // this one's, as on the node where it ran (a namespace the manager cannot see, with
    // no host pid recorded, is one it must not judge: that is another test's matter).
    {
        use std::os::unix::fs::MetadataExt;
        let here = std::fs::metadata("/proc/self/ns/pid").unwrap().ino();
        before
            .slot(dead[0].slot)
            .pidns
            .store(here, std::sync::atomic::Ordering::SeqCst);
    }
    let m = ManagerProc::start(&n, &dir, &[]);
    let log = m.log();
    let st = node_status(&m.socket);
    let mut ids: Vec<String> = st
        .allocations
        .iter()
        .map(|a| a.allocation.as_ref().unwrap().id.clone())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        ["fixture-held", "fixture-idle", "fixture-pod"],
        "{log}"
    );
    for e in EXPECTED {
        let s = status_of(&m.socket, e.id);
        assert_eq!(s.recovered, "", "{}: nothing was damaged:\n{log}", e.id);
        let a = s.allocation.unwrap();
        let want = request(&n, e);
        assert_eq!(a.devices, want.devices, "{}", e.id);
        assert_eq!(a.policy, want.policy, "{}", e.id);
        assert_eq!(a.device_ids, want.device_ids, "{}", e.id);
        let labels: BTreeMap<_, _> = a.labels.into_iter().collect();
        let want_labels: BTreeMap<_, _> = want.labels.into_iter().collect();
        assert_eq!(labels, want_labels, "{}", e.id);
        let (ns, pod, container) = e.owner.unwrap_or_default();
        assert_eq!(
            (a.namespace.as_str(), a.pod.as_str()),
            (ns, pod),
            "{}",
            e.id
        );
        assert_eq!(a.container, container, "{}", e.id);
        // The files were served as they are: not moved aside, not rewritten.
        assert!(Path::new(&a.control_path).is_file());
    }
    let aside: Vec<_> = std::fs::read_dir(dir.join("allocations"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".broken"))
        .collect();
    assert!(aside.is_empty(), "moved aside: {aside:?}\n{log}");

    // The dead process's 3 GiB are reclaimed by this manager.
    let reclaimed = eventually(T, || {
        status_of(&m.socket, "fixture-held")
            .devices
            .iter()
            .all(|d| d.memory_used_bytes == 0)
    });
    assert!(
        reclaimed.is_some(),
        "the fixture's dead slot kept its memory:\n{}",
        m.log()
    );
    assert_eq!(before.reserved(0), 0);
    assert!(before.processes(1).is_empty());

    // The capacity the old allocations hold is not re-sold: GPU 1 has 8 + 2 GiB and
    // 60 % of its time taken; 7 GiB does not fit beside them on a 16 GiB GPU, 5 GiB does.
    let uuid1 = n.node().device_info(1).unwrap().uuid;
    let big = pb::CreateAllocationRequest::one_device("too-big", &uuid1, 7 * GI, 100_000);
    let e = with_client(&m.socket, async |c| c.create_allocation(big).await)
        .expect_err("capacity re-sold");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    let share = pb::CreateAllocationRequest::one_device("too-much", &uuid1, GI, 500_000);
    let e = with_client(&m.socket, async |c| c.create_allocation(share).await)
        .expect_err("share re-sold");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
    create(&m.socket, "fits", &uuid1, 5 * GI, 300_000);

    // A process of this release joins an allocation of the old one and is held to it.
    let held = status_of(&m.socket, "fixture-held").allocation.unwrap();
    let mut w = governed_probe(&n, &held.control_path, &held.state_path);
    for cmd in ["init", "ctx", &format!("alloc {}", 5 * GI)] {
        let l = w.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    let over = w.cmd(&format!("alloc {}", 2 * GI), T);
    assert!(!over.ok, "past the old allocation's limit: {}", over.raw);
    w.kill();
    m.stop();
}

/// Starts the manager on `dir` expecting it to refuse: its exit status and stderr.
fn manager_refuses(n: &SimNode, dir: &Path) -> String {
    let out = role_command("manager", &manager_args(dir))
        .envs(n.env())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run the manager");
    let err = stderr(&out);
    assert!(
        !out.status.success(),
        "started on a newer release's state:\n{err}"
    );
    err
}

/// A rollback: state written by a newer release (a record of a newer layout, a control
/// file of a newer ABI) stops the manager's start with a line naming the file, and is
/// left exactly as it was (never "recovered" as damage, never moved aside).
#[test]
fn a_newer_releases_state_stops_the_manager_and_is_left_as_it_was() {
    let n = node();
    let dir = n.dir.path().join("m");
    let allocs = dir.join("allocations");
    copy_tree(&fixture_dir(), &allocs);
    let record = allocs.join("fixture-pod/allocation.json");
    let text = std::fs::read_to_string(&record).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["layout_version"] = 2.into();
    v["a_field_of_the_future"] = "x".into();
    let newer = serde_json::to_string_pretty(&v).unwrap();
    std::fs::write(&record, &newer).unwrap();
    let err = manager_refuses(&n, &dir);
    assert!(
        err.contains(&record.display().to_string())
            && err.contains("record layout version 2 was written by a newer Tessera"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&record).unwrap(), newer);
    std::fs::write(&record, &text).unwrap();

    let control = allocs.join("fixture-idle/control");
    let mut bytes = std::fs::read(&control).unwrap();
    bytes[8..12].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(&control, &bytes).unwrap();
    let err = manager_refuses(&n, &dir);
    assert!(
        err.contains(&control.display().to_string())
            && err.contains("control file ABI version 2 was written by a newer Tessera"),
        "{err}"
    );
    assert_eq!(std::fs::read(&control).unwrap(), bytes);
    let aside = std::fs::read_dir(&allocs)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".broken")
        })
        .count();
    assert_eq!(aside, 0);
}
