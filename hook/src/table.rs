//! The one list of functions the shim governs. It generates the exported
//! wrappers, the table of the real libraries' entry points, and what the
//! `dlsym` and `cuGetProcAddress` routes look up, so the three routes in can
//! never disagree about what is governed.
//!
//! Each governed entry names the exported symbol, its C signature, the base
//! name and CUDA version under which `cuGetProcAddress` hands it out (with
//! `ptsz` for the per-thread-default-stream flavour), and NVIDIA's `PFN_*`
//! typedef, which a compile-time check holds the signature to. The wrapper
//! body is the function of the same name in `crate::cuda` or `crate::nvml`.
//!
//! The table of real entry points lives here, beside the list that sizes
//! it; `crate::driver` below it only finds the real `dlsym` and opens a
//! library by name, knowing nothing of the list.
//!
//! The `used` entries are driver functions the hook calls for itself
//! (device UUIDs, the current context) without governing them.

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::ptr::null_mut;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::driver;
use tessera_ffi::hip::*;
use tessera_ffi::rocm_smi::{rsmi_process_info_t, rsmi_status_t};

use tessera_ffi::cuda::*;
use tessera_ffi::nvml::{
    nvmlDevice_t, nvmlMemory_t, nvmlMemory_v2_t, nvmlProcessInfo_t, nvmlProcessInfo_v1_t,
    nvmlProcessUtilizationSample_t, nvmlReturn_t, nvmlUtilization_t,
};

/// Which real library a symbol lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lib {
    Cuda,
    Nvml,
    /// AMD's HIP runtime (or Hygon's, which speaks the same API).
    Hip,
    /// AMD's ROCm SMI: what the driver holds for this process (settling a
    /// HIP context's charge, hip/context.rs).
    Rsmi,
}

impl Lib {
    /// The soname the hook opens.
    pub fn soname(self) -> &'static CStr {
        match self {
            Lib::Cuda => c"libcuda.so.1",
            Lib::Nvml => c"libnvidia-ml.so.1",
            Lib::Hip => c"libamdhip64.so.5",
            Lib::Rsmi => c"librocm_smi64.so.5",
        }
    }

    /// Every soname the hook tries, in order: Hygon's DTK ships the same
    /// API as `libgalaxyhip.so.5`.
    pub fn sonames(self) -> &'static [&'static CStr] {
        match self {
            Lib::Cuda => &[c"libcuda.so.1"],
            Lib::Nvml => &[c"libnvidia-ml.so.1"],
            Lib::Hip => &[c"libamdhip64.so.5", c"libgalaxyhip.so.5"],
            Lib::Rsmi => &[c"librocm_smi64.so.5"],
        }
    }
}

macro_rules! lib_of {
    (cuda) => {
        Lib::Cuda
    };
    (nvml) => {
        Lib::Nvml
    };
    (hip) => {
        Lib::Hip
    };
    (rsmi) => {
        Lib::Rsmi
    };
}

macro_rules! per_thread {
    () => {
        false
    };
    (ptsz) => {
        true
    };
}

/// Holds an export to NVIDIA's own typedef: a mismatch fails to compile.
macro_rules! abi_check {
    ($name:ident) => {};
    ($name:ident, $pfn:ident) => {
        const _: $pfn = Some(exports::$name);
    };
}

macro_rules! symbols {
    (
        governed {
            $(
                $lib:ident fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty
                    [$base:literal @ $ver:literal $($pt:ident)?] $(: $pfn:ident)? ;
            )*
        }
        used {
            $(
                $ulib:ident fn $uname:ident ( $($uarg:ident : $uty:ty),* $(,)? ) -> $uret:ty ;
            )*
        }
    ) => {
        /// Every symbol the hook resolves in the real libraries.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Sym {
            $($name,)*
            $($uname,)*
        }

        impl Sym {
            /// All symbols, governed ones first, in declaration order.
            pub const ALL: &'static [Sym] = &[$(Sym::$name,)* $(Sym::$uname,)*];

            /// Position in [`Sym::ALL`] and in the table of real entry points.
            pub const fn index(self) -> usize {
                self as usize
            }

            pub fn name(self) -> &'static str {
                match self {
                    $(Sym::$name => stringify!($name),)*
                    $(Sym::$uname => stringify!($uname),)*
                }
            }

            pub fn c_name(self) -> &'static CStr {
                let with_nul: &'static str = match self {
                    $(Sym::$name => concat!(stringify!($name), "\0"),)*
                    $(Sym::$uname => concat!(stringify!($uname), "\0"),)*
                };
                // Every literal above ends in its only NUL.
                CStr::from_bytes_with_nul(with_nul.as_bytes()).unwrap_or(c"")
            }

            pub fn lib(self) -> Lib {
                match self {
                    $(Sym::$name => lib_of!($lib),)*
                    $(Sym::$uname => lib_of!($ulib),)*
                }
            }

            /// Whether the shim exports a wrapper for this symbol.
            pub fn governed(self) -> bool {
                match self {
                    $(Sym::$name => true,)*
                    $(Sym::$uname => false,)*
                }
            }

            /// The name `cuGetProcAddress` is asked for (`cuMemAlloc` for
            /// `cuMemAlloc_v2`).
            pub fn base(self) -> &'static str {
                match self {
                    $(Sym::$name => $base,)*
                    $(Sym::$uname => stringify!($uname),)*
                }
            }

            /// The CUDA version that introduced this ABI of [`Sym::base`].
            pub fn version(self) -> u32 {
                match self {
                    $(Sym::$name => $ver,)*
                    $(Sym::$uname => 0,)*
                }
            }

            /// Whether this is the per-thread-default-stream flavour.
            pub fn per_thread(self) -> bool {
                match self {
                    $(Sym::$name => per_thread!($($pt)?),)*
                    $(Sym::$uname => false,)*
                }
            }

            /// The shim's exported wrapper; null for symbols it only uses.
            pub fn wrapper(self) -> *mut c_void {
                match self {
                    $(Sym::$name => exports::$name as *mut c_void,)*
                    $(Sym::$uname => std::ptr::null_mut(),)*
                }
            }

            /// The governed symbol with exactly this exported name.
            pub fn governed_by_name(name: &[u8]) -> Option<Sym> {
                let name = std::str::from_utf8(name).ok()?;
                match name {
                    $(stringify!($name) => Some(Sym::$name),)*
                    _ => None,
                }
            }
        }

        /// Typed access to the real entry points: `None` when the real
        /// library lacks the symbol or cannot be loaded.
        #[allow(non_snake_case, clippy::missing_transmute_annotations)]
        pub mod real {
            use super::*;
            $(
                #[inline(always)]
                pub fn $name() -> Option<unsafe extern "C" fn($($ty),*) -> $ret> {
                    let p = entry(Sym::$name);
                    // SAFETY: `p` is null or what the real library's dlsym
                    // returned for exactly this name, whose C signature is
                    // the one declared here (held to NVIDIA's typedef by
                    // `abi_check!` where one exists); a null pointer is None.
                    unsafe { std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn($($ty),*) -> $ret>>(p) }
                }
            )*
            $(
                #[inline(always)]
                pub fn $uname() -> Option<unsafe extern "C" fn($($uty),*) -> $uret> {
                    let p = entry(Sym::$uname);
                    // SAFETY: as above.
                    unsafe { std::mem::transmute::<*mut c_void, Option<unsafe extern "C" fn($($uty),*) -> $uret>>(p) }
                }
            )*
        }

        /// The exported wrappers. Each runs its body inside `catch_unwind`.
        #[allow(non_snake_case)]
        pub mod exports {
            use super::*;
            $(
                /// Governed by Tessera; see `docs/hook.md`.
                ///
                /// # Safety
                ///
                /// As for the driver function of the same name.
                #[unsafe(no_mangle)]
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                    crate::guard(move || {
                        // SAFETY: the caller upholds the driver's contract
                        // for this function; the body passes it on.
                        unsafe { crate::$lib::$name($($arg),*) }
                    })
                }
                abi_check!($name $(, $pfn)?);
            )*
        }
    };
}

