//! [`GpuBackend`] over NVML (`nvml-wrapper`): the same code runs against
//! the simulated node's `libnvidia-ml.so.1` and NVIDIA's.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::event::EventSet;
use parking_lot::Mutex;

use crate::gpu::{GpuBackend, GpuError, GpuEvent, GpuInfo, GpuProcess, GpuSample};

/// The soname NVML is loaded by when no path is configured.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";

/// NVML, initialised once for the life of the process.
pub struct NvmlGpu {
    // Leaked on purpose: an event set borrows the library handle, and both
    // must live as long as the event thread, which is the process's life.
    nvml: &'static Nvml,
    events: Mutex<Option<EventSet<'static>>>,
    /// The CUDA driver beside the NVML that was loaded, if any.
    cuda_lib: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for NvmlGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NvmlGpu")
    }
}

fn driver_err(call: &'static str) -> impl Fn(NvmlError) -> GpuError {
    move |e| GpuError::Driver {
        call,
        message: e.to_string(),
    }
}

fn device_err(uuid: &str, call: &'static str) -> impl Fn(NvmlError) -> GpuError {
    move |e| match e {
        NvmlError::GpuLost => GpuError::Lost(uuid.to_owned()),
        NvmlError::NotFound => GpuError::NotFound(uuid.to_owned()),
        e => GpuError::Driver {
            call,
            message: e.to_string(),
        },
    }
}

impl NvmlGpu {
    /// Loads NVML from `path`, or by its soname from the loader's search path.
    pub fn open(path: Option<&Path>) -> Result<Self, GpuError> {
        let lib: &OsStr = path.map_or(OsStr::new(NVML_SONAME), |p| p.as_os_str());
        let nvml = Nvml::builder().lib_path(lib).init().map_err(|e| {
            GpuError::Library(format!(
                "{}: {e} (is the NVIDIA driver installed? set --nvml-library to its libnvidia-ml.so.1)",
                lib.to_string_lossy()
            ))
        })?;
        // The CUDA driver ships beside NVML (the simulated node's does too).
        let cuda_lib = path
            .and_then(Path::parent)
            .map(|d| d.join("libcuda.so.1"))
            .filter(|p| p.exists());
        Ok(NvmlGpu {
            nvml: Box::leak(Box::new(nvml)),
            events: Mutex::new(None),
            cuda_lib,
        })
    }

    fn device(&self, uuid: &str) -> Result<nvml_wrapper::Device<'static>, GpuError> {
        self.nvml
            .device_by_uuid(uuid)
            .map_err(device_err(uuid, "nvmlDeviceGetHandleByUUID"))
    }

    /// An event set with XID events registered on every GPU that has them.
    fn event_set(&self) -> Result<EventSet<'static>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(driver_err("nvmlDeviceGetCount"))?;
        let mut set = self
            .nvml
            .create_event_set()
            .map_err(driver_err("nvmlEventSetCreate"))?;
        let mut registered = 0;
        for i in 0..count {
            let Ok(dev) = self.nvml.device_by_index(i) else {
                continue;
            };
            let supported = dev
                .supported_event_types()
                .is_ok_and(|t| t.contains(EventTypes::CRITICAL_XID_ERROR));
            if !supported {
                tracing::warn!(index = i, "GPU does not report XID events");
                continue;
            }
            // A failed registration frees the set (NVML's rule), so give up
            // on this round; the caller retries later.
            set = dev
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .map_err(|e| GpuError::Driver {
                    call: "nvmlDeviceRegisterEvents",
                    message: e.error.to_string(),
                })?;
            registered += 1;
        }
        if registered == 0 {
            return Err(GpuError::Driver {
                call: "nvmlDeviceRegisterEvents",
                message: "no GPU reports XID events".into(),
            });
        }
        Ok(set)
    }
}

impl GpuBackend for NvmlGpu {
    fn driver_version(&self) -> Result<String, GpuError> {
        self.nvml
            .sys_driver_version()
            .map_err(driver_err("nvmlSystemGetDriverVersion"))
    }

