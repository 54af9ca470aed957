//! A HIP device context's charge settled to what the driver holds, as the
//! CUDA shim settles its contexts through NVML (`cuda/context.rs`): the
//! runtime makes a device's context at the first use of the device, so the
//! shim charges the control file's figure before that first governed call
//! (`ensure_context` in mod.rs), and after the first allocation on the
//! device succeeds (the context exists by then) asks ROCm SMI what the
//! driver holds for this process there and settles the context's charge to
//! that less everything else the shim charges this process there.
//!
//! Where ROCm SMI cannot say (no `librocm_smi64.so.5` in the container, a
//! process list in another pid namespace with no host pid recorded, a
//! device it does not list) the charged figure stays. A context larger than
//! charged that does not fit any more cannot be undone (HIP has no call
//! that destroys one device's context and keeps the process's other state):
//! it stays charged at what fits, is logged, and the backstop, which reads
//! the same per-process figure, is what stops the process.

use std::sync::atomic::{AtomicU64, Ordering};

use tessera_ffi::rocm_smi::{RSMI_STATUS_NOT_SUPPORTED, RSMI_STATUS_SUCCESS, rsmi_process_info_t};

use super::*;

/// Bit `i`: the context on allocation device `i` has been settled (or
/// could not be, and keeps its charge).
static SETTLED: AtomicU64 = AtomicU64::new(0);

/// A forked child has no context of its own yet.
pub(super) fn forget() {
    SETTLED.store(0, Ordering::Release);
}

/// What the driver holds for this process on allocation device `i` by
/// ROCm SMI, or `None` when it cannot say.
fn driver_holds(g: &Governed, i: usize) -> Option<u64> {
    let uuid = g
        .devices
        .visible()
        .iter()
        .find(|v| v.index == Some(i))?
        .uuid
        .clone();
    if call_real!(rsmi_init(0)) != RSMI_STATUS_SUCCESS {
        return None;
    }
    let held = (|| {
        // ROCm SMI's index of the GPU: the manager names an AMD GPU
        // `GPU-<unique id>`, as the control file does.
        let mut n: u32 = 0;
        if call_real!(rsmi_num_monitor_devices(&mut n)) != RSMI_STATUS_SUCCESS {
            return None;
        }
        let dv = (0..n).find(|&dv| {
            let mut id: u64 = 0;
            call_real!(rsmi_dev_unique_id_get(dv, &mut id)) == RSMI_STATUS_SUCCESS
                && format!("GPU-{id:016x}").eq_ignore_ascii_case(&uuid)
        })?;
        let host = g
            .member()
            .map(|m| g.files.state.slot(m.slot).host_pid.load(Ordering::Relaxed))
            .unwrap_or(0);
        let mut pids = vec![std::process::id()];
        if host != 0 && host != pids[0] {
            pids.push(host);
        }
        pids.into_iter().find_map(|pid| {
            let mut info = rsmi_process_info_t::default();
            match call_real!(rsmi_compute_process_info_by_device_get(pid, dv, &mut info)) {
                RSMI_STATUS_SUCCESS => Some(info.vram_usage),
                // ROCm SMI older than 5.5 sums a process over every GPU:
                // that is this GPU's figure only when the process uses no
                // other.
                RSMI_STATUS_NOT_SUPPORTED if g.devices.visible().len() == 1 => {
                    (call_real!(rsmi_compute_process_info_by_pid_get(pid, &mut info))
                        == RSMI_STATUS_SUCCESS)
                        .then_some(info.vram_usage)
                }
                _ => None,
            }
        })
    })();
    let _ = call_real!(rsmi_shut_down());
    held
}

/// After a governed allocation on allocation device `i` succeeded: the
/// first time, the context's charge (`charged`, what `ensure_context`
/// reserved) is settled to what the driver holds beyond everything else
/// this process is charged there. One atomic load once settled.
pub(super) fn settle(g: &Governed, i: usize) {
    let bit = 1u64 << i;
    if SETTLED.load(Ordering::Acquire) & bit != 0 {
        return;
    }
    let _one = CONTEXT_LOCK.lock();
    if SETTLED.load(Ordering::Acquire) & bit != 0 {
        return;
    }
    SETTLED.fetch_or(bit, Ordering::AcqRel);
    let Some(m) = g.member() else { return };
    let Some(held) = driver_holds(g, i) else {
        return;
    };
    let charged = g.files.control.context_charge(i);
    let others = g.files.state.slot_usage(m.slot, i).saturating_sub(charged);
    let real = held.saturating_sub(others);
    if real == charged {
        return;
    }
    crate::log!(
        Level::Info,
        "HIP device {i}: the context holds {real} bytes (charged {charged} before)"
    );
    if g.settle(Some(i), charged, real).is_err() {
        crate::log!(
            Level::Warn,
            "HIP device {i}: the context holds {real} bytes, {} more than fit; left to the backstop",
            real - charged
        );
    }
}
