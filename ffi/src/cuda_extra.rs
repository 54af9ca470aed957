//! Driver API macros of `cuda.h` that bindgen cannot translate (pointer casts).

use crate::cuda::{CUdevice, CUstream};

/// `CU_STREAM_LEGACY`: the legacy default stream, usable from any context.
pub const CU_STREAM_LEGACY: CUstream = 0x1 as CUstream;
/// `CU_STREAM_PER_THREAD`: the calling thread's per-thread default stream.
pub const CU_STREAM_PER_THREAD: CUstream = 0x2 as CUstream;

/// `CU_LAUNCH_PARAM_END`: ends the `extra` array of `cuLaunchKernel`.
pub const CU_LAUNCH_PARAM_END: usize = 0x00;
/// `CU_LAUNCH_PARAM_BUFFER_POINTER`: the next `extra` entry points to the packed arguments.
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
/// `CU_LAUNCH_PARAM_BUFFER_SIZE`: the next `extra` entry points to a `size_t` buffer size.
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;

/// `CU_DEVICE_CPU`: the host, where a device ordinal is expected (e.g. prefetch).
pub const CU_DEVICE_CPU: CUdevice = -1;
/// `CU_DEVICE_INVALID`: no device.
pub const CU_DEVICE_INVALID: CUdevice = -2;