symbols! {
    governed {
        // Initialisation and the cuGetProcAddress route.
        cuda fn cuInit(flags: c_uint) -> CUresult ["cuInit" @ 2000]: PFN_cuInit_v2000;
        cuda fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: cuuint64_t) -> CUresult
            ["cuGetProcAddress" @ 11030]: PFN_cuGetProcAddress_v11030;
        cuda fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, cuda_version: c_int, flags: cuuint64_t, status: *mut CUdriverProcAddressQueryResult) -> CUresult
            ["cuGetProcAddress" @ 12000]: PFN_cuGetProcAddress_v12000;

        // The container's view of memory.
        cuda fn cuDeviceTotalMem(bytes: *mut c_uint, dev: CUdevice) -> CUresult ["cuDeviceTotalMem" @ 2000]: PFN_cuDeviceTotalMem_v2000;
        cuda fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult ["cuDeviceTotalMem" @ 3020]: PFN_cuDeviceTotalMem_v3020;
        cuda fn cuMemGetInfo(free: *mut c_uint, total: *mut c_uint) -> CUresult ["cuMemGetInfo" @ 2000]: PFN_cuMemGetInfo_v2000;
        cuda fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult ["cuMemGetInfo" @ 3020]: PFN_cuMemGetInfo_v3020;

        // Contexts, each charged the control file's context overhead.
        cuda fn cuCtxCreate(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult ["cuCtxCreate" @ 2000]: PFN_cuCtxCreate_v2000;
        cuda fn cuCtxCreate_v2(pctx: *mut CUcontext, flags: c_uint, dev: CUdevice) -> CUresult ["cuCtxCreate" @ 3020]: PFN_cuCtxCreate_v3020;
        cuda fn cuCtxCreate_v3(pctx: *mut CUcontext, params: *mut CUexecAffinityParam, num_params: c_int, flags: c_uint, dev: CUdevice) -> CUresult
            ["cuCtxCreate" @ 11040]: PFN_cuCtxCreate_v11040;
        cuda fn cuCtxCreate_v4(pctx: *mut CUcontext, params: *mut CUctxCreateParams, flags: c_uint, dev: CUdevice) -> CUresult
            ["cuCtxCreate" @ 12050]: PFN_cuCtxCreate_v12050;
        cuda fn cuCtxDestroy(ctx: CUcontext) -> CUresult ["cuCtxDestroy" @ 2000]: PFN_cuCtxDestroy_v2000;
        cuda fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult ["cuCtxDestroy" @ 4000]: PFN_cuCtxDestroy_v4000;
        cuda fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult ["cuDevicePrimaryCtxRetain" @ 7000]: PFN_cuDevicePrimaryCtxRetain_v7000;
        cuda fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult ["cuDevicePrimaryCtxRelease" @ 7000]: PFN_cuDevicePrimaryCtxRelease_v7000;
        cuda fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult ["cuDevicePrimaryCtxRelease" @ 11000]: PFN_cuDevicePrimaryCtxRelease_v11000;
        cuda fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult ["cuDevicePrimaryCtxReset" @ 7000]: PFN_cuDevicePrimaryCtxReset_v7000;
        cuda fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult ["cuDevicePrimaryCtxReset" @ 11000]: PFN_cuDevicePrimaryCtxReset_v11000;

        // Linear device memory.
        cuda fn cuMemAlloc(dptr: *mut CUdeviceptr_v1, bytesize: c_uint) -> CUresult ["cuMemAlloc" @ 2000]: PFN_cuMemAlloc_v2000;
        cuda fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult ["cuMemAlloc" @ 3020]: PFN_cuMemAlloc_v3020;
        cuda fn cuMemAllocPitch(dptr: *mut CUdeviceptr_v1, pitch: *mut c_uint, width: c_uint, height: c_uint, elem: c_uint) -> CUresult
            ["cuMemAllocPitch" @ 2000]: PFN_cuMemAllocPitch_v2000;
        cuda fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: c_uint) -> CUresult
            ["cuMemAllocPitch" @ 3020]: PFN_cuMemAllocPitch_v3020;
        cuda fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult ["cuMemAllocManaged" @ 6000]: PFN_cuMemAllocManaged_v6000;
        cuda fn cuMemFree(dptr: CUdeviceptr_v1) -> CUresult ["cuMemFree" @ 2000]: PFN_cuMemFree_v2000;
        cuda fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult ["cuMemFree" @ 3020]: PFN_cuMemFree_v3020;

        // Stream-ordered (pool) memory.
        cuda fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult ["cuMemAllocAsync" @ 11020]: PFN_cuMemAllocAsync_v11020;
        cuda fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult
            ["cuMemAllocAsync" @ 11020 ptsz]: PFN_cuMemAllocAsync_v11020_ptsz;
        cuda fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult
            ["cuMemAllocFromPoolAsync" @ 11020]: PFN_cuMemAllocFromPoolAsync_v11020;
        cuda fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult
            ["cuMemAllocFromPoolAsync" @ 11020 ptsz]: PFN_cuMemAllocFromPoolAsync_v11020_ptsz;
        cuda fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult ["cuMemFreeAsync" @ 11020]: PFN_cuMemFreeAsync_v11020;
        cuda fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult ["cuMemFreeAsync" @ 11020 ptsz]: PFN_cuMemFreeAsync_v11020_ptsz;
        cuda fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult ["cuMemPoolCreate" @ 11020]: PFN_cuMemPoolCreate_v11020;
        cuda fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult ["cuMemPoolDestroy" @ 11020]: PFN_cuMemPoolDestroy_v11020;
        cuda fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult
            ["cuDeviceGetDefaultMemPool" @ 11020]: PFN_cuDeviceGetDefaultMemPool_v11020;
        cuda fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult ["cuDeviceGetMemPool" @ 11020]: PFN_cuDeviceGetMemPool_v11020;

        cuda fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult ["cuMemPoolTrimTo" @ 11020]: PFN_cuMemPoolTrimTo_v11020;
        cuda fn cuMemPoolSetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void) -> CUresult
            ["cuMemPoolSetAttribute" @ 11020]: PFN_cuMemPoolSetAttribute_v11020;
        // Synchronisation: where pools give back what exceeds their threshold.
        cuda fn cuStreamSynchronize(stream: CUstream) -> CUresult ["cuStreamSynchronize" @ 2000]: PFN_cuStreamSynchronize_v2000;
        cuda fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult ["cuStreamSynchronize" @ 7000 ptsz]: PFN_cuStreamSynchronize_v7000_ptsz;
        cuda fn cuCtxSynchronize() -> CUresult ["cuCtxSynchronize" @ 2000]: PFN_cuCtxSynchronize_v2000;
        cuda fn cuEventSynchronize(event: CUevent) -> CUresult ["cuEventSynchronize" @ 2000]: PFN_cuEventSynchronize_v2000;

        // Graph memory: allocation nodes, mapped when a graph is launched.
        cuda fn cuGraphAddMemAllocNode(node: *mut CUgraphNode, graph: CUgraph, deps: *const CUgraphNode, ndeps: usize, params: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult
            ["cuGraphAddMemAllocNode" @ 11040]: PFN_cuGraphAddMemAllocNode_v11040;
        cuda fn cuGraphClone(clone: *mut CUgraph, graph: CUgraph) -> CUresult ["cuGraphClone" @ 10000]: PFN_cuGraphClone_v10000;
        cuda fn cuGraphDestroy(graph: CUgraph) -> CUresult ["cuGraphDestroy" @ 10000]: PFN_cuGraphDestroy_v10000;
        cuda fn cuGraphInstantiate(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, size: usize) -> CUresult
            ["cuGraphInstantiate" @ 10000]: PFN_cuGraphInstantiate_v10000;
        cuda fn cuGraphInstantiate_v2(exec: *mut CUgraphExec, graph: CUgraph, err: *mut CUgraphNode, log: *mut c_char, size: usize) -> CUresult
            ["cuGraphInstantiate" @ 11000]: PFN_cuGraphInstantiate_v11000;
        cuda fn cuGraphInstantiateWithFlags(exec: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong) -> CUresult
            ["cuGraphInstantiateWithFlags" @ 11040]: PFN_cuGraphInstantiateWithFlags_v11040;
        cuda fn cuGraphInstantiateWithParams(exec: *mut CUgraphExec, graph: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult
            ["cuGraphInstantiateWithParams" @ 12000]: PFN_cuGraphInstantiateWithParams_v12000;
        cuda fn cuGraphInstantiateWithParams_ptsz(exec: *mut CUgraphExec, graph: CUgraph, params: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult
            ["cuGraphInstantiateWithParams" @ 12000 ptsz]: PFN_cuGraphInstantiateWithParams_v12000_ptsz;
        cuda fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult ["cuGraphExecDestroy" @ 10000]: PFN_cuGraphExecDestroy_v10000;
        cuda fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult ["cuGraphUpload" @ 11010]: PFN_cuGraphUpload_v11010;
        cuda fn cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult ["cuGraphUpload" @ 11010 ptsz]: PFN_cuGraphUpload_v11010_ptsz;
        cuda fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult ["cuDeviceGraphMemTrim" @ 11040]: PFN_cuDeviceGraphMemTrim_v11040;

        // IPC and imported memory: counted once, at the exporter.
        cuda fn cuIpcGetMemHandle(handle: *mut CUipcMemHandle, dptr: CUdeviceptr) -> CUresult ["cuIpcGetMemHandle" @ 4010]: PFN_cuIpcGetMemHandle_v4010;
        cuda fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, kind: CUmemAllocationHandleType, flags: c_ulonglong) -> CUresult
            ["cuMemExportToShareableHandle" @ 10020]: PFN_cuMemExportToShareableHandle_v10020;
        cuda fn cuMemPoolExportToShareableHandle(handle_out: *mut c_void, pool: CUmemoryPool, kind: CUmemAllocationHandleType, flags: c_ulonglong) -> CUresult
            ["cuMemPoolExportToShareableHandle" @ 11020]: PFN_cuMemPoolExportToShareableHandle_v11020;
        cuda fn cuMemPoolImportFromShareableHandle(pool_out: *mut CUmemoryPool, handle: *mut c_void, kind: CUmemAllocationHandleType, flags: c_ulonglong) -> CUresult
            ["cuMemPoolImportFromShareableHandle" @ 11020]: PFN_cuMemPoolImportFromShareableHandle_v11020;
        cuda fn cuIpcOpenMemHandle(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CUresult
            ["cuIpcOpenMemHandle" @ 4010]: PFN_cuIpcOpenMemHandle_v4010;
        cuda fn cuIpcOpenMemHandle_v2(pdptr: *mut CUdeviceptr, handle: CUipcMemHandle, flags: c_uint) -> CUresult
            ["cuIpcOpenMemHandle" @ 11000]: PFN_cuIpcOpenMemHandle_v11000;
        cuda fn cuIpcCloseMemHandle(dptr: CUdeviceptr) -> CUresult ["cuIpcCloseMemHandle" @ 4010]: PFN_cuIpcCloseMemHandle_v4010;
        cuda fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, kind: CUmemAllocationHandleType) -> CUresult
            ["cuMemImportFromShareableHandle" @ 10020]: PFN_cuMemImportFromShareableHandle_v10020;

        // Virtual memory management: physical allocations.
        cuda fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: c_ulonglong) -> CUresult
            ["cuMemCreate" @ 10020]: PFN_cuMemCreate_v10020;
        cuda fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult ["cuMemRelease" @ 10020]: PFN_cuMemRelease_v10020;
        cuda fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: c_ulonglong) -> CUresult
            ["cuMemMap" @ 10020]: PFN_cuMemMap_v10020;
        cuda fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult ["cuMemUnmap" @ 10020]: PFN_cuMemUnmap_v10020;
        cuda fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> CUresult
            ["cuMemRetainAllocationHandle" @ 11000]: PFN_cuMemRetainAllocationHandle_v11000;

        // Arrays, sized from their descriptors.
        cuda fn cuArrayCreate(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1) -> CUresult ["cuArrayCreate" @ 2000]: PFN_cuArrayCreate_v2000;
        cuda fn cuArrayCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult ["cuArrayCreate" @ 3020]: PFN_cuArrayCreate_v3020;
        cuda fn cuArray3DCreate(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> CUresult ["cuArray3DCreate" @ 2000]: PFN_cuArray3DCreate_v2000;
        cuda fn cuArray3DCreate_v2(handle: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult ["cuArray3DCreate" @ 3020]: PFN_cuArray3DCreate_v3020;
        cuda fn cuArrayDestroy(handle: CUarray) -> CUresult ["cuArrayDestroy" @ 2000]: PFN_cuArrayDestroy_v2000;
        cuda fn cuMipmappedArrayCreate(handle: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: c_uint) -> CUresult
            ["cuMipmappedArrayCreate" @ 5000]: PFN_cuMipmappedArrayCreate_v5000;
        cuda fn cuMipmappedArrayDestroy(handle: CUmipmappedArray) -> CUresult ["cuMipmappedArrayDestroy" @ 5000]: PFN_cuMipmappedArrayDestroy_v5000;
        cuda fn cuMemMapArrayAsync(list: *mut CUarrayMapInfo, count: c_uint, stream: CUstream) -> CUresult
            ["cuMemMapArrayAsync" @ 11010]: PFN_cuMemMapArrayAsync_v11010;
        cuda fn cuMemMapArrayAsync_ptsz(list: *mut CUarrayMapInfo, count: c_uint, stream: CUstream) -> CUresult
            ["cuMemMapArrayAsync" @ 11010 ptsz]: PFN_cuMemMapArrayAsync_v11010_ptsz;

        // Work submission: each passes the compute gate first.
        cuda fn cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult
            ["cuLaunchKernel" @ 4000]: PFN_cuLaunchKernel_v4000;
        cuda fn cuLaunchKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult
            ["cuLaunchKernel" @ 7000 ptsz]: PFN_cuLaunchKernel_v7000_ptsz;
        cuda fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult
            ["cuLaunchKernelEx" @ 11060]: PFN_cuLaunchKernelEx_v11060;
        cuda fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) -> CUresult
            ["cuLaunchKernelEx" @ 11060 ptsz]: PFN_cuLaunchKernelEx_v11060_ptsz;
        cuda fn cuLaunchCooperativeKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult
            ["cuLaunchCooperativeKernel" @ 9000]: PFN_cuLaunchCooperativeKernel_v9000;
        cuda fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void) -> CUresult
            ["cuLaunchCooperativeKernel" @ 9000 ptsz]: PFN_cuLaunchCooperativeKernel_v9000_ptsz;
        cuda fn cuLaunchCooperativeKernelMultiDevice(list: *mut CUDA_LAUNCH_PARAMS, num_devices: c_uint, flags: c_uint) -> CUresult
            ["cuLaunchCooperativeKernelMultiDevice" @ 9000]: PFN_cuLaunchCooperativeKernelMultiDevice_v9000;
        cuda fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult ["cuGraphLaunch" @ 10000]: PFN_cuGraphLaunch_v10000;
        cuda fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult ["cuGraphLaunch" @ 10000 ptsz]: PFN_cuGraphLaunch_v10000_ptsz;
        cuda fn cuLaunch(f: CUfunction) -> CUresult ["cuLaunch" @ 2000]: PFN_cuLaunch_v2000;
        cuda fn cuLaunchGrid(f: CUfunction, width: c_int, height: c_int) -> CUresult ["cuLaunchGrid" @ 2000]: PFN_cuLaunchGrid_v2000;
        cuda fn cuLaunchGridAsync(f: CUfunction, width: c_int, height: c_int, stream: CUstream) -> CUresult ["cuLaunchGridAsync" @ 2000]: PFN_cuLaunchGridAsync_v2000;

        // NVML: initialisation (fails closed) and the memory view.
        nvml fn nvmlInit() -> nvmlReturn_t ["nvmlInit" @ 0];
        nvml fn nvmlInit_v2() -> nvmlReturn_t ["nvmlInit" @ 0];
        nvml fn nvmlInitWithFlags(flags: c_uint) -> nvmlReturn_t ["nvmlInitWithFlags" @ 0];
        nvml fn nvmlDeviceGetMemoryInfo(device: nvmlDevice_t, memory: *mut nvmlMemory_t) -> nvmlReturn_t ["nvmlDeviceGetMemoryInfo" @ 0];
        nvml fn nvmlDeviceGetMemoryInfo_v2(device: nvmlDevice_t, memory: *mut nvmlMemory_v2_t) -> nvmlReturn_t ["nvmlDeviceGetMemoryInfo" @ 0];
        // NVML: only the allocation's GPUs, processes and activity.
        nvml fn nvmlDeviceGetCount(n: *mut c_uint) -> nvmlReturn_t ["nvmlDeviceGetCount" @ 0];
        nvml fn nvmlDeviceGetCount_v2(n: *mut c_uint) -> nvmlReturn_t ["nvmlDeviceGetCount" @ 0];
        nvml fn nvmlDeviceGetHandleByIndex(index: c_uint, out: *mut nvmlDevice_t) -> nvmlReturn_t ["nvmlDeviceGetHandleByIndex" @ 0];
        nvml fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, out: *mut nvmlDevice_t) -> nvmlReturn_t ["nvmlDeviceGetHandleByIndex" @ 0];
        nvml fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, out: *mut nvmlDevice_t) -> nvmlReturn_t ["nvmlDeviceGetHandleByUUID" @ 0];
        nvml fn nvmlDeviceGetHandleByPciBusId(bus: *const c_char, out: *mut nvmlDevice_t) -> nvmlReturn_t ["nvmlDeviceGetHandleByPciBusId" @ 0];
        nvml fn nvmlDeviceGetHandleByPciBusId_v2(bus: *const c_char, out: *mut nvmlDevice_t) -> nvmlReturn_t ["nvmlDeviceGetHandleByPciBusId" @ 0];
        nvml fn nvmlDeviceGetHandleBySerial(serial: *const c_char, out: *mut nvmlDevice_t) -> nvmlReturn_t ["nvmlDeviceGetHandleBySerial" @ 0];
        nvml fn nvmlDeviceGetIndex(device: nvmlDevice_t, index: *mut c_uint) -> nvmlReturn_t ["nvmlDeviceGetIndex" @ 0];
        nvml fn nvmlDeviceGetComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t ["nvmlDeviceGetComputeRunningProcesses" @ 0];
        nvml fn nvmlDeviceGetComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t ["nvmlDeviceGetComputeRunningProcesses" @ 0];
        nvml fn nvmlDeviceGetComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t ["nvmlDeviceGetComputeRunningProcesses" @ 0];
        nvml fn nvmlDeviceGetGraphicsRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t ["nvmlDeviceGetGraphicsRunningProcesses" @ 0];
        nvml fn nvmlDeviceGetGraphicsRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t ["nvmlDeviceGetGraphicsRunningProcesses" @ 0];
        nvml fn nvmlDeviceGetGraphicsRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t ["nvmlDeviceGetGraphicsRunningProcesses" @ 0];
        nvml fn nvmlDeviceGetMPSComputeRunningProcesses(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t ["nvmlDeviceGetMPSComputeRunningProcesses" @ 0];
        nvml fn nvmlDeviceGetMPSComputeRunningProcesses_v2(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t ["nvmlDeviceGetMPSComputeRunningProcesses" @ 0];
        nvml fn nvmlDeviceGetMPSComputeRunningProcesses_v3(device: nvmlDevice_t, count: *mut c_uint, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t ["nvmlDeviceGetMPSComputeRunningProcesses" @ 0];
        nvml fn nvmlDeviceGetProcessUtilization(device: nvmlDevice_t, samples: *mut nvmlProcessUtilizationSample_t, count: *mut c_uint, since: c_ulonglong) -> nvmlReturn_t ["nvmlDeviceGetProcessUtilization" @ 0];
        nvml fn nvmlDeviceGetUtilizationRates(device: nvmlDevice_t, util: *mut nvmlUtilization_t) -> nvmlReturn_t ["nvmlDeviceGetUtilizationRates" @ 0];

        // HIP (hook/src/hip/): the view, memory admission, the gate.
        hip fn hipGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) -> hipError_t ["hipGetProcAddress" @ 0];
        hip fn hipGetDeviceCount(n: *mut c_int) -> hipError_t ["hipGetDeviceCount" @ 0];
        hip fn hipSetDevice(dev: c_int) -> hipError_t ["hipSetDevice" @ 0];
        hip fn hipMemGetInfo(free: *mut usize, total: *mut usize) -> hipError_t ["hipMemGetInfo" @ 0];
        hip fn hipDeviceTotalMem(bytes: *mut usize, dev: hipDevice_t) -> hipError_t ["hipDeviceTotalMem" @ 0];
        hip fn hipGetDeviceProperties(prop: *mut c_void, dev: c_int) -> hipError_t ["hipGetDeviceProperties" @ 0];
        hip fn hipGetDevicePropertiesR0600(prop: *mut c_void, dev: c_int) -> hipError_t ["hipGetDevicePropertiesR0600" @ 0];
        hip fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> hipError_t ["hipMalloc" @ 0];
        hip fn hipExtMallocWithFlags(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> hipError_t ["hipExtMallocWithFlags" @ 0];
        hip fn hipMallocManaged(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> hipError_t ["hipMallocManaged" @ 0];
        hip fn hipMallocPitch(ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) -> hipError_t ["hipMallocPitch" @ 0];
        hip fn hipMemAllocPitch(ptr: *mut hipDeviceptr_t, pitch: *mut usize, width: usize, height: usize, elem: c_uint) -> hipError_t ["hipMemAllocPitch" @ 0];
        hip fn hipMalloc3D(pitched: *mut hipPitchedPtr, extent: hipExtent) -> hipError_t ["hipMalloc3D" @ 0];
        hip fn hipFree(ptr: *mut c_void) -> hipError_t ["hipFree" @ 0];
        hip fn hipMallocArray(array: *mut hipArray_t, desc: *const hipChannelFormatDesc, width: usize, height: usize, flags: c_uint) -> hipError_t ["hipMallocArray" @ 0];
        hip fn hipMalloc3DArray(array: *mut hipArray_t, desc: *const hipChannelFormatDesc, extent: hipExtent, flags: c_uint) -> hipError_t ["hipMalloc3DArray" @ 0];
        hip fn hipArrayCreate(array: *mut hipArray_t, desc: *const HIP_ARRAY_DESCRIPTOR) -> hipError_t ["hipArrayCreate" @ 0];
        hip fn hipArray3DCreate(array: *mut hipArray_t, desc: *const HIP_ARRAY3D_DESCRIPTOR) -> hipError_t ["hipArray3DCreate" @ 0];
        hip fn hipFreeArray(array: hipArray_t) -> hipError_t ["hipFreeArray" @ 0];
        hip fn hipArrayDestroy(array: hipArray_t) -> hipError_t ["hipArrayDestroy" @ 0];
        hip fn hipMallocAsync(ptr: *mut *mut c_void, size: usize, stream: hipStream_t) -> hipError_t ["hipMallocAsync" @ 0];
        hip fn hipMallocFromPoolAsync(ptr: *mut *mut c_void, size: usize, pool: hipMemPool_t, stream: hipStream_t) -> hipError_t ["hipMallocFromPoolAsync" @ 0];
        hip fn hipFreeAsync(ptr: *mut c_void, stream: hipStream_t) -> hipError_t ["hipFreeAsync" @ 0];
        hip fn hipMemPoolCreate(pool: *mut hipMemPool_t, props: *const c_void) -> hipError_t ["hipMemPoolCreate" @ 0];
        hip fn hipMemPoolDestroy(pool: hipMemPool_t) -> hipError_t ["hipMemPoolDestroy" @ 0];
        hip fn hipMemPoolTrimTo(pool: hipMemPool_t, keep: usize) -> hipError_t ["hipMemPoolTrimTo" @ 0];
        hip fn hipMemPoolSetAttribute(pool: hipMemPool_t, attr: c_int, value: *mut c_void) -> hipError_t ["hipMemPoolSetAttribute" @ 0];
        hip fn hipDeviceGetDefaultMemPool(pool: *mut hipMemPool_t, dev: c_int) -> hipError_t ["hipDeviceGetDefaultMemPool" @ 0];
        hip fn hipDeviceGetMemPool(pool: *mut hipMemPool_t, dev: c_int) -> hipError_t ["hipDeviceGetMemPool" @ 0];
        hip fn hipIpcGetMemHandle(handle: *mut hipIpcMemHandle_t, ptr: *mut c_void) -> hipError_t ["hipIpcGetMemHandle" @ 0];
        hip fn hipIpcOpenMemHandle(ptr: *mut *mut c_void, handle: hipIpcMemHandle_t, flags: c_uint) -> hipError_t ["hipIpcOpenMemHandle" @ 0];
        hip fn hipIpcCloseMemHandle(ptr: *mut c_void) -> hipError_t ["hipIpcCloseMemHandle" @ 0];
        // Synchronisations: marked for the compute arbiter while they wait;
        // pools give back beyond their release threshold.
        hip fn hipStreamSynchronize(stream: hipStream_t) -> hipError_t ["hipStreamSynchronize" @ 0];
        hip fn hipDeviceSynchronize() -> hipError_t ["hipDeviceSynchronize" @ 0];
        hip fn hipEventSynchronize(ev: hipEvent_t) -> hipError_t ["hipEventSynchronize" @ 0];
        hip fn hipMemCreate(handle: *mut hipMemGenericAllocationHandle_t, size: usize, prop: *const hipMemAllocationProp, flags: c_ulonglong) -> hipError_t ["hipMemCreate" @ 0];
        hip fn hipMemRelease(handle: hipMemGenericAllocationHandle_t) -> hipError_t ["hipMemRelease" @ 0];
        hip fn hipMemMap(ptr: *mut c_void, size: usize, offset: usize, handle: hipMemGenericAllocationHandle_t, flags: c_ulonglong) -> hipError_t ["hipMemMap" @ 0];
        hip fn hipMemUnmap(ptr: *mut c_void, size: usize) -> hipError_t ["hipMemUnmap" @ 0];
        hip fn hipLaunchKernel(f: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared: usize, stream: hipStream_t) -> hipError_t ["hipLaunchKernel" @ 0];
        hip fn hipModuleLaunchKernel(f: hipFunction_t, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void) -> hipError_t
            ["hipModuleLaunchKernel" @ 0];
        hip fn hipExtLaunchKernel(f: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared: usize, stream: hipStream_t, start: hipEvent_t, stop: hipEvent_t, flags: c_int) -> hipError_t
            ["hipExtLaunchKernel" @ 0];
        hip fn _Z24hipExtModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_j(f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize, stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t, stop: hipEvent_t, flags: u32) -> hipError_t
            ["hipExtModuleLaunchKernel" @ 0];
        hip fn hipExtModuleLaunchKernel(f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize, stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t, stop: hipEvent_t, flags: u32) -> hipError_t
            ["hipExtModuleLaunchKernel" @ 0];
        hip fn hipHccModuleLaunchKernel(f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize, stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t, stop: hipEvent_t) -> hipError_t
            ["hipHccModuleLaunchKernel" @ 0];
        hip fn _Z24hipHccModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_(f: hipFunction_t, gx: u32, gy: u32, gz: u32, lx: u32, ly: u32, lz: u32, shared: usize, stream: hipStream_t, params: *mut *mut c_void, extra: *mut *mut c_void, start: hipEvent_t, stop: hipEvent_t) -> hipError_t
            ["hipHccModuleLaunchKernel" @ 0];
        hip fn hipLaunchCooperativeKernel(f: *const c_void, grid: dim3, block: dim3, args: *mut *mut c_void, shared: c_uint, stream: hipStream_t) -> hipError_t ["hipLaunchCooperativeKernel" @ 0];
        hip fn hipModuleLaunchCooperativeKernel(f: hipFunction_t, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: hipStream_t, params: *mut *mut c_void) -> hipError_t
            ["hipModuleLaunchCooperativeKernel" @ 0];
        hip fn hipLaunchCooperativeKernelMultiDevice(list: *mut hipLaunchParams, n: c_int, flags: c_uint) -> hipError_t ["hipLaunchCooperativeKernelMultiDevice" @ 0];
        hip fn hipGraphLaunch(exec: hipGraphExec_t, stream: hipStream_t) -> hipError_t ["hipGraphLaunch" @ 0];
    }
    used {
        cuda fn cuDeviceGetCount(count: *mut c_int) -> CUresult;
        cuda fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult;
        cuda fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
        cuda fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
        cuda fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult;
        cuda fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult;
        // The compute gate's drainer (gate.rs).
        cuda fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult;
        cuda fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult;
        // The queue bound (pacer.rs): a marker event after each governed launch.
        cuda fn cuEventCreate(ev: *mut CUevent, flags: c_uint) -> CUresult;
        cuda fn cuEventRecord(ev: CUevent, stream: CUstream) -> CUresult;
        cuda fn cuEventQuery(ev: CUevent) -> CUresult;
        cuda fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult;
        cuda fn cuEventDestroy_v2(ev: CUevent) -> CUresult;
        // Pool and graph-memory accounting, the device of a stream.
        cuda fn cuMemPoolGetAttribute(pool: CUmemoryPool, attr: CUmemPool_attribute, value: *mut c_void) -> CUresult;
        cuda fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void) -> CUresult;
        cuda fn cuStreamGetDevice(stream: CUstream, dev: *mut CUdevice) -> CUresult;
        cuda fn cuStreamGetCtx(stream: CUstream, pctx: *mut CUcontext) -> CUresult;
        cuda fn cuStreamGetCaptureInfo_v2(stream: CUstream, status: *mut CUstreamCaptureStatus, id: *mut cuuint64_t, graph: *mut CUgraph, deps: *mut *const CUgraphNode, ndeps: *mut usize) -> CUresult;
        cuda fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr) -> CUresult;
        cuda fn cuDeviceGetAttribute(value: *mut c_int, attr: CUdevice_attribute, dev: CUdevice) -> CUresult;
        nvml fn nvmlDeviceGetUUID(device: nvmlDevice_t, uuid: *mut c_char, length: c_uint) -> nvmlReturn_t;
        // Measuring what a context really holds (cuda/context.rs).
        nvml fn nvmlShutdown() -> nvmlReturn_t;
        // HIP: devices, their UUIDs, the granularity VMM charges in, drains.
        hip fn hipDeviceGetUuid(uuid: *mut hipUUID, dev: hipDevice_t) -> hipError_t;
        hip fn hipGetDevice(dev: *mut c_int) -> hipError_t;
        hip fn hipMemPoolGetAttribute(pool: hipMemPool_t, attr: c_int, value: *mut c_void) -> hipError_t;
        hip fn hipMemGetAllocationGranularity(g: *mut usize, prop: *const hipMemAllocationProp, option: c_int) -> hipError_t;
        // The queue bound's markers (hip/pace.rs).
        hip fn hipEventCreate(ev: *mut hipEvent_t) -> hipError_t;
        hip fn hipEventRecord(ev: hipEvent_t, stream: hipStream_t) -> hipError_t;
        hip fn hipEventQuery(ev: hipEvent_t) -> hipError_t;
        hip fn hipEventElapsedTime(ms: *mut f32, start: hipEvent_t, stop: hipEvent_t) -> hipError_t;
        hip fn hipEventDestroy(ev: hipEvent_t) -> hipError_t;
        hip fn hipStreamIsCapturing(stream: hipStream_t, status: *mut c_int) -> hipError_t;
        // Which ABI the runtime has where ROCm 6 moved a field (hip/vmm.rs).
        hip fn hipRuntimeGetVersion(v: *mut c_int) -> hipError_t;
        // What the driver holds for a HIP process (hip/context.rs).
        rsmi fn rsmi_init(flags: u64) -> rsmi_status_t;
        rsmi fn rsmi_shut_down() -> rsmi_status_t;
        rsmi fn rsmi_num_monitor_devices(n: *mut u32) -> rsmi_status_t;
        rsmi fn rsmi_dev_unique_id_get(dv: u32, id: *mut u64) -> rsmi_status_t;
        rsmi fn rsmi_compute_process_info_by_pid_get(pid: u32, info: *mut rsmi_process_info_t) -> rsmi_status_t;
        rsmi fn rsmi_compute_process_info_by_device_get(pid: u32, dv: u32, info: *mut rsmi_process_info_t) -> rsmi_status_t;
    }
}

