//! The simulated `libnvidia-ml.so.1`: NVML over the simulated node's shared state
//! (`tessera-sim`), with NVIDIA's symbol names and ABI.
//!
//! Memory and processes are the node's ground truth (every process's holdings, dead
//! processes reaped first). Utilization is the engine's busy fraction over the last
//! second; temperature, power, clocks and performance state are derived from it (see
//! `docs/simulator.md`). XID errors injected through `tessera_sim::Node` arrive through
//! event sets. Every export runs inside `guard` (a panic is `NVML_ERROR_UNKNOWN`).

#![allow(non_snake_case)]

use std::collections::BTreeSet;
use std::ffi::{CStr, c_char, c_int, c_uint, c_ulong, c_ulonglong};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use tessera_ffi::nvml::*;
use tessera_ffi::nvml_extra::nvmlMemory_v2;
use tessera_sim::clock::{now_ns, realtime_ns};
use tessera_sim::layout::MAX_DEVICES;
use tessera_sim::node::parse_bus_id;
use tessera_sim::{DeviceInfo, Node};

type NvResult<T> = Result<T, nvmlReturn_t>;

/// The driver version reported (the branch that shipped with CUDA 12.9).
pub const DRIVER_VERSION: &str = "575.57.08";
/// The CUDA driver version reported, as `cuDriverGetVersion`.
pub const CUDA_DRIVER_VERSION: c_int = 12090;
/// Board power limit and idle draw, in mW (an H100 SXM's).
pub const POWER_LIMIT_MW: c_uint = 700_000;
pub const POWER_IDLE_MW: c_uint = 72_000;

/// Runs an export's body: `Ok` is `NVML_SUCCESS`, a panic `NVML_ERROR_UNKNOWN`.
fn guard(body: impl FnOnce() -> NvResult<()>) -> nvmlReturn_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => nvmlReturn_t::NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => nvmlReturn_t::NVML_ERROR_UNKNOWN,
    }
}

/// Writes through an output pointer, or `NVML_ERROR_INVALID_ARGUMENT` when it is null.
///
/// # Safety
/// A non-null `out` must be valid for writing one `T`.
unsafe fn put<T>(out: *mut T, value: T) -> NvResult<()> {
    if out.is_null() {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null and, by the caller's contract, writable.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `s` and a NUL into a buffer of `len` bytes; too small is
/// `NVML_ERROR_INSUFFICIENT_SIZE`, as NVML reports it.
///
/// # Safety
/// A non-null `buf` must be valid for `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: c_uint, s: &str) -> NvResult<()> {
    if buf.is_null() {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    if (len as usize) < s.len() + 1 {
        return Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds `len` > s.len() bytes; the source is a Rust string.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

// ---- init ----

static NODE: OnceLock<Result<Node, String>> = OnceLock::new();
static INITS: AtomicU32 = AtomicU32::new(0);

fn init() -> NvResult<()> {
    match NODE.get_or_init(|| Node::open_from_env().map_err(|e| e.to_string())) {
        Ok(_) => {
            INITS.fetch_add(1, Ordering::AcqRel);
            Ok(())
        }
        Err(e) => {
            eprintln!("tessera-sim libnvidia-ml: {e}");
            Err(nvmlReturn_t::NVML_ERROR_DRIVER_NOT_LOADED)
        }
    }
}

/// The node, while NVML is initialised.
fn node() -> NvResult<&'static Node> {
    if INITS.load(Ordering::Acquire) == 0 {
        return Err(nvmlReturn_t::NVML_ERROR_UNINITIALIZED);
    }
    match NODE.get() {
        Some(Ok(n)) => Ok(n),
        _ => Err(nvmlReturn_t::NVML_ERROR_UNINITIALIZED),
    }
}

/// `nvmlInit_v2`.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit_v2() -> nvmlReturn_t {
    guard(init)
}

/// `nvmlInit` (the pre-v2 symbol; same behaviour).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInit() -> nvmlReturn_t {
    guard(init)
}

/// `nvmlInitWithFlags`: `NVML_INIT_FLAG_NO_GPUS` and `NVML_INIT_FLAG_NO_ATTACH` accepted.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t {
    guard(|| {
        if flags & !(NVML_INIT_FLAG_NO_GPUS | NVML_INIT_FLAG_NO_ATTACH) != 0 {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        init()
    })
}

/// `nvmlShutdown`: balances one init; the last one makes calls fail as uninitialised.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlShutdown() -> nvmlReturn_t {
    guard(|| {
        INITS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| nvmlReturn_t::NVML_ERROR_UNINITIALIZED)
    })
}

