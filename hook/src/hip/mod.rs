//! The HIP wrapper bodies (AMD's `libamdhip64.so.5`, Hygon's
//! `libgalaxyhip.so.5`), one per governed HIP row of `table.rs`, on the same
//! governor, ledger, state file and compute gate as CUDA (see the HIP
//! section of docs/hook.md).
//!
//! HIP has no `cuInit`: a governed process joins its allocation at its
//! first governed HIP call. It gets a [`Governed`] of its own (HIP devices
//! are numbered by the HIP runtime, not by CUDA), mapped by UUID onto the
//! same control file's devices.
//!
//! Re-entry: the HIP runtime calls its own public entry points, which the
//! preloaded shim would otherwise catch a second time. Every real call made
//! from a wrapper is marked on the calling thread (`nested`); a governed
//! wrapper entered while the mark is set passes straight through.
//!
//! One module per family: `view`, `memory` (linear, managed, pitched, 3D),
//! `arrays`, `pools` (stream-ordered, and the synchronisations), `ipc`,
//! `vmm`, `launch` (with the gate's HIP side in `gate`), `procaddr`
//! (`hipGetProcAddress`).

#![allow(non_snake_case)]
// HIP's error codes keep the header's names (`hipErrorNotFound`), also in patterns.
#![allow(non_upper_case_globals)]
#![allow(clippy::missing_safety_doc)]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tessera_ffi::cuda::CUresult;

use crate::devices::{DeviceMap, format_uuid};
use crate::governor::{self, Files, Governed, Hooks};
use crate::ledger::{Key, Rec};
use crate::log::Level;
use crate::table::call_real;

use tessera_ffi::hip::*;

const OK: hipError_t = hipSuccess;

/// The unit a HIP allocation holds device memory in: 4 KiB, the page the
/// GPU's memory manager maps (the simulated runtime's model; not measured
/// on an AMD GPU, see docs/hook.md). CUDA's is 2 MiB (`sizes::DEVICE_PAGE`).
pub const HIP_PAGE: u64 = 4 << 10;

/// `bytes` (at least one) in whole HIP pages: what the runtime holds for an
/// allocation of `bytes`. Saturates at `sizes::OVERFLOW`, which no limit
/// admits.
pub fn hip_pages(bytes: u64) -> u64 {
    bytes
        .max(1)
        .checked_next_multiple_of(HIP_PAGE)
        .unwrap_or(crate::sizes::OVERFLOW)
}

/// What every governed HIP entry point of a process that fails closed
/// returns: what the runtime answers before it is initialised.
pub const HIP_REFUSED: hipError_t = hipErrorNotInitialized;

thread_local! {
    /// How many real HIP calls made by a wrapper this thread is inside.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Whether this thread is inside a real HIP call a wrapper made: the
/// runtime calling one of its own entry points, which passes through.
#[inline(always)]
pub(crate) fn inside() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// Runs `f` (a call into the real runtime) with this thread marked as
/// inside it, so that the runtime's calls of its own public entry points
/// are not governed a second time.
#[inline(always)]
pub(crate) fn nested<R>(f: impl FnOnce() -> R) -> R {
    struct Mark;
    impl Drop for Mark {
        fn drop(&mut self) {
            DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    DEPTH.with(|d| d.set(d.get() + 1));
    let _mark = Mark;
    f()
}

/// `real!(name(args))`: the real entry point, called inside [`nested`].
macro_rules! real {
    ($name:ident($($a:expr),* $(,)?)) => {
        $crate::hip::nested(|| call_real!($name($($a),*)))
    };
}

/// The governor of a governed process, or: the real call's result for an
/// ungoverned one, or for a call the runtime makes of itself (`$pass` is
/// evaluated only then), or the refusal.
macro_rules! governed_or {
    ($pass:expr) => {{
        if $crate::hip::inside() {
            return $pass;
        }
        match $crate::hip::entry() {
            Ok(Some(g)) => g,
            Ok(None) => return $pass,
            Err(e) => return e,
        }
    }};
}

/// What the governor is handed: the HIP side of the gate, the IPC
/// settlement (`ipc.rs`, on CUDA's exports list) and the runtime's pool
/// queries (`pools.rs`).
static HOOKS: Hooks = Hooks {
    on_join: gate::on_join,
    settle_shared: crate::cuda::ipc::settle_shared,
    pools: Some(&pools::REAL_POOLS),
};

static GOVERNED: OnceLock<Governed> = OnceLock::new();
static ESTABLISH: Mutex<()> = Mutex::new(());

/// Bit `i`: this process's device context on allocation device `i` is
/// charged. The runtime makes a device's context at the first use of that
/// device and holds memory for it (the control file's `context_charge`);
/// the shim charges it before the first governed call that uses the device.
static CONTEXTS: AtomicU64 = AtomicU64::new(0);
static CONTEXT_LOCK: Mutex<()> = Mutex::new(());
const _: () = assert!(tessera_shm::layout::MAX_DEVICES <= 64);

/// Charges the context of allocation device `i` once per process (one
/// atomic load once it is); a context that does not fit is
/// `hipErrorOutOfMemory`, as the runtime answers when it cannot make one.
fn ensure_context(g: &Governed, i: usize) -> Result<(), hipError_t> {
    let bit = 1u64 << i;
    if CONTEXTS.load(Ordering::Acquire) & bit != 0 {
        return Ok(());
    }
    let _one = CONTEXT_LOCK.lock();
    if CONTEXTS.load(Ordering::Acquire) & bit != 0 {
        return Ok(());
    }
    g.reserve(Some(i), g.files.control.context_charge(i))
        .map_err(hip_err)?;
    CONTEXTS.fetch_or(bit, Ordering::AcqRel);
    Ok(())
}

/// `Ok(None)` for an ungoverned process, the joined governor for a governed
/// one (joining at the first call), or the error to return.
#[inline]
pub(crate) fn entry() -> Result<Option<&'static Governed>, hipError_t> {
    if let Some(g) = GOVERNED.get() {
        return g.ensure_member().map(Some).map_err(|_| HIP_REFUSED);
    }
    entry_slow()
}

#[cold]
fn entry_slow() -> Result<Option<&'static Governed>, hipError_t> {
    match governor::files() {
        None => Ok(None),
        Some(Err(())) => Err(HIP_REFUSED),
        Some(Ok(f)) => establish(f).map(Some),
    }
}

/// Installs `g` as the process's HIP governor and joins (unit tests, which
/// have no allocation in their environment).
#[cfg(test)]
pub(crate) fn install_for_test(g: Governed) -> &'static Governed {
    let g = GOVERNED.get_or_init(|| g);
    g.ensure_member().expect("joins");
    g
}

