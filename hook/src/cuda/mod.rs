//! The CUDA wrapper bodies, one per governed function of `table.rs`:
//! memory admission (reserve before the driver, record or roll back after),
//! the container's view of memory, context overhead, the
//! `cuGetProcAddress` route, and the gate before every submission.
//!
//! Every body of an ungoverned process calls the real function and nothing
//! else. A governed process whose files are bad gets
//! [`governor::CUDA_REFUSED`] from every one of them.
//!
//! One module per CUDA family, each re-exported here so that `table.rs`
//! finds every body as `crate::cuda::<name>`: `init` (cuInit and the
//! `cuGetProcAddress` route), `view` (the container's view of memory),
//! `context`, `memory` (linear and managed), `pools` (stream-ordered
//! memory and pools), `graphs` (graph memory), `ipc` (IPC and imported
//! memory), `vmm` (virtual memory management), `arrays`,
//! `launch` (the gate before every submission). The helpers below are the
//! admission steps they share.

#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};

use tessera_ffi::cuda::*;

use crate::gate;
use crate::governor::{self, CUDA_REFUSED, Governed, Hooks, Launch};
use crate::ledger::{Key, Rec, SharedKey};
use crate::log::Level;
use crate::procaddr;
use crate::sizes;
use crate::table::call_real;

const OK: CUresult = CUresult::CUDA_SUCCESS;

/// The governor of a governed process, or: the real call's result for an
/// ungoverned one (`$pass` is evaluated only then), or the refusal.
macro_rules! governed_or {
    ($pass:expr) => {
        match governor::cuda_entry(&$crate::cuda::CORE_HOOKS) {
            Ok(Some(g)) => g,
            Ok(None) => return $pass,
            Err(e) => return e,
        }
    };
}

/// What the governor is handed when it sets up: the gate's join hook, the
/// IPC bookkeeping's settlement and the real driver's pool queries. The
/// governor calls them and never names this layer.
pub(crate) static CORE_HOOKS: Hooks = Hooks {
    on_join: gate::on_join,
    settle_shared: ipc::settle_shared,
    pools: Some(&pools::REAL_POOLS),
};

/// Admission of one allocation of `bytes` on device `index`: reserve the
/// device pages the driver will hold for it (see sizes.rs), let the driver
/// allocate, then record it under the key it got, or roll back.
fn admit(
    g: &Governed,
    index: Option<usize>,
    ctx: usize,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> Key,
) -> CUresult {
    let bytes = sizes::pages(bytes);
    if let Err(e) = g.reserve(index, bytes) {
        return e;
    }
    let r = call();
    match (r, index) {
        (OK, Some(dev)) if bytes > 0 => g.record(key(), Rec { dev, bytes, ctx }),
        (OK, _) => {}
        _ => g.release(index, bytes),
    }
    r
}

/// Admission on the current context's device, owned by that context.
fn admit_current(
    g: &Governed,
    bytes: u64,
    call: impl FnOnce() -> CUresult,
    key: impl FnOnce() -> Key,
) -> CUresult {
    match g.current() {
        Ok((index, ctx)) => admit(g, index, ctx as usize, bytes, call, key),
        Err(e) => e,
    }
}

/// A free: forget the allocation, let the driver free it, and return its
/// quota only once the driver did (the record is restored if it did not).
/// A pointer from a pool stays charged to its pool (see pools.rs).
fn free(g: &Governed, key: Key, call: impl FnOnce() -> CUresult) -> CUresult {
    let Some(rec) = g.ledger.remove(key) else {
        let mut call = Some(call);
        if let Key::Ptr(p) = key
            && let Some(r) = g.pool_free(p, || call.take().map_or(OK, |c| c()))
        {
            return r;
        }
        return call.take().map_or(OK, |c| c());
    };
    let r = call();
    if r != OK {
        g.ledger.insert(key, rec);
    } else if let Key::Ptr(p) = key
        && g.sharing.load(std::sync::atomic::Ordering::Acquire)
    {
        ipc::freed(g, SharedKey::Ptr(p), rec.dev, rec.bytes);
    } else {
        g.release(Some(rec.dev), rec.bytes);
    }
    r
}

/// A VMM allocation the driver freed: its quota returns (unless it was
/// exported and an importer still has it open, see ipc.rs).
fn vmm_freed(g: &Governed, h: crate::ledger::VmmHandle) {
    if g.sharing.load(std::sync::atomic::Ordering::Acquire) {
        ipc::freed(g, SharedKey::Vmm(h.handle), h.dev, h.bytes);
    } else {
        g.release(Some(h.dev), h.bytes);
    }
}

/// Returns the quota of everything the driver freed with context `ctx`.
fn context_gone(g: &Governed, ctx: usize) {
    for rec in g.ledger.drain_context(ctx) {
        g.release(Some(rec.dev), rec.bytes);
    }
}

/// Reads `*p` when the driver succeeded and `p` is non-null.
///
/// # Safety
///
/// `p` is null or valid for reads.
unsafe fn out<T: Copy + Default>(p: *const T) -> T {
    if p.is_null() {
        T::default()
    } else {
        // SAFETY: non-null and valid per the contract.
        unsafe { *p }
    }
}

mod arrays;
mod context;
mod graphs;
mod init;
pub(crate) mod ipc;
mod launch;
mod memory;
mod pools;
#[cfg(test)]
mod tests;
mod view;
mod vmm;

pub use arrays::*;
pub use context::*;
pub use graphs::*;
pub use init::*;
pub use ipc::*;
pub use launch::*;
pub use memory::*;
pub use pools::*;
pub use view::*;
pub use vmm::*;
