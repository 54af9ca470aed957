//! [`GpuBackend`] over AMD's ROCm SMI library (`librocm_smi64.so.5`), loaded
//! with `libloading` as NVML is: the same code runs against the simulated
//! node's library and AMD's. The calls are those of `rocm_smi/rocm_smi.h`
//! (ROCm 5.2), their signatures written out here for the dozen calls used;
//! the types and codes are `tessera_ffi::rocm_smi`'s, the declaration the
//! shim and the simulated library share.
//!
//! What ROCm SMI does not give, and what that means:
//! - no XID-like error stream: health is what the sampler sees (a device whose
//!   queries fail is lost); [`GpuBackend::wait_event`] only waits;
//! - no compute-unit count and no compute capability: both unknown (0);
//! - per-process memory per device only from ROCm 5.5
//!   (`rsmi_compute_process_info_by_device_get`); with an older library a
//!   process on one AMD GPU is charged its whole VRAM there, and one on several
//!   is listed on each with 0 bytes (present, so it is still seen on a GPU it
//!   has no allocation on, but never stopped for memory it may not hold there).

use std::ffi::{CStr, c_char};
use std::path::Path;
use std::time::Duration;

use tessera_contract::Vendor;
use tessera_contract::vendor::format_amd_uuid;
use tessera_ffi::rocm_smi::{
    RSMI_MEM_TYPE_VRAM, RSMI_STATUS_FILE_ERROR, RSMI_STATUS_INSUFFICIENT_SIZE,
    RSMI_STATUS_NOT_FOUND, RSMI_STATUS_SUCCESS, RSMI_TEMP_CURRENT, RSMI_TEMP_TYPE_EDGE,
    rsmi_process_info_t, rsmi_status_t, rsmi_version_t,
};

use crate::gpu::{GpuBackend, GpuError, GpuEvent, GpuInfo, GpuProcess, GpuSample};

/// The soname ROCm SMI is loaded by when no path is configured.
pub const ROCM_SMI_SONAME: &str = "librocm_smi64.so.5";

/// The library's entry points, looked up once.
struct Api {
    init: unsafe extern "C" fn(u64) -> rsmi_status_t,
    count: unsafe extern "C" fn(*mut u32) -> rsmi_status_t,
    name: unsafe extern "C" fn(u32, *mut c_char, usize) -> rsmi_status_t,
    vendor_id: unsafe extern "C" fn(u32, *mut u16) -> rsmi_status_t,
    unique_id: unsafe extern "C" fn(u32, *mut u64) -> rsmi_status_t,
    pci_id: unsafe extern "C" fn(u32, *mut u64) -> rsmi_status_t,
    numa: Option<unsafe extern "C" fn(u32, *mut u32) -> rsmi_status_t>,
    mem_total: unsafe extern "C" fn(u32, u32, *mut u64) -> rsmi_status_t,
    mem_used: unsafe extern "C" fn(u32, u32, *mut u64) -> rsmi_status_t,
    busy: Option<unsafe extern "C" fn(u32, *mut u32) -> rsmi_status_t>,
    temp: Option<unsafe extern "C" fn(u32, u32, u32, *mut i64) -> rsmi_status_t>,
    power: Option<unsafe extern "C" fn(u32, u32, *mut u64) -> rsmi_status_t>,
    procs: unsafe extern "C" fn(*mut rsmi_process_info_t, *mut u32) -> rsmi_status_t,
    proc_gpus: unsafe extern "C" fn(u32, *mut u32, *mut u32) -> rsmi_status_t,
    /// ROCm 5.5 and later.
    proc_on_device:
        Option<unsafe extern "C" fn(u32, u32, *mut rsmi_process_info_t) -> rsmi_status_t>,
    version: Option<unsafe extern "C" fn(*mut rsmi_version_t) -> rsmi_status_t>,
    status_string: Option<unsafe extern "C" fn(rsmi_status_t, *mut *const c_char) -> rsmi_status_t>,
}

/// ROCm SMI, initialised once for the life of the process.
pub struct RocmSmiGpu {
    api: Api,
    // Kept loaded for the process's life: the function pointers in `api` point into it.
    _lib: libloading::Library,
}

impl std::fmt::Debug for RocmSmiGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RocmSmiGpu")
    }
}

