//! `nvml-wrapper` (the manager's NVML client) against the simulated `libnvidia-ml.so.1`:
//! initialisation, device identity, memory, processes, activity, XID events and a lost
//! device, with a probe process as the workload.
//!
//! This binary holds one test on purpose: it sets `TESSERA_SIM_STATE` in its own
//! environment before NVML is loaded, which is only sound with no other test running.

mod nvml_support;

use std::time::{Duration, Instant};

use nvml_support::nvml_on;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use tessera_e2e::{Mode, SimNode};

const GI: u64 = 1 << 30;
/// How long a probe may take to answer one command: a hang guard, generous for a
/// loaded box.
const T: Duration = Duration::from_secs(60);

#[test]
fn nvml_wrapper_reads_the_simulated_node() {
    let node = SimNode::builder().devices(2).memory("4Gi").build();
    // SAFETY: this is the only test of this binary, so no other thread reads or writes the
    // environment while it is changed (the harness's main thread only waits).
    let nvml = unsafe { nvml_on(&node) };

    assert_eq!(nvml.device_count().expect("count"), 2);
    assert_eq!(nvml.sys_cuda_driver_version().expect("cuda version"), 12090);
    assert!(!nvml.sys_driver_version().expect("driver").is_empty());

    let info0 = node.node().device_info(0).expect("device 0");
    let dev0 = nvml.device_by_index(0).expect("device 0");
    let dev1 = nvml.device_by_index(1).expect("device 1");
    assert_eq!(dev0.name().expect("name"), info0.name);
    assert_eq!(dev0.uuid().expect("uuid"), info0.uuid);
    assert_ne!(dev1.uuid().expect("uuid"), info0.uuid);
    assert_eq!(dev1.index().expect("index"), 1);
    assert_eq!(dev1.minor_number().expect("minor"), 1);
    let pci = dev0.pci_info().expect("pci");
    assert_eq!(pci.bus_id, info0.pci_bus_id());
    let by_uuid = nvml.device_by_uuid(info0.uuid.as_str()).expect("by uuid");
    assert_eq!(by_uuid.index().expect("index"), 0);
    let by_bus = nvml
        .device_by_pci_bus_id(pci.bus_id.as_str())
        .expect("by bus id");
    assert_eq!(by_bus.index().expect("index"), 0);
    let cc = dev0.cuda_compute_capability().expect("cc");
    assert_eq!((cc.major, cc.minor), (9, 0));
    assert!(matches!(
        nvml.device_by_uuid("GPU-00000000-0000-0000-0000-000000000000"),
        Err(NvmlError::NotFound)
    ));

    // A workload: 1 GiB on device 0 and a kernel of 100 ms, launched below.
    let mut worker = node.spawn(Mode::Link, &[]);
    for cmd in ["init", "ctx", "alloc 1073741824", "load kernel busy 100ms"] {
        let l = worker.cmd(cmd, T);
        assert!(l.ok, "{}", l.raw);
    }

    let mem = dev0.memory_info().expect("memory");
    assert_eq!((mem.total, mem.used, mem.free), (4 * GI, GI, 3 * GI));
    assert_eq!(dev1.memory_info().expect("memory").used, 0);
    let procs = dev0.running_compute_processes().expect("processes");
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].pid, worker.pid());
    assert_eq!(procs[0].used_gpu_memory, UsedGpuMemory::Used(GI));
    assert!(
        dev1.running_compute_processes()
            .expect("processes")
            .is_empty()
    );

    // The engine's activity, read while it runs a known stretch of work: 4.5 s of kernels
    // queued on an idle engine, read more than a second after the launch answered (so the
    // last second was all busy) and before the work ends. Queueing more would not keep a
    // late read busy: the simulator records work only a few seconds past the launch that
    // queued it (a process's ring spans 6.4 s, three quarters of it ahead). So the reads
    // count only if they all ended within 4.4 s of the launch; a loaded box that delays
    // them past that lets the engine empty and takes them again. Only a hang fails on time.
    let first = Instant::now();
    let mut attempts = 0u32;
    let a = loop {
        attempts += 1;
        // The kernels start between these two instants.
        let launched = Instant::now();
        let l = worker.cmd("launch busy 45", T);
        assert!(l.ok, "{}", l.raw);
        // More than a second after the first kernel started.
        std::thread::sleep(Duration::from_millis(1200));
        let a = Activity {
            util0: dev0.utilization_rates().expect("utilization").gpu,
            util1: dev1.utilization_rates().expect("utilization").gpu,
            temp0: dev0.temperature(TemperatureSensor::Gpu).expect("temp"),
            temp1: dev1.temperature(TemperatureSensor::Gpu).expect("temp"),
            power0: dev0.power_usage().expect("power"),
            power1: dev1.power_usage().expect("power"),
            clock0: dev0.clock_info(Clock::SM).expect("clock"),
            clock1: dev1.clock_info(Clock::SM).expect("clock"),
            // None (no sample) is judged below, if the read came in time.
            sm_util: dev0
                .process_utilization_stats(None)
                .ok()
                .and_then(|s| s.iter().find(|s| s.pid == worker.pid()).map(|s| s.sm_util)),
        };
        if launched.elapsed() < Duration::from_millis(4400) {
            break a;
        }
        assert!(
            first.elapsed() < Duration::from_secs(120),
            "no read of the activity came within 4.4 s of its launch in {attempts} tries"
        );
        // The engine empties before the next launch.
        std::thread::sleep(Duration::from_secs(5).saturating_sub(launched.elapsed()));
    };
    assert!(
        a.util0 >= 90,
        "gpu utilization {} ({attempts} tries)",
        a.util0
    );
    assert_eq!(a.util1, 0);
    assert!(a.temp0 > a.temp1, "{a:?}");
    assert!(a.power0 > a.power1, "{a:?}");
    assert_eq!(dev0.power_management_limit().expect("limit"), 700_000);
    assert!(a.clock0 > a.clock1, "{a:?}");
    let sm_util = a.sm_util.expect("the worker has a sample");
    assert!(sm_util >= 90, "sm util {sm_util} ({attempts} tries)");

    // XID errors injected on the node arrive through an event set.
    assert!(
        dev1.supported_event_types()
            .expect("event types")
            .contains(EventTypes::CRITICAL_XID_ERROR)
    );
    let set = nvml.create_event_set().expect("event set");
    let set = dev1
        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
        .expect("register");
    node.node().inject_xid(1, 43).expect("inject");
    // A hang guard, not a measure.
    let event = set.wait(60_000).expect("the XID arrives");
    assert_eq!(event.device.index().expect("index"), 1);
    assert!(matches!(event.event_data, Some(XidError::Value(43))));
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));

    // A lost device answers "GPU is lost" to NVML and "unavailable" to CUDA.
    node.node().set_lost(0, true).expect("lose device 0");
    assert!(matches!(dev0.memory_info(), Err(NvmlError::GpuLost)));
    let l = worker.cmd("alloc 1024", T);
    assert_eq!(l.error.as_deref(), Some("CUDA_ERROR_DEVICE_UNAVAILABLE"));
    node.node().set_lost(0, false).expect("recover device 0");
    assert_eq!(dev0.memory_info().expect("memory").used, GI);

    // A killed workload's memory and process entry are gone.
    worker.kill();
    assert_eq!(dev0.memory_info().expect("memory").used, 0);
    assert!(
        dev0.running_compute_processes()
            .expect("processes")
            .is_empty()
    );
}

/// What NVML says of the engines' activity in one round of reads.
#[derive(Debug)]
struct Activity {
    util0: u32,
    util1: u32,
    temp0: u32,
    temp1: u32,
    power0: u32,
    power1: u32,
    clock0: u32,
    clock1: u32,
    sm_util: Option<u32>,
}