macro_rules! error_strings {
    ($($name:ident => $text:literal,)*) => {
        fn error_text(r: nvmlReturn_t) -> &'static CStr {
            $(if r == nvmlReturn_t::$name { return $text; })*
            c"Unknown Error"
        }
    };
}

error_strings! {
    NVML_SUCCESS => c"Success",
    NVML_ERROR_UNINITIALIZED => c"Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT => c"Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED => c"Not Supported",
    NVML_ERROR_NO_PERMISSION => c"Insufficient Permissions",
    NVML_ERROR_ALREADY_INITIALIZED => c"Already Initialized",
    NVML_ERROR_NOT_FOUND => c"Not Found",
    NVML_ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
    NVML_ERROR_INSUFFICIENT_POWER => c"Insufficient External Power",
    NVML_ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
    NVML_ERROR_TIMEOUT => c"Timeout",
    NVML_ERROR_IRQ_ISSUE => c"Interrupt Request Issue",
    NVML_ERROR_LIBRARY_NOT_FOUND => c"NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND => c"Function Not Found",
    NVML_ERROR_CORRUPTED_INFOROM => c"Corrupted infoROM",
    NVML_ERROR_GPU_IS_LOST => c"GPU is lost",
    NVML_ERROR_RESET_REQUIRED => c"GPU requires restart",
    NVML_ERROR_OPERATING_SYSTEM => c"GPU access blocked by the operating system",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH => c"Driver/library version mismatch",
    NVML_ERROR_IN_USE => c"In use by another client",
    NVML_ERROR_MEMORY => c"Insufficient Memory",
    NVML_ERROR_NO_DATA => c"No data",
    NVML_ERROR_INSUFFICIENT_RESOURCES => c"Insufficient resources",
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument version mismatch",
    NVML_ERROR_DEPRECATED => c"Deprecated",
    NVML_ERROR_NOT_READY => c"Not ready",
    NVML_ERROR_GPU_NOT_FOUND => c"GPU not found",
    NVML_ERROR_INVALID_STATE => c"Invalid state",
    NVML_ERROR_UNKNOWN => c"Unknown Error",
}

/// `nvmlErrorString`: a static string for every code (unknown codes included).
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlErrorString(result: nvmlReturn_t) -> *const c_char {
    catch_unwind(|| error_text(result).as_ptr()).unwrap_or(c"Unknown Error".as_ptr())
}

// ---- system ----

/// `nvmlSystemGetDriverVersion`.
///
/// # Safety
/// `version` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        node()?;
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(version, length, DRIVER_VERSION) }
    })
}

/// `nvmlSystemGetNVMLVersion`.
///
/// # Safety
/// `version` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(
    version: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(version, length, &format!("12.{DRIVER_VERSION}")) }
    })
}

/// `nvmlSystemGetCudaDriverVersion`.
///
/// # Safety
/// `v` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: the caller passes a writable pointer or null (rejected).
    guard(|| unsafe { put(v, CUDA_DRIVER_VERSION) })
}

/// `nvmlSystemGetCudaDriverVersion_v2`.
///
/// # Safety
/// `v` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(v: *mut c_int) -> nvmlReturn_t {
    // SAFETY: the caller passes a writable pointer or null (rejected).
    guard(|| unsafe { put(v, CUDA_DRIVER_VERSION) })
}

// ---- device handles ----

/// What an `nvmlDevice_t` points to: one static slot per possible device.
#[repr(C)]
#[derive(Debug)]
pub struct DeviceSlot {
    index: u32,
}

static SLOTS: [DeviceSlot; MAX_DEVICES] = {
    let mut s = [const { DeviceSlot { index: 0 } }; MAX_DEVICES];
    let mut i = 0;
    while i < MAX_DEVICES {
        s[i].index = i as u32;
        i += 1;
    }
    s
};

fn handle(index: u32) -> nvmlDevice_t {
    (&SLOTS[index as usize] as *const DeviceSlot)
        .cast_mut()
        .cast()
}

/// The device index a handle names, if it is one of ours and the device exists.
fn index_of(node: &Node, d: nvmlDevice_t) -> NvResult<u32> {
    let base = SLOTS.as_ptr() as usize;
    let p = d as usize;
    let size = size_of::<DeviceSlot>();
    if p < base || p >= base + MAX_DEVICES * size || !(p - base).is_multiple_of(size) {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    let i = ((p - base) / size) as u32;
    if i >= node.device_count() {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(i)
}

/// A device query that works on a lost device too (identity).
fn device(d: nvmlDevice_t) -> NvResult<(&'static Node, u32)> {
    let node = node()?;
    Ok((node, index_of(node, d)?))
}

/// A device query that needs the device to be reachable.
fn live(d: nvmlDevice_t) -> NvResult<(&'static Node, u32)> {
    let (node, i) = device(d)?;
    if node.is_lost(i as usize) {
        return Err(nvmlReturn_t::NVML_ERROR_GPU_IS_LOST);
    }
    Ok((node, i))
}

fn info(node: &Node, i: u32) -> NvResult<DeviceInfo> {
    node.device_info(i)
        .map_err(|_| nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)
}

fn count(c: *mut c_uint) -> NvResult<()> {
    let node = node()?;
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(c, node.device_count()) }
}

/// `nvmlDeviceGetCount_v2`.
///
/// # Safety
/// `deviceCount` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(deviceCount: *mut c_uint) -> nvmlReturn_t {
    guard(|| count(deviceCount))
}

