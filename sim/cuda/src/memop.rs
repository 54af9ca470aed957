//! Stream memory operations: `cuStreamWriteValue32` and `cuStreamWaitValue32` (with their
//! `_v2` and `_ptsz` ABIs), and `cuStreamBatchMemOp`, which is not supported.
//!
//! PyTorch looks these up through `cudaGetDriverEntryPoint` when it initialises CUDA; a
//! lookup that fails leaves `cudaErrorSymbolNotFound` as the runtime's last error, which
//! PyTorch's next error check then reports. So they exist, doing what the simulator can.

use std::ffi::c_uint;

use tessera_ffi::cuda::*;

use crate::runtime::rt;
use crate::{CuResult, guard};

/// A 32-bit stream memory operation's operands, as both calls take them (`pt`: the
/// per-thread default stream's ABI).
struct Value32 {
    stream: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: c_uint,
    pt: bool,
}

/// Checks that `addr` is 4 aligned bytes of device memory, then waits until the work
/// queued on `stream` so far has ended: the start of a stream memory operation.
fn after_stream_work(stream: CUstream, addr: CUdeviceptr, pt: bool) -> CuResult<()> {
    let t = crate::stream::resolve(stream, pt)?;
    crate::memory::check_device_range(addr, 4)?;
    if !addr.is_multiple_of(4) {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    tessera_sim::clock::sleep_until(t.last_end());
    Ok(())
}

/// `cuStreamWriteValue32`: writes `value` at `addr` once the stream's earlier work has
/// ended (the calling thread waits for that, as `cuLaunchHostFunc` does here).
fn write_value32(op: Value32) -> CuResult<()> {
    rt()?;
    if op.flags & !1 != 0 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    after_stream_work(op.stream, op.addr, op.pt)?;
    // SAFETY: 4 aligned bytes of live device memory (checked above), mapped read-write in
    // this process.
    unsafe { (op.addr as *mut u32).write_volatile(op.value) };
    Ok(())
}

/// `cuStreamWriteValue32` and `cuStreamWaitValue32` (each with `_v2`, `_ptsz`): the same
/// parameters, one body `$op` (`write_value32`, `wait_value32`), per-thread stream or not.
macro_rules! value32 {
    ($op:ident: $($name:ident $pt:expr;)*) => {$(
        #[doc = concat!("`", stringify!($name), "` (see `", stringify!($op), "`).")]
        ///
        /// # Safety
        /// No pointer arguments are dereferenced unchecked.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(stream: CUstream, addr: CUdeviceptr, value: cuuint32_t, flags: c_uint) -> CUresult {
            guard(|| $op(Value32 { stream, addr, value, flags, pt: $pt }))
        }
    )*};
}

value32! {
    write_value32:
    cuStreamWriteValue32 false;
    cuStreamWriteValue32_v2 false;
    cuStreamWriteValue32_ptsz true;
    cuStreamWriteValue32_v2_ptsz true;
}

/// `cuStreamWaitValue32`: once the stream's earlier work has ended, the calling thread
/// waits until the 32-bit value at `addr` satisfies the condition (`>=`, `==`, `& != 0`,
/// `!(a | b)`), as a stream would before running later work; at most 10 s, then
/// `CUDA_ERROR_TIMEOUT` (a real stream would hang; a host thread here must not).
fn wait_value32(op: Value32) -> CuResult<()> {
    rt()?;
    let cond = op.flags & !(1 << 30);
    if cond > 3 {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    after_stream_work(op.stream, op.addr, op.pt)?;
    let holds = || {
        // SAFETY: 4 aligned bytes of live device memory (checked above), mapped in this
        // process; another thread or process may write them, hence volatile.
        let v = unsafe { (op.addr as *const u32).read_volatile() };
        match cond {
            0 => (v as i32).wrapping_sub(op.value as i32) >= 0,
            1 => v == op.value,
            2 => v & op.value != 0,
            _ => !(v | op.value) != 0,
        }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !holds() {
        if std::time::Instant::now() > deadline {
            return Err(CUresult::CUDA_ERROR_TIMEOUT);
        }
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
    Ok(())
}

value32! {
    wait_value32:
    cuStreamWaitValue32 false;
    cuStreamWaitValue32_v2 false;
    cuStreamWaitValue32_ptsz true;
    cuStreamWaitValue32_v2_ptsz true;
}

/// `cuStreamBatchMemOp`: not supported (use `cuStreamWriteValue32`/`cuStreamWaitValue32`).
///
/// # Safety
/// No pointer is dereferenced.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamBatchMemOp(
    _stream: CUstream,
    _count: c_uint,
    _paramArray: *mut CUstreamBatchMemOpParams,
    _flags: c_uint,
) -> CUresult {
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}