    fn devices(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(driver_err("nvmlDeviceGetCount"))?;
        let mut out = Vec::with_capacity(count as usize);
        // NVML answers the SM count only for MIG devices; CUDA knows it.
        let mut sms = None;
        for i in 0..count {
            let d = self
                .nvml
                .device_by_index(i)
                .map_err(driver_err("nvmlDeviceGetHandleByIndex"))?;
            let uuid = d.uuid().map_err(driver_err("nvmlDeviceGetUUID"))?;
            let mem = d
                .memory_info()
                .map_err(device_err(&uuid, "nvmlDeviceGetMemoryInfo"))?;
            let cc = d
                .cuda_compute_capability()
                .map_err(device_err(&uuid, "nvmlDeviceGetCudaComputeCapability"))?;
            out.push(GpuInfo {
                index: d.index().unwrap_or(i),
                vendor: tessera_contract::Vendor::Nvidia,
                name: d.name().map_err(device_err(&uuid, "nvmlDeviceGetName"))?,
                memory_total_bytes: mem.total,
                sm_count: match d.attributes() {
                    Ok(a) if a.multiprocessor_count > 0 => a.multiprocessor_count,
                    _ => sms
                        .get_or_insert_with(|| {
                            crate::cuda_info::sm_counts(self.cuda_lib.as_deref())
                        })
                        .get(&uuid)
                        .copied()
                        .unwrap_or(0),
                },
                pci_bus_id: d
                    .pci_info()
                    .map(|p| p.bus_id)
                    .map_err(device_err(&uuid, "nvmlDeviceGetPciInfo"))?,
                numa_node: d
                    .numa_node_id()
                    .ok()
                    .and_then(|n| i32::try_from(n).ok())
                    .unwrap_or(-1),
                compute_capability: (
                    u32::try_from(cc.major).unwrap_or(0),
                    u32::try_from(cc.minor).unwrap_or(0),
                ),
                uuid,
            });
        }
        Ok(out)
    }

    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError> {
        let d = self.device(uuid)?;
        let mem = d
            .memory_info()
            .map_err(device_err(uuid, "nvmlDeviceGetMemoryInfo"))?;
        // Utilization, temperature and power are optional on some boards;
        // a lost GPU shows in the memory query above.
        Ok(GpuSample {
            memory_used_bytes: mem.used,
            utilization_percent: d.utilization_rates().map(|u| u.gpu).unwrap_or(0),
            temperature_c: d.temperature(TemperatureSensor::Gpu).unwrap_or(0),
            power_mw: d.power_usage().unwrap_or(0),
        })
    }

    fn processes(&self, uuid: &str) -> Result<Vec<GpuProcess>, GpuError> {
        let d = self.device(uuid)?;
        let procs = d
            .running_compute_processes()
            .map_err(device_err(uuid, "nvmlDeviceGetComputeRunningProcesses"))?;
        Ok(procs
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_bytes: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b,
                    UsedGpuMemory::Unavailable => 0,
                },
            })
            .collect())
    }

    fn context_sizes(&self) -> std::collections::HashMap<String, u64> {
        let me = std::process::id();
        crate::cuda_info::measure_contexts(self.cuda_lib.as_deref(), |uuid| {
            // The driver's own count for this process: what the shim settles
            // each context to (NVML reports host pids; a manager outside the
            // host's pid namespace finds itself under another pid, and
            // measures nothing).
            self.processes(uuid)
                .ok()?
                .into_iter()
                .find(|p| p.pid == me)
                .map(|p| p.used_bytes)
        })
    }

    fn wait_event(&self, timeout: Duration) -> Result<Option<GpuEvent>, GpuError> {
        let mut guard = self.events.lock();
        if guard.is_none() {
            *guard = Some(self.event_set()?);
        }
        let Some(set) = guard.as_ref() else {
            return Ok(None);
        };
        let ms = u32::try_from(timeout.as_millis()).unwrap_or(u32::MAX);
        match set.wait(ms) {
            Ok(ev) => {
                let uuid = ev.device.uuid().map_err(driver_err("nvmlDeviceGetUUID"))?;
                if !ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    return Ok(None);
                }
                let xid = match ev.event_data {
                    Some(XidError::Value(x)) => x,
                    // Unknown XIDs count as critical: 0 is in no ignore list.
                    Some(XidError::Unknown) | None => 0,
                };
                Ok(Some(GpuEvent::Xid { uuid, xid }))
            }
            Err(NvmlError::Timeout) => Ok(None),
            // NVML does not say which GPU; the sampler finds it.
            Err(NvmlError::GpuLost) => Err(GpuError::Lost("(unknown)".into())),
            Err(e) => Err(GpuError::Driver {
                call: "nvmlEventSetWait",
                message: e.to_string(),
            }),
        }
    }
}