/// `nvmlDeviceGetCount`.
///
/// # Safety
/// `deviceCount` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount(deviceCount: *mut c_uint) -> nvmlReturn_t {
    guard(|| count(deviceCount))
}

fn by_index(index: c_uint, out: *mut nvmlDevice_t) -> NvResult<()> {
    let node = node()?;
    if index >= node.device_count() {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(out, handle(index)) }
}

/// `nvmlDeviceGetHandleByIndex_v2`.
///
/// # Safety
/// `device` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| by_index(index, device))
}

/// `nvmlDeviceGetHandleByIndex`.
///
/// # Safety
/// `device` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex(
    index: c_uint,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| by_index(index, device))
}

fn c_arg<'a>(s: *const c_char) -> NvResult<std::borrow::Cow<'a, str>> {
    if s.is_null() {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated string.
    Ok(unsafe { CStr::from_ptr(s) }.to_string_lossy())
}

/// `nvmlDeviceGetHandleByUUID`.
///
/// # Safety
/// `uuid` must be null or a C string; `device` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| {
        let node = node()?;
        let want = c_arg(uuid)?;
        for i in 0..node.device_count() {
            if info(node, i)?.uuid.eq_ignore_ascii_case(want.trim()) {
                // SAFETY: the caller passes a writable pointer or null (rejected).
                return unsafe { put(device, handle(i)) };
            }
        }
        Err(nvmlReturn_t::NVML_ERROR_NOT_FOUND)
    })
}

fn by_bus_id(bus: *const c_char, out: *mut nvmlDevice_t) -> NvResult<()> {
    let node = node()?;
    let want = parse_bus_id(&c_arg(bus)?).ok_or(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)?;
    for i in 0..node.device_count() {
        let d = info(node, i)?;
        if (d.pci_domain, d.pci_bus, d.pci_device) == want {
            // SAFETY: the caller passes a writable pointer or null (rejected).
            return unsafe { put(out, handle(i)) };
        }
    }
    Err(nvmlReturn_t::NVML_ERROR_NOT_FOUND)
}

/// `nvmlDeviceGetHandleByPciBusId_v2`.
///
/// # Safety
/// `pciBusId` must be null or a C string; `device` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| by_bus_id(pciBusId, device))
}

/// `nvmlDeviceGetHandleByPciBusId`.
///
/// # Safety
/// `pciBusId` must be null or a C string; `device` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId(
    pciBusId: *const c_char,
    device: *mut nvmlDevice_t,
) -> nvmlReturn_t {
    guard(|| by_bus_id(pciBusId, device))
}

// ---- identity ----

/// `nvmlDeviceGetName`.
///
/// # Safety
/// `name` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device_: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = device(device_)?;
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(name, length, &info(node, i)?.name) }
    })
}

/// `nvmlDeviceGetUUID`.
///
/// # Safety
/// `uuid` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device_: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = device(device_)?;
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(uuid, length, &info(node, i)?.uuid) }
    })
}

/// `nvmlDeviceGetSerial`.
///
/// # Safety
/// `serial` must be valid for `length` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSerial(
    device_: nvmlDevice_t,
    serial: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = device(device_)?;
        let u = info(node, i)?.uuid_bytes;
        let s = format!(
            "165{:010}",
            u64::from_be_bytes(u[..8].try_into().unwrap_or_default()) % 10_000_000_000
        );
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(serial, length, &s) }
    })
}

/// `nvmlDeviceGetIndex`.
///
/// # Safety
/// `index` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device_: nvmlDevice_t,
    index: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (_, i) = device(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(index, i) }
    })
}

/// `nvmlDeviceGetMinorNumber`: the index (as `/dev/nvidia<N>` would be).
///
/// # Safety
/// `minorNumber` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device_: nvmlDevice_t,
    minorNumber: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (_, i) = device(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(minorNumber, i) }
    })
}

