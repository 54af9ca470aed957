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
use tessera_sim::{DeviceInfo, Node, Vendor};

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

mod activity;
mod events;
mod fields;
mod handles;
mod identity;
mod init;
mod memory;
mod modes;
mod nvlink;
mod processes;
mod system;
#[cfg(test)]
mod tests;

pub use activity::*;
pub use events::*;
pub use fields::*;
pub use handles::*;
pub use identity::*;
pub use init::*;
pub use memory::*;
pub use modes::*;
pub use processes::*;
pub use system::*;