/// Number of symbols in the table.
pub const COUNT: usize = Sym::ALL.len();

/// `call_real!(name(args))` calls the real entry point `name` with `args`, or returns the "missing"
/// code of its return type when the real library lacks it.
macro_rules! call_real {
    ($name:ident($($a:expr),* $(,)?)) => {
        match $crate::table::real::$name() {
            // SAFETY: the arguments are the caller's own, passed on with
            // the C signature the real function was declared with.
            Some(f) => unsafe { f($($a),*) },
            None => $crate::missing(),
        }
    };
}
pub(crate) use call_real;

/// Real entry points, indexed by [`Sym::index`]; null until resolved or
/// when the real library lacks the symbol.
static TABLE: [AtomicPtr<c_void>; COUNT] = [const { AtomicPtr::new(null_mut()) }; COUNT];

#[derive(Debug, Clone, Copy)]
struct Handle(*mut c_void);
// SAFETY: a dlopen handle is an opaque token the loader lets any thread use.
unsafe impl Send for Handle {}
// SAFETY: as for Send.
unsafe impl Sync for Handle {}

static CUDA: OnceLock<Option<Handle>> = OnceLock::new();
static NVML: OnceLock<Option<Handle>> = OnceLock::new();
static HIP: OnceLock<Option<Handle>> = OnceLock::new();
static RSMI: OnceLock<Option<Handle>> = OnceLock::new();

