//! The manager on a mixed node (an NVIDIA GPU and an AMD GPU of the simulated node):
//! both in its inventory, `tessera status` (table and JSON) and the metrics, each
//! named by its vendor, and a process on the AMD GPU seen by the backstop through
//! ROCm SMI's per-process figures.

mod manager_support;

use manager_support::*;
use tessera_contract::vendor::format_amd_uuid;
use tessera_e2e::{SimNode, sim_rocm_smi_library};
use tessera_sim::{GpuSpec, NodeConfig};

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;

role_test!();

#[test]
fn status_and_metrics_show_both_vendors_and_the_backstop_reads_amd_usage() {
    let _serial = serial();
    let n = SimNode::builder()
        .config(NodeConfig {
            devices: 2,
            memory_per_device: 16 * GI,
            sms: 100,
            cc_major: 8,
            cc_minor: 6,
            name: "E2E Simulated GPU".into(),
            seed: 0x313d,
            gpus: vec![GpuSpec::nvidia(), GpuSpec::amd(Some("AMD Instinct MI210"))],
        })
        .build();
    let rocm = sim_rocm_smi_library();
    // Report only: the process this test leaves on the AMD GPU is this test's own.
    let m = ManagerProc::start(
        &n,
        &n.dir.path().join("m"),
        &[
            "--rocm-smi-library",
            rocm.to_str().expect("a UTF-8 path"),
            "--backstop-kill",
            "false",
        ],
    );
    let nv = n.node().device_info(0).expect("device 0");
    let amd = n.node().device_info(1).expect("device 1");
    let mut id = [0u8; 8];
    id.copy_from_slice(&amd.uuid_bytes[..8]);
    let amd_uuid = format_amd_uuid(u64::from_be_bytes(id));

    let st = node_status(&m.socket);
    let seen: Vec<(u32, &str, &str, &str)> = st
        .gpus
        .iter()
        .map(|g| (g.index, g.uuid.as_str(), g.vendor.as_str(), g.name.as_str()))
        .collect();
    assert_eq!(
        seen,
        [
            (0, nv.uuid.as_str(), "nvidia", "E2E Simulated GPU"),
            (1, amd_uuid.as_str(), "amd", "AMD Instinct MI210")
        ]
    );
    assert!(
        st.driver_version.contains("rocm-smi 5.2.3"),
        "{}",
        st.driver_version
    );

    // This process holds 256 MiB on the AMD GPU with no allocation: ROCm SMI lists it,
    // and the backstop, reading that list, reports it.
    let node = n.node();
    let slot = node.attach().expect("a process slot");
    assert!(node.reserve_memory(slot, 1, 256 * MI));
    let reported = eventually(DEADLINE, || {
        let e = parse_exposition(&scrape(m.metrics)).expect("exposition");
        e.get(
            "tessera_ungoverned_processes",
            &[("UUID", &amd_uuid), ("reason", "no_shim")],
        ) == Some(1.0)
            && e.get("tessera_gpu_memory_used_bytes", &[("UUID", &amd_uuid)])
                == Some((256 * MI) as f64)
    });
    assert!(
        reported.is_some(),
        "the backstop never reported the process on the AMD GPU:\n{}\n{}",
        scrape(m.metrics),
        m.log()
    );
    let e = parse_exposition(&scrape(m.metrics)).expect("exposition");
    for (uuid, vendor) in [(nv.uuid.as_str(), "nvidia"), (amd_uuid.as_str(), "amd")] {
        assert_eq!(
            e.get("tessera_gpu_info", &[("UUID", uuid), ("vendor", vendor)]),
            Some(1.0),
            "{uuid} {vendor}"
        );
    }
    assert_eq!(
        e.get(
            "tessera_ungoverned_processes",
            &[("UUID", &nv.uuid), ("reason", "no_shim")]
        ),
        Some(0.0),
        "nothing on the NVIDIA GPU"
    );

    // `tessera status`, and one frame of `tessera top` (not on a terminal:
    // the frame is printed plain), each GPU with its vendor.
    let sock = m.socket.to_str().expect("a UTF-8 path").to_owned();
    for cmd in [
        &["status", "--socket", &sock][..],
        &["top", "--socket", &sock, "-n", "1"][..],
    ] {
        let out = client(&n, cmd);
        assert!(out.status.success(), "{cmd:?}: {}", stderr(&out));
        let table = role_stdout(&out);
        let row = |i: &str| {
            table
                .lines()
                .find(|l| l.starts_with(&format!("{i} ")))
                .unwrap_or_else(|| panic!("{cmd:?}: no row {i}:\n{table}"))
                .to_owned()
        };
        assert!(
            row("0").contains(" nvidia ") && row("0").contains("E2E Simulated GPU"),
            "{cmd:?}: {table}"
        );
        assert!(
            row("1").contains(" amd ") && row("1").contains("AMD Instinct MI210"),
            "{cmd:?}: {table}"
        );
        assert!(row("1").contains("256Mi / 16Gi"), "{cmd:?}: {table}");
    }
    let out = client(&n, &["status", "--socket", &sock, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&role_stdout(&out)).expect("status JSON");
    assert_eq!(v["gpus"][0]["vendor"], "nvidia");
    assert_eq!(v["gpus"][1]["vendor"], "amd");
    assert_eq!(v["gpus"][1]["uuid"], amd_uuid.as_str());

    node.release_memory(slot, 1, 256 * MI);
    m.stop();
}