/// Maps the HIP devices, creates the governor and joins, once.
fn establish(files: &'static Files) -> Result<&'static Governed, hipError_t> {
    let _once = ESTABLISH.lock();
    if let Some(g) = GOVERNED.get() {
        return g.ensure_member().map_err(|_| HIP_REFUSED);
    }
    pin_visible(files);
    let devices = nested(|| discover(files))?;
    for v in devices.visible() {
        crate::log!(
            Level::Debug,
            "HIP device {} {} -> allocation index {:?}",
            v.device,
            v.uuid,
            v.index
        );
    }
    let g = GOVERNED.get_or_init(|| Governed::new(files, devices, HOOKS));
    install_process_hooks();
    g.ensure_member().map_err(|_| HIP_REFUSED)
}

/// The variable ROCm's ROCr layer reads, once, when the runtime starts: the
/// GPUs the process can see at all, by UUID (`GPU-<unique id>`, AMD's
/// "GPU isolation techniques"); `HIP_VISIBLE_DEVICES` only indexes within.
const ROCR_VISIBLE_DEVICES: &str = "ROCR_VISIBLE_DEVICES";

/// Points `ROCR_VISIBLE_DEVICES` at the allocation's AMD GPUs before the
/// runtime starts (at the process's first governed HIP call, which every
/// device query and `hipSetDevice` is), as the CUDA side pins
/// `CUDA_VISIBLE_DEVICES` at `cuInit`: the runtime then enumerates only
/// them, numbered from 0, on every route. The GPUs come from the control
/// file, which the tenant cannot write; the tenant's own value may only
/// narrow them (`pinned_visible`). An NVIDIA GPU of a mixed allocation is
/// left out (ROCr stops at the first entry it does not know). A runtime
/// already started by an ungoverned call keeps its view; `hipSetDevice`
/// still refuses a GPU outside the allocation.
fn pin_visible(files: &Files) {
    let alloc: Vec<&str> = (0..files.control.n_devices())
        .map(|i| files.control.uuid(i))
        .filter(|u| is_amd_uuid(u))
        .collect();
    let spec = std::env::var_os(ROCR_VISIBLE_DEVICES);
    let spec = spec.as_ref().map(|s| s.to_string_lossy());
    let want = crate::devices::pinned_visible(spec.as_deref(), &alloc);
    if spec.as_deref() == Some(want.as_str()) {
        return;
    }
    crate::log!(
        Level::Info,
        "{ROCR_VISIBLE_DEVICES}={spec:?} set to {want:?}: the allocation's GPUs"
    );
    // SAFETY: setenv is unsound only against another thread reading or
    // writing the environment at the same instant. This runs at the
    // process's first governed HIP call, under ESTABLISH, before the
    // runtime reads the variable; glibc never frees an environment string,
    // so a concurrent getenv sees the old value or the new one.
    unsafe { std::env::set_var(ROCR_VISIBLE_DEVICES, &want) };
}

/// Whether `uuid` is an AMD GPU's as the manager names it: `GPU-` and the
/// 16 hex digits of ROCm SMI's unique id (NVIDIA's are 8-4-4-4-12).
fn is_amd_uuid(uuid: &str) -> bool {
    uuid.strip_prefix("GPU-")
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The HIP governor's exit and fork handlers, as `governor::process`
/// installs for CUDA's: at exit a process holding nothing leaves its slot;
/// across `fork()` every lock is held, and the child forgets its parent's
/// allocations and joins a slot of its own at its first HIP call.
fn install_process_hooks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers functions of this library, which is never
        // unloaded (a preloaded object stays for the process's life).
        unsafe {
            libc::atexit(at_exit);
            libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
        }
    });
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(g) = GOVERNED.get() {
            g.at_exit();
        }
    });
}

