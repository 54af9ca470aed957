//! The simulated AMD runtime: a `libamdhip64.so.5` over the simulated node.
//!
//! It shows the node's AMD devices (an NVIDIA device of a mixed node is CUDA's, not
//! HIP's) and keeps the same ground truth as the simulated `libcuda`: every byte a process
//! holds on a device is admitted against the device's capacity and recorded in its slot
//! of the node state file, and every kernel occupies the device's one engine for its
//! modelled time. Enough of HIP for CuPy-ROCm 13.3 (`cupy-rocm-5-0`) to import, allocate,
//! compile an elementwise kernel with hiprtc and launch it; kernels do not compute (see
//! `docs/simulator.md`, "The AMD node"). `libgalaxyhip.so.5`, Hygon's name for the same
//! ABI, is this library under a second file name.
//!
//! Every export is declared through `hip_api!`, which gives it the symbol version ROCm
//! 5.2.3's library gives it (`hip_4.2` for most, `hip_4.3` for graphs and capture,
//! `hip_5.1` for pools and virtual memory; `tests/runtime.rs` checks them against that
//! library's list): a reference like `hipMalloc@hip_4.2` binds only to a definition of
//! that version.

#![allow(non_snake_case, non_camel_case_types, non_upper_case_globals)]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use tessera_sim::{DriverCosts, Node, NodeError, Vendor};

pub mod device;
pub mod ipc;
pub mod memory;
pub mod module;
pub mod pool;
pub mod procaddr;
pub mod registry;
pub mod rtc;
pub mod stream;
pub mod unsupported;

/// HIP's C types and constants: the ones the shim declares too (`tessera_ffi::hip`).
pub use tessera_ffi::hip::*;

