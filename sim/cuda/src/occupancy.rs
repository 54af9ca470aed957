//! Function and kernel attributes and occupancy, against the limits of an H100's SM
//! (registers, threads, blocks, shared memory), for the functions of [`crate::module`].

use std::ffi::{c_int, c_uint};
use std::sync::atomic::Ordering;

use tessera_ffi::cuda::*;

use crate::module::{ANY_DEVICE, Function, LIBRARIES, MODULES, arch_of, function};
use crate::runtime::{Runtime, rt};
use crate::{CuResult, guard, put};

// One H100 SM's limits.
const REGS_PER_SM: u32 = 65536;
const THREADS_PER_SM: u32 = 2048;
const BLOCKS_PER_SM: u32 = 32;
const SHARED_PER_SM: u64 = 228 << 10;
const SHARED_PER_BLOCK_OPTIN: i32 = 227 << 10;
/// Shared memory a block may use without opting in.
const SHARED_PER_BLOCK: u64 = 48 << 10;

fn attribute(f: &Function, attrib: CUfunction_attribute, arch: u32) -> CuResult<c_int> {
    use CUfunction_attribute as A;
    Ok(match attrib {
        A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => f.max_block() as c_int,
        A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES => f.shared.unwrap_or(0) as c_int,
        A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES => f.local.unwrap_or(0) as c_int,
        A::CU_FUNC_ATTRIBUTE_NUM_REGS => f.regs.unwrap_or(32) as c_int,
        A::CU_FUNC_ATTRIBUTE_PTX_VERSION | A::CU_FUNC_ATTRIBUTE_BINARY_VERSION => arch as c_int,
        A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
            match f.max_dynamic_shared.load(Ordering::Relaxed) {
                0 => (SHARED_PER_BLOCK as i32 - f.shared.unwrap_or(0) as i32).max(0),
                v => v,
            }
        }
        A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT => -1,
        A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED => {
            f.non_portable_cluster.load(Ordering::Relaxed)
        }
        a if a.0 < A::CU_FUNC_ATTRIBUTE_MAX.0 => 0,
        _ => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    })
}

fn set_attribute(f: &Function, attrib: CUfunction_attribute, value: c_int) -> CuResult<()> {
    use CUfunction_attribute as A;
    match attrib {
        A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
            let fixed = f.shared.unwrap_or(0) as i32;
            if value < 0 || value + fixed > SHARED_PER_BLOCK_OPTIN {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            f.max_dynamic_shared.store(value, Ordering::Relaxed);
            Ok(())
        }
        A::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED => {
            if !(0..=1).contains(&value) {
                return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
            }
            f.non_portable_cluster.store(value, Ordering::Relaxed);
            Ok(())
        }
        a if a.0 < A::CU_FUNC_ATTRIBUTE_MAX.0 => Ok(()),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

fn function_arch(rt: &Runtime, f: &Function) -> u32 {
    let module_arch = MODULES
        .get(f.module)
        .and_then(|m| m.code.contents().ok().and_then(|c| c.arch));
    let device = if f.device == ANY_DEVICE { 0 } else { f.device };
    module_arch.unwrap_or_else(|| arch_of(rt, device))
}

/// `cuFuncGetAttribute`: registers, static shared and local memory from the image where
/// it says (else 32 registers and none), an H100's limits otherwise.
///
/// # Safety
/// `pi` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(
    pi: *mut c_int,
    attrib: CUfunction_attribute,
    hfunc: CUfunction,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let f = function(hfunc)?;
        let v = attribute(&f, attrib, function_arch(rt, &f))?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pi, v) }
    })
}

/// `cuFuncSetAttribute`: only the dynamic shared memory limit is kept.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncSetAttribute(
    hfunc: CUfunction,
    attrib: CUfunction_attribute,
    value: c_int,
) -> CUresult {
    guard(|| {
        rt()?;
        set_attribute(&*function(hfunc)?, attrib, value)
    })
}