extern "C" fn fork_prepare() {
    let _ = std::panic::catch_unwind(|| {
        std::mem::forget(ESTABLISH.lock());
        if let Some(g) = GOVERNED.get() {
            g.lock_all();
        }
    });
}

extern "C" fn fork_parent() {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: fork_prepare ran in this process just before and took
        // ESTABLISH and every lock of the governor.
        unsafe {
            if let Some(g) = GOVERNED.get() {
                g.unlock_all();
            }
            ESTABLISH.force_unlock(Default::default());
        }
    });
}

extern "C" fn fork_child() {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: fork_prepare took ESTABLISH and every lock of the governor
        // in the parent; this thread is its continuation in the child, which
        // has no other thread.
        unsafe {
            if let Some(g) = GOVERNED.get() {
                g.forget_parent();
            }
            // The child has no device context of its own yet.
            CONTEXTS.store(0, Ordering::Release);
            context::forget();
            ESTABLISH.force_unlock(Default::default());
        }
    });
}

/// The UUID string of a HIP device, as the control file names it. ROCm
/// fills `hipUUID` with the 16 ASCII hex digits of the GPU's unique id,
/// which the manager writes as `GPU-<unique id>` (ROCm SMI's id); a runtime
/// that gives raw bytes is tried as CUDA's UUIDs are formatted, and as the
/// unique id its first eight bytes make. The form the control file knows
/// wins; none known leaves the device outside the allocation.
fn uuid_string(bytes: &[u8; 16], files: &Files) -> String {
    let mut candidates = Vec::with_capacity(4);
    if bytes.iter().all(u8::is_ascii_alphanumeric) {
        let text = String::from_utf8_lossy(bytes).into_owned();
        candidates.push(format!("GPU-{text}"));
        candidates.push(text);
    }
    let raw = format_uuid(bytes);
    candidates.push(raw.clone());
    let mut head = [0u8; 8];
    head.copy_from_slice(&bytes[..8]);
    candidates.push(format!("GPU-{:016x}", u64::from_be_bytes(head)));
    candidates
        .into_iter()
        .find(|c| files.find_uuid(c).is_some())
        .unwrap_or(raw)
}

/// The visible HIP devices and their UUIDs, from the real runtime.
///
/// A runtime without `hipDeviceGetUuid` (older than HIP 5.2, or a partial
/// one) cannot say which GPU a device is: then one visible device of an
/// allocation of one GPU is taken to be that GPU (logged), and any other
/// arrangement leaves every device outside the allocation (refused). The
/// runtime shows a container only the GPUs mounted into it, so the one
/// device it sees is the allocation's; where a process can see more (a
/// `tessera run` on a bare node), memory it takes on another GPU is still
/// within its limit, and the manager's backstop stops a process on a GPU
/// it has no allocation on.
fn discover(files: &Files) -> Result<DeviceMap, hipError_t> {
    let mut n: c_int = 0;
    check(call_real!(hipGetDeviceCount(&mut n)))?;
    let mut list = Vec::with_capacity(n.max(0) as usize);
    for dev in 0..n {
        let mut uuid = hipUUID::default();
        match call_real!(hipDeviceGetUuid(&mut uuid, dev)) {
            OK => list.push((dev, uuid_string(&uuid.bytes, files))),
            hipErrorNotFound if n == 1 && files.control.n_devices() == 1 => {
                let only = files.control.uuid(0).to_owned();
                crate::log!(
                    Level::Warn,
                    "the HIP runtime has no hipDeviceGetUuid: its one device taken as the allocation's {only}"
                );
                list.push((dev, only));
            }
            hipErrorNotFound => {
                crate::log!(
                    Level::Warn,
                    "the HIP runtime has no hipDeviceGetUuid: device {dev} is outside the allocation"
                );
                list.push((dev, String::new()));
            }
            r => return Err(r),
        }
    }
    Ok(DeviceMap::new(list, |u| files.find_uuid(u)))
}