impl RocmSmiGpu {
    /// Loads ROCm SMI from `path`, or by its soname from the loader's search
    /// path, and initialises it.
    pub fn open(path: Option<&Path>) -> Result<Self, GpuError> {
        let name = path.map_or_else(|| ROCM_SMI_SONAME.into(), |p| p.as_os_str().to_owned());
        let shown = name.to_string_lossy().into_owned();
        let lib_err = |e: String| {
            GpuError::Library(format!(
                "{shown}: {e} (is ROCm installed? set --rocm-smi-library to its librocm_smi64.so.5)"
            ))
        };
        // SAFETY: loading ROCm SMI runs its initialisers, which are written to
        // be loaded into any process (rocm-smi and every monitoring agent do).
        let lib = unsafe { libloading::Library::new(&name) }.map_err(|e| lib_err(e.to_string()))?;
        /// Looks a symbol up as the function type the binding's field has.
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: each symbol is looked up with the C signature
                // rocm_smi.h declares for it (the field's type).
                unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map(|s| *s)
                    .map_err(|e| lib_err(format!("{}: {e}", $name)))
            };
        }
        let api = Api {
            init: sym!("rsmi_init")?,
            count: sym!("rsmi_num_monitor_devices")?,
            name: sym!("rsmi_dev_name_get")?,
            vendor_id: sym!("rsmi_dev_vendor_id_get")?,
            unique_id: sym!("rsmi_dev_unique_id_get")?,
            pci_id: sym!("rsmi_dev_pci_id_get")?,
            numa: sym!("rsmi_topo_numa_affinity_get").ok(),
            mem_total: sym!("rsmi_dev_memory_total_get")?,
            mem_used: sym!("rsmi_dev_memory_usage_get")?,
            busy: sym!("rsmi_dev_busy_percent_get").ok(),
            temp: sym!("rsmi_dev_temp_metric_get").ok(),
            power: sym!("rsmi_dev_power_ave_get").ok(),
            procs: sym!("rsmi_compute_process_info_get")?,
            proc_gpus: sym!("rsmi_compute_process_gpus_get")?,
            proc_on_device: sym!("rsmi_compute_process_info_by_device_get").ok(),
            version: sym!("rsmi_version_get").ok(),
            status_string: sym!("rsmi_status_string").ok(),
        };
        let gpu = RocmSmiGpu { api, _lib: lib };
        // SAFETY: rsmi_init takes flags only; 0 is the documented default.
        gpu.check("rsmi_init", unsafe { (gpu.api.init)(0) })
            .map_err(|e| lib_err(e.to_string()))?;
        Ok(gpu)
    }

    /// The library's words for a status.
    fn describe(&self, status: rsmi_status_t) -> String {
        let mut text: *const c_char = std::ptr::null();
        if let Some(f) = self.api.status_string
            // SAFETY: a valid out-pointer; the library hands back a static string.
            && unsafe { f(status, &mut text) } == RSMI_STATUS_SUCCESS
            && !text.is_null()
        {
            // SAFETY: non-null, NUL-terminated and static, as documented.
            return unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned();
        }
        format!("status {}", status.0)
    }

    fn check(&self, call: &'static str, status: rsmi_status_t) -> Result<(), GpuError> {
        if status == RSMI_STATUS_SUCCESS {
            return Ok(());
        }
        Err(GpuError::Driver {
            call,
            message: self.describe(status),
        })
    }

    /// As [`Self::check`], for a query about one device: a file error is the
    /// device gone (its sysfs files no longer read).
    fn check_device(
        &self,
        uuid: &str,
        call: &'static str,
        status: rsmi_status_t,
    ) -> Result<(), GpuError> {
        if status == RSMI_STATUS_FILE_ERROR {
            return Err(GpuError::Lost(uuid.to_owned()));
        }
        self.check(call, status)
    }

    fn count(&self) -> Result<u32, GpuError> {
        let mut n = 0u32;
        // SAFETY: a valid out-pointer.
        self.check("rsmi_num_monitor_devices", unsafe {
            (self.api.count)(&mut n)
        })?;
        Ok(n)
    }

    fn uuid_of(&self, dv: u32) -> Result<String, GpuError> {
        let mut id = 0u64;
        // SAFETY: a device index below the count and a valid out-pointer.
        self.check("rsmi_dev_unique_id_get", unsafe {
            (self.api.unique_id)(dv, &mut id)
        })?;
        Ok(format_amd_uuid(id))
    }

    /// ROCm SMI's index of the GPU with this UUID.
    fn index_of(&self, uuid: &str) -> Result<u32, GpuError> {
        for dv in 0..self.count()? {
            if self.uuid_of(dv)? == uuid {
                return Ok(dv);
            }
        }
        Err(GpuError::NotFound(uuid.to_owned()))
    }

    fn info(&self, dv: u32) -> Result<GpuInfo, GpuError> {
        let uuid = self.uuid_of(dv)?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer's length is passed with it.
        let r = unsafe { (self.api.name)(dv, name.as_mut_ptr(), name.len()) };
        // Truncated is still a name.
        if r != RSMI_STATUS_INSUFFICIENT_SIZE {
            self.check_device(&uuid, "rsmi_dev_name_get", r)?;
        }
        // SAFETY: the library NUL-terminates what it writes, and the buffer
        // ends in the zero it was filled with if it wrote nothing.
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut vendor_id = 0u16;
        // SAFETY: a valid out-pointer.
        let r = unsafe { (self.api.vendor_id)(dv, &mut vendor_id) };
        self.check_device(&uuid, "rsmi_dev_vendor_id_get", r)?;
        let mut total = 0u64;
        // SAFETY: a valid out-pointer.
        let r = unsafe { (self.api.mem_total)(dv, RSMI_MEM_TYPE_VRAM, &mut total) };
        self.check_device(&uuid, "rsmi_dev_memory_total_get", r)?;
        let mut bdf = 0u64;
        // SAFETY: a valid out-pointer.
        let r = unsafe { (self.api.pci_id)(dv, &mut bdf) };
        self.check_device(&uuid, "rsmi_dev_pci_id_get", r)?;
        let numa = self.api.numa.and_then(|f| {
            let mut n = 0u32;
            // SAFETY: a valid out-pointer.
            (unsafe { f(dv, &mut n) } == RSMI_STATUS_SUCCESS).then_some(n)
        });
        Ok(GpuInfo {
            index: dv,
            uuid,
            // ROCm SMI on a Hygon DCU reports Hygon's PCI vendor id; anything
            // else this library shows is AMD's.
            vendor: match Vendor::from_pci_vendor(vendor_id) {
                Some(Vendor::Hygon) => Vendor::Hygon,
                _ => Vendor::Amd,
            },
            name,
            memory_total_bytes: total,
            sm_count: 0,
            pci_bus_id: pci_bus_id(bdf),
            numa_node: numa.and_then(|n| i32::try_from(n).ok()).unwrap_or(-1),
            compute_capability: (0, 0),
        })
    }

    /// The memory `pid` holds on ROCm SMI's device `dv`, `None` when it does
    /// not use that device (see the module's note on older libraries).
    fn held_on(&self, pid: u32, dv: u32, total: u64) -> Result<Option<u64>, GpuError> {
        if let Some(f) = self.api.proc_on_device {
            let mut p = rsmi_process_info_t::default();
            // SAFETY: a valid out-pointer to one record.
            return match unsafe { f(pid, dv, &mut p) } {
                RSMI_STATUS_SUCCESS => Ok(Some(p.vram_usage)),
                RSMI_STATUS_NOT_FOUND => Ok(None),
                r => self
                    .check("rsmi_compute_process_info_by_device_get", r)
                    .map(|()| None),
            };
        }
        let mut gpus = [0u32; 64];
        let mut n = gpus.len() as u32;
        // SAFETY: the array's length is passed with it.
        match unsafe { (self.api.proc_gpus)(pid, gpus.as_mut_ptr(), &mut n) } {
            RSMI_STATUS_SUCCESS | RSMI_STATUS_INSUFFICIENT_SIZE => {}
            // The process ended between the two calls.
            RSMI_STATUS_NOT_FOUND => return Ok(None),
            r => self.check("rsmi_compute_process_gpus_get", r)?,
        }
        let used = &gpus[..(n as usize).min(gpus.len())];
        Ok(match used {
            [only] if *only == dv => Some(total),
            several if several.contains(&dv) => Some(0),
            _ => None,
        })
    }
}

