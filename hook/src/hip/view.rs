//! The container's view of memory: `hipMemGetInfo`, `hipDeviceTotalMem`
//! and `totalGlobalMem` in the device properties.

use super::*;

pub unsafe fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> hipError_t {
    let g = governed_or!(call_real!(hipMemGetInfo(free, total)));
    // What pools gave back since the last look is not the process's any more.
    g.reconcile_pools();
    let r = real!(hipMemGetInfo(free, total));
    if r != OK || free.is_null() || total.is_null() {
        return r;
    }
    let Ok(index) = current(g) else {
        return r;
    };
    // SAFETY: the runtime succeeded and wrote both.
    unsafe {
        let (t, used) = g.files.view(index, *total as u64);
        *free = (t.saturating_sub(used)).min(*free as u64) as usize;
        *total = t as usize;
    }
    r
}

pub unsafe fn hipDeviceTotalMem(bytes: *mut usize, dev: hipDevice_t) -> hipError_t {
    let g = governed_or!(call_real!(hipDeviceTotalMem(bytes, dev)));
    let r = real!(hipDeviceTotalMem(bytes, dev));
    if r == OK && !bytes.is_null() {
        // SAFETY: the runtime succeeded and wrote it.
        unsafe { *bytes = g.files.view(g.index_of(dev), *bytes as u64).0 as usize };
    }
    r
}

/// `totalGlobalMem` at `offset` in the properties the runtime just wrote,
/// replaced by the allocation's view.
///
/// # Safety
///
/// `prop` points to a properties struct of the layout `offset` belongs to.
unsafe fn limit_properties(g: &Governed, prop: *mut c_void, dev: c_int, offset: usize) {
    // SAFETY: per the contract the field is a size_t at `offset`; the
    // runtime-written struct carries no alignment promise we rely on.
    unsafe {
        let field = prop.cast::<u8>().add(offset).cast::<usize>();
        let physical = field.read_unaligned() as u64;
        field.write_unaligned(g.files.view(g.index_of(dev), physical).0 as usize);
    }
}

pub unsafe fn hipGetDeviceProperties(prop: *mut c_void, dev: c_int) -> hipError_t {
    let g = governed_or!(call_real!(hipGetDeviceProperties(prop, dev)));
    let r = real!(hipGetDeviceProperties(prop, dev));
    if r == OK && !prop.is_null() {
        // SAFETY: HIP 5's hipDeviceProp_t, which the runtime just wrote.
        unsafe { limit_properties(g, prop, dev, TOTAL_GLOBAL_MEM_OFFSET) };
    }
    r
}

pub unsafe fn hipGetDevicePropertiesR0600(prop: *mut c_void, dev: c_int) -> hipError_t {
    let g = governed_or!(call_real!(hipGetDevicePropertiesR0600(prop, dev)));
    let r = real!(hipGetDevicePropertiesR0600(prop, dev));
    if r == OK && !prop.is_null() {
        // SAFETY: ROCm 6's hipDeviceProp_tR0600, which the runtime just wrote.
        unsafe { limit_properties(g, prop, dev, TOTAL_GLOBAL_MEM_OFFSET_R0600) };
    }
    r
}
