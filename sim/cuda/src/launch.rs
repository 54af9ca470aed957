//! Kernel launches: `cuLaunchKernel`, `cuLaunchKernelEx`, `cuLaunchCooperativeKernel`,
//! `cuLaunchCooperativeKernelMultiDevice`, `cuLaunchHostFunc`. A launch queues the
//! kernel's simulated duration on its stream's device engine and returns at once: the
//! explicit duration of a simulated module's kernel, or for a real kernel (cubin, PTX, fat
//! binary) the model `base + grid threads × per-thread cost` (`TESSERA_SIM_KERNEL_TIME`,
//! see `tessera_sim::module::KernelTime`).

use std::ffi::{c_uint, c_void};

use tessera_ffi::cuda::*;
use tessera_sim::clock::sleep_until;

use crate::module::{ANY_DEVICE, function};
use crate::runtime::{Runtime, rt};
use crate::stream::{Target, resolve};
use crate::{CuResult, get, guard};

/// A launch's shape.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub grid: [c_uint; 3],
    pub block: [c_uint; 3],
    pub shared: c_uint,
}

/// The [`Shape`] of any of the driver's parameter structs that spell it out field by
/// field (`CUlaunchConfig`, `CUDA_LAUNCH_PARAMS`, the kernel node parameters of both
/// versions): the same field names in different types.
macro_rules! shape_of {
    ($p:expr) => {
        $crate::launch::Shape {
            grid: [$p.gridDimX, $p.gridDimY, $p.gridDimZ],
            block: [$p.blockDimX, $p.blockDimY, $p.blockDimZ],
            shared: $p.sharedMemBytes,
        }
    };
}
pub(crate) use shape_of;

