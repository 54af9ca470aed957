//! The manager's ROCm SMI backend (`tessera_manager::rocm_smi`) and the vendor seam
//! (`vendors::open`) against the simulated `librocm_smi64.so.5` and NVML on a mixed node:
//! inventory, memory and per-process usage by the node's ground truth, a lost device.
//!
//! This binary holds one test on purpose: it sets `TESSERA_SIM_STATE` in its own
//! environment before the libraries are loaded, which is only sound with no other test
//! running.

use tessera_contract::Vendor;
use tessera_contract::vendor::format_amd_uuid;
use tessera_e2e::{SimNode, sim_nvml_library, sim_rocm_smi_library};
use tessera_manager::gpu::{GpuBackend, GpuError, GpuProcess};
use tessera_manager::rocm_smi::RocmSmiGpu;
use tessera_sim::{GpuSpec, NodeConfig};

const GI: u64 = 1 << 30;
const MI: u64 = 1 << 20;

/// The UUID the manager must give the node's device `i` (an AMD one): rocm-smi's unique
/// id is the device's first eight UUID bytes.
fn amd_uuid(node: &SimNode, i: u32) -> String {
    let info = node.node().device_info(i).expect("device");
    let mut b = [0u8; 8];
    b.copy_from_slice(&info.uuid_bytes[..8]);
    format_amd_uuid(u64::from_be_bytes(b))
}

#[test]
fn rocm_smi_reads_the_amd_gpus_of_a_mixed_node() {
    // NVIDIA, AMD, NVIDIA, AMD: each library must pick its own out of the node's order.
    let node = SimNode::builder()
        .config(NodeConfig {
            devices: 4,
            memory_per_device: 8 * GI,
            gpus: vec![
                GpuSpec::nvidia(),
                GpuSpec::amd(Some("AMD Instinct MI210")),
                GpuSpec::nvidia(),
                GpuSpec::amd(Some("AMD Instinct MI300X")),
            ],
            seed: 0x05ee_da3d,
            ..NodeConfig::default()
        })
        .build();
    // SAFETY: this is the only test of this binary, so no other thread reads or writes the
    // environment while it is changed (the harness's main thread only waits).
    unsafe { std::env::set_var("TESSERA_SIM_STATE", &node.state) };

    let amd = RocmSmiGpu::open(Some(&sim_rocm_smi_library())).expect("ROCm SMI opens");
    assert_eq!(amd.driver_version().expect("version"), "rocm-smi 5.2.3");
    let gpus = amd.devices().expect("inventory");
    let seen: Vec<(u32, &str, Vendor)> = gpus
        .iter()
        .map(|g| (g.index, g.name.as_str(), g.vendor))
        .collect();
    assert_eq!(
        seen,
        [
            (0, "AMD Instinct MI210", Vendor::Amd),
            (1, "AMD Instinct MI300X", Vendor::Amd)
        ],
        "only the AMD devices, numbered by ROCm SMI"
    );
    assert_eq!(gpus[0].uuid, amd_uuid(&node, 1));
    assert_eq!(gpus[1].uuid, amd_uuid(&node, 3));
    assert_eq!(gpus[0].memory_total_bytes, 8 * GI);
    let want = node.node().device_info(1).expect("device 1");
    assert_eq!(
        gpus[0].pci_bus_id,
        format!(
            "{:04x}:{:02x}:{:02x}.0",
            want.pci_domain, want.pci_bus, want.pci_device
        )
    );

    // Ground truth: this process holds 300 MiB on the first AMD GPU and 100 MiB on the
    // NVIDIA GPU beside it; ROCm SMI must charge the AMD GPU with its own bytes only.
    let n = node.node();
    let slot = n.attach().expect("a process slot");
    assert!(n.reserve_memory(slot, 1, 300 * MI));
    assert!(n.reserve_memory(slot, 0, 100 * MI));
    let me = std::process::id();
    assert_eq!(
        amd.processes(&gpus[0].uuid).expect("processes"),
        [GpuProcess {
            pid: me,
            used_bytes: 300 * MI
        }]
    );
    assert_eq!(amd.processes(&gpus[1].uuid).expect("processes"), []);
    let s = amd.sample(&gpus[0].uuid).expect("sample");
    assert_eq!(s.memory_used_bytes, 300 * MI);
    assert!(
        s.utilization_percent <= 100 && s.temperature_c >= 34,
        "{s:?}"
    );

    // Both vendors through the seam, as the daemon opens them.
    let both =
        tessera_manager::vendors::open(Some(&sim_nvml_library()), Some(&sim_rocm_smi_library()))
            .expect("NVML and ROCm SMI");
    let all = both.devices().expect("inventory");
    let seen: Vec<(u32, Vendor)> = all.iter().map(|g| (g.index, g.vendor)).collect();
    assert_eq!(
        seen,
        [
            (0, Vendor::Nvidia),
            (1, Vendor::Nvidia),
            (2, Vendor::Amd),
            (3, Vendor::Amd)
        ],
        "NVML's indices first, ROCm SMI's after them"
    );
    assert_eq!(all[0].uuid, n.device_info(0).expect("device 0").uuid);
    let mut uuids: Vec<&str> = all.iter().map(|g| g.uuid.as_str()).collect();
    uuids.sort_unstable();
    uuids.dedup();
    assert_eq!(uuids.len(), 4, "UUIDs unique across vendors");
    assert_eq!(
        both.processes(&all[0].uuid).expect("NVML's processes")[0].used_bytes,
        100 * MI
    );
    assert_eq!(
        both.processes(&all[2].uuid).expect("ROCm SMI's processes")[0].used_bytes,
        300 * MI
    );

    // A lost AMD GPU: its queries fail as lost, the other vendor's GPU answers.
    n.set_lost(1, true).expect("lose device 1");
    assert_eq!(
        both.sample(&all[2].uuid),
        Err(GpuError::Lost(all[2].uuid.clone()))
    );
    assert!(both.sample(&all[0].uuid).is_ok());
    n.release_memory(slot, 1, 300 * MI);
    n.release_memory(slot, 0, 100 * MI);
}
