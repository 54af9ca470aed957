//! What the manager needs from the GPU driver, as a small trait: the
//! inventory, periodic samples, per-process memory and health events. This
//! is the vendor seam: NVIDIA's GPUs through NVML ([`crate::nvml`]), AMD's
//! through ROCm SMI ([`crate::rocm_smi`]), a node with both through
//! [`crate::vendors::Vendors`], which keeps indices and UUIDs unique across
//! them; `fake::FakeGpu` stands in for any of them in tests. The fake is compiled only for this crate's unit tests
//! and with the `testing` feature (its integration tests and other crates'
//! dev-dependencies), never into the release binary.

use std::time::Duration;

/// One GPU as the inventory describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    /// Whose GPU it is (which library reports it, which API the shim governs).
    #[serde(serialize_with = "vendor_name")]
    pub vendor: tessera_contract::Vendor,
    /// The model, as the driver names it (`NVIDIA H200`, `AMD Instinct MI210`).
    pub name: String,
    pub memory_total_bytes: u64,
    /// SMs (NVIDIA); 0 when the driver does not say (ROCm SMI never does).
    pub sm_count: u32,
    pub pci_bus_id: String,
    /// -1 when unknown.
    pub numa_node: i32,
    /// CUDA's compute capability; (0, 0) for other vendors.
    pub compute_capability: (u32, u32),
}

/// A vendor as its name (`nvidia`, `amd`): the contract crate stays free of
/// serde, which the shim links.
fn vendor_name<S: serde::Serializer>(
    v: &tessera_contract::Vendor,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(v.as_str())
}

/// What a GPU is doing right now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuSample {
    pub memory_used_bytes: u64,
    pub utilization_percent: u32,
    pub temperature_c: u32,
    pub power_mw: u32,
}

/// A process with a context on a GPU, as the driver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuProcess {
    /// In the manager's pid namespace (the host's, when deployed).
    pub pid: u32,
    pub used_bytes: u64,
}

/// Something the driver reported about a GPU's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuEvent {
    /// An XID error on the GPU with this UUID.
    Xid { uuid: String, xid: u64 },
    /// The GPU fell off the bus or stopped answering.
    Lost { uuid: String },
}

/// What went wrong talking to the driver.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    #[error("GPU {0} is lost (fallen off the bus or not answering)")]
    Lost(String),
    #[error("no GPU with UUID {0}")]
    NotFound(String),
    #[error("cannot load the GPU driver library: {0}")]
    Library(String),
    #[error("{call}: {message}")]
    Driver { call: &'static str, message: String },
}

/// The driver, as far as the manager is concerned.
pub trait GpuBackend: Send + Sync + 'static {
    /// The driver's version string.
    fn driver_version(&self) -> Result<String, GpuError>;
    /// Every GPU, in the driver's index order.
    fn devices(&self) -> Result<Vec<GpuInfo>, GpuError>;
    /// Usage, utilization, temperature and power of one GPU.
    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError>;
    /// Processes with a context on one GPU and the memory each uses.
    fn processes(&self, uuid: &str) -> Result<Vec<GpuProcess>, GpuError>;
    /// Waits up to `timeout` for the next health event. `Ok(None)` when
    /// none came. Called from one thread only.
    fn wait_event(&self, timeout: Duration) -> Result<Option<GpuEvent>, GpuError>;
    /// What a CUDA context holds on each GPU, by UUID, measured once at
    /// start-up (before anything else uses the GPUs for the manager); a GPU
    /// left out is charged the configured estimate. None by default.
    fn context_sizes(&self) -> std::collections::HashMap<String, u64> {
        std::collections::HashMap::new()
    }
}

#[cfg(any(test, feature = "testing"))]
pub mod fake {
    //! A scripted driver for tests.

    use std::collections::{HashMap, VecDeque};
    use std::time::Duration;

    use parking_lot::{Condvar, Mutex};

    use super::*;

    #[derive(Default)]
    struct Inner {
        devices: Vec<GpuInfo>,
        samples: HashMap<String, GpuSample>,
        processes: HashMap<String, Vec<GpuProcess>>,
        lost: HashMap<String, bool>,
        events: VecDeque<GpuEvent>,
        context_sizes: HashMap<String, u64>,
    }

    /// A driver whose every answer the test sets.
    #[derive(Default)]
    pub struct FakeGpu {
        inner: Mutex<Inner>,
        event_ready: Condvar,
    }

