//! `CUDA_VISIBLE_DEVICES` in the simulated driver: which devices a process sees, under
//! which ordinals, and that its work is recorded against the physical device it chose.
//! NVML ignores the variable, as on a real node.

use std::time::Duration;

use tessera_e2e::{Mode, ProbeChild, ProbeOutput, SimNode};
use tessera_sim::NodeConfig;
use tessera_sim::node::{device_uuid, format_uuid};

const T: Duration = Duration::from_secs(30);
const MI: u64 = 1 << 20;
const VAR: &str = "CUDA_VISIBLE_DEVICES";

fn node3() -> SimNode {
    SimNode::builder().devices(3).memory("1Gi").build()
}

fn uuid(node: &SimNode, index: u32) -> String {
    node.node().device_info(index).expect("device info").uuid
}

/// Runs the probe with `CUDA_VISIBLE_DEVICES` set to `spec` (`None`: removed).
fn run(node: &SimNode, spec: Option<&str>, script: &[&str]) -> ProbeOutput {
    let mut c = node.probe(Mode::Link, script);
    match spec {
        Some(s) => c.env(VAR, s),
        None => c.env_remove(VAR),
    };
    ProbeOutput::from_output(c.output().expect("running the probe"))
}

/// The UUIDs of ordinals `0..n` as the process sees them, after checking the count.
fn seen(node: &SimNode, spec: Option<&str>, n: usize) -> Vec<String> {
    let mut script = vec!["init".to_string(), "count".to_string()];
    for d in 0..n {
        script.push(format!("device {d}"));
        script.push("uuid".to_string());
    }
    let script: Vec<&str> = script.iter().map(String::as_str).collect();
    let out = run(node, spec, &script);
    out.expect_ok();
    assert_eq!(
        out.get("count").u64("n"),
        n as u64,
        "{spec:?}: {}",
        out.stdout
    );
    out.fields("uuid", "uuid")
        .into_iter()
        .map(str::to_owned)
        .collect()
}

#[test]
fn unset_shows_every_device_in_node_order() {
    let node = node3();
    let all: Vec<String> = (0..3).map(|i| uuid(&node, i)).collect();
    assert_eq!(seen(&node, None, 3), all);
}

