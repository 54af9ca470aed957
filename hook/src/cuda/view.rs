//! The container's view of memory.

use super::*;

/// The current device's (total, free) as the allocation sees it, from the
/// driver's own figures. `None` leaves the driver's figures as they are.
fn current_view(g: &Governed, free: u64, total: u64) -> Option<(u64, u64)> {
    // A pool freed from since the last look may have given memory back.
    if g.pool_slack.load(std::sync::atomic::Ordering::Acquire) {
        g.reconcile_pools();
    }
    let (index, _) = g.current().ok()?;
    let (total_v, used) = g.files.view(index, total);
    Some((total_v, total_v.saturating_sub(used).min(free)))
}

pub unsafe fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let g = governed_or!(call_real!(cuMemGetInfo_v2(free, total)));
    let r = call_real!(cuMemGetInfo_v2(free, total));
    if r != OK || free.is_null() || total.is_null() {
        return r;
    }
    // SAFETY: the driver succeeded and wrote both.
    let (f, t) = unsafe { (*free as u64, *total as u64) };
    if let Some((t, f)) = current_view(g, f, t) {
        // SAFETY: as above.
        unsafe {
            *total = t as usize;
            *free = f as usize;
        }
    }
    r
}

pub unsafe fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult {
    let g = governed_or!(call_real!(cuMemGetInfo(free, total)));
    let r = call_real!(cuMemGetInfo(free, total));
    if r != OK || free.is_null() || total.is_null() {
        return r;
    }
    // SAFETY: the driver succeeded and wrote both.
    let (f, t) = unsafe { (u64::from(*free), u64::from(*total)) };
    if let Some((t, f)) = current_view(g, f, t) {
        // SAFETY: as above; both are at most the driver's own values.
        unsafe {
            *total = t as c_uint;
            *free = f as c_uint;
        }
    }
    r
}

pub unsafe fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDeviceTotalMem_v2(bytes, dev)));
    let r = call_real!(cuDeviceTotalMem_v2(bytes, dev));
    if r == OK && !bytes.is_null() {
        // SAFETY: the driver succeeded and wrote it.
        unsafe { *bytes = g.files.view(g.index_of(dev), *bytes as u64).0 as usize };
    }
    r
}

pub unsafe fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult {
    let g = governed_or!(call_real!(cuDeviceTotalMem(bytes, dev)));
    let r = call_real!(cuDeviceTotalMem(bytes, dev));
    if r == OK && !bytes.is_null() {
        // SAFETY: the driver succeeded and wrote it; the view is at most it.
        unsafe { *bytes = g.files.view(g.index_of(dev), u64::from(*bytes)).0 as c_uint };
    }
    r
}
