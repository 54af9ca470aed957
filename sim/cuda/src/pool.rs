//! Stream-ordered allocation and memory pools: `cuMemAllocAsync`, `cuMemFreeAsync`,
//! `cuMemAllocFromPoolAsync`, `cuMemPoolCreate`/`Destroy`/`TrimTo`/attributes and the
//! device's default and current pools.
//!
//! A pool keeps memory it has taken from the device (`reserved`) after its allocations
//! are freed, and gives back what exceeds its release threshold at the next
//! synchronisation (or `cuMemPoolTrimTo`), as CUDA pools do: between a free and the next
//! synchronisation the device still counts the memory. Pools track bytes, not
//! fragmentation; what a pool takes from the device and gives back is whole device pages
//! (`memory::DEVICE_PAGE`), as the real driver maps a pool's memory in its allocation
//! granularity.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

use tessera_ffi::cuda::*;

use crate::memory::{
    DEVICE_PAGE, Kind, alloc_device_on, device_pages, find, free_device, round_up,
};
use crate::registry::{Registry, handle_of};
use crate::runtime::{Runtime, rt};
use crate::stream::resolve;
use crate::{CuResult, guard, put};

pub static POOLS: Registry<Pool> = Registry::new();

#[derive(Debug)]
pub struct Pool {
    pub device: usize,
    pub is_default: bool,
    /// `CUmemPoolProps::maxSize`; 0 for no limit.
    pub max_size: u64,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
pub struct PoolState {
    /// Bytes taken from the device.
    pub reserved: u64,
    /// Bytes in live allocations.
    pub used: u64,
    pub reserved_high: u64,
    pub used_high: u64,
    pub release_threshold: u64,
    pub reuse: [i32; 3],
    pub destroyed: bool,
}

impl Pool {
    pub fn new_default(device: usize) -> Arc<Pool> {
        Arc::new(Pool {
            device,
            is_default: true,
            max_size: 0,
            state: Mutex::new(PoolState {
                reuse: [1, 1, 1],
                ..PoolState::default()
            }),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `bytes` for an allocation, from the pool's unused reserve first and from the
    /// device for the rest.
    pub fn take(&self, rt: &Runtime, bytes: u64) -> CuResult<()> {
        let mut s = self.lock();
        if s.destroyed {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let spare = s.reserved - s.used;
        if spare < bytes {
            let need = device_pages(bytes - spare)?;
            if self.max_size != 0 && s.reserved + need > self.max_size {
                return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
            }
            rt.charge(self.device, need)?;
            s.reserved += need;
        }
        s.used += bytes;
        s.used_high = s.used_high.max(s.used);
        s.reserved_high = s.reserved_high.max(s.reserved);
        Ok(())
    }

    /// An allocation of `bytes` was freed: the pool keeps the memory (a destroyed pool
    /// gives it straight back).
    pub fn give_back(&self, rt: &Runtime, bytes: u64) {
        let mut s = self.lock();
        s.used = s.used.saturating_sub(bytes);
        if s.destroyed {
            let keep = round_up(s.used, DEVICE_PAGE).unwrap_or(s.reserved);
            let excess = s.reserved.saturating_sub(keep);
            s.reserved -= excess;
            rt.uncharge(self.device, excess);
        }
    }

    /// Releases unused memory down to `keep` bytes reserved (never below what is used),
    /// in whole device pages.
    pub fn trim(&self, rt: &Runtime, keep: u64) {
        let mut s = self.lock();
        let target = round_up(keep.max(s.used), DEVICE_PAGE).unwrap_or(u64::MAX);
        if s.reserved > target {
            rt.uncharge(self.device, s.reserved - target);
            s.reserved = target;
        }
    }
}

/// At a synchronisation point, pools on `device` release what exceeds their threshold.
pub fn trim_pools_after_sync(rt: &Runtime, device: usize) {
    for p in POOLS.all() {
        if p.device == device {
            let keep = p.lock().release_threshold;
            p.trim(rt, keep);
        }
    }
}

fn lookup(pool: CUmemoryPool) -> CuResult<Arc<Pool>> {
    POOLS
        .get(pool as usize)
        .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
}

fn alloc_from(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: Arc<Pool>,
    stream: CUstream,
    ptsz: bool,
) -> CuResult<()> {
    let rt = rt()?;
    let t = resolve(stream, ptsz)?;
    if dptr.is_null() || bytesize == 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let bytes = bytesize as u64;
    // The memory lives where the pool is, whatever the stream's or the current
    // context's device (every device may use every pool here).
    if let Some(graph) = t.capturing() {
        // Captured: the allocation becomes a graph allocation node (the driver makes
        // captured stream-ordered allocations graph memory, not pool memory).
        let (node, base) =
            crate::graph::add_alloc_node(graph as CUgraph, &t.capture_deps(), pool.device, bytes)?;
        t.captured(node);
        // SAFETY: checked non-null above.
        unsafe { dptr.write(base) };
        return Ok(());
    }
    pool.take(rt, bytes)?;
    match alloc_device_on(rt, t.ctx(), pool.device, bytes, Kind::Pool(pool.clone()), 0) {
        Ok(base) => {
            // SAFETY: checked non-null above.
            unsafe { dptr.write(base) };
            Ok(())
        }
        Err(e) => {
            pool.give_back(rt, bytes);
            Err(e)
        }
    }
}

fn alloc_async(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    stream: CUstream,
    ptsz: bool,
) -> CuResult<()> {
    let rt = rt()?;
    let t = resolve(stream, ptsz)?;
    // The current pool of the stream's device, not of the current context's.
    let d = rt
        .local(t.ctx().device)
        .ok_or(CUresult::CUDA_ERROR_INVALID_DEVICE)?;
    let pool = POOLS
        .get(d.current_pool.load(std::sync::atomic::Ordering::Acquire))
        .unwrap_or_else(|| d.default_pool.clone());
    alloc_from(dptr, bytesize, pool, stream, ptsz)
}

crate::ptsz_exports! {
    /// `cuMemAllocAsync`: from the current pool of the stream's device.
    ///
    /// # Safety
    /// `dptr` must be null or writable.
    fn cuMemAllocAsync / cuMemAllocAsync_ptsz [per_thread](
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        hStream: CUstream,
    ) -> CUresult {
        guard(|| alloc_async(dptr, bytesize, hStream, per_thread))
    }
}

crate::ptsz_exports! {
    /// `cuMemAllocFromPoolAsync`.
    ///
    /// # Safety
    /// `dptr` must be null or writable.
    fn cuMemAllocFromPoolAsync / cuMemAllocFromPoolAsync_ptsz [per_thread](
        dptr: *mut CUdeviceptr,
        bytesize: usize,
        pool: CUmemoryPool,
        hStream: CUstream,
    ) -> CUresult {
        guard(|| alloc_from(dptr, bytesize, lookup(pool)?, hStream, per_thread))
    }
}

fn free_async(dptr: CUdeviceptr, stream: CUstream, ptsz: bool) -> CuResult<()> {
    let rt = rt()?;
    let t = resolve(stream, ptsz)?;
    if let Some(graph) = t.capturing() {
        // Captured: a free node (of a graph allocation; other memory cannot be freed in
        // a graph).
        let node = crate::graph::add_free_node(graph as CUgraph, &t.capture_deps(), dptr)?;
        t.captured(node);
        return Ok(());
    }
    match find(dptr) {
        Some(a) if a.base == dptr => free_device(rt, dptr).map(|_| ()),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

crate::ptsz_exports! {
    /// `cuMemFreeAsync`: pool memory goes back to its pool; other memory is freed at once.
    ///
    /// # Safety
    /// Any pointer value is accepted; unknown ones are reported.
    fn cuMemFreeAsync / cuMemFreeAsync_ptsz [per_thread](
        dptr: CUdeviceptr,
        hStream: CUstream,
    ) -> CUresult {
        guard(|| free_async(dptr, hStream, per_thread))
    }
}

/// `cuMemPoolCreate`: pinned device pools only.
///
/// # Safety
/// `pool` must be null or writable; `poolProps` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(
    pool: *mut CUmemoryPool,
    poolProps: *const CUmemPoolProps,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        // SAFETY: the caller passes null (rejected) or a valid CUmemPoolProps.
        let props = unsafe { crate::get(poolProps) }?;
        if pool.is_null()
            || props.allocType != CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
            || props.location.type_ != CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let d = rt
            .device(props.location.id)
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let p = Arc::new(Pool {
            device: d.index,
            is_default: false,
            max_size: props.maxSize as u64,
            state: Mutex::new(PoolState::default()),
        });
        let h = POOLS.insert(p);
        // SAFETY: checked non-null above.
        unsafe { pool.write(h as CUmemoryPool) };
        Ok(())
    })
}

/// `cuMemPoolDestroy`: unused memory returns at once, memory still allocated when its
/// allocations are freed. Default pools cannot be destroyed.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let p = lookup(pool)?;
        if p.is_default {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        p.trim(rt, 0);
        p.lock().destroyed = true;
        POOLS.remove(pool as usize);
        for d in &rt.devices {
            // A destroyed current pool reverts to the default one.
            let _ = d.current_pool.compare_exchange(
                pool as usize,
                handle_of(&d.default_pool),
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        Ok(())
    })
}

/// `cuMemPoolTrimTo`.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: CUmemoryPool, minBytesToKeep: usize) -> CUresult {
    guard(|| {
        let rt = rt()?;
        lookup(pool)?.trim(rt, minBytesToKeep as u64);
        Ok(())
    })
}

/// The pool an attribute call names, with its value pointer checked non-null.
fn attribute_target(pool: CUmemoryPool, value: *mut c_void) -> CuResult<Arc<Pool>> {
    rt()?;
    let p = lookup(pool)?;
    if value.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(p)
}

/// `cuMemPoolSetAttribute`.
///
/// # Safety
/// `value` must point to the attribute's type (int or cuuint64_t).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    guard(|| set_attribute(&mut attribute_target(pool, value)?.lock(), attr, value))
}

/// `cuMemPoolGetAttribute`.
///
/// # Safety
/// `value` must be valid for writing the attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: *mut c_void,
) -> CUresult {
    guard(|| get_attribute(&attribute_target(pool, value)?.lock(), attr, value))
}

/// `cuMemPoolSetAttribute`'s body: `value` is non-null (`attribute_target`) and, by the
/// export's contract, points to the attribute's type.
fn set_attribute(s: &mut PoolState, attr: CUmemPool_attribute, value: *mut c_void) -> CuResult<()> {
    use CUmemPool_attribute as A;
    match attr {
        A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
        | A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
        | A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            // SAFETY: non-null; these attributes are ints.
            s.reuse[attr.0 as usize - 1] = unsafe { value.cast::<i32>().read() };
        }
        A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => {
            // SAFETY: non-null; the threshold is a cuuint64_t.
            s.release_threshold = unsafe { value.cast::<u64>().read() };
        }
        A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH | A::CU_MEMPOOL_ATTR_USED_MEM_HIGH => {
            // SAFETY: non-null; high watermarks are cuuint64_t and may only be reset to 0.
            if unsafe { value.cast::<u64>().read() } != 0 {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            if attr == A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH {
                s.reserved_high = s.reserved;
            } else {
                s.used_high = s.used;
            }
        }
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
    Ok(())
}

/// `cuMemPoolGetAttribute`'s body: `value` is non-null (`attribute_target`) and, by the
/// export's contract, writable for the attribute's type.
fn get_attribute(s: &PoolState, attr: CUmemPool_attribute, value: *mut c_void) -> CuResult<()> {
    use CUmemPool_attribute as A;
    let v64 = match attr {
        A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES
        | A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC
        | A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
            // SAFETY: non-null; these attributes are ints.
            unsafe { value.cast::<i32>().write(s.reuse[attr.0 as usize - 1]) };
            return Ok(());
        }
        A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD => s.release_threshold,
        A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT => s.reserved,
        A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH => s.reserved_high,
        A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT => s.used,
        A::CU_MEMPOOL_ATTR_USED_MEM_HIGH => s.used_high,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    };
    // SAFETY: non-null; the remaining attributes are cuuint64_t.
    unsafe { value.cast::<u64>().write(v64) };
    Ok(())
}

/// `cuMemPoolSetAccess`: every device may use every pool here, so this only validates.
///
/// # Safety
/// `map` must point to `count` descriptors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAccess(
    pool: CUmemoryPool,
    map: *const CUmemAccessDesc,
    count: usize,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        lookup(pool)?;
        if count > 0 && map.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..count {
            // SAFETY: the caller passes `count` descriptors.
            let d = unsafe { &*map.add(i) };
            rt.device(d.location.id)
                .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        }
        Ok(())
    })
}

