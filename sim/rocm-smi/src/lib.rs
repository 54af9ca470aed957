//! The simulated `librocm_smi64.so.5`: the subset of AMD's ROCm SMI C API (`rsmi_*`,
//! as `rocm_smi/rocm_smi.h` 5.2 declares it) that Tessera's manager uses, over the
//! simulated node's shared state (`tessera-sim`), the same ground truth the simulated
//! NVML reads.
//!
//! Only the node's AMD devices are shown, numbered 0.. in node order (ROCm SMI numbers
//! its own devices; an NVIDIA device of a mixed node is NVML's). Memory and processes
//! are the node's ground truth, dead processes reaped first; busy percent is the
//! engine's busy fraction over the last second; temperature and power follow it, as
//! the simulated NVML's do. A lost device answers `RSMI_STATUS_FILE_ERROR` to every
//! query but its identity: on a real node its sysfs files stop reading, and that is
//! the error ROCm SMI gives for them (an assumption, see `docs/simulator.md`).
//! Every export runs inside `guard` (a panic is `RSMI_STATUS_INTERNAL_EXCEPTION`).

use std::ffi::c_char;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

use tessera_sim::clock::now_ns;
use tessera_sim::{Node, Vendor};

mod device;
mod processes;
#[cfg(test)]
mod tests;

pub use device::*;
pub use processes::*;

// The types and status codes are the ones the shim calls with: one declaration in ffi.
pub use tessera_ffi::rocm_smi::*;

/// The library version reported: the 5.2 release whose header this follows.
pub const VERSION: (u32, u32, u32) = (5, 2, 3);

type RsmiResult<T> = Result<T, rsmi_status_t>;

/// Runs an export's body: `Ok` is success, a panic `RSMI_STATUS_INTERNAL_EXCEPTION`.
fn guard(body: impl FnOnce() -> RsmiResult<()>) -> rsmi_status_t {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => RSMI_STATUS_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => RSMI_STATUS_INTERNAL_EXCEPTION,
    }
}

/// Writes through an output pointer; null is `RSMI_STATUS_INVALID_ARGS`, as the
/// header documents for every query.
///
/// # Safety
/// A non-null `out` must be valid for writing one `T`.
unsafe fn put<T>(out: *mut T, value: T) -> RsmiResult<()> {
    if out.is_null() {
        return Err(RSMI_STATUS_INVALID_ARGS);
    }
    // SAFETY: non-null and, by the caller's contract, writable.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `s` and a NUL into a buffer of `len` bytes. ROCm SMI truncates a string
/// that does not fit and says so with `RSMI_STATUS_INSUFFICIENT_SIZE`.
///
/// # Safety
/// A non-null `buf` must be valid for `len` bytes.
unsafe fn put_str(buf: *mut c_char, len: usize, s: &str) -> RsmiResult<()> {
    if buf.is_null() || len == 0 {
        return Err(RSMI_STATUS_INVALID_ARGS);
    }
    let n = s.len().min(len - 1);
    // SAFETY: the buffer holds `len` > n bytes; the source is a Rust string.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), n);
        buf.add(n).write(0);
    }
    if n < s.len() {
        return Err(RSMI_STATUS_INSUFFICIENT_SIZE);
    }
    Ok(())
}

static NODE: OnceLock<Result<Node, String>> = OnceLock::new();
static INITS: AtomicU32 = AtomicU32::new(0);

/// The node, while the library is initialised.
fn node() -> RsmiResult<&'static Node> {
    if INITS.load(Ordering::Acquire) == 0 {
        return Err(RSMI_STATUS_INIT_ERROR);
    }
    match NODE.get() {
        Some(Ok(n)) => Ok(n),
        _ => Err(RSMI_STATUS_INIT_ERROR),
    }
}

/// The node's device indices that are AMD's, in node order: ROCm SMI's device `k` is
/// the `k`-th of them (each vendor's library numbers only its own GPUs).
pub(crate) fn amd_devices(node: &Node) -> Vec<u32> {
    node.devices_of(Vendor::Amd)
}

/// The node device behind ROCm SMI's index `dv`.
fn device(dv: u32) -> RsmiResult<(&'static Node, u32)> {
    let node = node()?;
    amd_devices(node)
        .get(dv as usize)
        .map(|&i| (node, i))
        .ok_or(RSMI_STATUS_INVALID_ARGS)
}