/// The real entry point of `sym`, or null. The hot path: one atomic load
/// once the library is loaded.
#[inline(always)]
pub fn entry(sym: Sym) -> *mut c_void {
    let p = TABLE[sym.index()].load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    entry_slow(sym)
}

#[cold]
fn entry_slow(sym: Sym) -> *mut c_void {
    if library(sym.lib()).is_null() {
        return null_mut();
    }
    TABLE[sym.index()].load(Ordering::Acquire)
}

/// The handle of a real library, loading it and resolving all its symbols
/// on first use; null when it cannot be loaded.
pub fn library(lib: Lib) -> *mut c_void {
    let cell = match lib {
        Lib::Cuda => &CUDA,
        Lib::Nvml => &NVML,
        Lib::Hip => &HIP,
        Lib::Rsmi => &RSMI,
    };
    cell.get_or_init(|| load(lib)).map_or(null_mut(), |h| h.0)
}

fn load(lib: Lib) -> Option<Handle> {
    let mut sonames = lib.sonames().iter();
    let h = loop {
        let soname = sonames.next()?;
        // Each candidate's absence is logged (at warn, when logging is on).
        if let Some(h) = driver::open(soname) {
            break h;
        }
    };
    for &sym in Sym::ALL.iter().filter(|s| s.lib() == lib) {
        // SAFETY: a handle dlopen just gave.
        let p = unsafe { driver::real_dlsym(h, sym.c_name()) };
        if !p.is_null() {
            TABLE[sym.index()].store(p, Ordering::Release);
        }
    }
    driver::clear_dlerror();
    Some(Handle(h))
}