/// `nvmlDeviceGetBrand`.
///
/// # Safety
/// `type_` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetBrand(
    device_: nvmlDevice_t,
    type_: *mut nvmlBrandType_t,
) -> nvmlReturn_t {
    guard(|| {
        device(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(type_, nvmlBrandType_t::NVML_BRAND_NVIDIA) }
    })
}

/// `nvmlDeviceGetArchitecture`: from the compute capability.
///
/// # Safety
/// `arch` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetArchitecture(
    device_: nvmlDevice_t,
    arch: *mut nvmlDeviceArchitecture_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = device(device_)?;
        let d = info(node, i)?;
        let a = match (d.cc_major, d.cc_minor) {
            (7, 0) | (7, 2) => NVML_DEVICE_ARCH_VOLTA,
            (7, _) => NVML_DEVICE_ARCH_TURING,
            (8, 9) => NVML_DEVICE_ARCH_ADA,
            (8, _) => NVML_DEVICE_ARCH_AMPERE,
            (9, _) => NVML_DEVICE_ARCH_HOPPER,
            (10, _) | (12, _) => NVML_DEVICE_ARCH_BLACKWELL,
            _ => NVML_DEVICE_ARCH_UNKNOWN,
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(arch, a) }
    })
}

fn pci_info(d: nvmlDevice_t, out: *mut nvmlPciInfo_t) -> NvResult<()> {
    let (node, i) = device(d)?;
    let di = info(node, i)?;
    let mut p = nvmlPciInfo_t {
        domain: di.pci_domain,
        bus: di.pci_bus,
        device: di.pci_device,
        pciDeviceId: 0x2330_10de,
        pciSubSystemId: 0x16c1_10de,
        ..Default::default()
    };
    let long = tessera_ffi::nvml_extra::pci_bus_id(di.pci_domain, di.pci_bus, di.pci_device);
    let short =
        tessera_ffi::nvml_extra::pci_bus_id_legacy(di.pci_domain, di.pci_bus, di.pci_device);
    for (dst, src) in p.busId.iter_mut().zip(long.bytes()) {
        *dst = src as c_char;
    }
    for (dst, src) in p.busIdLegacy.iter_mut().zip(short.bytes()) {
        *dst = src as c_char;
    }
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(out, p) }
}

/// `nvmlDeviceGetPciInfo_v3`.
///
/// # Safety
/// `pci` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device_: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guard(|| pci_info(device_, pci))
}

/// `nvmlDeviceGetPciInfo_v2` (same layout).
///
/// # Safety
/// `pci` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v2(
    device_: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guard(|| pci_info(device_, pci))
}

/// `nvmlDeviceGetCudaComputeCapability`.
///
/// # Safety
/// Both pointers must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCudaComputeCapability(
    device_: nvmlDevice_t,
    major: *mut c_int,
    minor: *mut c_int,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = device(device_)?;
        let d = info(node, i)?;
        // SAFETY: the caller passes writable pointers or null (rejected).
        unsafe {
            put(major, d.cc_major as c_int)?;
            put(minor, d.cc_minor as c_int)
        }
    })
}

// ---- memory and processes ----

/// Total and used memory of a device, dead processes reaped first (the device would
/// have freed their memory already).
fn memory(node: &Node, i: u32) -> NvResult<(u64, u64)> {
    node.reap_dead();
    let u = node
        .device_usage(i)
        .map_err(|_| nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)?;
    Ok((u.memory_total, u.memory_used.min(u.memory_total)))
}

/// `nvmlDeviceGetMemoryInfo`.
///
/// # Safety
/// `memory_` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device_: nvmlDevice_t,
    memory_: *mut nvmlMemory_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let (total, used) = memory(node, i)?;
        let m = nvmlMemory_t {
            total,
            free: total - used,
            used,
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(memory_, m) }
    })
}

/// `nvmlDeviceGetMemoryInfo_v2`: `version` must be `nvmlMemory_v2`. Nothing is reserved
/// by the simulated driver, so `reserved` is 0.
///
/// # Safety
/// `memory_` must be null or a valid, writable `nvmlMemory_v2_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device_: nvmlDevice_t,
    memory_: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        if memory_.is_null() {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller passes a valid struct whose version we check.
        if unsafe { (*memory_).version } != nvmlMemory_v2 {
            return Err(nvmlReturn_t::NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let (total, used) = memory(node, i)?;
        let m = nvmlMemory_v2_t {
            version: nvmlMemory_v2,
            total,
            reserved: 0,
            free: total - used,
            used,
        };
        // SAFETY: checked non-null above.
        unsafe { memory_.write(m) };
        Ok(())
    })
}

