//! Modes and topology: fixed states (persistence, ECC, compute mode, MIG ...) and CPU/memory affinity.

use super::*;

macro_rules! fixed_state {
    ($($(#[$doc:meta])* $name:ident: $ty:ty = $value:expr;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// The out pointer must be null or writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device_: nvmlDevice_t, out: *mut $ty) -> nvmlReturn_t {
            guard(|| {
                live(device_)?;
                // SAFETY: the caller passes a writable pointer or null (rejected).
                unsafe { put(out, $value) }
            })
        }
    )*};
}

fixed_state! {
    /// `nvmlDeviceGetPersistenceMode`: enabled, as on servers.
    nvmlDeviceGetPersistenceMode: nvmlEnableState_t = nvmlEnableState_t::NVML_FEATURE_ENABLED;
    /// `nvmlDeviceGetComputeMode`: default (shared).
    nvmlDeviceGetComputeMode: nvmlComputeMode_t = nvmlComputeMode_t::NVML_COMPUTEMODE_DEFAULT;
    /// `nvmlDeviceGetDisplayMode`: no display.
    nvmlDeviceGetDisplayMode: nvmlEnableState_t = nvmlEnableState_t::NVML_FEATURE_DISABLED;
    /// `nvmlDeviceGetDisplayActive`: no display.
    nvmlDeviceGetDisplayActive: nvmlEnableState_t = nvmlEnableState_t::NVML_FEATURE_DISABLED;
}

/// `nvmlDeviceGetMigMode`: MIG disabled (current and pending).
///
/// # Safety
/// Both pointers must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device_: nvmlDevice_t,
    currentMode: *mut c_uint,
    pendingMode: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        // SAFETY: the caller passes writable pointers or null (rejected).
        unsafe {
            put(currentMode, 0)?;
            put(pendingMode, 0)
        }
    })
}

/// `nvmlDeviceGetEccMode`: enabled (current and pending).
///
/// # Safety
/// Both pointers must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetEccMode(
    device_: nvmlDevice_t,
    current: *mut nvmlEnableState_t,
    pending: *mut nvmlEnableState_t,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        // SAFETY: the caller passes writable pointers or null (rejected).
        unsafe {
            put(current, nvmlEnableState_t::NVML_FEATURE_ENABLED)?;
            put(pending, nvmlEnableState_t::NVML_FEATURE_ENABLED)
        }
    })
}

/// `nvmlDeviceGetFanSpeed`: data-centre parts have no fan of their own.
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFanSpeed(
    device_: nvmlDevice_t,
    _speed: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)
    })
}

/// `nvmlDeviceGetNumaNodeId`: not reported (the simulated devices have no NUMA affinity).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device_: nvmlDevice_t,
    _node: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)
    })
}

pub(crate) fn fill_bitmask(size: c_uint, set: *mut c_ulong, bits: usize) -> NvResult<()> {
    if size == 0 || set.is_null() {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    let word_bits = c_ulong::BITS as usize;
    for w in 0..size as usize {
        let lo = w * word_bits;
        let v = if bits >= lo + word_bits {
            c_ulong::MAX
        } else if bits > lo {
            (1 << (bits - lo)) - 1
        } else {
            0
        };
        // SAFETY: w < size words of the caller's array.
        unsafe { set.add(w).write(v) };
    }
    Ok(())
}

/// `nvmlDeviceGetCpuAffinity`: every online CPU.
///
/// # Safety
/// `cpuSet` must hold `cpuSetSize` words.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCpuAffinity(
    device_: nvmlDevice_t,
    cpuSetSize: c_uint,
    cpuSet: *mut c_ulong,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        fill_bitmask(cpuSetSize, cpuSet, cpus)
    })
}

/// `nvmlDeviceGetMemoryAffinity`: NUMA node 0.
///
/// # Safety
/// `nodeSet` must hold `nodeSetSize` words.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryAffinity(
    device_: nvmlDevice_t,
    nodeSetSize: c_uint,
    nodeSet: *mut c_ulong,
    _scope: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        fill_bitmask(nodeSetSize, nodeSet, 1)
    })
}

/// `nvmlDeviceGetTotalEccErrors`: no memory errors happen on the simulated devices, so 0
/// for either error type and counter.
///
/// # Safety
/// `eccCounts` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device_: nvmlDevice_t,
    errorType: nvmlMemoryErrorType_t,
    counterType: nvmlEccCounterType_t,
    eccCounts: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        if errorType.0 >= nvmlMemoryErrorType_t::NVML_MEMORY_ERROR_TYPE_COUNT.0
            || counterType.0 > nvmlEccCounterType_t::NVML_AGGREGATE_ECC.0
        {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(eccCounts, 0) }
    })
}

/// `nvmlDeviceGetMaxMigDeviceCount`: 0, as for a GPU with MIG disabled.
///
/// # Safety
/// `count` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device_: nvmlDevice_t,
    count: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(count, 0) }
    })
}

/// `nvmlDeviceIsMigDeviceHandle`: every handle is a whole GPU.
///
/// # Safety
/// `isMigDevice` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device_: nvmlDevice_t,
    isMigDevice: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(isMigDevice, 0) }
    })
}

macro_rules! windows_only {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// No pointer is dereferenced.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            device_: nvmlDevice_t,
            _current: *mut nvmlDriverModel_t,
            _pending: *mut nvmlDriverModel_t,
        ) -> nvmlReturn_t {
            guard(|| {
                live(device_)?;
                Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED)
            })
        }
    )*};
}

windows_only! {
    /// `nvmlDeviceGetDriverModel`: a Windows notion; `NVML_ERROR_NOT_SUPPORTED` on Linux,
    /// as NVIDIA's library answers.
    nvmlDeviceGetDriverModel;
    /// `nvmlDeviceGetDriverModel_v2`: as `nvmlDeviceGetDriverModel`.
    nvmlDeviceGetDriverModel_v2;
}