/// `cuMemPoolGetAccess`: read-write from every device.
///
/// # Safety
/// `flags` must be null or writable; `location` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAccess(
    flags: *mut CUmemAccess_flags,
    memPool: CUmemoryPool,
    location: *mut CUmemLocation,
) -> CUresult {
    guard(|| {
        rt()?;
        lookup(memPool)?;
        if location.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(flags, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE) }
    })
}

/// `cuDeviceGetDefaultMemPool`.
///
/// # Safety
/// `pool_out` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(
    pool_out: *mut CUmemoryPool,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let d = rt.device(dev)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pool_out, handle_of(&d.default_pool) as CUmemoryPool) }
    })
}

/// `cuDeviceGetMemPool`: the pool `cuMemAllocAsync` uses on the device.
///
/// # Safety
/// `pool` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let d = rt.device(dev)?;
        let h = d.current_pool.load(std::sync::atomic::Ordering::Acquire);
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pool, h as CUmemoryPool) }
    })
}

/// `cuDeviceSetMemPool`.
///
/// # Safety
/// Any handle value is accepted; unknown ones are reported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceSetMemPool(dev: CUdevice, pool: CUmemoryPool) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let d = rt.device(dev)?;
        let p = lookup(pool)?;
        if p.device != d.index {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        d.current_pool
            .store(pool as usize, std::sync::atomic::Ordering::Release);
        Ok(())
    })
}