/// The processes using a device: a context on it or memory held on it.
fn processes(node: &Node, i: u32) -> Vec<(u32, u64)> {
    node.reap_dead();
    node.processes()
        .into_iter()
        .filter(|p| p.contexts & (1 << i) != 0 || p.memory[i as usize] > 0)
        .map(|p| (p.pid, p.memory[i as usize]))
        .collect()
}

/// Fills a process list the NVML way: with too small a buffer (or none), the count
/// needed and `NVML_ERROR_INSUFFICIENT_SIZE`.
fn fill_processes<T>(
    d: nvmlDevice_t,
    count: *mut c_uint,
    infos: *mut T,
    make: impl Fn(u32, u64) -> T,
) -> NvResult<()> {
    let (node, i) = live(d)?;
    if count.is_null() {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    let list = processes(node, i);
    // SAFETY: `count` is non-null and the caller's to read and write.
    let room = unsafe { count.read() } as usize;
    // SAFETY: as above.
    unsafe { count.write(list.len() as c_uint) };
    if list.is_empty() {
        return Ok(());
    }
    if infos.is_null() || room < list.len() {
        return Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (k, (pid, mem)) in list.into_iter().enumerate() {
        // SAFETY: k < list.len() <= room entries of the caller's array.
        unsafe { infos.add(k).write(make(pid, mem)) };
    }
    Ok(())
}

fn info_v2(pid: u32, mem: u64) -> nvmlProcessInfo_t {
    nvmlProcessInfo_t {
        pid,
        usedGpuMemory: mem,
        gpuInstanceId: u32::MAX,
        computeInstanceId: u32::MAX,
    }
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`.
///
/// # Safety
/// `infoCount` must be valid; `infos` null or holding `*infoCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device_: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| fill_processes(device_, infoCount, infos, info_v2))
}

/// `nvmlDeviceGetComputeRunningProcesses_v2` (same record layout as `_v3`).
///
/// # Safety
/// `infoCount` must be valid; `infos` null or holding `*infoCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device_: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v2_t,
) -> nvmlReturn_t {
    guard(|| fill_processes(device_, infoCount, infos, info_v2))
}

/// `nvmlDeviceGetComputeRunningProcesses` (the legacy 16-byte records).
///
/// # Safety
/// `infoCount` must be valid; `infos` null or holding `*infoCount` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device_: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    guard(|| {
        fill_processes(device_, infoCount, infos, |pid, mem| nvmlProcessInfo_v1_t {
            pid,
            usedGpuMemory: mem,
        })
    })
}

fn no_processes(d: nvmlDevice_t, count: *mut c_uint) -> NvResult<()> {
    live(d)?;
    // SAFETY: the caller passes a writable pointer or null (rejected).
    unsafe { put(count, 0) }
}

/// `nvmlDeviceGetGraphicsRunningProcesses_v3`: no graphics work is simulated.
///
/// # Safety
/// `infoCount` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device_: nvmlDevice_t,
    infoCount: *mut c_uint,
    _infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| no_processes(device_, infoCount))
}

/// `nvmlDeviceGetMPSComputeRunningProcesses_v3`: there is no MPS here.
///
/// # Safety
/// `infoCount` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device_: nvmlDevice_t,
    infoCount: *mut c_uint,
    _infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    guard(|| no_processes(device_, infoCount))
}

// ---- activity ----

/// Busy fraction of the device's engine over the last `window_ns`.
fn busy(node: &Node, i: u32, window_ns: u64) -> f64 {
    node.device(i)
        .map(|d| d.busy.utilization(now_ns(), window_ns))
        .unwrap_or(0.0)
}

fn pct(x: f64) -> c_uint {
    (x * 100.0).round().clamp(0.0, 100.0) as c_uint
}

/// `nvmlDeviceGetUtilizationRates`: GPU = engine busy over the last second; memory =
/// a synthetic 40% of that (no memory traffic is simulated).
///
/// # Safety
/// `utilization` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device_: nvmlDevice_t,
    utilization: *mut nvmlUtilization_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let b = busy(node, i, 1_000_000_000);
        let u = nvmlUtilization_t {
            gpu: pct(b),
            memory: pct(b * 0.4),
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(utilization, u) }
    })
}