#[test]
fn indices_select_and_reorder_devices() {
    let node = node3();
    assert_eq!(
        seen(&node, Some("2,0"), 2),
        vec![uuid(&node, 2), uuid(&node, 0)]
    );
    // An ordinal past the list is not a device.
    let out = run(&node, Some("2,0"), &["init", "device 2", "uuid"]);
    assert_eq!(
        out.get("uuid").error.as_deref(),
        Some("CUDA_ERROR_INVALID_DEVICE"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_uuid_makes_that_device_ordinal_0_and_its_work_lands_there() {
    let node = node3();
    let chosen = uuid(&node, 1);
    let mut c = node.probe(Mode::Link, &[]);
    c.env(VAR, &chosen);
    let mut p = ProbeChild::start(c);
    for cmd in ["init", "ctx", "load kernel step 1ms", "nvml-init"] {
        let l = p.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    assert_eq!(p.cmd("count", T).u64("n"), 1);
    assert_eq!(p.cmd("uuid", T).str("uuid"), chosen);
    assert_eq!(p.cmd("nvml-count", T).u64("n"), 3, "NVML sees every device");
    assert_eq!(
        p.cmd("totalmem", T).u64("bytes"),
        node.node().device_info(1).expect("info").memory_total
    );

    let a = p.cmd(&format!("alloc {}", 32 * MI), T);
    assert!(a.ok, "{}", a.raw);
    assert!(p.cmd("launch step 5", T).ok);
    assert!(p.cmd("sync", T).ok);

    // Ground truth: memory, context and busy time are on physical device 1.
    let n = node.node();
    assert_eq!(n.memory_used(1), 32 * MI);
    assert_eq!(n.memory_used(0), 0);
    assert_eq!(n.memory_used(2), 0);
    let usage = n.process(p.pid()).expect("the probe is listed");
    assert_eq!(usage.memory, vec![0, 32 * MI, 0]);
    assert_eq!(usage.contexts, 0b010, "a context on device 1 only");
    assert_eq!(usage.launches, vec![0, 5, 0]);
    assert!(usage.busy_ns[1] >= 5_000_000 && usage.busy_ns[0] == 0);
    // Memory info of ordinal 0 is device 1's.
    let m = p.cmd("meminfo", T);
    assert_eq!(m.u64("total") - m.u64("free"), 32 * MI);
    p.finish();
}

#[test]
fn a_unique_uuid_prefix_selects_its_device() {
    let node = node3();
    let full = uuid(&node, 2);
    // The shortest prefix (beyond "GPU-") no other device shares.
    let prefix = (5..full.len())
        .map(|n| &full[..n])
        .find(|p| (0..2).all(|i| !uuid(&node, i).starts_with(p)))
        .expect("uuids differ");
    assert_eq!(seen(&node, Some(prefix), 1), vec![full.clone()]);
    assert_eq!(
        seen(&node, Some(&format!("{prefix},0")), 2),
        vec![full, uuid(&node, 0)]
    );
}

#[test]
fn parsing_stops_at_the_first_invalid_entry() {
    let node = node3();
    let (u0, u1, u2) = (uuid(&node, 0), uuid(&node, 1), uuid(&node, 2));
    assert_eq!(
        seen(&node, Some("1,7,0"), 1),
        vec![u1.clone()],
        "unknown index"
    );
    assert_eq!(
        seen(&node, Some(&format!("2,GPU-not-a-device,{u0}")), 1),
        vec![u2.clone()],
        "unknown uuid"
    );
    assert_eq!(seen(&node, Some("1,1,2"), 1), vec![u1.clone()], "duplicate");
    assert_eq!(
        seen(&node, Some(&format!("{u2},2,0")), 1),
        vec![u2],
        "the same device twice"
    );
    assert_eq!(seen(&node, Some("0,,1"), 1), vec![u0], "empty entry");
}

#[test]
fn an_ambiguous_prefix_is_invalid() {
    // A node whose devices 0 and 1 share their UUIDs' first hex digit.
    let seed = (1..10_000u64)
        .find(|s| format_uuid(&device_uuid(*s, 0))[..5] == format_uuid(&device_uuid(*s, 1))[..5])
        .expect("some seed gives two devices the same first digit");
    let node = SimNode::builder()
        .config(NodeConfig {
            seed,
            devices: 2,
            ..NodeConfig::default()
        })
        .build();
    let (u0, u1) = (uuid(&node, 0), uuid(&node, 1));
    assert_eq!(u0[..5], u1[..5], "the seed search found a shared digit");
    assert_eq!(
        seen(&node, Some(&format!("1,{}", &u0[..5])), 1),
        vec![u1.clone()]
    );
    // One device past the shared digit is unique again.
    let unique = (6..u0.len())
        .map(|n| &u0[..n])
        .find(|p| !u1.starts_with(p))
        .expect("uuids differ");
    assert_eq!(seen(&node, Some(unique), 1), vec![u0]);
}

#[test]
fn no_visible_device_is_no_device() {
    let node = node3();
    for spec in ["", "-1", "7", "GPU-not-a-device,0"] {
        let out = run(
            &node,
            Some(spec),
            &["init", "count", "nvml-init", "nvml-count"],
        );
        assert_eq!(
            out.get("init").error.as_deref(),
            Some("CUDA_ERROR_NO_DEVICE"),
            "{spec:?}: {}",
            out.stdout
        );
        assert_eq!(out.get("count").u64("n"), 0, "{spec:?}: {}", out.stdout);
        assert_eq!(
            out.get("nvml-count").u64("n"),
            3,
            "{spec:?}: NVML unaffected"
        );
    }
}

/// On a mixed node NVIDIA's libraries see only NVIDIA's GPUs, numbered among themselves,
/// and the work of ordinal 0 lands on the physical device behind it (the ground truth is
/// indexed physically, whoever's the GPU).
#[test]
fn a_mixed_node_shows_cuda_and_nvml_only_the_nvidia_devices() {
    use tessera_sim::{GpuSpec, Vendor};
    let node = SimNode::builder()
        .config(NodeConfig {
            devices: 4,
            memory_per_device: 1 << 30,
            gpus: vec![
                GpuSpec::amd(None),
                GpuSpec::nvidia(),
                GpuSpec::amd(Some("AMD Instinct MI300X")),
                GpuSpec::nvidia(),
            ],
            ..NodeConfig::default()
        })
        .build();
    assert_eq!(node.node().devices_of(Vendor::Nvidia), vec![1, 3]);
    assert_eq!(seen(&node, None, 2), vec![uuid(&node, 1), uuid(&node, 3)]);
    // CUDA_VISIBLE_DEVICES indexes NVIDIA's numbering: "1" is physical device 3, and
    // an AMD device's UUID names nothing.
    assert_eq!(seen(&node, Some("1"), 1), vec![uuid(&node, 3)]);
    let none = run(&node, Some(&uuid(&node, 2)), &["init"]);
    assert_eq!(
        none.get("init").error.as_deref(),
        Some("CUDA_ERROR_NO_DEVICE"),
        "{}",
        none.stdout
    );

    let mut p = ProbeChild::start(node.probe(Mode::Link, &[]));
    for cmd in ["init", "ctx", "nvml-init"] {
        let l = p.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }
    assert_eq!(p.cmd("nvml-count", T).u64("n"), 2);
    assert_eq!(p.cmd("nvml-uuid", T).str("uuid"), uuid(&node, 1));
    let a = p.cmd(&format!("alloc {}", 32 * MI), T);
    assert!(a.ok, "{}", a.raw);
    let usage = node.node().process(p.pid()).expect("the probe is listed");
    assert_eq!(usage.memory[..4], [0, 32 * MI, 0, 0]);
    p.finish();
}
