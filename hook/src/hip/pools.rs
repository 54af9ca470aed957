//! Stream-ordered memory. Each allocation is charged its own pages on the
//! current device when asked for, and returned when freed: unlike CUDA's
//! (`governor::pools`), what a HIP pool keeps beyond its live allocations
//! is not charged (docs/hook.md says where that leaves the limit).

use super::*;

pub unsafe fn hipMallocAsync(
    ptr: *mut *mut c_void,
    size: usize,
    stream: hipStream_t,
) -> hipError_t {
    let g = governed_or!(call_real!(hipMallocAsync(ptr, size, stream)));
    admit_current(
        g,
        size as u64,
        || real!(hipMallocAsync(ptr, size, stream)),
        // SAFETY: read only after the runtime succeeded and wrote it.
        || unsafe { out_ptr(ptr) },
    )
}

pub unsafe fn hipMallocFromPoolAsync(
    ptr: *mut *mut c_void,
    size: usize,
    pool: hipMemPool_t,
    stream: hipStream_t,
) -> hipError_t {
    let g = governed_or!(call_real!(hipMallocFromPoolAsync(ptr, size, pool, stream)));
    admit_current(
        g,
        size as u64,
        || real!(hipMallocFromPoolAsync(ptr, size, pool, stream)),
        // SAFETY: read only after the runtime succeeded and wrote it.
        || unsafe { out_ptr(ptr) },
    )
}

pub unsafe fn hipFreeAsync(ptr: *mut c_void, stream: hipStream_t) -> hipError_t {
    let g = governed_or!(call_real!(hipFreeAsync(ptr, stream)));
    free(g, Key::Ptr(ptr as u64), || real!(hipFreeAsync(ptr, stream)))
}