/// A BDFID (`domain << 32 | bus << 8 | device << 3 | function`) in the
/// `0000:03:00.0` form sysfs and ROCm SMI print.
fn pci_bus_id(bdf: u64) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        bdf >> 32,
        (bdf >> 8) & 0xff,
        (bdf >> 3) & 0x1f,
        bdf & 0x7
    )
}

impl GpuBackend for RocmSmiGpu {
    fn driver_version(&self) -> Result<String, GpuError> {
        let Some(f) = self.api.version else {
            return Ok("rocm-smi".into());
        };
        let mut v = rsmi_version_t {
            major: 0,
            minor: 0,
            patch: 0,
            build: std::ptr::null(),
        };
        // SAFETY: a valid out-pointer.
        self.check("rsmi_version_get", unsafe { f(&mut v) })?;
        Ok(format!("rocm-smi {}.{}.{}", v.major, v.minor, v.patch))
    }

    fn devices(&self) -> Result<Vec<GpuInfo>, GpuError> {
        (0..self.count()?).map(|dv| self.info(dv)).collect()
    }

    fn sample(&self, uuid: &str) -> Result<GpuSample, GpuError> {
        let dv = self.index_of(uuid)?;
        let mut used = 0u64;
        // SAFETY: a valid out-pointer.
        let r = unsafe { (self.api.mem_used)(dv, RSMI_MEM_TYPE_VRAM, &mut used) };
        self.check_device(uuid, "rsmi_dev_memory_usage_get", r)?;
        // Busy percent, temperature and power are optional on some boards, as
        // with NVML; a lost GPU shows in the memory query above.
        let busy = self.api.busy.map_or(0, |f| {
            let mut p = 0u32;
            // SAFETY: a valid out-pointer.
            if unsafe { f(dv, &mut p) } == RSMI_STATUS_SUCCESS {
                p
            } else {
                0
            }
        });
        let temp = self.api.temp.map_or(0, |f| {
            let mut t = 0i64;
            // SAFETY: a valid out-pointer.
            if unsafe { f(dv, RSMI_TEMP_TYPE_EDGE, RSMI_TEMP_CURRENT, &mut t) }
                == RSMI_STATUS_SUCCESS
            {
                u32::try_from(t / 1000).unwrap_or(0)
            } else {
                0
            }
        });
        let power = self.api.power.map_or(0, |f| {
            let mut uw = 0u64;
            // SAFETY: a valid out-pointer.
            if unsafe { f(dv, 0, &mut uw) } == RSMI_STATUS_SUCCESS {
                u32::try_from(uw / 1000).unwrap_or(u32::MAX)
            } else {
                0
            }
        });
        Ok(GpuSample {
            memory_used_bytes: used,
            utilization_percent: busy,
            temperature_c: temp,
            power_mw: power,
        })
    }