/// `nvmlDeviceGetProcessUtilization`: one sample per process busy on the device in the
/// last second, stamped now (µs since the epoch).
///
/// # Safety
/// `processSamplesCount` must be valid; `utilization` null or holding that many entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device_: nvmlDevice_t,
    utilization: *mut nvmlProcessUtilizationSample_t,
    processSamplesCount: *mut c_uint,
    lastSeenTimeStamp: c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        if processSamplesCount.is_null() {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        node.reap_dead();
        let stamp = realtime_ns() / 1000;
        let samples: Vec<nvmlProcessUtilizationSample_t> = if stamp > lastSeenTimeStamp {
            node.processes()
                .into_iter()
                .filter(|p| p.utilization[i as usize] > 0.0)
                .map(|p| nvmlProcessUtilizationSample_t {
                    pid: p.pid,
                    timeStamp: stamp,
                    smUtil: pct(p.utilization[i as usize]),
                    memUtil: pct(p.utilization[i as usize] * 0.4),
                    encUtil: 0,
                    decUtil: 0,
                })
                .collect()
        } else {
            Vec::new()
        };
        // SAFETY: non-null; the caller's to read and write.
        let room = unsafe { processSamplesCount.read() } as usize;
        // SAFETY: as above.
        unsafe { processSamplesCount.write(samples.len() as c_uint) };
        if samples.is_empty() {
            return Err(nvmlReturn_t::NVML_ERROR_NOT_FOUND);
        }
        if utilization.is_null() || room < samples.len() {
            return Err(nvmlReturn_t::NVML_ERROR_INSUFFICIENT_SIZE);
        }
        for (k, s) in samples.into_iter().enumerate() {
            // SAFETY: k < samples.len() <= room entries of the caller's array.
            unsafe { utilization.add(k).write(s) };
        }
        Ok(())
    })
}

/// Temperature in °C: 34 idle, 78 fully busy, following the last five seconds.
fn temperature_c(node: &Node, i: u32) -> c_uint {
    34 + (44.0 * busy(node, i, 5_000_000_000)).round() as c_uint
}

/// `nvmlDeviceGetTemperature`.
///
/// # Safety
/// `temp` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device_: nvmlDevice_t,
    sensorType: nvmlTemperatureSensors_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        if sensorType != nvmlTemperatureSensors_t::NVML_TEMPERATURE_GPU {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(temp, temperature_c(node, i)) }
    })
}

/// `nvmlDeviceGetTemperatureThreshold`.
///
/// # Safety
/// `temp` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTemperatureThreshold(
    device_: nvmlDevice_t,
    thresholdType: nvmlTemperatureThresholds_t,
    temp: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        use nvmlTemperatureThresholds_t as T;
        let v = match thresholdType {
            T::NVML_TEMPERATURE_THRESHOLD_SHUTDOWN => 92,
            T::NVML_TEMPERATURE_THRESHOLD_SLOWDOWN => 89,
            T::NVML_TEMPERATURE_THRESHOLD_MEM_MAX => 95,
            T::NVML_TEMPERATURE_THRESHOLD_GPU_MAX => 87,
            _ => return Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED),
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(temp, v) }
    })
}

fn power_mw(node: &Node, i: u32) -> c_uint {
    POWER_IDLE_MW
        + ((POWER_LIMIT_MW - POWER_IDLE_MW) as f64 * busy(node, i, 1_000_000_000)).round() as c_uint
}

/// `nvmlDeviceGetPowerUsage` (mW): idle draw plus the busy share of the rest.
///
/// # Safety
/// `power` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device_: nvmlDevice_t,
    power: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(power, power_mw(node, i)) }
    })
}

macro_rules! power_limit {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// `limit` must be null or writable.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(device_: nvmlDevice_t, limit: *mut c_uint) -> nvmlReturn_t {
            guard(|| {
                live(device_)?;
                // SAFETY: the caller passes a writable pointer or null (rejected).
                unsafe { put(limit, POWER_LIMIT_MW) }
            })
        }
    )*};
}

power_limit! {
    /// `nvmlDeviceGetPowerManagementLimit` (mW).
    nvmlDeviceGetPowerManagementLimit;
    /// `nvmlDeviceGetEnforcedPowerLimit` (mW).
    nvmlDeviceGetEnforcedPowerLimit;
    /// `nvmlDeviceGetPowerManagementDefaultLimit` (mW).
    nvmlDeviceGetPowerManagementDefaultLimit;
}

/// `nvmlDeviceGetPowerManagementLimitConstraints` (mW).
///
/// # Safety
/// Both pointers must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerManagementLimitConstraints(
    device_: nvmlDevice_t,
    minLimit: *mut c_uint,
    maxLimit: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        live(device_)?;
        // SAFETY: the caller passes writable pointers or null (rejected).
        unsafe {
            put(minLimit, 200_000)?;
            put(maxLimit, POWER_LIMIT_MW)
        }
    })
}