/// Declares exported HIP functions with their symbol versions: `"hip_4.2" fn hipMalloc(..)`.
/// Each body is an ordinary `unsafe extern "C"` function of that name; outside test builds
/// a `.symver` makes the name's default version the one given (unit tests link the code
/// into an executable, which has no version nodes). The crate is also an rlib only so
/// that cargo rebuilds the cdylib for `tests/runtime.rs`, which loads it with `dlopen`
/// and links nothing of it.
macro_rules! hip_api {
    ($($(#[$attr:meta])* $ver:literal fn $name:ident $params:tt $(-> $ret:ty)? $body:block)*) => {
        $(
            $(#[$attr])*
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name $params $(-> $ret)? $body
            #[cfg(not(test))]
            std::arch::global_asm!(concat!(
                ".symver ", stringify!($name), ", ", stringify!($name), "@@", $ver
            ));
        )*
    };
}
pub(crate) use hip_api;

/// A HIP call's outcome inside this crate; `Err` carries the `hipError_t` to return.
pub type HipResult<T> = Result<T, hipError_t>;

thread_local! {
    /// `hipGetLastError`'s error: the last failure of a call on this thread.
    static LAST_ERROR: Cell<hipError_t> = const { Cell::new(hipSuccess) };
}

/// The host cost of a launch, a synchronisation's round trip and the device's gap between
/// kernels (`TESSERA_SIM_LAUNCH_COST` and the others), read once: the CUDA driver's figures.
pub(crate) fn costs() -> &'static DriverCosts {
    static COSTS: OnceLock<DriverCosts> = OnceLock::new();
    COSTS.get_or_init(|| {
        DriverCosts::from_env().unwrap_or_else(|e| {
            eprintln!("tessera-sim libamdhip64: {e}; using the defaults");
            DriverCosts::default()
        })
    })
}

/// Runs an export's body: `Ok` is `hipSuccess`; an error is also remembered for
/// `hipGetLastError`; a panic is `hipErrorUnknown` and never crosses the FFI boundary.
pub(crate) fn guard(body: impl FnOnce() -> HipResult<()>) -> hipError_t {
    let e = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return hipSuccess,
        Ok(Err(e)) => e,
        Err(_) => hipErrorUnknown,
    };
    LAST_ERROR.with(|l| l.set(e));
    e
}

/// Writes through an output pointer, or `hipErrorInvalidValue` when it is null.
///
/// # Safety
/// A non-null `out` must be valid for writing one `T`.
pub(crate) unsafe fn put<T>(out: *mut T, value: T) -> HipResult<()> {
    if out.is_null() {
        return Err(hipErrorInvalidValue);
    }
    // SAFETY: non-null and, by the caller's contract, writable.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `s` and a NUL into a buffer of `len` bytes, truncating as HIP does.
///
/// # Safety
/// A non-null `buf` must be valid for `len` bytes.
pub(crate) unsafe fn put_str(buf: *mut c_char, len: usize, s: &str) -> HipResult<()> {
    if buf.is_null() || len == 0 {
        return Err(hipErrorInvalidValue);
    }
    let n = s.len().min(len - 1);
    // SAFETY: the buffer holds `len` > n bytes; the source is a Rust string of >= n bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        buf.add(n).write(0);
    }
    Ok(())
}

/// What a process of the simulated node holds once HIP is initialised.
pub struct Runtime {
    pub node: Node,
    /// This process's slot in the node state file.
    pub slot: usize,
    /// HIP's device ordinals: ordinal n is physical device `devices[n]`.
    pub devices: Vec<usize>,
    /// Bit n: the device context of ordinal n exists (its memory is charged).
    contexts: std::sync::Mutex<u32>,
}

static RUNTIME: OnceLock<HipResult<Runtime>> = OnceLock::new();

thread_local! {
    /// `hipSetDevice`'s ordinal: HIP keeps the current device per thread.
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// The variable HIP reads to choose and order the devices a process sees.
pub const VISIBLE_VAR: &str = "HIP_VISIBLE_DEVICES";

/// The AMD devices (physical indices) a process sees, in ordinal order: all of the
/// node's AMD devices unless `HIP_VISIBLE_DEVICES` lists ordinals among them. As with
/// `CUDA_VISIBLE_DEVICES`, the list stops at the first entry that names no device.
pub fn visible(amd: &[u32], spec: Option<&str>) -> Vec<usize> {
    let Some(spec) = spec else {
        return amd.iter().map(|&i| i as usize).collect();
    };
    let mut out = Vec::new();
    for entry in spec.split(',') {
        match entry.trim().parse::<usize>().ok().and_then(|k| amd.get(k)) {
            Some(&i) if !out.contains(&(i as usize)) => out.push(i as usize),
            _ => break,
        }
    }
    out
}

/// The variable ROCm's lower layer (ROCr) reads first: the devices it exposes at all,
/// by index or by UUID (`GPU-<unique id>`, the form `rocminfo` prints; AMD's ROCm
/// documentation, "GPU isolation techniques"). `HIP_VISIBLE_DEVICES` then indexes what
/// it left.
pub const ROCR_VISIBLE_VAR: &str = "ROCR_VISIBLE_DEVICES";

/// The AMD devices (physical indices) `ROCR_VISIBLE_DEVICES` exposes, in its order;
/// `unique_id` gives a device's unique id. The list stops at the first entry that
/// names no device, as `visible` does.
pub fn rocr_visible(amd: &[u32], spec: Option<&str>, unique_id: impl Fn(u32) -> u64) -> Vec<u32> {
    let Some(spec) = spec else {
        return amd.to_vec();
    };
    let mut out = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        let found = match entry.parse::<usize>() {
            Ok(k) => amd.get(k).copied(),
            Err(_) => {
                let hex = entry
                    .get(..4)
                    .filter(|h| h.eq_ignore_ascii_case("GPU-"))
                    .and_then(|_| u64::from_str_radix(&entry[4..], 16).ok());
                hex.and_then(|id| amd.iter().copied().find(|&i| unique_id(i) == id))
            }
        };
        match found {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

/// `TESSERA_SIM_HIP_ROCM6=1`: the runtime answers as ROCm 6 does where its ABI moved:
/// `hipRuntimeGetVersion`/`hipDriverGetVersion` report 6.2 ([`ROCM6_VERSION`]) and
/// `hipMemAllocationProp` is read in ROCm 6's layout (`type`, `requestedHandleType`, then
/// `location` at byte 8; ROCm 6's `hip_runtime_api.h`), so the shim's handling of both
/// layouts can be tested on one simulated node. Read once.
pub fn rocm6() -> bool {
    static ROCM6: OnceLock<bool> = OnceLock::new();
    *ROCM6.get_or_init(|| std::env::var("TESSERA_SIM_HIP_ROCM6").is_ok_and(|v| v == "1"))
}

/// The `HIP_VERSION` a ROCm 6.2 runtime reports (major × 10^7 + minor × 10^5 + patch).
pub const ROCM6_VERSION: c_int = 60_241_134;

/// The version the runtime reports: 5.2.3's, or 6.2's in ROCm 6 mode.
pub fn hip_version() -> c_int {
    if rocm6() { ROCM6_VERSION } else { HIP_VERSION }
}

/// The device ordinal a `hipMemAllocationProp` names, in the layout of the version the
/// runtime reports: HIP 5's `location` is at byte 4 (after `unsigned char
/// compressionType`), ROCm 6's at byte 8.
///
/// # Safety
/// `prop` must be readable for 16 bytes.
pub unsafe fn prop_device(prop: *const c_void) -> c_int {
    let at = if rocm6() { 12 } else { 8 };
    // SAFETY: `location.id` lies within the first 16 bytes in both layouts; the read is
    // unaligned-safe.
    unsafe { prop.cast::<u8>().add(at).cast::<c_int>().read_unaligned() }
}

/// Set in a child forked after the runtime was set up: the child is not the process
/// the node's slot belongs to, so every call fails there, as HIP fails in such a child.
static FORKED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn child_after_fork() {
    FORKED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The runtime of this process, set up on first use (HIP initialises implicitly).
pub(crate) fn rt() -> HipResult<&'static Runtime> {
    if FORKED.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(hipErrorNotInitialized);
    }
    RUNTIME
        .get_or_init(|| {
            // SAFETY: registers a child handler only; it stores to an atomic, which is
            // async-signal-safe, as a handler running in a forked child must be.
            unsafe { libc::pthread_atfork(None, None, Some(child_after_fork)) };
            let node = Node::open_from_env().map_err(|e| {
                // The one place this library writes to stderr: without it a broken setup
                // would show up only as an error code.
                eprintln!("tessera-sim libamdhip64: {e}");
                match e {
                    NodeError::NoSlot => hipErrorOutOfMemory,
                    _ => hipErrorNotInitialized,
                }
            })?;
            let slot = node.attach().map_err(|e| {
                eprintln!("tessera-sim libamdhip64: {e}");
                hipErrorOutOfMemory
            })?;
            let amd = node.devices_of(Vendor::Amd);
            let rocr = std::env::var(ROCR_VISIBLE_VAR).ok();
            let amd = rocr_visible(&amd, rocr.as_deref(), |i| {
                let mut head = [0u8; 8];
                if let Ok(d) = node.device_info(i) {
                    head.copy_from_slice(&d.uuid_bytes[..8]);
                }
                u64::from_be_bytes(head)
            });
            let spec = std::env::var(VISIBLE_VAR).ok();
            let devices = visible(&amd, spec.as_deref());
            Ok(Runtime {
                node,
                slot,
                devices,
                contexts: std::sync::Mutex::new(0),
            })
        })
        .as_ref()
        .map_err(|e| *e)
}

impl Runtime {
    /// The physical index of ordinal `ordinal`.
    pub fn physical(&self, ordinal: c_int) -> HipResult<usize> {
        usize::try_from(ordinal)
            .ok()
            .and_then(|o| self.devices.get(o).copied())
            .ok_or(hipErrorInvalidDevice)
    }

    /// The calling thread's current device: (ordinal, physical index).
    pub fn current(&self) -> HipResult<(usize, usize)> {
        if self.devices.is_empty() {
            return Err(hipErrorNoDevice);
        }
        let o = CURRENT.with(Cell::get);
        Ok((o, self.physical(o as c_int)?))
    }

    /// Makes sure ordinal `ordinal`'s device context exists: the first use of a device
    /// charges the memory the node says a context holds, as the real runtime's device
    /// initialisation takes memory before any allocation.
    pub fn touch(&self, ordinal: usize) -> HipResult<usize> {
        let physical = self.physical(ordinal as c_int)?;
        let mut made = self.contexts.lock().unwrap_or_else(|p| p.into_inner());
        if *made & (1 << ordinal) == 0 {
            let bytes = self.node.context_memory();
            if bytes > 0 && !self.node.reserve_memory(self.slot, physical, bytes) {
                return Err(hipErrorOutOfMemory);
            }
            self.node.set_context(self.slot, physical, true);
            *made |= 1 << ordinal;
        }
        Ok(physical)
    }

    /// The current device, its context made: (ordinal, physical index).
    pub fn current_touched(&self) -> HipResult<(usize, usize)> {
        let (o, _) = self.current()?;
        Ok((o, self.touch(o)?))
    }
}

pub(crate) fn set_current(ordinal: usize) {
    CURRENT.with(|c| c.set(ordinal));
}

pub(crate) fn take_last_error() -> hipError_t {
    LAST_ERROR.with(|l| l.replace(hipSuccess))
}

pub(crate) fn peek_last_error() -> hipError_t {
    LAST_ERROR.with(Cell::get)
}

/// How a synchronisation waits for the simulated engine to finish work it has queued (the
/// engine is a timeline, not a thread): as the simulated CUDA driver's do, asleep with a
/// 1 µs timer slack until the work's end, then `TESSERA_SIM_SYNC_LATENCY` (the driver's
/// round trip). A plain sleep with the default 50 µs slack made every HIP wait, the
/// compute gate's drain included, that much later than CUDA's for the same work.
pub(crate) fn wait_until(until_ns: u64) {
    costs().wait_for(until_ns);
}

/// `hipError_t` values' names and descriptions, for `hipGetErrorName`/`String`.
pub(crate) fn error_text(e: hipError_t) -> (&'static std::ffi::CStr, &'static std::ffi::CStr) {
    match e {
        hipSuccess => (c"hipSuccess", c"no error"),
        hipErrorInvalidValue => (c"hipErrorInvalidValue", c"invalid argument"),
        hipErrorOutOfMemory => (c"hipErrorOutOfMemory", c"out of memory"),
        hipErrorNotInitialized => (c"hipErrorNotInitialized", c"initialization error"),
        hipErrorInvalidDevicePointer => {
            (c"hipErrorInvalidDevicePointer", c"invalid device pointer")
        }
        hipErrorNoDevice => (c"hipErrorNoDevice", c"no ROCm-capable device is detected"),
        hipErrorInvalidDevice => (c"hipErrorInvalidDevice", c"invalid device ordinal"),
        hipErrorInvalidImage => (c"hipErrorInvalidImage", c"device kernel image is invalid"),
        hipErrorInvalidHandle => (c"hipErrorInvalidHandle", c"invalid resource handle"),
        hipErrorNotFound => (c"hipErrorNotFound", c"named symbol not found"),
        hipErrorNotReady => (c"hipErrorNotReady", c"device not ready"),
        hipErrorNotSupported => (c"hipErrorNotSupported", c"operation not supported"),
        _ => (c"hipErrorUnknown", c"unknown error"),
    }
}

hip_api! {
    /// `hipInit`: sets the runtime up (it also sets itself up on any first call).
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipInit(_flags: c_uint) -> hipError_t {
        guard(|| rt().map(|_| ()))
    }

    /// `hipGetLastError`: the last error of this thread, cleared.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipGetLastError() -> hipError_t {
        take_last_error()
    }

    /// `hipPeekAtLastError`: the last error of this thread, kept.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipPeekAtLastError() -> hipError_t {
        peek_last_error()
    }

    /// `hipGetErrorName`.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipGetErrorName(e: hipError_t) -> *const c_char {
        error_text(e).0.as_ptr()
    }

    /// `hipGetErrorString`.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipGetErrorString(e: hipError_t) -> *const c_char {
        error_text(e).1.as_ptr()
    }

    /// `hipProfilerStart`: nothing to profile.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipProfilerStart() -> hipError_t {
        hipSuccess
    }

    /// `hipProfilerStop`.
    ///
    /// # Safety
    /// No pointers.
    "hip_4.2" fn hipProfilerStop() -> hipError_t {
        hipSuccess
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visible_devices_index_amds_own_numbering() {
        let amd = [0, 2, 5];
        assert_eq!(visible(&amd, None), vec![0, 2, 5]);
        assert_eq!(visible(&amd, Some("2,0")), vec![5, 0]);
        // Parsing stops at the first entry that names no device.
        assert_eq!(visible(&amd, Some("1,7,0")), vec![2]);
        assert_eq!(visible(&amd, Some("")), Vec::<usize>::new());
        assert_eq!(visible(&amd, Some("0,0")), vec![0]);
    }

    #[test]
    fn errors_are_remembered_per_thread_until_read() {
        assert_eq!(guard(|| Err(hipErrorInvalidValue)), hipErrorInvalidValue);
        assert_eq!(peek_last_error(), hipErrorInvalidValue);
        assert_eq!(take_last_error(), hipErrorInvalidValue);
        assert_eq!(take_last_error(), hipSuccess);
        assert_eq!(guard(|| panic!("inside")), hipErrorUnknown);
    }
}
