//! `cuInit`, the driver version, and device queries: count, handles, name, UUID, PCI bus
//! id, total memory, compute capability and attributes (an H100-like part, with the SM
//! count, capability and memory of the simulated node's configuration).
//! Peer queries are in `peer`.

use std::ffi::{CStr, c_char, c_int, c_uint};

use tessera_ffi::cuda::*;
use tessera_sim::DeviceInfo;
use tessera_sim::node::parse_bus_id;

use crate::runtime::{self, Runtime, rt};
use crate::{CuResult, guard, put};

/// The driver version the simulated driver reports by default (that of the headers it is
/// built from); `TESSERA_SIM_DRIVER_VERSION` changes it per process ([`driver_version`]).
pub const DRIVER_VERSION: c_int = CUDA_VERSION as c_int;

/// The driver version this process reports, read once from `TESSERA_SIM_DRIVER_VERSION`.
/// A bad value is `CUDA_ERROR_OPERATING_SYSTEM` from every call that needs it, with one
/// line on stderr.
pub fn driver_version() -> CuResult<c_int> {
    static VERSION: std::sync::OnceLock<CuResult<c_int>> = std::sync::OnceLock::new();
    *VERSION.get_or_init(|| {
        tessera_sim::config::driver_version_from_lookup(|k| std::env::var(k).ok()).map_err(|e| {
            crate::errors::say(&e.to_string());
            CUresult::CUDA_ERROR_OPERATING_SYSTEM
        })
    })
}

/// `cuInit`: maps the node state and joins the node. `Flags` must be 0.
/// `CUDA_ERROR_NO_DEVICE` when `CUDA_VISIBLE_DEVICES` leaves no device (later calls then
/// see a count of 0, as with the real driver).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(Flags: c_uint) -> CUresult {
    guard(|| {
        if Flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let rt = runtime::init()?;
        if rt.devices.is_empty() {
            return Err(CUresult::CUDA_ERROR_NO_DEVICE);
        }
        Ok(())
    })
}

/// `cuDriverGetVersion`: works before `cuInit`, as the real one.
///
/// # Safety
/// `driverVersion` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(driverVersion: *mut c_int) -> CUresult {
    // SAFETY: the caller passes a writable pointer or null (rejected).
    guard(|| unsafe { put(driverVersion, driver_version()?) })
}

/// `cuDeviceGet`.
///
/// # Safety
/// `device` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> CUresult {
    guard(|| {
        let rt = rt()?;
        rt.device(ordinal)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(device, ordinal) }
    })
}

/// `cuDeviceGetCount`.
///
/// # Safety
/// `count` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    guard(|| {
        let rt = rt()?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(count, rt.devices.len() as c_int) }
    })
}

pub(crate) fn info(rt: &Runtime, dev: CUdevice) -> CuResult<DeviceInfo> {
    let d = rt.device(dev)?;
    rt.node
        .device_info(d.index as u32)
        .map_err(|_| CUresult::CUDA_ERROR_INVALID_DEVICE)
}

/// Copies `s` into a C buffer of `len` bytes, truncating and NUL-terminating.
///
/// # Safety
/// `buf` must be valid for `len` bytes of writes.
unsafe fn write_cstr(buf: *mut c_char, len: c_int, s: &str) -> CuResult<()> {
    if buf.is_null() || len <= 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let n = s.len().min(len as usize - 1);
    // SAFETY: `buf` holds `len` > n bytes by the caller's contract; source and destination
    // do not overlap (one is a Rust string).
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        buf.add(n).write(0);
    }
    Ok(())
}

/// `cuDeviceGetName`.
///
/// # Safety
/// `name` must be valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    guard(|| {
        let i = info(rt()?, dev)?;
        // SAFETY: the caller passes a buffer of `len` bytes.
        unsafe { write_cstr(name, len, &i.name) }
    })
}

fn uuid(uuid: *mut CUuuid, dev: CUdevice) -> CuResult<()> {
    let i = info(rt()?, dev)?;
    let mut u = CUuuid::default();
    for (dst, src) in u.bytes.iter_mut().zip(i.uuid_bytes) {
        *dst = src as c_char;
    }
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(uuid, u) }
}

tessera_sim::exports! {
    /// `cuDeviceGetUuid`, `cuDeviceGetUuid_v2`.
    ///
    /// # Safety
    /// `uuid` must be null or writable.
    fn [cuDeviceGetUuid, cuDeviceGetUuid_v2](uuid_out: *mut CUuuid, dev: CUdevice) -> CUresult {
        guard(|| uuid(uuid_out, dev))
    }
}

/// `cuDeviceGetLuid`: Windows only, as on Linux drivers.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetLuid(
    _luid: *mut c_char,
    _deviceNodeMask: *mut c_uint,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        rt()?.device(dev)?;
        Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
    })
}

/// `cuDeviceTotalMem_v2`.
///
/// # Safety
/// `bytes` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    guard(|| {
        let i = info(rt()?, dev)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(bytes, i.memory_total as usize) }
    })
}

/// `cuDeviceTotalMem` (the pre-3.2 ABI with a 32-bit size, saturated).
///
/// # Safety
/// `bytes` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    guard(|| {
        let i = info(rt()?, dev)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(bytes, i.memory_total.min(u64::from(u32::MAX)) as c_uint) }
    })
}

