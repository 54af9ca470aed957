//! Devices: counting and choosing them, their properties and attributes, versions.
//!
//! A device's figures come from the node state file (name, memory, compute units,
//! architecture, PCI location); the rest are constants of AMD's CDNA parts (64-wide
//! wavefronts, 1024 threads per block, 64 KiB of LDS per workgroup) from AMD's
//! documentation, the same for every simulated model.

use std::ffi::{c_char, c_int};

use crate::*;

/// Threads per block, wavefront width and LDS per workgroup of AMD's CDNA GPUs.
const MAX_THREADS_PER_BLOCK: c_int = 1024;
const WARP_SIZE: c_int = 64;
const LDS_BYTES: usize = 64 << 10;

fn count() -> HipResult<c_int> {
    let rt = rt()?;
    Ok(rt.devices.len() as c_int)
}

fn info(ordinal: c_int) -> HipResult<tessera_sim::DeviceInfo> {
    let rt = rt()?;
    let p = rt.physical(ordinal)?;
    rt.node
        .device_info(p as u32)
        .map_err(|_| hipErrorInvalidDevice)
}

fn fill_c(dst: &mut [c_char], s: &str) {
    let room = dst.len() - 1;
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

/// The properties of ordinal `ordinal`, as `hipGetDeviceProperties` gives them.
pub fn properties(ordinal: c_int) -> HipResult<hipDeviceProp_t> {
    let d = info(ordinal)?;
    // SAFETY: hipDeviceProp_t is plain C data (integers, arrays, raw pointers), for which
    // all-zero bytes are a valid value.
    let mut p: hipDeviceProp_t = unsafe { std::mem::zeroed() };
    fill_c(&mut p.name, &d.name);
    fill_c(&mut p.gcnArchName, &d.arch);
    p.totalGlobalMem = d.memory_total as usize;
    p.sharedMemPerBlock = LDS_BYTES;
    p.regsPerBlock = 65536;
    p.warpSize = WARP_SIZE;
    p.maxThreadsPerBlock = MAX_THREADS_PER_BLOCK;
    p.maxThreadsDim = [1024, 1024, 1024];
    p.maxGridSize = [i32::MAX, 65536, 65536];
    p.clockRate = 1_700_000;
    p.memoryClockRate = 1_600_000;
    p.memoryBusWidth = 4096;
    p.totalConstMem = 2 << 30;
    p.major = d.cc_major as c_int;
    p.minor = d.cc_minor as c_int;
    p.multiProcessorCount = d.sms as c_int;
    p.l2CacheSize = 8 << 20;
    p.maxThreadsPerMultiProcessor = 2048;
    p.clockInstructionRate = 1_000_000;
    p.concurrentKernels = 1;
    p.pciDomainID = d.pci_domain as c_int;
    p.pciBusID = d.pci_bus as c_int;
    p.pciDeviceID = d.pci_device as c_int;
    p.maxSharedMemoryPerMultiProcessor = LDS_BYTES;
    p.canMapHostMemory = 1;
    // The gfx number as an integer (gfx90a is 910, as HIP's own gcnArch reads it).
    p.gcnArch = (d.cc_major * 100 + d.cc_minor * 10) as c_int;
    p.cooperativeLaunch = 1;
    p.cooperativeMultiDeviceLaunch = 1;
    p.maxTexture1DLinear = 1 << 27;
    p.maxTexture1D = 1 << 14;
    p.maxTexture2D = [1 << 14, 1 << 14];
    p.maxTexture3D = [1 << 14, 1 << 14, 8192];
    p.memPitch = usize::MAX >> 1;
    p.textureAlignment = 256;
    p.texturePitchAlignment = 256;
    p.ECCEnabled = 1;
    p.isLargeBar = 1;
    p.managedMemory = 1;
    p.concurrentManagedAccess = 1;
    Ok(p)
}

/// `hipDeviceGetAttribute`'s answer, or `hipErrorInvalidValue` for an attribute the
/// simulator does not model.
pub fn attribute(a: c_int, ordinal: c_int) -> HipResult<c_int> {
    let p = properties(ordinal)?;
    Ok(match a {
        attr::MaxThreadsPerBlock => p.maxThreadsPerBlock,
        attr::MaxBlockDimX | attr::MaxBlockDimY | attr::MaxBlockDimZ => 1024,
        attr::MaxGridDimX => p.maxGridSize[0],
        attr::MaxGridDimY => p.maxGridSize[1],
        attr::MaxGridDimZ => p.maxGridSize[2],
        attr::MaxSharedMemoryPerBlock => p.sharedMemPerBlock as c_int,
        attr::WarpSize => p.warpSize,
        attr::MultiprocessorCount => p.multiProcessorCount,
        attr::ComputeCapabilityMajor => p.major,
        attr::ComputeCapabilityMinor => p.minor,
        attr::TotalConstantMemory => c_int::MAX,
        attr::MaxRegistersPerBlock => p.regsPerBlock,
        attr::ClockRate => p.clockRate,
        attr::MemoryClockRate => p.memoryClockRate,
        attr::MemoryBusWidth => p.memoryBusWidth,
        attr::L2CacheSize => p.l2CacheSize,
        attr::MaxThreadsPerMultiProcessor => p.maxThreadsPerMultiProcessor,
        attr::PciBusId => p.pciBusID,
        attr::PciDeviceId => p.pciDeviceID,
        attr::PciDomainID => p.pciDomainID,
        attr::ConcurrentKernels
        | attr::ManagedMemory
        | attr::MemoryPoolsSupported
        | attr::CooperativeLaunch
        | attr::CanMapHostMemory
        | attr::UnifiedAddressing => 1,
        attr::Integrated => 0,
        _ => return Err(hipErrorInvalidValue),
    })
}

fn bus_id(ordinal: c_int) -> HipResult<String> {
    let d = info(ordinal)?;
    // HIP writes the domain with four digits, as the CUDA runtime does.
    Ok(format!(
        "{:04x}:{:02x}:{:02x}.0",
        d.pci_domain, d.pci_bus, d.pci_device
    ))
}

hip_api! {
    /// `hipGetDeviceCount`: the AMD devices this process sees.
    ///
    /// # Safety
    /// `n` must be null or writable.
    "hip_4.2" fn hipGetDeviceCount(n: *mut c_int) -> hipError_t {
        guard(|| {
            let c = count()?;
            // SAFETY: the caller passes a writable pointer or null (rejected).
            unsafe { put(n, c) }?;
            if c == 0 { Err(hipErrorNoDevice) } else { Ok(()) }
        })
    }

    /// `hipGetDevice`.
    ///
    /// # Safety
    /// `device` must be null or writable.
    "hip_4.2" fn hipGetDevice(device: *mut c_int) -> hipError_t {
        guard(|| {
            let (o, _) = rt()?.current()?;
            // SAFETY: as above.
            unsafe { put(device, o as c_int) }
        })
    }

    /// `hipSetDevice`.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipSetDevice(device: c_int) -> hipError_t {
        guard(|| {
            rt()?.physical(device)?;
            set_current(device as usize);
            Ok(())
        })
    }

    /// `hipDeviceGet`: a device handle is its ordinal.
    ///
    /// # Safety
    /// `device` must be null or writable.
    "hip_4.2" fn hipDeviceGet(device: *mut c_int, ordinal: c_int) -> hipError_t {
        guard(|| {
            rt()?.physical(ordinal)?;
            // SAFETY: as above.
            unsafe { put(device, ordinal) }
        })
    }

    /// `hipGetDeviceProperties`.
    ///
    /// # Safety
    /// `prop` must be null or writable.
    "hip_4.2" fn hipGetDeviceProperties(prop: *mut hipDeviceProp_t, device: c_int) -> hipError_t {
        guard(|| {
            let p = properties(device)?;
            // SAFETY: as above.
            unsafe { put(prop, p) }
        })
    }

    /// `hipGetDevicePropertiesR0600`, ROCm 6's layout (`hipDeviceProp_tR0600`: after
    /// `char name[256]`, a 16-byte `hipUUID`, `char luid[8]` and an `unsigned int` mask,
    /// so `totalGlobalMem` at byte 288). Written: the name, the UUID and
    /// `totalGlobalMem`, the first 296 bytes; the simulator does not model the rest of
    /// that struct and leaves it as the caller's.
    ///
    /// # Safety
    /// `prop` must be null or writable for 296 bytes.
    "hip_6.0" fn hipGetDevicePropertiesR0600(prop: *mut c_void, device: c_int) -> hipError_t {
        guard(|| {
            let d = info(device)?;
            if prop.is_null() {
                return Err(hipErrorInvalidValue);
            }
            let mut head = [0u8; 296];
            let name = d.name.as_bytes();
            let n = name.len().min(255);
            head[..n].copy_from_slice(&name[..n]);
            head[256..272].copy_from_slice(&d.uuid_bytes);
            head[288..296].copy_from_slice(&(d.memory_total as usize).to_ne_bytes());
            // SAFETY: non-null, and writable for 296 bytes by the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(head.as_ptr(), prop.cast::<u8>(), head.len()) };
            Ok(())
        })
    }

    /// `hipDeviceGetAttribute`.
    ///
    /// # Safety
    /// `value` must be null or writable.
    "hip_4.2" fn hipDeviceGetAttribute(value: *mut c_int, a: c_int, device: c_int) -> hipError_t {
        guard(|| {
            let v = attribute(a, device)?;
            // SAFETY: as above.
            unsafe { put(value, v) }
        })
    }

    /// `hipDeviceGetName`.
    ///
    /// # Safety
    /// `name` must be null or valid for `len` bytes.
    "hip_4.2" fn hipDeviceGetName(name: *mut c_char, len: c_int, device: c_int) -> hipError_t {
        guard(|| {
            let d = info(device)?;
            // SAFETY: the caller passes a buffer of `len` bytes.
            unsafe { put_str(name, len.max(0) as usize, &d.name) }
        })
    }

    /// `hipDeviceTotalMem`: the device's whole memory.
    ///
    /// # Safety
    /// `bytes` must be null or writable.
    "hip_4.2" fn hipDeviceTotalMem(bytes: *mut usize, device: c_int) -> hipError_t {
        guard(|| {
            let d = info(device)?;
            // SAFETY: as above.
            unsafe { put(bytes, d.memory_total as usize) }
        })
    }

    /// `hipDeviceGetPCIBusId`.
    ///
    /// # Safety
    /// `pci` must be null or valid for `len` bytes.
    "hip_4.2" fn hipDeviceGetPCIBusId(pci: *mut c_char, len: c_int, device: c_int) -> hipError_t {
        guard(|| {
            let s = bus_id(device)?;
            // SAFETY: the caller passes a buffer of `len` bytes.
            unsafe { put_str(pci, len.max(0) as usize, &s) }
        })
    }

    /// `hipDeviceGetByPCIBusId`.
    ///
    /// # Safety
    /// `device` must be null or writable; `pci` null or a C string.
    "hip_4.2" fn hipDeviceGetByPCIBusId(device: *mut c_int, pci: *const c_char) -> hipError_t {
        guard(|| {
            if pci.is_null() {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: non-null, and the caller passes a NUL-terminated string.
            let want = unsafe { std::ffi::CStr::from_ptr(pci) }.to_string_lossy();
            let want = tessera_sim::node::parse_bus_id(&want).ok_or(hipErrorInvalidValue)?;
            let rt = rt()?;
            for o in 0..rt.devices.len() {
                let d = info(o as c_int)?;
                if (d.pci_domain, d.pci_bus, d.pci_device) == want {
                    // SAFETY: as above.
                    return unsafe { put(device, o as c_int) };
                }
            }
            Err(hipErrorInvalidDevice)
        })
    }

    /// `hipDeviceGetUuid`: the node's UUID bytes of the device (the ones NVML-style
    /// `GPU-…` strings and rocm-smi's unique id are made from).
    ///
    /// # Safety
    /// `uuid` must be null or writable for 16 bytes.
    "hip_5.1" fn hipDeviceGetUuid(uuid: *mut [u8; 16], device: c_int) -> hipError_t {
        guard(|| {
            let d = info(device)?;
            // SAFETY: the caller's contract.
            unsafe { put(uuid, d.uuid_bytes) }
        })
    }

    /// `hipDriverGetVersion`.
    ///
    /// # Safety
    /// `v` must be null or writable.
    "hip_4.2" fn hipDriverGetVersion(v: *mut c_int) -> hipError_t {
        // SAFETY: as above.
        guard(|| unsafe { put(v, hip_version()) })
    }

    /// `hipRuntimeGetVersion`.
    ///
    /// # Safety
    /// `v` must be null or writable.
    "hip_4.2" fn hipRuntimeGetVersion(v: *mut c_int) -> hipError_t {
        // SAFETY: as above.
        guard(|| unsafe { put(v, hip_version()) })
    }

    /// `hipDeviceGetLimit`: the stack and heap limits HIP reports by default.
    ///
    /// # Safety
    /// `value` must be null or writable.
    "hip_4.2" fn hipDeviceGetLimit(value: *mut usize, limit: c_int) -> hipError_t {
        guard(|| {
            let v = match limit {
                0 => 1024,      // hipLimitStackSize
                1 => 1 << 20,   // hipLimitPrintfFifoSize
                2 => 8 << 20,   // hipLimitMallocHeapSize
                _ => return Err(hipErrorNotSupported),
            };
            // SAFETY: as above.
            unsafe { put(value, v) }
        })
    }

    /// `hipDeviceCanAccessPeer`: the simulated devices have no peer links.
    ///
    /// # Safety
    /// `can` must be null or writable.
    "hip_4.2" fn hipDeviceCanAccessPeer(can: *mut c_int, device: c_int, peer: c_int) -> hipError_t {
        guard(|| {
            let rt = rt()?;
            rt.physical(device)?;
            rt.physical(peer)?;
            // SAFETY: as above.
            unsafe { put(can, 0) }
        })
    }

    /// `hipDeviceEnablePeerAccess`.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipDeviceEnablePeerAccess(_peer: c_int, _flags: c_uint) -> hipError_t {
        guard(|| Err(hipErrorNotSupported))
    }

    /// `hipDeviceDisablePeerAccess`.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipDeviceDisablePeerAccess(_peer: c_int) -> hipError_t {
        guard(|| Err(hipErrorNotSupported))
    }

    /// `hipDevicePrimaryCtxRelease`: the device context lives as long as the process.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipDevicePrimaryCtxRelease(device: c_int) -> hipError_t {
        guard(|| rt()?.physical(device).map(|_| ()))
    }
}