/// As [`device`], for queries a lost device no longer answers.
fn live(dv: u32) -> RsmiResult<(&'static Node, u32)> {
    let (node, i) = device(dv)?;
    if node.is_lost(i as usize) {
        return Err(RSMI_STATUS_FILE_ERROR);
    }
    Ok((node, i))
}

/// The busy fraction of node device `i` over the last `window_ns`.
fn busy(node: &Node, i: u32, window_ns: u64) -> f64 {
    node.device(i)
        .map(|d| d.busy.utilization(now_ns(), window_ns))
        .unwrap_or(0.0)
}

/// `rsmi_init`: opens the node of this process's environment; flags other than
/// `RSMI_INIT_FLAG_ALL_GPUS` (0x1) and the reserved test bits are refused.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_init(init_flags: u64) -> rsmi_status_t {
    guard(|| {
        // RSMI_INIT_FLAG_ALL_GPUS and RSMI_INIT_FLAG_RESRV_TEST1.
        if init_flags & !(0x1 | 0x0800_0000_0000_0000) != 0 {
            return Err(RSMI_STATUS_INVALID_ARGS);
        }
        match NODE.get_or_init(|| Node::open_from_env().map_err(|e| e.to_string())) {
            Ok(_) => {
                INITS.fetch_add(1, Ordering::AcqRel);
                Ok(())
            }
            Err(e) => {
                eprintln!("tessera-sim librocm_smi64: {e}");
                Err(RSMI_STATUS_INIT_ERROR)
            }
        }
    })
}

/// `rsmi_shut_down`: balances one `rsmi_init`.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_shut_down() -> rsmi_status_t {
    guard(|| {
        INITS
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .map(|_| ())
            .map_err(|_| RSMI_STATUS_INIT_ERROR)
    })
}

/// `rsmi_num_monitor_devices`: the node's AMD devices.
///
/// # Safety
/// `num_devices` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_num_monitor_devices(num_devices: *mut u32) -> rsmi_status_t {
    guard(|| {
        let n = amd_devices(node()?).len() as u32;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(num_devices, n) }
    })
}

/// `rsmi_version_get`.
///
/// # Safety
/// `version` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_version_get(version: *mut rsmi_version_t) -> rsmi_status_t {
    guard(|| {
        let v = rsmi_version_t {
            major: VERSION.0,
            minor: VERSION.1,
            patch: VERSION.2,
            build: c"tessera-sim".as_ptr(),
        };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(version, v) }
    })
}

/// The text of a status, as `rsmi_status_string` gives it.
pub(crate) fn status_text(s: rsmi_status_t) -> &'static std::ffi::CStr {
    match s {
        RSMI_STATUS_SUCCESS => c"RSMI_STATUS_SUCCESS: The function has been executed successfully.",
        RSMI_STATUS_INVALID_ARGS => c"RSMI_STATUS_INVALID_ARGS: The provided arguments do not meet the preconditions required for input by the function.",
        RSMI_STATUS_NOT_SUPPORTED => c"RSMI_STATUS_NOT_SUPPORTED: The requested information or action is not available for the given input.",
        RSMI_STATUS_FILE_ERROR => c"RSMI_STATUS_FILE_ERROR: Problem accessing a file.",
        RSMI_STATUS_INTERNAL_EXCEPTION => c"RSMI_STATUS_INTERNAL_EXCEPTION: An internal exception was caught.",
        RSMI_STATUS_INIT_ERROR => c"RSMI_STATUS_INIT_ERROR: An error occurred during initialization.",
        RSMI_STATUS_NOT_FOUND => c"RSMI_STATUS_NOT_FOUND: An item required to complete the call was not found.",
        RSMI_STATUS_INSUFFICIENT_SIZE => c"RSMI_STATUS_INSUFFICIENT_SIZE: Not enough resources were available to fully execute the call.",
        _ => c"An unknown error occurred",
    }
}

/// `rsmi_status_string`.
///
/// # Safety
/// `status_string` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rsmi_status_string(
    status: rsmi_status_t,
    status_string: *mut *const c_char,
) -> rsmi_status_t {
    // SAFETY: the caller passes a writable pointer or null (rejected).
    guard(|| unsafe { put(status_string, status_text(status).as_ptr()) })
}