/// `nvmlDeviceGetTotalEnergyConsumption` (mJ since the node was created): idle draw
/// over that time plus the busy share over the work completed.
///
/// # Safety
/// `energy` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    device_: nvmlDevice_t,
    energy: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let now = now_ns();
        let u = node
            .device_usage(i)
            .map_err(|_| nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT)?;
        let done = u
            .busy_ns
            .saturating_sub(u.busy_until_ns.saturating_sub(now));
        let alive = now.saturating_sub(node.created_ns());
        // mW × ns / 1e9 = mJ
        let mj = (u128::from(POWER_IDLE_MW) * u128::from(alive)
            + u128::from(POWER_LIMIT_MW - POWER_IDLE_MW) * u128::from(done))
            / 1_000_000_000;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(energy, mj as c_ulonglong) }
    })
}

fn clock_mhz(node: &Node, i: u32, t: nvmlClockType_t, max: bool) -> NvResult<c_uint> {
    let active = max || busy(node, i, 1_000_000_000) > 0.0;
    use nvmlClockType_t as C;
    Ok(match t {
        C::NVML_CLOCK_GRAPHICS | C::NVML_CLOCK_SM => {
            if active {
                1980
            } else {
                345
            }
        }
        C::NVML_CLOCK_MEM => 2619,
        C::NVML_CLOCK_VIDEO => {
            if active {
                1755
            } else {
                765
            }
        }
        _ => return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT),
    })
}

/// `nvmlDeviceGetClockInfo` (MHz): boost clocks while busy, idle clocks otherwise.
///
/// # Safety
/// `clock` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device_: nvmlDevice_t,
    type_: nvmlClockType_t,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let v = clock_mhz(node, i, type_, false)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(clock, v) }
    })
}

/// `nvmlDeviceGetMaxClockInfo` (MHz).
///
/// # Safety
/// `clock` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxClockInfo(
    device_: nvmlDevice_t,
    type_: nvmlClockType_t,
    clock: *mut c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let v = clock_mhz(node, i, type_, true)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(clock, v) }
    })
}

/// `nvmlDeviceGetPerformanceState`: P0 while busy, P8 idle.
///
/// # Safety
/// `pState` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPerformanceState(
    device_: nvmlDevice_t,
    pState: *mut nvmlPstates_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let p = if busy(node, i, 1_000_000_000) > 0.0 {
            nvmlPstates_t::NVML_PSTATE_0
        } else {
            nvmlPstates_t::NVML_PSTATE_8
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pState, p) }
    })
}

/// `nvmlDeviceGetCurrentClocksEventReasons`: "GPU idle" when idle, none otherwise.
///
/// # Safety
/// `reasons` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksEventReasons(
    device_: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let r = if busy(node, i, 1_000_000_000) > 0.0 {
            0
        } else {
            u64::from(nvmlClocksEventReasonGpuIdle)
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(reasons, r) }
    })
}

/// `nvmlDeviceGetCurrentClocksThrottleReasons` (the older name).
///
/// # Safety
/// `reasons` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device_: nvmlDevice_t,
    reasons: *mut c_ulonglong,
) -> nvmlReturn_t {
    // SAFETY: same contract.
    unsafe { nvmlDeviceGetCurrentClocksEventReasons(device_, reasons) }
}

// ---- modes and topology ----

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

fn fill_bitmask(size: c_uint, set: *mut c_ulong, bits: usize) -> NvResult<()> {
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

// ---- events ----

/// An event set: which event types it wants from which devices, and the last XID
/// sequence number it has delivered per device.
#[derive(Debug, Default)]
pub struct EventSet {
    regs: Mutex<Vec<(u32, u64, u64)>>,
}

static SETS: Mutex<BTreeSet<usize>> = Mutex::new(BTreeSet::new());

/// Event types the simulated devices raise.
const SUPPORTED_EVENTS: u64 = nvmlEventTypeXidCriticalError as u64;

fn event_set(set: nvmlEventSet_t) -> NvResult<&'static EventSet> {
    let sets = SETS.lock().unwrap_or_else(|e| e.into_inner());
    if !sets.contains(&(set as usize)) {
        return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
    }
    // SAFETY: registered sets are leaked boxes that stay alive until `nvmlEventSetFree`
    // removes them from SETS; callers must not use a set after freeing it (NVML's contract).
    Ok(unsafe { &*(set as *const EventSet) })
}

/// `nvmlEventSetCreate`.
///
/// # Safety
/// `set` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        node()?;
        if set.is_null() {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        let p = Box::into_raw(Box::<EventSet>::default());
        SETS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(p as usize);
        // SAFETY: checked non-null above.
        unsafe { set.write(p.cast()) };
        Ok(())
    })
}

/// `nvmlEventSetFree`.
///
/// # Safety
/// `set` must not be used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    guard(|| {
        node()?;
        if !SETS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(set as usize))
        {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: it was a registered leaked box, now unregistered, so this is its only free.
        drop(unsafe { Box::from_raw(set as *mut EventSet) });
        Ok(())
    })
}