/// Checks a cache preference for a function (`CU_FUNC_CACHE_PREFER_*`, 0 to 3); it has no
/// effect here.
fn check_cache_config(f: CUfunction, config: CUfunc_cache) -> CuResult<()> {
    function(f)?;
    if config.0 > 3 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// `cuFuncSetCacheConfig`: accepted, no effect.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncSetCacheConfig(hfunc: CUfunction, config: CUfunc_cache) -> CUresult {
    guard(|| {
        rt()?;
        check_cache_config(hfunc, config)
    })
}

impl Function {
    /// Largest block a launch of this function may use.
    pub fn max_block(&self) -> u32 {
        let by_regs = self
            .regs
            .filter(|r| *r > 0)
            .map_or(1024, |r| (REGS_PER_SM / r / 32 * 32).max(32));
        self.max_threads.unwrap_or(1024).min(1024).min(by_regs)
    }
}

/// Blocks of `block` threads with `dynamic` bytes of dynamic shared memory that fit on
/// one SM at once (threads, blocks, registers and shared memory of an H100's SM).
fn active_blocks(f: &Function, block: c_int, dynamic: usize) -> CuResult<c_int> {
    if block <= 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let block = block as u32;
    if block > f.max_block() {
        return Ok(0);
    }
    let warps = block.div_ceil(32) * 32;
    let by_threads = THREADS_PER_SM / warps;
    let regs = f.regs.unwrap_or(32).max(1) * warps;
    let by_regs = REGS_PER_SM / regs;
    let shared = u64::from(f.shared.unwrap_or(0)) + dynamic as u64;
    let by_shared = if shared == 0 {
        BLOCKS_PER_SM
    } else {
        (SHARED_PER_SM / shared.div_ceil(1024).max(1) / 1024).min(u64::from(BLOCKS_PER_SM)) as u32
    };
    Ok(by_threads.min(by_regs).min(by_shared).min(BLOCKS_PER_SM) as c_int)
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor`.
///
/// # Safety
/// `numBlocks` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessor(
    numBlocks: *mut c_int,
    func: CUfunction,
    blockSize: c_int,
    dynamicSMemSize: usize,
) -> CUresult {
    guard(|| {
        rt()?;
        let n = active_blocks(&*function(func)?, blockSize, dynamicSMemSize)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(numBlocks, n) }
    })
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags`: the flags change nothing here.
///
/// # Safety
/// `numBlocks` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
    numBlocks: *mut c_int,
    func: CUfunction,
    blockSize: c_int,
    dynamicSMemSize: usize,
    _flags: c_uint,
) -> CUresult {
    // SAFETY: same contract.
    unsafe {
        cuOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks, func, blockSize, dynamicSMemSize)
    }
}

fn potential_block_size(
    min_grid: *mut c_int,
    block_size: *mut c_int,
    func: CUfunction,
    to_dynamic: CUoccupancyB2DSize,
    dynamic: usize,
    limit: c_int,
) -> CuResult<()> {
    let rt = rt()?;
    let f = function(func)?;
    if min_grid.is_null() || block_size.is_null() || limit < 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut top = f.max_block() as c_int;
    if limit > 0 {
        top = top.min(limit);
    }
    let mut best = (0, 0, 0);
    let mut size = top;
    while size > 0 {
        let dyn_bytes = match to_dynamic {
            // SAFETY: the program's callback, called as the driver calls it.
            Some(cb) => unsafe { cb(size) },
            None => dynamic,
        };
        let blocks = active_blocks(&f, size, dyn_bytes)?;
        if blocks * size > best.0 {
            best = (blocks * size, size, blocks);
        }
        size = if size % 32 == 0 {
            size - 32
        } else {
            size / 32 * 32
        };
    }
    let sms = rt
        .node
        .device_info(if f.device == ANY_DEVICE {
            0
        } else {
            f.device as u32
        })
        .map(|i| i.sms as c_int)
        .unwrap_or(132);
    // SAFETY: both checked non-null above; writable by the caller's contract.
    unsafe {
        min_grid.write(best.2 * sms);
        block_size.write(best.1);
    }
    Ok(())
}

