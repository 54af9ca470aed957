//! Stream-ordered memory and pools: `hipMallocAsync`, `hipMallocFromPoolAsync`,
//! `hipFreeAsync`, `hipMemPoolCreate`/`Destroy`/`TrimTo`, the pool attributes and the
//! device's default and current pools.
//!
//! A pool keeps what it has taken from the device (`reserved`) after its blocks are
//! freed, and gives back what exceeds its release threshold (0 unless set) at the next
//! synchronisation of the device (`hipStreamSynchronize`, `hipDeviceSynchronize`,
//! `hipEventSynchronize`) or at `hipMemPoolTrimTo`: HIP's documented pool semantics
//! (`hip_runtime_api.h` of HIP 5.2.3, `hipMemPoolAttrReleaseThreshold`: "amount of
//! reserved memory in bytes to hold onto before trying to release memory back to the
//! OS"), the same as CUDA's. Between a free and the next synchronisation the device still
//! counts the memory. A pool tracks bytes, not fragmentation: a block takes its size
//! rounded to [`DEVICE_PAGE`] from the pool's spare reserve first and from the device
//! for the rest. The pools' accounting, which a free and a synchronisation settle too,
//! is `registry`'s; this module holds the calls and each device's default and current
//! pool.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::Mutex;

use crate::registry::{
    DEVICE_PAGE, Kind, block_freed, forget_pool, free, insert, lock, map, new_pool, pool, round_up,
};
use crate::stream;
use crate::*;

/// Each ordinal's default pool, made on first request.
static DEFAULT: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());
/// Each ordinal's current pool (`hipDeviceSetMemPool`), the default one when unset.
static CURRENT: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

fn default_pool(rt: &Runtime, ordinal: usize) -> HipResult<usize> {
    rt.physical(ordinal as c_int)?;
    let mut d = lock(&DEFAULT);
    if let Some(&h) = d.get(&ordinal) {
        return Ok(h);
    }
    let h = new_pool(rt, ordinal)?;
    d.insert(ordinal, h);
    Ok(h)
}

fn current_pool(rt: &Runtime, ordinal: usize) -> HipResult<usize> {
    if let Some(&h) = lock(&CURRENT).get(&ordinal) {
        return Ok(h);
    }
    default_pool(rt, ordinal)
}

/// A block of `size` bytes from pool `h`.
fn alloc_from(h: usize, size: u64) -> HipResult<*mut c_void> {
    let rt = rt()?;
    let p = pool(h as *mut c_void)?;
    rt.touch(p.ordinal)?;
    let bytes = round_up(size.max(1), DEVICE_PAGE).ok_or(hipErrorOutOfMemory)?;
    {
        let mut s = p.lock();
        if s.destroyed {
            return Err(hipErrorInvalidValue);
        }
        let spare = s.reserved - s.used;
        if spare < bytes {
            let need = bytes - spare;
            if !rt.node.reserve_memory(rt.slot, p.physical, need) {
                return Err(hipErrorOutOfMemory);
            }
            s.reserved += need;
        }
        s.used += bytes;
        s.used_high = s.used_high.max(s.used);
        s.reserved_high = s.reserved_high.max(s.reserved);
    }
    let addr = match map(bytes) {
        Ok(a) => a,
        Err(e) => {
            block_freed(rt, h, bytes);
            return Err(e);
        }
    };
    insert(addr, p.ordinal, p.physical, bytes, size, Kind::Pool, h);
    Ok(addr)
}