/// The governed symbols whose real entry point is exactly `p` (a pointer
/// the real `cuGetProcAddress` handed out). Usually one; a driver may share
/// one function between variants.
pub fn governed_at(p: *mut c_void) -> Vec<Sym> {
    Sym::ALL
        .iter()
        .copied()
        .filter(|s| s.governed() && TABLE[s.index()].load(Ordering::Acquire) == p)
        .collect()
}

/// Installs a fake entry point, for tests of wrapper bodies against a fake
/// driver.
#[cfg(test)]
pub(crate) fn set_entry(sym: Sym, p: *mut c_void) {
    TABLE[sym.index()].store(p, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_only_governed_ones_are_found() {
        for &s in Sym::ALL {
            assert_eq!(s.c_name().to_str().unwrap(), s.name());
            assert_eq!(Sym::ALL[s.index()], s);
            let found = Sym::governed_by_name(s.name().as_bytes());
            if s.governed() {
                assert_eq!(found, Some(s));
                assert!(!s.wrapper().is_null());
            } else {
                assert_eq!(found, None, "{} is only used, never handed out", s.name());
                assert!(s.wrapper().is_null());
            }
        }
        assert_eq!(Sym::governed_by_name(b"cuMemcpy"), None);
        assert_eq!(Sym::governed_by_name(b"\xff"), None);
    }

    #[test]
    fn variants_carry_their_base_name_version_and_flavour() {
        assert_eq!(Sym::cuMemAlloc_v2.base(), "cuMemAlloc");
        assert_eq!(Sym::cuMemAlloc_v2.version(), 3020);
        assert_eq!(Sym::cuMemAlloc.version(), 2000);
        assert!(Sym::cuLaunchKernel_ptsz.per_thread());
        assert!(!Sym::cuLaunchKernel.per_thread());
        assert_eq!(Sym::nvmlInit_v2.lib(), Lib::Nvml);
        // Exported names are distinct: one wrapper per symbol.
        let mut names: Vec<_> = Sym::ALL.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), COUNT);
    }
}
