//! A node's GPUs from every vendor's library as one [`GpuBackend`]: which
//! libraries to open ([`open`]), and [`Vendors`], which puts their
//! inventories side by side.
//!
//! Indices stay unique across vendors: the first backend's GPUs keep their
//! own indices (NVML's, so an NVIDIA node numbers its GPUs exactly as
//! before) and each later backend's follow after the highest index before
//! it. UUIDs are the libraries' own (NVIDIA's and AMD's have different
//! shapes, see `tessera_contract::vendor`); two backends reporting the same
//! UUID is an error, never a guess about which one to ask. Queries about one
//! GPU go to the backend that reported it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;

use crate::gpu::{GpuBackend, GpuError, GpuEvent, GpuInfo, GpuProcess, GpuSample};

/// Several backends, one per vendor, as one.
pub struct Vendors {
    backends: Vec<Arc<dyn GpuBackend>>,
    /// Which backend (position in `backends`) each UUID belongs to, from the
    /// last inventory.
    routes: RwLock<HashMap<String, usize>>,
}

impl std::fmt::Debug for Vendors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vendors({} backends)", self.backends.len())
    }
}

impl Vendors {
    /// The backends in index order (NVIDIA's first, by [`open`]).
    pub fn new(backends: Vec<Arc<dyn GpuBackend>>) -> Self {
        Vendors {
            backends,
            routes: RwLock::new(HashMap::new()),
        }
    }

    /// The backend that reported `uuid` (asking for the inventory first if
    /// this UUID has not been seen).
    fn route(&self, uuid: &str) -> Result<&Arc<dyn GpuBackend>, GpuError> {
        if let Some(&k) = self.routes.read().get(uuid) {
            return Ok(&self.backends[k]);
        }
        self.devices()?;
        let k = self.routes.read().get(uuid).copied();
        k.map(|k| &self.backends[k])
            .ok_or_else(|| GpuError::NotFound(uuid.to_owned()))
    }
}

impl GpuBackend for Vendors {
    fn driver_version(&self) -> Result<String, GpuError> {
        let versions = self
            .backends
            .iter()
            .map(|b| b.driver_version())
            .collect::<Result<Vec<_>, _>>()?;
        Ok(versions.join(", "))
    }

    fn devices(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let mut out: Vec<GpuInfo> = Vec::new();
        let mut owners = HashMap::new();
        let mut next = 0u32;
        for (k, b) in self.backends.iter().enumerate() {
            let offset = next;
            for mut g in b.devices()? {
                g.index += offset;
                next = next.max(g.index + 1);
                if let Some(first) = owners.insert(g.uuid.clone(), k) {
                    let other = out.iter().find(|o| o.uuid == g.uuid).map(|o| o.vendor);
                    return Err(GpuError::Driver {
                        call: "inventory",
                        message: format!(
                            "GPU {} is reported by two libraries ({} and {}); a UUID must name one GPU",
                            g.uuid,
                            other.map_or_else(|| format!("backend {first}"), |v| v.to_string()),
                            g.vendor
                        ),
                    });
                }
                out.push(g);
            }
        }
        *self.routes.write() = owners;
        Ok(out)
    }

    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError> {
        self.route(uuid)?.sample(uuid)
    }

    fn processes(&self, uuid: &str) -> Result<Vec<GpuProcess>, GpuError> {
        self.route(uuid)?.processes(uuid)
    }

    /// The first backend's events (NVML's XIDs where there is NVIDIA
    /// hardware); the others have no event stream of their own and are
    /// watched by sampling.
    fn wait_event(&self, timeout: Duration) -> Result<Option<GpuEvent>, GpuError> {
        match self.backends.first() {
            Some(b) => b.wait_event(timeout),
            None => {
                std::thread::sleep(timeout);
                Ok(None)
            }
        }
    }

    fn context_sizes(&self) -> HashMap<String, u64> {
        self.backends
            .iter()
            .flat_map(|b| b.context_sizes())
            .collect()
    }
}