/// `cuDeviceComputeCapability`.
///
/// # Safety
/// Both pointers must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceComputeCapability(
    major: *mut c_int,
    minor: *mut c_int,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let i = info(rt()?, dev)?;
        // SAFETY: the caller passes writable pointers or null (rejected).
        unsafe {
            put(major, i.cc_major as c_int)?;
            put(minor, i.cc_minor as c_int)
        }
    })
}

/// The value of a device attribute; `None` for values outside the enum.
pub fn attribute(i: &DeviceInfo, attrib: CUdevice_attribute) -> Option<c_int> {
    use CUdevice_attribute as A;
    if attrib.0 == 0 || attrib.0 >= A::CU_DEVICE_ATTRIBUTE_MAX.0 {
        return None;
    }
    Some(match attrib {
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X | A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => 64,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => i32::MAX,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y | A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => 65535,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => 48 << 10,
        A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY => 64 << 10,
        A::CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        A::CU_DEVICE_ATTRIBUTE_MAX_PITCH => i32::MAX,
        A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK => 65536,
        A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE => 1_980_000,
        A::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT => 512,
        A::CU_DEVICE_ATTRIBUTE_GPU_OVERLAP => 1,
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => i.sms as c_int,
        A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY => 1,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE => 0,
        A::CU_DEVICE_ATTRIBUTE_SURFACE_ALIGNMENT => 512,
        A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS => 1,
        A::CU_DEVICE_ATTRIBUTE_ECC_ENABLED => 1,
        A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => i.pci_bus as c_int,
        A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID => i.pci_device as c_int,
        A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => i.pci_domain as c_int,
        A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE => 2_619_000,
        A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH => 5120,
        A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE => 50 << 20,
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => 2048,
        A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 2,
        A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING => 1,
        A::CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT => 32,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => i.cc_major as c_int,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => i.cc_minor as c_int,
        A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED => 1,
        A::CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED => 1,
        A::CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED => 1,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 228 << 10,
        A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
        A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY => 1,
        A::CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO => 2,
        A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS => 1,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED => 1,
        A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM => 1,
        A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH => 1,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 227 << 10,
        A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED => 1,
        A::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED => 1,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        A::CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE => 30 << 20,
        A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK => 1024,
        A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED => 1,
        A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES => 0,
        A::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH => 1,
        A::CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT => 4,
        A::CU_DEVICE_ATTRIBUTE_NUMA_ID | A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID => -1,
        A::CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID => 0x2330_10de_u32 as c_int,
        _ => 0,
    })
}

/// `cuDeviceGetAttribute`.
///
/// # Safety
/// `pi` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(
    pi: *mut c_int,
    attrib: CUdevice_attribute,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let i = info(rt()?, dev)?;
        let v = attribute(&i, attrib).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pi, v) }
    })
}

/// `cuDeviceGetProperties` (deprecated, still exported).
///
/// # Safety
/// `prop` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetProperties(prop: *mut CUdevprop, dev: CUdevice) -> CUresult {
    guard(|| {
        let i = info(rt()?, dev)?;
        let a = |x| attribute(&i, x).unwrap_or(0);
        use CUdevice_attribute as A;
        let p = CUdevprop {
            maxThreadsPerBlock: a(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            maxThreadsDim: [
                a(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X),
                a(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
                a(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z),
            ],
            maxGridSize: [
                a(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X),
                a(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y),
                a(A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z),
            ],
            sharedMemPerBlock: a(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
            totalConstantMemory: a(A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY),
            SIMDWidth: a(A::CU_DEVICE_ATTRIBUTE_WARP_SIZE),
            memPitch: a(A::CU_DEVICE_ATTRIBUTE_MAX_PITCH),
            regsPerBlock: a(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK),
            clockRate: a(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
            textureAlign: a(A::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT),
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(prop, p) }
    })
}

/// The bus id in CUDA's form, `0000:18:00.0` (NVML writes an 8-digit domain).
pub fn cuda_bus_id(i: &DeviceInfo) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.0",
        i.pci_domain, i.pci_bus, i.pci_device
    )
}

/// `cuDeviceGetPCIBusId`.
///
/// # Safety
/// `pciBusId` must be valid for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(
    pciBusId: *mut c_char,
    len: c_int,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let i = info(rt()?, dev)?;
        // SAFETY: the caller passes a buffer of `len` bytes.
        unsafe { write_cstr(pciBusId, len, &cuda_bus_id(&i)) }
    })
}

/// `cuDeviceGetByPCIBusId`.
///
/// # Safety
/// `dev` must be null or writable; `pciBusId` null or a C string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(
    dev: *mut CUdevice,
    pciBusId: *const c_char,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        if pciBusId.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null, and the caller passes a NUL-terminated string.
        let s = unsafe { CStr::from_ptr(pciBusId) }.to_string_lossy();
        let want = parse_bus_id(&s).ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
        // Only visible devices are found, under their ordinals.
        for ordinal in 0..rt.devices.len() as CUdevice {
            let i = info(rt, ordinal)?;
            if (i.pci_domain, i.pci_bus, i.pci_device) == want {
                // SAFETY: the caller passes a writable pointer or null (rejected).
                return unsafe { put(dev, ordinal) };
            }
        }
        Err(CUresult::CUDA_ERROR_INVALID_DEVICE)
    })
}

/// `cuDeviceGetExecAffinitySupport`: no SM partitioning.
///
/// # Safety
/// `pi` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetExecAffinitySupport(
    pi: *mut c_int,
    _type: CUexecAffinityType,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        rt()?.device(dev)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pi, 0) }
    })
}