fn check(r: hipError_t) -> Result<(), hipError_t> {
    if r == OK { Ok(()) } else { Err(r) }
}

/// The governor's CUDA-typed answer in HIP's words.
fn hip_err(e: CUresult) -> hipError_t {
    match e {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => hipErrorOutOfMemory,
        governor::CUDA_REFUSED => HIP_REFUSED,
        _ => hipErrorUnknown,
    }
}

/// The allocation's index of the calling thread's current HIP device, its
/// context charged.
fn current(g: &Governed) -> Result<Option<usize>, hipError_t> {
    let index = if g.devices.single() {
        g.devices.only()
    } else {
        let mut dev: c_int = 0;
        check(real!(hipGetDevice(&mut dev)))?;
        g.index_of(dev)
    };
    if let Some(i) = index {
        ensure_context(g, i)?;
    }
    Ok(index)
}

/// Admission of `bytes` (already in the driver's units) on device `index`:
/// reserve, call, then record under the key the driver gave, or roll back.
fn admit(
    g: &Governed,
    index: Option<usize>,
    bytes: u64,
    call: impl FnOnce() -> hipError_t,
    key: impl FnOnce() -> Key,
) -> hipError_t {
    if let Err(e) = g.reserve(index, bytes) {
        return hip_err(e);
    }
    let r = call();
    match (r, index) {
        (OK, Some(dev)) if bytes > 0 => match key() {
            // Nothing handed out (a zero-byte request): nothing held.
            Key::Ptr(0) | Key::Array(0) => g.release(index, bytes),
            k => {
                g.record(k, Rec { dev, bytes, ctx: 0 });
                // The device's context exists now: its charge follows the
                // driver (once).
                context::settle(g, dev);
            }
        },
        (OK, _) => {}
        _ => g.release(index, bytes),
    }
    r
}

/// Admission of `size` bytes on the current device, in HIP pages.
fn admit_current(
    g: &Governed,
    size: u64,
    call: impl FnOnce() -> hipError_t,
    key: impl FnOnce() -> Key,
) -> hipError_t {
    match current(g) {
        Ok(index) => admit(g, index, hip_pages(size), call, key),
        Err(e) => e,
    }
}

/// A free: forget the allocation, let the runtime free it, return its
/// quota only once it did (the record is restored if it did not). A block
/// of a pool stays charged to its pool (see `pools.rs`).
fn free(g: &Governed, key: Key, call: impl FnOnce() -> hipError_t) -> hipError_t {
    let Some(rec) = g.ledger.remove(key) else {
        let mut call = Some(call);
        let mut code = OK;
        if let Key::Ptr(p) = key
            && g.pool_free(p, || {
                code = call.take().map_or(OK, |c| c());
                if code == OK {
                    CUresult::CUDA_SUCCESS
                } else {
                    CUresult::CUDA_ERROR_UNKNOWN
                }
            })
            .is_some()
        {
            return code;
        }
        return call.take().map_or(OK, |c| c());
    };
    let r = call();
    if r != OK {
        g.ledger.insert(key, rec);
    } else if let Key::Ptr(p) = key
        && g.sharing.load(Ordering::Acquire)
    {
        // Exported memory an importer still has open stays charged.
        crate::cuda::ipc::freed(g, crate::ledger::SharedKey::Ptr(p), rec.dev, rec.bytes);
    } else {
        g.release(Some(rec.dev), rec.bytes);
    }
    r
}

/// Reads `*p` when the runtime succeeded and `p` is non-null.
///
/// # Safety
///
/// `p` is null or valid for reads.
unsafe fn out<T: Copy>(p: *const T, default: T) -> T {
    if p.is_null() {
        default
    } else {
        // SAFETY: non-null and valid per the contract.
        unsafe { *p }
    }
}

/// The pointer a `void**` out-parameter received, as a ledger key.
///
/// # Safety
///
/// `p` is null or valid for reads.
unsafe fn out_ptr(p: *mut *mut c_void) -> Key {
    // SAFETY: per the contract.
    Key::Ptr(unsafe { out(p, std::ptr::null_mut()) } as u64)
}

mod arrays;
mod context;
mod devices;
mod gate;
mod ipc;
mod launch;
mod memory;
mod pace;
mod pools;
mod procaddr;
#[cfg(test)]
mod tests;
mod view;
mod vmm;

pub use arrays::*;
pub use devices::*;
pub use ipc::*;
pub use launch::*;
pub use memory::*;
pub use pools::*;
pub use procaddr::*;
pub use view::*;
pub use vmm::*;