impl Shape {
    /// Checks the limits the device enforces (an H100's) and returns the block count.
    #[inline]
    pub fn blocks(&self) -> CuResult<u64> {
        let [gx, gy, gz] = self.grid;
        let [bx, by, bz] = self.block;
        let threads = u64::from(bx) * u64::from(by) * u64::from(bz);
        if gx == 0
            || gy == 0
            || gz == 0
            || gx > i32::MAX as u32
            || gy > 65535
            || gz > 65535
            || threads == 0
            || threads > 1024
            || bz > 64
            || self.shared > 227 << 10
        {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Ok(u64::from(gx) * u64::from(gy) * u64::from(gz))
    }

    /// Threads per block.
    #[inline]
    pub fn threads(&self) -> u64 {
        self.block.iter().map(|d| u64::from(*d)).product()
    }
}

/// Validates everything about a launch without queuing it; returns the target stream and
/// the kernel's duration.
#[allow(clippy::too_many_arguments)]
#[inline]
fn prepare(
    rt: &Runtime,
    f: CUfunction,
    shape: &Shape,
    stream: CUstream,
    per_thread: bool,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    cooperative: bool,
) -> CuResult<(Target, u64)> {
    let func = function(f)?;
    let t = resolve(stream, per_thread)?;
    let device = t.ctx().device;
    if func.device != ANY_DEVICE && func.device != device {
        return Err(CUresult::CUDA_ERROR_INVALID_HANDLE);
    }
    if !params.is_null() && !extra.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let blocks = shape.blocks()?;
    if shape.threads() > u64::from(func.max_block()) {
        // More threads than the kernel's registers (or its .maxntid) allow per block.
        return Err(CUresult::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
    }
    if cooperative {
        let sms = rt
            .node
            .device_info(device as u32)
            .map(|i| u64::from(i.sms))
            .unwrap_or(1);
        // One block per SM slot the kernel could occupy at once (32 per SM).
        if blocks > sms * 32 {
            return Err(CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
        }
    }
    Ok((t, func.cost.launch(blocks, shape.threads())))
}

#[allow(clippy::too_many_arguments)]
#[inline]
fn launch(
    f: CUfunction,
    shape: Shape,
    stream: CUstream,
    per_thread: bool,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    cooperative: bool,
) -> CuResult<()> {
    let rt = rt()?;
    let (t, duration) = prepare(
        rt,
        f,
        &shape,
        stream,
        per_thread,
        params,
        extra,
        cooperative,
    )?;
    rt.costs.pay_launch();
    t.submit(rt, duration).map(|_| ())
}

/// The `extra` argument of a launch entry point: the parameter when it has one
/// (`cuLaunchKernel`), else none (`cuLaunchCooperativeKernel` takes no `extra`).
macro_rules! extra_or_null {
    () => {
        std::ptr::null_mut()
    };
    ($extra:ident) => {
        $extra
    };
}

/// The `cuLaunchKernel` family: the same parameters (`extra` only where the entry point
/// takes it, named in the parentheses), per-thread default stream or not, cooperative or
/// not.
macro_rules! launch_kernel {
    ($($(#[$doc:meta])* $name:ident($($extra:ident)?), $ptsz:expr, $coop:expr;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// Kernel arguments are not read (no code runs); handles are checked.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            f: CUfunction,
            gridDimX: c_uint,
            gridDimY: c_uint,
            gridDimZ: c_uint,
            blockDimX: c_uint,
            blockDimY: c_uint,
            blockDimZ: c_uint,
            sharedMemBytes: c_uint,
            hStream: CUstream,
            kernelParams: *mut *mut c_void,
            $($extra: *mut *mut c_void,)?
        ) -> CUresult {
            guard(|| {
                let shape = Shape {
                    grid: [gridDimX, gridDimY, gridDimZ],
                    block: [blockDimX, blockDimY, blockDimZ],
                    shared: sharedMemBytes,
                };
                let extra = extra_or_null!($($extra)?);
                launch(f, shape, hStream, $ptsz, kernelParams, extra, $coop)
            })
        }
    )*};
}

launch_kernel! {
    /// `cuLaunchKernel`.
    cuLaunchKernel(extra), false, false;
    /// `cuLaunchKernel_ptsz`.
    cuLaunchKernel_ptsz(extra), true, false;
    /// `cuLaunchCooperativeKernel`: the grid must fit on the device at once.
    cuLaunchCooperativeKernel(), false, true;
    /// `cuLaunchCooperativeKernel_ptsz`.
    cuLaunchCooperativeKernel_ptsz(), true, true;
}

fn launch_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    per_thread: bool,
) -> CuResult<()> {
    // SAFETY: the caller passes null (rejected) or a valid CUlaunchConfig.
    let c = unsafe { get(config) }?;
    if c.numAttrs > 0 && c.attrs.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    let mut cooperative = false;
    for i in 0..c.numAttrs as usize {
        // SAFETY: the config holds `numAttrs` attributes at `attrs`.
        let a = unsafe { &*c.attrs.add(i) };
        if a.id == CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE {
            // SAFETY: for this attribute id the union holds `cooperative`.
            cooperative = unsafe { a.value.cooperative } != 0;
        }
    }
    let shape = shape_of!(c);
    launch(f, shape, c.hStream, per_thread, params, extra, cooperative)
}

crate::ptsz_exports! {
    /// `cuLaunchKernelEx`: the cooperative attribute is honoured; others are accepted.
    ///
    /// # Safety
    /// `config` must be null or valid with `numAttrs` attributes.
    fn cuLaunchKernelEx / cuLaunchKernelEx_ptsz [per_thread](
        config: *const CUlaunchConfig,
        f: CUfunction,
        kernelParams: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> CUresult {
        guard(|| launch_ex(config, f, kernelParams, extra, per_thread))
    }
}

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated, still exported): every launch is
/// validated before any is queued.
///
/// # Safety
/// `launchParamsList` must point to `numDevices` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchCooperativeKernelMultiDevice(
    launchParamsList: *mut CUDA_LAUNCH_PARAMS,
    numDevices: c_uint,
    flags: c_uint,
) -> CUresult {
    guard(|| {
        let rt = rt()?;
        if launchParamsList.is_null() || numDevices == 0 || flags & !0x3 != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let mut ready = Vec::with_capacity(numDevices as usize);
        for i in 0..numDevices as usize {
            // SAFETY: the caller passes `numDevices` entries.
            let p = unsafe { &*launchParamsList.add(i) };
            let shape = shape_of!(p);
            let prepared = prepare(
                rt,
                p.function,
                &shape,
                p.hStream,
                false,
                p.kernelParams,
                std::ptr::null_mut(),
                true,
            )?;
            if ready
                .iter()
                .any(|(t, _): &(Target, u64)| t.ctx().device == prepared.0.ctx().device)
            {
                // One launch per device.
                return Err(CUresult::CUDA_ERROR_INVALID_DEVICE);
            }
            ready.push(prepared);
        }
        for (t, d) in ready {
            rt.costs.pay_launch();
            t.submit(rt, d)?;
        }
        Ok(())
    })
}

fn host_func(stream: CUstream, f: CUhostFn, user: *mut c_void, per_thread: bool) -> CuResult<()> {
    let rt = rt()?;
    let f = f.ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)?;
    let t = resolve(stream, per_thread)?;
    rt.check_device(t.ctx().device)?;
    // Run in order after the stream's queued work. The call is made here, synchronously,
    // so later work on the stream cannot complete before it has run.
    sleep_until(t.last_end());
    // SAFETY: calling the program's host function with its own user data, as the driver
    // does; the function's contract is the program's.
    unsafe { f(user) };
    Ok(())
}

crate::ptsz_exports! {
    /// `cuLaunchHostFunc`: runs `fn(userData)` once the stream's earlier work has ended
    /// (the calling thread waits for that; see docs/simulator.md).
    ///
    /// # Safety
    /// `fn_` must be a valid host function for `userData`.
    fn cuLaunchHostFunc / cuLaunchHostFunc_ptsz [per_thread](
        hStream: CUstream,
        fn_: CUhostFn,
        userData: *mut c_void,
    ) -> CUresult {
        guard(|| host_func(hStream, fn_, userData, per_thread))
    }
}
