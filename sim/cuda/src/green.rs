//! Green contexts (SM partitions of a device): not simulated. PyTorch resolves these by
//! name when it initialises CUDA and takes `CUDA_ERROR_NOT_SUPPORTED` as "no green
//! contexts here".

use std::ffi::{c_int, c_uint};

use tessera_ffi::cuda::*;

/// Green contexts (SM partitions) are not simulated: every call is
/// `CUDA_ERROR_NOT_SUPPORTED`, which PyTorch takes as "no green contexts here".
macro_rules! no_green_contexts {
    ($($name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: `CUDA_ERROR_NOT_SUPPORTED` (no green contexts).")]
        ///
        /// # Safety
        /// No pointer is dereferenced.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            $(let _ = $arg;)*
            CUresult::CUDA_ERROR_NOT_SUPPORTED
        }
    )*};
}

no_green_contexts! {
    cuCtxFromGreenCtx(pContext: *mut CUcontext, hCtx: CUgreenCtx);
    cuGreenCtxCreate(phCtx: *mut CUgreenCtx, desc: CUdevResourceDesc, dev: CUdevice, flags: c_uint);
    cuGreenCtxDestroy(hCtx: CUgreenCtx);
    cuGreenCtxStreamCreate(phStream: *mut CUstream, greenCtx: CUgreenCtx, flags: c_uint, priority: c_int);
    cuDevSmResourceSplitByCount(result: *mut CUdevResource, nbGroups: *mut c_uint, input: *const CUdevResource, remaining: *mut CUdevResource, useFlags: c_uint, minCount: c_uint);
    cuDeviceGetDevResource(dev: CUdevice, result: *mut CUdevResource, type_: CUdevResourceType);
    cuDevResourceGenerateDesc(phDesc: *mut CUdevResourceDesc, resources: *mut CUdevResource, nbResources: c_uint);
}