    impl std::fmt::Debug for FakeGpu {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("FakeGpu")
        }
    }

    /// An AMD GPU description with test-friendly values for index `i` (its
    /// UUID in the AMD form, no SM count or compute capability, as ROCm SMI
    /// reports).
    pub fn test_amd_gpu(i: u32, memory: u64) -> GpuInfo {
        GpuInfo {
            index: i,
            uuid: tessera_contract::vendor::format_amd_uuid(0xa3d0_0000_0000_0000 | u64::from(i)),
            vendor: tessera_contract::Vendor::Amd,
            name: "AMD Instinct MI210".into(),
            memory_total_bytes: memory,
            sm_count: 0,
            pci_bus_id: format!("0000:{:02x}:00.0", 0x40 + i),
            numa_node: 0,
            compute_capability: (0, 0),
        }
    }

    /// A GPU description with test-friendly values for index `i`.
    pub fn test_gpu(i: u32, memory: u64) -> GpuInfo {
        GpuInfo {
            index: i,
            uuid: format!("GPU-00000000-0000-0000-0000-00000000000{i}"),
            vendor: tessera_contract::Vendor::Nvidia,
            name: "Fake GPU".into(),
            memory_total_bytes: memory,
            sm_count: 80,
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + i),
            numa_node: 0,
            compute_capability: (9, 0),
        }
    }

    impl FakeGpu {
        /// `n` GPUs of `memory` bytes each.
        pub fn new(n: u32, memory: u64) -> Self {
            let g = FakeGpu::default();
            g.inner.lock().devices = (0..n).map(|i| test_gpu(i, memory)).collect();
            g
        }

        /// One GPU for each description, in order (UUIDs, memory and NUMA
        /// nodes as given).
        pub fn with_devices(devices: Vec<GpuInfo>) -> Self {
            let g = FakeGpu::default();
            g.inner.lock().devices = devices;
            g
        }

        pub fn uuid(&self, i: usize) -> String {
            self.inner.lock().devices[i].uuid.clone()
        }

        pub fn set_sample(&self, uuid: &str, s: GpuSample) {
            self.inner.lock().samples.insert(uuid.to_owned(), s);
        }

        pub fn set_processes(&self, uuid: &str, p: Vec<GpuProcess>) {
            self.inner.lock().processes.insert(uuid.to_owned(), p);
        }

        /// Makes every query about `uuid` fail as a lost GPU does, or not.
        pub fn set_lost(&self, uuid: &str, lost: bool) {
            self.inner.lock().lost.insert(uuid.to_owned(), lost);
        }

        /// What [`GpuBackend::context_sizes`] reports for `uuid`.
        pub fn set_context_size(&self, uuid: &str, bytes: u64) {
            self.inner
                .lock()
                .context_sizes
                .insert(uuid.to_owned(), bytes);
        }

        pub fn push_event(&self, e: GpuEvent) {
            self.inner.lock().events.push_back(e);
            self.event_ready.notify_all();
        }

        fn check(&self, inner: &Inner, uuid: &str) -> Result<(), GpuError> {
            if !inner.devices.iter().any(|d| d.uuid == uuid) {
                return Err(GpuError::NotFound(uuid.to_owned()));
            }
            if inner.lost.get(uuid).copied().unwrap_or(false) {
                return Err(GpuError::Lost(uuid.to_owned()));
            }
            Ok(())
        }
    }

    impl GpuBackend for FakeGpu {
        fn driver_version(&self) -> Result<String, GpuError> {
            Ok("999.99".into())
        }
        fn devices(&self) -> Result<Vec<GpuInfo>, GpuError> {
            Ok(self.inner.lock().devices.clone())
        }
        fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError> {
            let inner = self.inner.lock();
            self.check(&inner, uuid)?;
            Ok(inner.samples.get(uuid).copied().unwrap_or_default())
        }
        fn processes(&self, uuid: &str) -> Result<Vec<GpuProcess>, GpuError> {
            let inner = self.inner.lock();
            self.check(&inner, uuid)?;
            Ok(inner.processes.get(uuid).cloned().unwrap_or_default())
        }
        fn wait_event(&self, timeout: Duration) -> Result<Option<GpuEvent>, GpuError> {
            let mut inner = self.inner.lock();
            if inner.events.is_empty() {
                self.event_ready.wait_for(&mut inner, timeout);
            }
            Ok(inner.events.pop_front())
        }
        fn context_sizes(&self) -> HashMap<String, u64> {
            self.inner.lock().context_sizes.clone()
        }
    }
}