/// `nvmlDeviceGetSupportedEventTypes`: XID critical errors.
///
/// # Safety
/// `eventTypes` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device_: nvmlDevice_t,
    eventTypes: *mut c_ulonglong,
) -> nvmlReturn_t {
    guard(|| {
        device(device_)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(eventTypes, SUPPORTED_EVENTS) }
    })
}

/// `nvmlDeviceRegisterEvents`: only events after registration are delivered.
///
/// # Safety
/// Handles are checked; no pointer is written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device_: nvmlDevice_t,
    eventTypes: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    guard(|| {
        let (node, i) = live(device_)?;
        let s = event_set(set)?;
        if eventTypes & !SUPPORTED_EVENTS != 0 {
            return Err(nvmlReturn_t::NVML_ERROR_NOT_SUPPORTED);
        }
        let seen = node
            .device(i)
            .map(|d| d.xid_seq.load(Ordering::Acquire))
            .unwrap_or(0);
        let mut regs = s.regs.lock().unwrap_or_else(|e| e.into_inner());
        regs.retain(|r| r.0 != i);
        regs.push((i, eventTypes, seen));
        Ok(())
    })
}

/// `nvmlEventSetWait_v2`: the next event of a registered device, waiting up to
/// `timeoutms` (a futex on the node state, woken by the injecting process).
///
/// # Safety
/// `data` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeoutms: c_uint,
) -> nvmlReturn_t {
    guard(|| {
        let node = node()?;
        let s = event_set(set)?;
        if data.is_null() {
            return Err(nvmlReturn_t::NVML_ERROR_INVALID_ARGUMENT);
        }
        let deadline = now_ns().saturating_add(u64::from(timeoutms) * 1_000_000);
        loop {
            let seq = node.event_seq();
            {
                let mut regs = s.regs.lock().unwrap_or_else(|e| e.into_inner());
                for r in regs.iter_mut() {
                    if r.1 & SUPPORTED_EVENTS == 0 {
                        continue;
                    }
                    let (events, _) = node.xid_events_since(r.0, r.2);
                    if let Some(e) = events.first() {
                        r.2 = e.seq;
                        let d = nvmlEventData_t {
                            device: handle(r.0),
                            eventType: SUPPORTED_EVENTS,
                            eventData: e.xid,
                            gpuInstanceId: u32::MAX,
                            computeInstanceId: u32::MAX,
                        };
                        // SAFETY: checked non-null above.
                        unsafe { data.write(d) };
                        return Ok(());
                    }
                }
            }
            let now = now_ns();
            if now >= deadline {
                return Err(nvmlReturn_t::NVML_ERROR_TIMEOUT);
            }
            node.wait_event(seq, (deadline - now).min(100_000_000));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_strings_exist_for_all_codes() {
        assert_eq!(error_text(nvmlReturn_t::NVML_SUCCESS), c"Success");
        assert_eq!(
            error_text(nvmlReturn_t::NVML_ERROR_GPU_IS_LOST),
            c"GPU is lost"
        );
        assert_eq!(error_text(nvmlReturn_t(4242)), c"Unknown Error");
    }

    #[test]
    fn calls_before_init_are_uninitialized() {
        let mut n = 0;
        // SAFETY: valid out pointer.
        let r = unsafe { nvmlDeviceGetCount_v2(&mut n) };
        assert_eq!(r, nvmlReturn_t::NVML_ERROR_UNINITIALIZED);
        // SAFETY: no arguments.
        let r = unsafe { nvmlShutdown() };
        assert_eq!(r, nvmlReturn_t::NVML_ERROR_UNINITIALIZED);
    }

    #[test]
    fn bitmasks_cover_exactly_the_cpus() {
        let mut words = [0 as c_ulong; 2];
        fill_bitmask(2, words.as_mut_ptr(), 70).expect("fill");
        assert_eq!(words[0], c_ulong::MAX);
        assert_eq!(words[1], (1 << 6) - 1);
        assert!(fill_bitmask(0, words.as_mut_ptr(), 1).is_err());
    }

    #[test]
    fn device_handles_are_validated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = tessera_sim::NodeConfig {
            devices: 2,
            ..Default::default()
        };
        let node = Node::open(&dir.path().join("node"), &config).expect("node");
        assert_eq!(index_of(&node, handle(1)), Ok(1));
        assert!(
            index_of(&node, handle(2)).is_err(),
            "beyond the node's devices"
        );
        assert!(index_of(&node, std::ptr::null_mut()).is_err());
        let inside = (handle(0) as usize + 1) as nvmlDevice_t;
        assert!(index_of(&node, inside).is_err(), "not the start of a slot");
    }
}
