//! The NVML calls nvidia-smi-like tools (nvitop, gpustat) make beyond the basics,
//! against the simulated `libnvidia-ml.so.1` through `nvml-wrapper`: ECC error counts,
//! BAR1 memory, encoder/decoder utilization, PCIe throughput, field values, MIG handle
//! queries, the process detail list, and every process's memory including what its
//! contexts hold.
//!
//! This binary holds one test on purpose: it sets `TESSERA_SIM_STATE` in its own
//! environment before NVML is loaded, which is only sound with no other test running.

mod nvml_support;

use std::time::Duration;

use nvml_support::nvml_on;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, PcieUtilCounter};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use tessera_e2e::{Mode, SimNode};

const MI: u64 = 1 << 20;
const T: Duration = Duration::from_secs(20);

#[test]
fn the_calls_of_nvidia_smi_like_tools_answer() {
    let node = SimNode::builder().devices(2).memory("16Gi").build();
    // What a context holds: the simulator's default, an H200's.
    let context = tessera_sim::node::DEFAULT_CONTEXT_MEMORY;
    node.node().set_context_memory(context);
    // SAFETY: this is the only test of this binary, so no other thread reads or writes the
    // environment while it is changed (the harness's main thread only waits).
    let nvml = unsafe { nvml_on(&node) };
    let dev = nvml.device_by_index(0).expect("device 0");

    for (e, c) in [
        (MemoryError::Corrected, EccCounter::Volatile),
        (MemoryError::Uncorrected, EccCounter::Aggregate),
    ] {
        assert_eq!(dev.total_ecc_errors(e, c).expect("ecc errors"), 0);
    }
    let bar1 = dev.bar1_memory_info().expect("bar1");
    assert_eq!(bar1.total, 16 << 30, "16 GiB rounds to itself");
    assert_eq!(bar1.used + bar1.free, bar1.total);
    let enc = dev.encoder_utilization().expect("encoder");
    let dec = dev.decoder_utilization().expect("decoder");
    assert_eq!((enc.utilization, dec.utilization), (0, 0));
    assert!(enc.sampling_period > 0);
    assert_eq!(dev.pcie_throughput(PcieUtilCounter::Send).expect("tx"), 0);
    assert!(!dev.mig_is_mig_device_handle().expect("mig handle"));
    assert_eq!(dev.mig_device_count().expect("mig count"), 0);

    // NVLink link count (91) is known, ECC current (1) too; 9999 is no field.
    let values = dev
        .field_values_for(&[FieldId(91), FieldId(1), FieldId(9999)])
        .expect("field values");
    assert!(matches!(
        values[0].as_ref().expect("sample").value,
        Ok(SampleValue::U32(0))
    ));
    assert!(matches!(
        values[1].as_ref().expect("sample").value,
        Ok(SampleValue::U32(1))
    ));
    assert!(matches!(
        values[2].as_ref().map(|s| &s.value),
        Ok(Err(NvmlError::NotSupported)) | Err(NvmlError::NotSupported)
    ));

    // A process with a context and 1 GiB: listed with both.
    let mut p = node.spawn(Mode::Link, &[]);
    for cmd in ["init", "ctx", &format!("alloc {}", 1024 * MI)] {
        assert!(p.cmd(cmd, T).ok, "{cmd}");
    }
    let procs = dev.running_compute_processes().expect("processes");
    let me = procs
        .iter()
        .find(|q| q.pid == p.pid())
        .expect("the probe is listed");
    assert_eq!(me.used_gpu_memory, UsedGpuMemory::Used(context + 1024 * MI));
    assert_eq!(
        dev.memory_info().expect("memory").used,
        context + 1024 * MI,
        "ground truth counts the context"
    );
    p.kill();
}