/// `cuOccupancyMaxPotentialBlockSize` and its `WithFlags` twin: one parameter list and
/// one body (`potential_block_size`); the flags change nothing here.
macro_rules! potential_block_size_exports {
    ($($(#[$attr:meta])* fn $name:ident($($flags:ident: $fty:ty)?);)*) => {$(
        $(#[$attr])*
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            minGridSize: *mut c_int,
            blockSize: *mut c_int,
            func: CUfunction,
            blockSizeToDynamicSMemSize: CUoccupancyB2DSize,
            dynamicSMemSize: usize,
            blockSizeLimit: c_int,
            $($flags: $fty,)?
        ) -> CUresult {
            guard(|| {
                potential_block_size(
                    minGridSize,
                    blockSize,
                    func,
                    blockSizeToDynamicSMemSize,
                    dynamicSMemSize,
                    blockSizeLimit,
                )
            })
        }
    )*};
}

potential_block_size_exports! {
    /// `cuOccupancyMaxPotentialBlockSize`: the block size with the most resident threads
    /// per SM, and the grid that fills the device with it.
    ///
    /// # Safety
    /// `minGridSize` and `blockSize` must be null or writable; the callback, if any,
    /// callable.
    fn cuOccupancyMaxPotentialBlockSize();

    /// `cuOccupancyMaxPotentialBlockSizeWithFlags`.
    ///
    /// # Safety
    /// As `cuOccupancyMaxPotentialBlockSize`.
    fn cuOccupancyMaxPotentialBlockSizeWithFlags(_flags: c_uint);
}

/// `cuOccupancyAvailableDynamicSMemPerBlock`.
///
/// # Safety
/// `dynamicSmemSize` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyAvailableDynamicSMemPerBlock(
    dynamicSmemSize: *mut usize,
    func: CUfunction,
    numBlocks: c_int,
    blockSize: c_int,
) -> CUresult {
    guard(|| {
        rt()?;
        let f = function(func)?;
        if numBlocks <= 0 || blockSize <= 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        if active_blocks(&f, blockSize, 0)? < numBlocks {
            // SAFETY: the caller passes a writable pointer or null (rejected).
            return unsafe { put(dynamicSmemSize, 0) };
        }
        let per_block = (SHARED_PER_SM / numBlocks as u64 / 1024 * 1024)
            .min(SHARED_PER_BLOCK_OPTIN as u64)
            .saturating_sub(u64::from(f.shared.unwrap_or(0)));
        // SAFETY: as above.
        unsafe { put(dynamicSmemSize, per_block as usize) }
    })
}

/// Largest thread block cluster: 8 blocks portably, 16 on an H100 when the kernel allows
/// non-portable sizes.
fn max_cluster(f: &Function) -> c_int {
    if f.non_portable_cluster.load(Ordering::Relaxed) != 0 {
        16
    } else {
        8
    }
}

/// The cluster size a launch configuration asks for (1 without the attribute).
///
/// # Safety
/// `config` must be null or a valid `CUlaunchConfig` with `numAttrs` attributes.
unsafe fn cluster_of<'a>(config: *const CUlaunchConfig) -> CuResult<(&'a CUlaunchConfig, u64)> {
    // SAFETY: the caller's contract.
    let c: &CUlaunchConfig =
        unsafe { config.as_ref() }.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    if c.numAttrs > 0 && c.attrs.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut size = 1u64;
    for i in 0..c.numAttrs as usize {
        // SAFETY: `numAttrs` attributes at `attrs`.
        let a = unsafe { &*c.attrs.add(i) };
        if a.id == CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION {
            // SAFETY: for this id the union holds `clusterDim`.
            let d = unsafe { a.value.clusterDim };
            size = u64::from(d.x.max(1)) * u64::from(d.y.max(1)) * u64::from(d.z.max(1));
        }
    }
    Ok((c, size))
}