/// Opens the libraries of the vendors whose GPUs this node has: NVML and
/// ROCm SMI. A library given by path must open (a clear error otherwise);
/// one looked up by its soname may be missing, so long as one of them opens.
/// One backend alone is returned as itself, so an NVIDIA-only node runs
/// exactly the NVML code it always ran.
pub fn open(nvml: Option<&Path>, rocm_smi: Option<&Path>) -> Result<Arc<dyn GpuBackend>, GpuError> {
    let mut backends: Vec<Arc<dyn GpuBackend>> = Vec::new();
    let mut missing = Vec::new();
    match crate::nvml::NvmlGpu::open(nvml) {
        Ok(g) => backends.push(Arc::new(g)),
        Err(e) if nvml.is_some() => return Err(e),
        Err(e) => missing.push(e.to_string()),
    }
    match crate::rocm_smi::RocmSmiGpu::open(rocm_smi) {
        Ok(g) => backends.push(Arc::new(g)),
        Err(e) if rocm_smi.is_some() => return Err(e),
        Err(e) => {
            tracing::debug!(error = %e, "no ROCm SMI; no AMD GPUs");
            missing.push(e.to_string());
        }
    }
    match backends.len() {
        0 => Err(GpuError::Library(format!(
            "no GPU library could be loaded: {}",
            missing.join("; ")
        ))),
        1 => Ok(backends.remove(0)),
        _ => Ok(Arc::new(Vendors::new(backends))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::fake::{FakeGpu, test_amd_gpu, test_gpu};
    use tessera_contract::Vendor;

    fn node() -> (Arc<FakeGpu>, Arc<FakeGpu>, Vendors) {
        let nv = Arc::new(FakeGpu::with_devices(vec![
            test_gpu(0, 16 << 30),
            test_gpu(1, 16 << 30),
        ]));
        let amd = Arc::new(FakeGpu::with_devices(vec![test_amd_gpu(0, 64 << 30)]));
        let v = Vendors::new(vec![nv.clone(), amd.clone()]);
        (nv, amd, v)
    }

    #[test]
    fn indices_follow_on_across_vendors_and_uuids_route_to_their_library() {
        let (nv, amd, v) = node();
        let gpus = v.devices().expect("inventory");
        let seen: Vec<(u32, Vendor)> = gpus.iter().map(|g| (g.index, g.vendor)).collect();
        assert_eq!(
            seen,
            [(0, Vendor::Nvidia), (1, Vendor::Nvidia), (2, Vendor::Amd)]
        );

        let amd_uuid = amd.uuid(0);
        amd.set_processes(
            &amd_uuid,
            vec![GpuProcess {
                pid: 7,
                used_bytes: 5 << 20,
            }],
        );
        nv.set_processes(
            &nv.uuid(1),
            vec![GpuProcess {
                pid: 8,
                used_bytes: 1 << 20,
            }],
        );
        assert_eq!(v.processes(&amd_uuid).expect("amd")[0].pid, 7);
        assert_eq!(v.processes(&nv.uuid(1)).expect("nvidia")[0].pid, 8);
        amd.set_lost(&amd_uuid, true);
        assert_eq!(v.sample(&amd_uuid), Err(GpuError::Lost(amd_uuid.clone())));
        assert!(
            v.sample(&nv.uuid(0)).is_ok(),
            "one vendor's lost GPU is not the other's"
        );
        assert_eq!(
            v.sample("GPU-nobody"),
            Err(GpuError::NotFound("GPU-nobody".into()))
        );
    }

    #[test]
    fn one_uuid_from_two_libraries_is_refused() {
        let a = Arc::new(FakeGpu::with_devices(vec![test_gpu(0, 1 << 30)]));
        let b = Arc::new(FakeGpu::with_devices(vec![test_gpu(0, 1 << 30)]));
        let v = Vendors::new(vec![a, b]);
        let e = v.devices().expect_err("duplicate UUID");
        assert!(e.to_string().contains("reported by two libraries"), "{e}");
    }

    #[test]
    fn events_come_from_the_first_library_and_context_sizes_from_all() {
        let (nv, amd, v) = node();
        nv.push_event(GpuEvent::Xid {
            uuid: nv.uuid(0),
            xid: 79,
        });
        assert_eq!(
            v.wait_event(Duration::ZERO).expect("event"),
            Some(GpuEvent::Xid {
                uuid: nv.uuid(0),
                xid: 79
            })
        );
        nv.set_context_size(&nv.uuid(0), 500 << 20);
        amd.set_context_size(&amd.uuid(0), 300 << 20);
        let sizes = v.context_sizes();
        assert_eq!(sizes.len(), 2);
        assert_eq!(sizes[&amd.uuid(0)], 300 << 20);
    }

    #[test]
    fn a_library_given_by_path_must_open() {
        // By path, so nothing on this machine's loader path is found by chance.
        let e = open(
            Some(Path::new("/nonexistent/libnvidia-ml.so.1")),
            Some(Path::new("/nonexistent/librocm_smi64.so.5")),
        )
        .err()
        .expect("neither opens");
        assert!(
            e.to_string().contains("/nonexistent/libnvidia-ml.so.1"),
            "{e}"
        );
    }
}