    fn processes(&self, uuid: &str) -> Result<Vec<GpuProcess>, GpuError> {
        let dv = self.index_of(uuid)?;
        // The list can grow between the count and the fill: ask again with
        // room to spare until it fits.
        let mut room = 0u32;
        // SAFETY: null records with a valid count pointer asks for the count.
        let r = unsafe { (self.api.procs)(std::ptr::null_mut(), &mut room) };
        self.check("rsmi_compute_process_info_get", r)?;
        let list = loop {
            let mut buf = vec![rsmi_process_info_t::default(); room as usize + 8];
            let mut n = buf.len() as u32;
            // SAFETY: the buffer holds `n` records.
            match unsafe { (self.api.procs)(buf.as_mut_ptr(), &mut n) } {
                RSMI_STATUS_SUCCESS => {
                    buf.truncate(n as usize);
                    break buf;
                }
                RSMI_STATUS_INSUFFICIENT_SIZE => room = buf.len() as u32 * 2,
                r => {
                    return self
                        .check("rsmi_compute_process_info_get", r)
                        .map(|()| vec![]);
                }
            }
        };
        let mut out = Vec::new();
        for p in list {
            if let Some(used) = self.held_on(p.process_id, dv, p.vram_usage)? {
                out.push(GpuProcess {
                    pid: p.process_id,
                    used_bytes: used,
                });
            }
        }
        Ok(out)
    }

    fn wait_event(&self, timeout: Duration) -> Result<Option<GpuEvent>, GpuError> {
        // No XID-like stream: the sampler finds a lost AMD GPU by its failing
        // queries. Waiting the timeout keeps the health thread's pace.
        std::thread::sleep(timeout);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_are_spelled_as_sysfs_spells_them() {
        let bdf = (0x0001u64 << 32) | (0xc3 << 8) | (0x1f << 3) | 0x2;
        assert_eq!(pci_bus_id(bdf), "0001:c3:1f.2");
        assert_eq!(pci_bus_id(0x0300), "0000:03:00.0");
    }

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let e = RocmSmiGpu::open(Some(Path::new("/nonexistent/librocm_smi64.so.5")))
            .expect_err("no library there");
        let text = e.to_string();
        assert!(text.contains("/nonexistent/librocm_smi64.so.5"), "{text}");
        assert!(text.contains("--rocm-smi-library"), "{text}");
    }
}