/// `cuOccupancyMaxPotentialClusterSize`: 8, or 16 with non-portable sizes allowed, fewer
/// when the blocks of a cluster would not fit on the SMs of a GPC (an H100 has 16 or 18).
///
/// # Safety
/// `clusterSize` must be null or writable; `config` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxPotentialClusterSize(
    clusterSize: *mut c_int,
    func: CUfunction,
    config: *const CUlaunchConfig,
) -> CUresult {
    guard(|| {
        rt()?;
        let f = function(func)?;
        // SAFETY: the caller's contract.
        let (c, _) = unsafe { cluster_of(config) }?;
        let block = (u64::from(c.blockDimX) * u64::from(c.blockDimY) * u64::from(c.blockDimZ))
            .min(i32::MAX as u64) as c_int;
        let per_sm = active_blocks(&f, block, c.sharedMemBytes as usize)?;
        let size = if per_sm == 0 { 0 } else { max_cluster(&f) };
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(clusterSize, size) }
    })
}

/// `cuOccupancyMaxActiveClusters`: clusters of the configured size that fit on the device
/// at once.
///
/// # Safety
/// `numClusters` must be null or writable; `config` null or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuOccupancyMaxActiveClusters(
    numClusters: *mut c_int,
    func: CUfunction,
    config: *const CUlaunchConfig,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let f = function(func)?;
        // SAFETY: the caller's contract.
        let (c, size) = unsafe { cluster_of(config) }?;
        if size > max_cluster(&f) as u64 {
            return Err(CUresult::CUDA_ERROR_INVALID_CLUSTER_SIZE);
        }
        let block = (u64::from(c.blockDimX) * u64::from(c.blockDimY) * u64::from(c.blockDimZ))
            .min(i32::MAX as u64) as c_int;
        let per_sm = active_blocks(&f, block, c.sharedMemBytes as usize)? as u64;
        let device = if f.device == ANY_DEVICE {
            0
        } else {
            f.device as u32
        };
        let sms = rt
            .node
            .device_info(device)
            .map_or(132, |i| u64::from(i.sms));
        let n = (per_sm * sms / size).min(i32::MAX as u64) as c_int;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(numClusters, n) }
    })
}

/// `cuKernelGetAttribute`: as `cuFuncGetAttribute` (`dev` must be a visible device).
///
/// # Safety
/// `pi` must be null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: *mut c_int,
    attrib: CUfunction_attribute,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        let d = rt.device(dev)?.index;
        let f = function(kernel as CUfunction)?;
        let arch = MODULES
            .get(f.module)
            .and_then(|m| m.code.contents().ok().and_then(|c| c.arch))
            .or_else(|| {
                LIBRARIES
                    .get(f.library)
                    .and_then(|l| l.code.contents().ok().and_then(|c| c.arch))
            })
            .unwrap_or_else(|| arch_of(rt, d));
        let v = attribute(&f, attrib, arch)?;
        // SAFETY: the caller passes a writable pointer or null (rejected).
        unsafe { put(pi, v) }
    })
}

/// `cuKernelSetAttribute`: as `cuFuncSetAttribute`, for every device.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelSetAttribute(
    attrib: CUfunction_attribute,
    val: c_int,
    kernel: CUkernel,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        rt.device(dev)?;
        set_attribute(&*function(kernel as CUfunction)?, attrib, val)
    })
}

/// `cuKernelSetCacheConfig`: accepted, no effect.
///
/// # Safety
/// No pointer arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelSetCacheConfig(
    kernel: CUkernel,
    config: CUfunc_cache,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        rt.device(dev)?;
        check_cache_config(kernel as CUfunction, config)
    })
}