hip_api! {
    /// `hipDeviceGetDefaultMemPool`.
    ///
    /// # Safety
    /// `out` must be null or writable.
    "hip_5.1" fn hipDeviceGetDefaultMemPool(out: *mut *mut c_void, device: c_int) -> hipError_t {
        guard(|| {
            let rt = rt()?;
            let o = usize::try_from(device).map_err(|_| hipErrorInvalidDevice)?;
            let h = default_pool(rt, o)?;
            // SAFETY: the caller's contract.
            unsafe { put(out, h as *mut c_void) }
        })
    }

    /// `hipDeviceGetMemPool`: the device's current pool.
    ///
    /// # Safety
    /// `out` must be null or writable.
    "hip_5.1" fn hipDeviceGetMemPool(out: *mut *mut c_void, device: c_int) -> hipError_t {
        guard(|| {
            let rt = rt()?;
            let o = usize::try_from(device).map_err(|_| hipErrorInvalidDevice)?;
            let h = current_pool(rt, o)?;
            // SAFETY: the caller's contract.
            unsafe { put(out, h as *mut c_void) }
        })
    }

    /// `hipDeviceSetMemPool`: a pool of that device becomes its current pool.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_5.1" fn hipDeviceSetMemPool(device: c_int, mem_pool: *mut c_void) -> hipError_t {
        guard(|| {
            let o = usize::try_from(device).map_err(|_| hipErrorInvalidDevice)?;
            rt()?.physical(device)?;
            if pool(mem_pool)?.ordinal != o {
                return Err(hipErrorInvalidValue);
            }
            lock(&CURRENT).insert(o, mem_pool as usize);
            Ok(())
        })
    }

    /// `hipMemPoolCreate`: a pool on the device its properties name.
    ///
    /// # Safety
    /// `out` must be null or writable; `props` null or readable.
    "hip_5.1" fn hipMemPoolCreate(out: *mut *mut c_void, props: *const hipMemPoolProps) -> hipError_t {
        guard(|| {
            if out.is_null() || props.is_null() {
                return Err(hipErrorInvalidValue);
            }
            // SAFETY: checked non-null; the caller passes readable properties.
            let id = unsafe { (*props).location.id };
            let o = usize::try_from(id).map_err(|_| hipErrorInvalidValue)?;
            let h = new_pool(rt()?, o).map_err(|_| hipErrorInvalidValue)?;
            // SAFETY: as above.
            unsafe { put(out, h as *mut c_void) }
        })
    }

    /// `hipMemPoolDestroy`: its unused reserve goes back at once; live blocks keep their
    /// memory until freed. A device's default pool cannot be destroyed.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_5.1" fn hipMemPoolDestroy(mem_pool: *mut c_void) -> hipError_t {
        guard(|| {
            let rt = rt()?;
            let p = pool(mem_pool)?;
            if lock(&DEFAULT).values().any(|&h| h == mem_pool as usize) {
                return Err(hipErrorInvalidValue);
            }
            forget_pool(mem_pool as usize);
            lock(&CURRENT).retain(|_, h| *h != mem_pool as usize);
            p.lock().destroyed = true;
            p.trim(rt, 0);
            Ok(())
        })
    }

    /// `hipMemPoolTrimTo`: unused memory released down to `keep` bytes reserved.
    ///
    /// # Safety
    /// Any handle value is accepted; unknown ones are reported.
    "hip_5.1" fn hipMemPoolTrimTo(mem_pool: *mut c_void, keep: usize) -> hipError_t {
        guard(|| {
            pool(mem_pool)?.trim(rt()?, keep as u64);
            Ok(())
        })
    }

    /// `hipMemPoolSetAttribute`: the release threshold (a `uint64_t`), the reuse flags
    /// (an `int`, accepted), and the high-water marks reset (value 0).
    ///
    /// # Safety
    /// `value` must be null or readable as the attribute's type.
    "hip_5.1" fn hipMemPoolSetAttribute(mem_pool: *mut c_void, attr: c_int, value: *mut c_void) -> hipError_t {
        guard(|| {
            let p = pool(mem_pool)?;
            if value.is_null() {
                return Err(hipErrorInvalidValue);
            }
            let mut s = p.lock();
            match attr {
                hipMemPoolReuseFollowEventDependencies..=hipMemPoolReuseAllowInternalDependencies => {}
                // SAFETY: non-null; the threshold is a uint64_t.
                hipMemPoolAttrReleaseThreshold => s.release_threshold = unsafe { value.cast::<u64>().read() },
                hipMemPoolAttrReservedMemHigh => s.reserved_high = s.reserved,
                hipMemPoolAttrUsedMemHigh => s.used_high = s.used,
                _ => return Err(hipErrorInvalidValue),
            }
            Ok(())
        })
    }

    /// `hipMemPoolGetAttribute`.
    ///
    /// # Safety
    /// `value` must be null or writable as the attribute's type.
    "hip_5.1" fn hipMemPoolGetAttribute(mem_pool: *mut c_void, attr: c_int, value: *mut c_void) -> hipError_t {
        guard(|| {
            let p = pool(mem_pool)?;
            let s = p.lock();
            let v = match attr {
                hipMemPoolReuseFollowEventDependencies..=hipMemPoolReuseAllowInternalDependencies => {
                    // SAFETY: the caller's contract: the reuse flags are ints.
                    return unsafe { put(value.cast::<c_int>(), 1) };
                }
                hipMemPoolAttrReleaseThreshold => s.release_threshold,
                hipMemPoolAttrReservedMemCurrent => s.reserved,
                hipMemPoolAttrReservedMemHigh => s.reserved_high,
                hipMemPoolAttrUsedMemCurrent => s.used,
                hipMemPoolAttrUsedMemHigh => s.used_high,
                _ => return Err(hipErrorInvalidValue),
            };
            // SAFETY: the caller's contract: these are uint64_t.
            unsafe { put(value.cast::<u64>(), v) }
        })
    }

    /// `hipMallocAsync`: from the current pool of the stream's device.
    ///
    /// # Safety
    /// `ptr` must be null or writable.
    "hip_5.1" fn hipMallocAsync(ptr: *mut *mut c_void, size: usize, s: *mut c_void) -> hipError_t {
        guard(|| {
            if ptr.is_null() {
                return Err(hipErrorInvalidValue);
            }
            let ordinal = stream::ordinal_of(s)?;
            let h = current_pool(rt()?, ordinal)?;
            let p = alloc_from(h, size as u64)?;
            // SAFETY: as above.
            unsafe { put(ptr, p) }
        })
    }

    /// `hipMallocFromPoolAsync`.
    ///
    /// # Safety
    /// `ptr` must be null or writable.
    "hip_5.1" fn hipMallocFromPoolAsync(ptr: *mut *mut c_void, size: usize, mem_pool: *mut c_void, s: *mut c_void) -> hipError_t {
        guard(|| {
            if ptr.is_null() {
                return Err(hipErrorInvalidValue);
            }
            stream::ordinal_of(s)?;
            let p = alloc_from(mem_pool as usize, size as u64)?;
            // SAFETY: as above.
            unsafe { put(ptr, p) }
        })
    }

    /// `hipFreeAsync`: freed at once (the stream's earlier work is already done in the
    /// simulator's sense: it only occupies time); a pool block's memory stays with its
    /// pool until the next synchronisation or trim.
    ///
    /// # Safety
    /// Any pointer value is accepted; unknown ones are reported.
    "hip_5.1" fn hipFreeAsync(ptr: *mut c_void, s: *mut c_void) -> hipError_t {
        guard(|| {
            stream::ordinal_of(s)?;
            free(ptr, &[Kind::Pool, Kind::Device, Kind::Managed])
        })
    }
}
