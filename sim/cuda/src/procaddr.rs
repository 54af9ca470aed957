//! `cuGetProcAddress` / `cuGetProcAddress_v2` with CUDA 12 semantics, from one table of
//! every exported driver function.
//!
//! Each entry names the symbol (the base name a program asks for), the CUDA version that
//! introduced that ABI, whether it is the per-thread-default-stream variant, and the
//! `PFN_*` typedef of `cudaTypedefs.h` the function must match: the table does not
//! compile if an export's signature differs from NVIDIA's.
//!
//! A request for `symbol` at `cudaVersion` gets the newest ABI introduced at or before
//! that version; with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM` a `_ptsz`/`_ptds`
//! variant is preferred where one exists. An unknown name is `CUDA_ERROR_NOT_FOUND` with
//! `CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND`; a name whose every ABI is newer than
//! `cudaVersion` is `CUDA_ERROR_NOT_FOUND` with `CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT`.
//!
//! The version asked for is capped at the driver's own (`TESSERA_SIM_DRIVER_VERSION`,
//! 12.9 by default): ABIs introduced in CUDA 13 are handed out only by a 13.x driver.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::OnceLock;

use tessera_ffi::cuda::*;

use crate::array::*;
use crate::context::*;
use crate::copy::*;
use crate::device::*;
use crate::errors::*;
use crate::graph::*;
use crate::green::*;
use crate::ipc::*;
use crate::launch::*;
use crate::link::*;
use crate::managed::*;
use crate::memop::*;
use crate::memory::*;
use crate::module::*;
use crate::multicast::*;
use crate::occupancy::*;
use crate::peer::*;
use crate::pool::*;
use crate::stream::*;
use crate::tensor_map::*;
use crate::vmm::*;
use crate::{CuResult, guard};

/// One ABI of one driver function.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub name: &'static str,
    pub version: c_int,
    pub per_thread: bool,
    pub ptr: *const c_void,
}

// SAFETY: `ptr` is the address of a function, immutable and valid for the whole process.
unsafe impl Send for Entry {}
// SAFETY: as above.
unsafe impl Sync for Entry {}

macro_rules! entries {
    ($($name:literal $ver:literal $($pt:ident)? : $pfn:ident = $f:ident;)*) => {
        fn build() -> Vec<Entry> {
            vec![$(
                Entry {
                    name: $name,
                    version: $ver,
                    per_thread: entries!(@pt $($pt)?),
                    ptr: {
                        let f: $pfn = Some($f);
                        f.map_or(std::ptr::null(), |f| f as *const c_void)
                    },
                },
            )*]
        }
    };
    (@pt) => { false };
    (@pt pt) => { true };
}

entries! {
    "cuInit" 2000: PFN_cuInit_v2000 = cuInit;
    "cuDriverGetVersion" 2020: PFN_cuDriverGetVersion_v2020 = cuDriverGetVersion;
    "cuGetErrorName" 6000: PFN_cuGetErrorName_v6000 = cuGetErrorName;
    "cuGetErrorString" 6000: PFN_cuGetErrorString_v6000 = cuGetErrorString;
    "cuGetProcAddress" 11030: PFN_cuGetProcAddress_v11030 = cuGetProcAddress;
    "cuGetProcAddress" 12000: PFN_cuGetProcAddress_v12000 = cuGetProcAddress_v2;
    "cuGetExportTable" 3000: PFN_cuGetExportTable_v3000 = cuGetExportTable;

    "cuDeviceGet" 2000: PFN_cuDeviceGet_v2000 = cuDeviceGet;
    "cuDeviceGetCount" 2000: PFN_cuDeviceGetCount_v2000 = cuDeviceGetCount;
    "cuDeviceGetName" 2000: PFN_cuDeviceGetName_v2000 = cuDeviceGetName;
    "cuDeviceGetUuid" 9020: PFN_cuDeviceGetUuid_v9020 = cuDeviceGetUuid;
    "cuDeviceGetUuid" 11040: PFN_cuDeviceGetUuid_v11040 = cuDeviceGetUuid_v2;
    "cuDeviceGetLuid" 10000: PFN_cuDeviceGetLuid_v10000 = cuDeviceGetLuid;
    "cuDeviceTotalMem" 2000: PFN_cuDeviceTotalMem_v2000 = cuDeviceTotalMem;
    "cuDeviceTotalMem" 3020: PFN_cuDeviceTotalMem_v3020 = cuDeviceTotalMem_v2;
    "cuDeviceComputeCapability" 2000: PFN_cuDeviceComputeCapability_v2000 = cuDeviceComputeCapability;
    "cuDeviceGetAttribute" 2000: PFN_cuDeviceGetAttribute_v2000 = cuDeviceGetAttribute;
    "cuDeviceGetProperties" 2000: PFN_cuDeviceGetProperties_v2000 = cuDeviceGetProperties;
    "cuDeviceGetPCIBusId" 4010: PFN_cuDeviceGetPCIBusId_v4010 = cuDeviceGetPCIBusId;
    "cuDeviceGetByPCIBusId" 4010: PFN_cuDeviceGetByPCIBusId_v4010 = cuDeviceGetByPCIBusId;
    "cuDeviceCanAccessPeer" 4000: PFN_cuDeviceCanAccessPeer_v4000 = cuDeviceCanAccessPeer;
    "cuDeviceGetExecAffinitySupport" 11040: PFN_cuDeviceGetExecAffinitySupport_v11040 = cuDeviceGetExecAffinitySupport;
    "cuDeviceGetDefaultMemPool" 11020: PFN_cuDeviceGetDefaultMemPool_v11020 = cuDeviceGetDefaultMemPool;
    "cuDeviceGetMemPool" 11020: PFN_cuDeviceGetMemPool_v11020 = cuDeviceGetMemPool;
    "cuDeviceSetMemPool" 11020: PFN_cuDeviceSetMemPool_v11020 = cuDeviceSetMemPool;

    "cuDevicePrimaryCtxRetain" 7000: PFN_cuDevicePrimaryCtxRetain_v7000 = cuDevicePrimaryCtxRetain;
    "cuDevicePrimaryCtxRelease" 7000: PFN_cuDevicePrimaryCtxRelease_v7000 = cuDevicePrimaryCtxRelease;
    "cuDevicePrimaryCtxRelease" 11000: PFN_cuDevicePrimaryCtxRelease_v11000 = cuDevicePrimaryCtxRelease_v2;
    "cuDevicePrimaryCtxReset" 7000: PFN_cuDevicePrimaryCtxReset_v7000 = cuDevicePrimaryCtxReset;
    "cuDevicePrimaryCtxReset" 11000: PFN_cuDevicePrimaryCtxReset_v11000 = cuDevicePrimaryCtxReset_v2;
    "cuDevicePrimaryCtxSetFlags" 7000: PFN_cuDevicePrimaryCtxSetFlags_v7000 = cuDevicePrimaryCtxSetFlags;
    "cuDevicePrimaryCtxSetFlags" 11000: PFN_cuDevicePrimaryCtxSetFlags_v11000 = cuDevicePrimaryCtxSetFlags_v2;
    "cuDevicePrimaryCtxGetState" 7000: PFN_cuDevicePrimaryCtxGetState_v7000 = cuDevicePrimaryCtxGetState;

    "cuCtxCreate" 2000: PFN_cuCtxCreate_v2000 = cuCtxCreate;
    "cuCtxCreate" 3020: PFN_cuCtxCreate_v3020 = cuCtxCreate_v2;
    "cuCtxCreate" 11040: PFN_cuCtxCreate_v11040 = cuCtxCreate_v3;
    // `cuCtxCreate_v4` (CUDA 12.5) is a separate name in CUDA 12: cudaTypedefs.h keeps
    // `PFN_cuCtxCreate` at the v11040 ABI, so the plain name gets it only from CUDA 13.
    "cuCtxCreate" 13000: PFN_cuCtxCreate_v12050 = cuCtxCreate_v4;
    "cuCtxDestroy" 2000: PFN_cuCtxDestroy_v2000 = cuCtxDestroy;
    "cuCtxDestroy" 4000: PFN_cuCtxDestroy_v4000 = cuCtxDestroy_v2;
    "cuCtxPushCurrent" 2000: PFN_cuCtxPushCurrent_v2000 = cuCtxPushCurrent;
    "cuCtxPushCurrent" 4000: PFN_cuCtxPushCurrent_v4000 = cuCtxPushCurrent_v2;
    "cuCtxPopCurrent" 2000: PFN_cuCtxPopCurrent_v2000 = cuCtxPopCurrent;
    "cuCtxPopCurrent" 4000: PFN_cuCtxPopCurrent_v4000 = cuCtxPopCurrent_v2;
    "cuCtxSetCurrent" 4000: PFN_cuCtxSetCurrent_v4000 = cuCtxSetCurrent;
    "cuCtxGetCurrent" 4000: PFN_cuCtxGetCurrent_v4000 = cuCtxGetCurrent;
    "cuCtxGetDevice" 2000: PFN_cuCtxGetDevice_v2000 = cuCtxGetDevice;
    "cuCtxGetFlags" 7000: PFN_cuCtxGetFlags_v7000 = cuCtxGetFlags;
    "cuCtxSetFlags" 12010: PFN_cuCtxSetFlags_v12010 = cuCtxSetFlags;
    "cuCtxGetId" 12000: PFN_cuCtxGetId_v12000 = cuCtxGetId;
    "cuCtxSynchronize" 2000: PFN_cuCtxSynchronize_v2000 = cuCtxSynchronize;
    "cuCtxGetApiVersion" 3020: PFN_cuCtxGetApiVersion_v3020 = cuCtxGetApiVersion;
    "cuCtxGetLimit" 3010: PFN_cuCtxGetLimit_v3010 = cuCtxGetLimit;
    "cuCtxSetLimit" 3010: PFN_cuCtxSetLimit_v3010 = cuCtxSetLimit;
    "cuCtxGetStreamPriorityRange" 5050: PFN_cuCtxGetStreamPriorityRange_v5050 = cuCtxGetStreamPriorityRange;
    "cuCtxGetCacheConfig" 3020: PFN_cuCtxGetCacheConfig_v3020 = cuCtxGetCacheConfig;
    "cuCtxSetCacheConfig" 3020: PFN_cuCtxSetCacheConfig_v3020 = cuCtxSetCacheConfig;

    "cuMemGetInfo" 2000: PFN_cuMemGetInfo_v2000 = cuMemGetInfo;
    "cuMemGetInfo" 3020: PFN_cuMemGetInfo_v3020 = cuMemGetInfo_v2;
    "cuMemAlloc" 2000: PFN_cuMemAlloc_v2000 = cuMemAlloc;
    "cuMemAlloc" 3020: PFN_cuMemAlloc_v3020 = cuMemAlloc_v2;
    "cuMemAllocPitch" 3020: PFN_cuMemAllocPitch_v3020 = cuMemAllocPitch_v2;
    "cuMemFree" 2000: PFN_cuMemFree_v2000 = cuMemFree;
    "cuMemFree" 3020: PFN_cuMemFree_v3020 = cuMemFree_v2;
    "cuMemGetAddressRange" 3020: PFN_cuMemGetAddressRange_v3020 = cuMemGetAddressRange_v2;
    "cuMemAllocHost" 2000: PFN_cuMemAllocHost_v2000 = cuMemAllocHost;
    "cuMemAllocHost" 3020: PFN_cuMemAllocHost_v3020 = cuMemAllocHost_v2;
    "cuMemFreeHost" 2000: PFN_cuMemFreeHost_v2000 = cuMemFreeHost;
    "cuMemHostAlloc" 2020: PFN_cuMemHostAlloc_v2020 = cuMemHostAlloc;
    "cuMemHostGetDevicePointer" 3020: PFN_cuMemHostGetDevicePointer_v3020 = cuMemHostGetDevicePointer_v2;
    "cuMemHostGetFlags" 2030: PFN_cuMemHostGetFlags_v2030 = cuMemHostGetFlags;
    "cuMemHostRegister" 4000: PFN_cuMemHostRegister_v4000 = cuMemHostRegister;
    "cuMemHostRegister" 6050: PFN_cuMemHostRegister_v6050 = cuMemHostRegister_v2;
    "cuMemHostUnregister" 4000: PFN_cuMemHostUnregister_v4000 = cuMemHostUnregister;
    "cuMemAllocManaged" 6000: PFN_cuMemAllocManaged_v6000 = cuMemAllocManaged;
    "cuPointerGetAttribute" 4000: PFN_cuPointerGetAttribute_v4000 = cuPointerGetAttribute;
    "cuPointerGetAttributes" 7000: PFN_cuPointerGetAttributes_v7000 = cuPointerGetAttributes;
    "cuDeviceGetP2PAttribute" 8000: PFN_cuDeviceGetP2PAttribute_v8000 = cuDeviceGetP2PAttribute;
    "cuCtxEnablePeerAccess" 4000: PFN_cuCtxEnablePeerAccess_v4000 = cuCtxEnablePeerAccess;
    "cuCtxDisablePeerAccess" 4000: PFN_cuCtxDisablePeerAccess_v4000 = cuCtxDisablePeerAccess;
    "cuStreamAddCallback" 5000: PFN_cuStreamAddCallback_v5000 = cuStreamAddCallback;
    "cuStreamAddCallback" 7000 pt: PFN_cuStreamAddCallback_v7000_ptsz = cuStreamAddCallback_ptsz;
    "cuThreadExchangeStreamCaptureMode" 10010: PFN_cuThreadExchangeStreamCaptureMode_v10010 = cuThreadExchangeStreamCaptureMode;
    "cuMemAdvise" 8000: PFN_cuMemAdvise_v8000 = cuMemAdvise;
    "cuMemAdvise" 12020: PFN_cuMemAdvise_v12020 = cuMemAdvise_v2;
    "cuMemPrefetchAsync" 8000: PFN_cuMemPrefetchAsync_v8000 = cuMemPrefetchAsync;
    "cuMemPrefetchAsync" 8000 pt: PFN_cuMemPrefetchAsync_v8000_ptsz = cuMemPrefetchAsync_ptsz;
    "cuMemPrefetchAsync" 12020: PFN_cuMemPrefetchAsync_v12020 = cuMemPrefetchAsync_v2;
    "cuMemPrefetchAsync" 12020 pt: PFN_cuMemPrefetchAsync_v12020_ptsz = cuMemPrefetchAsync_v2_ptsz;
    "cuCtxResetPersistingL2Cache" 11000: PFN_cuCtxResetPersistingL2Cache_v11000 = cuCtxResetPersistingL2Cache;

    "cuMemAllocAsync" 11020: PFN_cuMemAllocAsync_v11020 = cuMemAllocAsync;
    "cuMemAllocAsync" 11020 pt: PFN_cuMemAllocAsync_v11020_ptsz = cuMemAllocAsync_ptsz;
    "cuMemAllocFromPoolAsync" 11020: PFN_cuMemAllocFromPoolAsync_v11020 = cuMemAllocFromPoolAsync;
    "cuMemAllocFromPoolAsync" 11020 pt: PFN_cuMemAllocFromPoolAsync_v11020_ptsz = cuMemAllocFromPoolAsync_ptsz;
    "cuMemFreeAsync" 11020: PFN_cuMemFreeAsync_v11020 = cuMemFreeAsync;
    "cuMemFreeAsync" 11020 pt: PFN_cuMemFreeAsync_v11020_ptsz = cuMemFreeAsync_ptsz;
    "cuMemPoolCreate" 11020: PFN_cuMemPoolCreate_v11020 = cuMemPoolCreate;
    "cuMemPoolDestroy" 11020: PFN_cuMemPoolDestroy_v11020 = cuMemPoolDestroy;
    "cuMemPoolTrimTo" 11020: PFN_cuMemPoolTrimTo_v11020 = cuMemPoolTrimTo;
    "cuMemPoolSetAttribute" 11020: PFN_cuMemPoolSetAttribute_v11020 = cuMemPoolSetAttribute;
    "cuMemPoolGetAttribute" 11020: PFN_cuMemPoolGetAttribute_v11020 = cuMemPoolGetAttribute;
    "cuMemPoolSetAccess" 11020: PFN_cuMemPoolSetAccess_v11020 = cuMemPoolSetAccess;
    "cuMemPoolGetAccess" 11020: PFN_cuMemPoolGetAccess_v11020 = cuMemPoolGetAccess;

    "cuMemGetAllocationGranularity" 10020: PFN_cuMemGetAllocationGranularity_v10020 = cuMemGetAllocationGranularity;
    "cuMemCreate" 10020: PFN_cuMemCreate_v10020 = cuMemCreate;
    "cuMemRelease" 10020: PFN_cuMemRelease_v10020 = cuMemRelease;
    "cuMemRetainAllocationHandle" 11000: PFN_cuMemRetainAllocationHandle_v11000 = cuMemRetainAllocationHandle;
    "cuMemGetAllocationPropertiesFromHandle" 10020: PFN_cuMemGetAllocationPropertiesFromHandle_v10020 = cuMemGetAllocationPropertiesFromHandle;
    "cuMemAddressReserve" 10020: PFN_cuMemAddressReserve_v10020 = cuMemAddressReserve;
    "cuMemAddressFree" 10020: PFN_cuMemAddressFree_v10020 = cuMemAddressFree;
    "cuMemMap" 10020: PFN_cuMemMap_v10020 = cuMemMap;
    "cuMemUnmap" 10020: PFN_cuMemUnmap_v10020 = cuMemUnmap;
    "cuMemSetAccess" 10020: PFN_cuMemSetAccess_v10020 = cuMemSetAccess;
    "cuMemGetAccess" 10020: PFN_cuMemGetAccess_v10020 = cuMemGetAccess;

    "cuArrayCreate" 3020: PFN_cuArrayCreate_v3020 = cuArrayCreate_v2;
    "cuArray3DCreate" 3020: PFN_cuArray3DCreate_v3020 = cuArray3DCreate_v2;
    "cuArrayDestroy" 2000: PFN_cuArrayDestroy_v2000 = cuArrayDestroy;
    "cuArrayGetDescriptor" 3020: PFN_cuArrayGetDescriptor_v3020 = cuArrayGetDescriptor_v2;
    "cuArray3DGetDescriptor" 3020: PFN_cuArray3DGetDescriptor_v3020 = cuArray3DGetDescriptor_v2;
    "cuMipmappedArrayCreate" 5000: PFN_cuMipmappedArrayCreate_v5000 = cuMipmappedArrayCreate;
    "cuMipmappedArrayDestroy" 5000: PFN_cuMipmappedArrayDestroy_v5000 = cuMipmappedArrayDestroy;
    "cuMipmappedArrayGetLevel" 5000: PFN_cuMipmappedArrayGetLevel_v5000 = cuMipmappedArrayGetLevel;

    "cuMemcpy" 4000: PFN_cuMemcpy_v4000 = cuMemcpy;
    "cuMemcpy" 7000 pt: PFN_cuMemcpy_v7000_ptds = cuMemcpy_ptds;
    "cuMemcpyAsync" 4000: PFN_cuMemcpyAsync_v4000 = cuMemcpyAsync;
    "cuMemcpyAsync" 7000 pt: PFN_cuMemcpyAsync_v7000_ptsz = cuMemcpyAsync_ptsz;
    "cuMemcpyHtoD" 3020: PFN_cuMemcpyHtoD_v3020 = cuMemcpyHtoD_v2;
    "cuMemcpyHtoD" 7000 pt: PFN_cuMemcpyHtoD_v7000_ptds = cuMemcpyHtoD_v2_ptds;
    "cuMemcpyDtoH" 3020: PFN_cuMemcpyDtoH_v3020 = cuMemcpyDtoH_v2;
    "cuMemcpyDtoH" 7000 pt: PFN_cuMemcpyDtoH_v7000_ptds = cuMemcpyDtoH_v2_ptds;
    "cuMemcpyDtoD" 3020: PFN_cuMemcpyDtoD_v3020 = cuMemcpyDtoD_v2;
    "cuMemcpyDtoD" 7000 pt: PFN_cuMemcpyDtoD_v7000_ptds = cuMemcpyDtoD_v2_ptds;
    "cuMemcpyHtoDAsync" 3020: PFN_cuMemcpyHtoDAsync_v3020 = cuMemcpyHtoDAsync_v2;
    "cuMemcpyHtoDAsync" 7000 pt: PFN_cuMemcpyHtoDAsync_v7000_ptsz = cuMemcpyHtoDAsync_v2_ptsz;
    "cuMemcpyDtoHAsync" 3020: PFN_cuMemcpyDtoHAsync_v3020 = cuMemcpyDtoHAsync_v2;
    "cuMemcpyDtoHAsync" 7000 pt: PFN_cuMemcpyDtoHAsync_v7000_ptsz = cuMemcpyDtoHAsync_v2_ptsz;
    "cuMemcpyDtoDAsync" 3020: PFN_cuMemcpyDtoDAsync_v3020 = cuMemcpyDtoDAsync_v2;
    "cuMemcpyDtoDAsync" 7000 pt: PFN_cuMemcpyDtoDAsync_v7000_ptsz = cuMemcpyDtoDAsync_v2_ptsz;
    "cuMemcpyPeer" 4000: PFN_cuMemcpyPeer_v4000 = cuMemcpyPeer;
    "cuMemcpyPeerAsync" 4000: PFN_cuMemcpyPeerAsync_v4000 = cuMemcpyPeerAsync;
    "cuMemcpy2D" 3020: PFN_cuMemcpy2D_v3020 = cuMemcpy2D_v2;
    "cuMemcpy2D" 7000 pt: PFN_cuMemcpy2D_v7000_ptds = cuMemcpy2D_v2_ptds;
    "cuMemcpy2DUnaligned" 3020: PFN_cuMemcpy2DUnaligned_v3020 = cuMemcpy2DUnaligned_v2;
    "cuMemcpy2DUnaligned" 7000 pt: PFN_cuMemcpy2DUnaligned_v7000_ptds = cuMemcpy2DUnaligned_v2_ptds;
    "cuMemcpy2DAsync" 3020: PFN_cuMemcpy2DAsync_v3020 = cuMemcpy2DAsync_v2;
    "cuMemcpy2DAsync" 7000 pt: PFN_cuMemcpy2DAsync_v7000_ptsz = cuMemcpy2DAsync_v2_ptsz;
    "cuMemsetD8" 3020: PFN_cuMemsetD8_v3020 = cuMemsetD8_v2;
    "cuMemsetD8" 7000 pt: PFN_cuMemsetD8_v7000_ptds = cuMemsetD8_v2_ptds;
    "cuMemsetD16" 3020: PFN_cuMemsetD16_v3020 = cuMemsetD16_v2;
    "cuMemsetD16" 7000 pt: PFN_cuMemsetD16_v7000_ptds = cuMemsetD16_v2_ptds;
    "cuMemsetD32" 3020: PFN_cuMemsetD32_v3020 = cuMemsetD32_v2;
    "cuMemsetD32" 7000 pt: PFN_cuMemsetD32_v7000_ptds = cuMemsetD32_v2_ptds;
    "cuMemsetD8Async" 3020: PFN_cuMemsetD8Async_v3020 = cuMemsetD8Async;
    "cuMemsetD8Async" 7000 pt: PFN_cuMemsetD8Async_v7000_ptsz = cuMemsetD8Async_ptsz;
    "cuMemsetD16Async" 3020: PFN_cuMemsetD16Async_v3020 = cuMemsetD16Async;
    "cuMemsetD16Async" 7000 pt: PFN_cuMemsetD16Async_v7000_ptsz = cuMemsetD16Async_ptsz;
    "cuMemsetD32Async" 3020: PFN_cuMemsetD32Async_v3020 = cuMemsetD32Async;
    "cuMemsetD32Async" 7000 pt: PFN_cuMemsetD32Async_v7000_ptsz = cuMemsetD32Async_ptsz;
    "cuMemsetD2D8" 3020: PFN_cuMemsetD2D8_v3020 = cuMemsetD2D8_v2;
    "cuMemsetD2D8" 7000 pt: PFN_cuMemsetD2D8_v7000_ptds = cuMemsetD2D8_v2_ptds;
    "cuMemsetD2D16" 3020: PFN_cuMemsetD2D16_v3020 = cuMemsetD2D16_v2;
    "cuMemsetD2D16" 7000 pt: PFN_cuMemsetD2D16_v7000_ptds = cuMemsetD2D16_v2_ptds;
    "cuMemsetD2D32" 3020: PFN_cuMemsetD2D32_v3020 = cuMemsetD2D32_v2;
    "cuMemsetD2D32" 7000 pt: PFN_cuMemsetD2D32_v7000_ptds = cuMemsetD2D32_v2_ptds;
    "cuMemsetD2D8Async" 3020: PFN_cuMemsetD2D8Async_v3020 = cuMemsetD2D8Async;
    "cuMemsetD2D8Async" 7000 pt: PFN_cuMemsetD2D8Async_v7000_ptsz = cuMemsetD2D8Async_ptsz;
    "cuMemsetD2D16Async" 3020: PFN_cuMemsetD2D16Async_v3020 = cuMemsetD2D16Async;
    "cuMemsetD2D16Async" 7000 pt: PFN_cuMemsetD2D16Async_v7000_ptsz = cuMemsetD2D16Async_ptsz;
    "cuMemsetD2D32Async" 3020: PFN_cuMemsetD2D32Async_v3020 = cuMemsetD2D32Async;
    "cuMemsetD2D32Async" 7000 pt: PFN_cuMemsetD2D32Async_v7000_ptsz = cuMemsetD2D32Async_ptsz;

    "cuModuleLoad" 2000: PFN_cuModuleLoad_v2000 = cuModuleLoad;
    "cuModuleLoadData" 2000: PFN_cuModuleLoadData_v2000 = cuModuleLoadData;
    "cuModuleLoadDataEx" 2010: PFN_cuModuleLoadDataEx_v2010 = cuModuleLoadDataEx;
    "cuModuleLoadFatBinary" 2000: PFN_cuModuleLoadFatBinary_v2000 = cuModuleLoadFatBinary;
    "cuModuleUnload" 2000: PFN_cuModuleUnload_v2000 = cuModuleUnload;
    "cuModuleGetFunction" 2000: PFN_cuModuleGetFunction_v2000 = cuModuleGetFunction;
    "cuModuleGetGlobal" 3020: PFN_cuModuleGetGlobal_v3020 = cuModuleGetGlobal_v2;
    "cuFuncGetAttribute" 2020: PFN_cuFuncGetAttribute_v2020 = cuFuncGetAttribute;
    "cuFuncSetAttribute" 9000: PFN_cuFuncSetAttribute_v9000 = cuFuncSetAttribute;
    "cuFuncSetCacheConfig" 3000: PFN_cuFuncSetCacheConfig_v3000 = cuFuncSetCacheConfig;
    "cuFuncGetName" 12030: PFN_cuFuncGetName_v12030 = cuFuncGetName;
    "cuFuncGetModule" 11000: PFN_cuFuncGetModule_v11000 = cuFuncGetModule;
    "cuLibraryLoadData" 12000: PFN_cuLibraryLoadData_v12000 = cuLibraryLoadData;
    "cuLibraryLoadFromFile" 12000: PFN_cuLibraryLoadFromFile_v12000 = cuLibraryLoadFromFile;
    "cuLibraryUnload" 12000: PFN_cuLibraryUnload_v12000 = cuLibraryUnload;
    "cuLibraryGetKernel" 12000: PFN_cuLibraryGetKernel_v12000 = cuLibraryGetKernel;
    "cuKernelGetFunction" 12000: PFN_cuKernelGetFunction_v12000 = cuKernelGetFunction;
    "cuModuleGetFunctionCount" 12040: PFN_cuModuleGetFunctionCount_v12040 = cuModuleGetFunctionCount;
    "cuModuleEnumerateFunctions" 12040: PFN_cuModuleEnumerateFunctions_v12040 = cuModuleEnumerateFunctions;
    "cuModuleGetLoadingMode" 11070: PFN_cuModuleGetLoadingMode_v11070 = cuModuleGetLoadingMode;
    "cuFuncIsLoaded" 12040: PFN_cuFuncIsLoaded_v12040 = cuFuncIsLoaded;
    "cuFuncLoad" 12040: PFN_cuFuncLoad_v12040 = cuFuncLoad;
    "cuLibraryGetKernelCount" 12040: PFN_cuLibraryGetKernelCount_v12040 = cuLibraryGetKernelCount;
    "cuLibraryEnumerateKernels" 12040: PFN_cuLibraryEnumerateKernels_v12040 = cuLibraryEnumerateKernels;
    "cuLibraryGetModule" 12000: PFN_cuLibraryGetModule_v12000 = cuLibraryGetModule;
    "cuLibraryGetGlobal" 12000: PFN_cuLibraryGetGlobal_v12000 = cuLibraryGetGlobal;
    "cuLibraryGetManaged" 12000: PFN_cuLibraryGetManaged_v12000 = cuLibraryGetManaged;
    "cuLibraryGetUnifiedFunction" 12000: PFN_cuLibraryGetUnifiedFunction_v12000 = cuLibraryGetUnifiedFunction;
    "cuKernelGetAttribute" 12000: PFN_cuKernelGetAttribute_v12000 = cuKernelGetAttribute;
    "cuKernelSetAttribute" 12000: PFN_cuKernelSetAttribute_v12000 = cuKernelSetAttribute;
    "cuKernelSetCacheConfig" 12000: PFN_cuKernelSetCacheConfig_v12000 = cuKernelSetCacheConfig;
    "cuKernelGetName" 12030: PFN_cuKernelGetName_v12030 = cuKernelGetName;
    "cuKernelGetLibrary" 12050: PFN_cuKernelGetLibrary_v12050 = cuKernelGetLibrary;
    "cuOccupancyMaxActiveBlocksPerMultiprocessor" 6050: PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor_v6050 = cuOccupancyMaxActiveBlocksPerMultiprocessor;
    "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags" 7000: PFN_cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags_v7000 = cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags;
    "cuOccupancyMaxPotentialBlockSize" 6050: PFN_cuOccupancyMaxPotentialBlockSize_v6050 = cuOccupancyMaxPotentialBlockSize;
    "cuOccupancyMaxPotentialBlockSizeWithFlags" 7000: PFN_cuOccupancyMaxPotentialBlockSizeWithFlags_v7000 = cuOccupancyMaxPotentialBlockSizeWithFlags;
    "cuOccupancyAvailableDynamicSMemPerBlock" 10020: PFN_cuOccupancyAvailableDynamicSMemPerBlock_v10020 = cuOccupancyAvailableDynamicSMemPerBlock;
    "cuOccupancyMaxPotentialClusterSize" 11070: PFN_cuOccupancyMaxPotentialClusterSize_v11070 = cuOccupancyMaxPotentialClusterSize;
    "cuOccupancyMaxActiveClusters" 11070: PFN_cuOccupancyMaxActiveClusters_v11070 = cuOccupancyMaxActiveClusters;
    "cuFuncGetParamInfo" 12040: PFN_cuFuncGetParamInfo_v12040 = cuFuncGetParamInfo;
    "cuKernelGetParamInfo" 12040: PFN_cuKernelGetParamInfo_v12040 = cuKernelGetParamInfo;
    "cuStreamWriteValue32" 8000: PFN_cuStreamWriteValue32_v8000 = cuStreamWriteValue32;
    "cuStreamWriteValue32" 8000 pt: PFN_cuStreamWriteValue32_v8000_ptsz = cuStreamWriteValue32_ptsz;
    "cuStreamWriteValue32" 11070: PFN_cuStreamWriteValue32_v11070 = cuStreamWriteValue32_v2;
    "cuStreamWriteValue32" 11070 pt: PFN_cuStreamWriteValue32_v11070_ptsz = cuStreamWriteValue32_v2_ptsz;
    "cuMulticastCreate" 12010: PFN_cuMulticastCreate_v12010 = cuMulticastCreate;
    "cuMulticastAddDevice" 12010: PFN_cuMulticastAddDevice_v12010 = cuMulticastAddDevice;
    "cuMulticastBindMem" 12010: PFN_cuMulticastBindMem_v12010 = cuMulticastBindMem;
    "cuMulticastUnbind" 12010: PFN_cuMulticastUnbind_v12010 = cuMulticastUnbind;
    "cuTensorMapEncodeTiled" 12000: PFN_cuTensorMapEncodeTiled_v12000 = cuTensorMapEncodeTiled;
    "cuTensorMapEncodeIm2col" 12000: PFN_cuTensorMapEncodeIm2col_v12000 = cuTensorMapEncodeIm2col;
    "cuTensorMapReplaceAddress" 12000: PFN_cuTensorMapReplaceAddress_v12000 = cuTensorMapReplaceAddress;
    "cuStreamWaitValue32" 8000: PFN_cuStreamWaitValue32_v8000 = cuStreamWaitValue32;
    "cuStreamWaitValue32" 8000 pt: PFN_cuStreamWaitValue32_v8000_ptsz = cuStreamWaitValue32_ptsz;
    "cuStreamWaitValue32" 11070: PFN_cuStreamWaitValue32_v11070 = cuStreamWaitValue32_v2;
    "cuStreamWaitValue32" 11070 pt: PFN_cuStreamWaitValue32_v11070_ptsz = cuStreamWaitValue32_v2_ptsz;
    "cuStreamBatchMemOp" 8000: PFN_cuStreamBatchMemOp_v8000 = cuStreamBatchMemOp;
    "cuLinkCreate" 6050: PFN_cuLinkCreate_v6050 = cuLinkCreate_v2;
    "cuLinkAddData" 6050: PFN_cuLinkAddData_v6050 = cuLinkAddData_v2;
    "cuLinkComplete" 5050: PFN_cuLinkComplete_v5050 = cuLinkComplete;
    "cuLinkDestroy" 5050: PFN_cuLinkDestroy_v5050 = cuLinkDestroy;
    "cuLogsRegisterCallback" 12090: PFN_cuLogsRegisterCallback_v12090 = cuLogsRegisterCallback;
    "cuLogsUnregisterCallback" 12090: PFN_cuLogsUnregisterCallback_v12090 = cuLogsUnregisterCallback;
    "cuCtxFromGreenCtx" 12040: PFN_cuCtxFromGreenCtx_v12040 = cuCtxFromGreenCtx;
    "cuGreenCtxCreate" 12040: PFN_cuGreenCtxCreate_v12040 = cuGreenCtxCreate;
    "cuGreenCtxDestroy" 12040: PFN_cuGreenCtxDestroy_v12040 = cuGreenCtxDestroy;
    "cuGreenCtxStreamCreate" 12050: PFN_cuGreenCtxStreamCreate_v12050 = cuGreenCtxStreamCreate;
    "cuDevSmResourceSplitByCount" 12040: PFN_cuDevSmResourceSplitByCount_v12040 = cuDevSmResourceSplitByCount;
    "cuDeviceGetDevResource" 12040: PFN_cuDeviceGetDevResource_v12040 = cuDeviceGetDevResource;
    "cuDevResourceGenerateDesc" 12040: PFN_cuDevResourceGenerateDesc_v12040 = cuDevResourceGenerateDesc;

    "cuLaunchKernel" 4000: PFN_cuLaunchKernel_v4000 = cuLaunchKernel;
    "cuLaunchKernel" 7000 pt: PFN_cuLaunchKernel_v7000_ptsz = cuLaunchKernel_ptsz;
    "cuLaunchKernelEx" 11060: PFN_cuLaunchKernelEx_v11060 = cuLaunchKernelEx;
    "cuLaunchKernelEx" 11060 pt: PFN_cuLaunchKernelEx_v11060_ptsz = cuLaunchKernelEx_ptsz;
    "cuLaunchCooperativeKernel" 9000: PFN_cuLaunchCooperativeKernel_v9000 = cuLaunchCooperativeKernel;
    "cuLaunchCooperativeKernel" 9000 pt: PFN_cuLaunchCooperativeKernel_v9000_ptsz = cuLaunchCooperativeKernel_ptsz;
    "cuLaunchCooperativeKernelMultiDevice" 9000: PFN_cuLaunchCooperativeKernelMultiDevice_v9000 = cuLaunchCooperativeKernelMultiDevice;
    "cuLaunchHostFunc" 10000: PFN_cuLaunchHostFunc_v10000 = cuLaunchHostFunc;
    "cuLaunchHostFunc" 10000 pt: PFN_cuLaunchHostFunc_v10000_ptsz = cuLaunchHostFunc_ptsz;

    "cuStreamCreate" 2000: PFN_cuStreamCreate_v2000 = cuStreamCreate;
    "cuStreamCreateWithPriority" 5050: PFN_cuStreamCreateWithPriority_v5050 = cuStreamCreateWithPriority;
    "cuStreamDestroy" 2000: PFN_cuStreamDestroy_v2000 = cuStreamDestroy;
    "cuStreamDestroy" 4000: PFN_cuStreamDestroy_v4000 = cuStreamDestroy_v2;
    "cuStreamSynchronize" 2000: PFN_cuStreamSynchronize_v2000 = cuStreamSynchronize;
    "cuStreamSynchronize" 7000 pt: PFN_cuStreamSynchronize_v7000_ptsz = cuStreamSynchronize_ptsz;
    "cuStreamQuery" 2000: PFN_cuStreamQuery_v2000 = cuStreamQuery;
    "cuStreamQuery" 7000 pt: PFN_cuStreamQuery_v7000_ptsz = cuStreamQuery_ptsz;
    "cuStreamWaitEvent" 3020: PFN_cuStreamWaitEvent_v3020 = cuStreamWaitEvent;
    "cuStreamWaitEvent" 7000 pt: PFN_cuStreamWaitEvent_v7000_ptsz = cuStreamWaitEvent_ptsz;
    "cuStreamGetCtx" 9020: PFN_cuStreamGetCtx_v9020 = cuStreamGetCtx;
    "cuStreamGetCtx" 9020 pt: PFN_cuStreamGetCtx_v9020_ptsz = cuStreamGetCtx_ptsz;
    "cuStreamGetCtx" 12050: PFN_cuStreamGetCtx_v12050 = cuStreamGetCtx_v2;
    "cuStreamGetCtx" 12050 pt: PFN_cuStreamGetCtx_v12050_ptsz = cuStreamGetCtx_v2_ptsz;
    "cuStreamGetDevice" 12080: PFN_cuStreamGetDevice_v12080 = cuStreamGetDevice;
    "cuStreamGetDevice" 12080 pt: PFN_cuStreamGetDevice_v12080_ptsz = cuStreamGetDevice_ptsz;
    "cuStreamGetFlags" 5050: PFN_cuStreamGetFlags_v5050 = cuStreamGetFlags;
    "cuStreamGetFlags" 7000 pt: PFN_cuStreamGetFlags_v7000_ptsz = cuStreamGetFlags_ptsz;
    "cuStreamGetPriority" 5050: PFN_cuStreamGetPriority_v5050 = cuStreamGetPriority;
    "cuStreamGetPriority" 7000 pt: PFN_cuStreamGetPriority_v7000_ptsz = cuStreamGetPriority_ptsz;
    "cuStreamGetId" 12000: PFN_cuStreamGetId_v12000 = cuStreamGetId;
    "cuStreamGetId" 12000 pt: PFN_cuStreamGetId_v12000_ptsz = cuStreamGetId_ptsz;
    "cuStreamIsCapturing" 10000: PFN_cuStreamIsCapturing_v10000 = cuStreamIsCapturing;
    "cuStreamIsCapturing" 10000 pt: PFN_cuStreamIsCapturing_v10000_ptsz = cuStreamIsCapturing_ptsz;

    "cuEventCreate" 2000: PFN_cuEventCreate_v2000 = cuEventCreate;
    "cuEventDestroy" 2000: PFN_cuEventDestroy_v2000 = cuEventDestroy;
    "cuEventDestroy" 4000: PFN_cuEventDestroy_v4000 = cuEventDestroy_v2;
    "cuEventRecord" 2000: PFN_cuEventRecord_v2000 = cuEventRecord;
    "cuEventRecord" 7000 pt: PFN_cuEventRecord_v7000_ptsz = cuEventRecord_ptsz;
    "cuEventRecordWithFlags" 11010: PFN_cuEventRecordWithFlags_v11010 = cuEventRecordWithFlags;
    "cuEventRecordWithFlags" 11010 pt: PFN_cuEventRecordWithFlags_v11010_ptsz = cuEventRecordWithFlags_ptsz;
    "cuEventQuery" 2000: PFN_cuEventQuery_v2000 = cuEventQuery;
    "cuEventSynchronize" 2000: PFN_cuEventSynchronize_v2000 = cuEventSynchronize;
    "cuEventElapsedTime" 2000: PFN_cuEventElapsedTime_v2000 = cuEventElapsedTime;
    "cuEventElapsedTime" 12080: PFN_cuEventElapsedTime_v12080 = cuEventElapsedTime_v2;

    "cuGraphCreate" 10000: PFN_cuGraphCreate_v10000 = cuGraphCreate;
    "cuGraphDestroy" 10000: PFN_cuGraphDestroy_v10000 = cuGraphDestroy;
    "cuGraphAddKernelNode" 10000: PFN_cuGraphAddKernelNode_v10000 = cuGraphAddKernelNode;
    "cuGraphAddKernelNode" 12000: PFN_cuGraphAddKernelNode_v12000 = cuGraphAddKernelNode_v2;
    "cuGraphAddEmptyNode" 10000: PFN_cuGraphAddEmptyNode_v10000 = cuGraphAddEmptyNode;
    "cuGraphGetNodes" 10000: PFN_cuGraphGetNodes_v10000 = cuGraphGetNodes;
    "cuGraphInstantiate" 10000: PFN_cuGraphInstantiate_v10000 = cuGraphInstantiate;
    "cuGraphInstantiate" 11000: PFN_cuGraphInstantiate_v11000 = cuGraphInstantiate_v2;
    // CUDA 12 made `cuGraphInstantiate` the flags form.
    "cuGraphInstantiate" 12000: PFN_cuGraphInstantiateWithFlags_v11040 = cuGraphInstantiateWithFlags;
    "cuGraphInstantiateWithFlags" 11040: PFN_cuGraphInstantiateWithFlags_v11040 = cuGraphInstantiateWithFlags;
    "cuGraphInstantiateWithParams" 12000: PFN_cuGraphInstantiateWithParams_v12000 = cuGraphInstantiateWithParams;
    "cuGraphInstantiateWithParams" 12000 pt: PFN_cuGraphInstantiateWithParams_v12000_ptsz = cuGraphInstantiateWithParams_ptsz;
    "cuGraphLaunch" 10000: PFN_cuGraphLaunch_v10000 = cuGraphLaunch;
    "cuGraphLaunch" 10000 pt: PFN_cuGraphLaunch_v10000_ptsz = cuGraphLaunch_ptsz;
    "cuGraphUpload" 11010: PFN_cuGraphUpload_v11010 = cuGraphUpload;
    "cuGraphUpload" 11010 pt: PFN_cuGraphUpload_v11010_ptsz = cuGraphUpload_ptsz;
    "cuGraphExecDestroy" 10000: PFN_cuGraphExecDestroy_v10000 = cuGraphExecDestroy;
    // Memory routes shared between processes, graph memory, capture, sparse arrays.
    "cuIpcGetMemHandle" 4010: PFN_cuIpcGetMemHandle_v4010 = cuIpcGetMemHandle;
    "cuIpcOpenMemHandle" 4010: PFN_cuIpcOpenMemHandle_v4010 = cuIpcOpenMemHandle;
    "cuIpcOpenMemHandle" 11000: PFN_cuIpcOpenMemHandle_v11000 = cuIpcOpenMemHandle_v2;
    "cuIpcCloseMemHandle" 4010: PFN_cuIpcCloseMemHandle_v4010 = cuIpcCloseMemHandle;
    "cuIpcGetEventHandle" 4010: PFN_cuIpcGetEventHandle_v4010 = cuIpcGetEventHandle;
    "cuIpcOpenEventHandle" 4010: PFN_cuIpcOpenEventHandle_v4010 = cuIpcOpenEventHandle;
    "cuMemExportToShareableHandle" 10020: PFN_cuMemExportToShareableHandle_v10020 = cuMemExportToShareableHandle;
    "cuMemImportFromShareableHandle" 10020: PFN_cuMemImportFromShareableHandle_v10020 = cuMemImportFromShareableHandle;
    "cuMemMapArrayAsync" 11010: PFN_cuMemMapArrayAsync_v11010 = cuMemMapArrayAsync;
    "cuMemMapArrayAsync" 11010 pt: PFN_cuMemMapArrayAsync_v11010_ptsz = cuMemMapArrayAsync_ptsz;
    "cuArrayGetMemoryRequirements" 11060: PFN_cuArrayGetMemoryRequirements_v11060 = cuArrayGetMemoryRequirements;
    "cuMipmappedArrayGetMemoryRequirements" 11060: PFN_cuMipmappedArrayGetMemoryRequirements_v11060 = cuMipmappedArrayGetMemoryRequirements;
    "cuArrayGetSparseProperties" 11010: PFN_cuArrayGetSparseProperties_v11010 = cuArrayGetSparseProperties;
    "cuMipmappedArrayGetSparseProperties" 11010: PFN_cuMipmappedArrayGetSparseProperties_v11010 = cuMipmappedArrayGetSparseProperties;
    "cuGraphAddMemAllocNode" 11040: PFN_cuGraphAddMemAllocNode_v11040 = cuGraphAddMemAllocNode;
    "cuGraphAddMemFreeNode" 11040: PFN_cuGraphAddMemFreeNode_v11040 = cuGraphAddMemFreeNode;
    "cuGraphMemAllocNodeGetParams" 11040: PFN_cuGraphMemAllocNodeGetParams_v11040 = cuGraphMemAllocNodeGetParams;
    "cuGraphMemFreeNodeGetParams" 11040: PFN_cuGraphMemFreeNodeGetParams_v11040 = cuGraphMemFreeNodeGetParams;
    "cuDeviceGraphMemTrim" 11040: PFN_cuDeviceGraphMemTrim_v11040 = cuDeviceGraphMemTrim;
    "cuDeviceGetGraphMemAttribute" 11040: PFN_cuDeviceGetGraphMemAttribute_v11040 = cuDeviceGetGraphMemAttribute;
    "cuDeviceSetGraphMemAttribute" 11040: PFN_cuDeviceSetGraphMemAttribute_v11040 = cuDeviceSetGraphMemAttribute;
    "cuStreamBeginCapture" 10000: PFN_cuStreamBeginCapture_v10000 = cuStreamBeginCapture;
    "cuStreamBeginCapture" 10000 pt: PFN_cuStreamBeginCapture_v10000_ptsz = cuStreamBeginCapture_ptsz;
    "cuStreamBeginCapture" 10010: PFN_cuStreamBeginCapture_v10010 = cuStreamBeginCapture_v2;
    "cuStreamBeginCapture" 10010 pt: PFN_cuStreamBeginCapture_v10010_ptsz = cuStreamBeginCapture_v2_ptsz;
    "cuStreamEndCapture" 10000: PFN_cuStreamEndCapture_v10000 = cuStreamEndCapture;
    "cuStreamEndCapture" 10000 pt: PFN_cuStreamEndCapture_v10000_ptsz = cuStreamEndCapture_ptsz;
    "cuStreamGetCaptureInfo" 10010: PFN_cuStreamGetCaptureInfo_v10010 = cuStreamGetCaptureInfo;
    "cuStreamGetCaptureInfo" 10010 pt: PFN_cuStreamGetCaptureInfo_v10010_ptsz = cuStreamGetCaptureInfo_ptsz;
    "cuStreamGetCaptureInfo" 11030: PFN_cuStreamGetCaptureInfo_v11030 = cuStreamGetCaptureInfo_v2;
    "cuStreamGetCaptureInfo" 11030 pt: PFN_cuStreamGetCaptureInfo_v11030_ptsz = cuStreamGetCaptureInfo_v2_ptsz;
    "cuStreamGetCaptureInfo" 12030: PFN_cuStreamGetCaptureInfo_v12030 = cuStreamGetCaptureInfo_v3;
    "cuStreamGetCaptureInfo" 12030 pt: PFN_cuStreamGetCaptureInfo_v12030_ptsz = cuStreamGetCaptureInfo_v3_ptsz;
}

/// The table, built once.
pub fn table() -> &'static [Entry] {
    static TABLE: OnceLock<Vec<Entry>> = OnceLock::new();
    TABLE.get_or_init(build)
}

/// Resolves `symbol` for `cuda_version` and `flags` (see the module docs).
pub fn resolve(
    symbol: &str,
    cuda_version: c_int,
    flags: u64,
) -> Result<*const c_void, (CUresult, CUdriverProcAddressQueryResult)> {
    use CUdriverProcAddress_flags as F;
    use CUdriverProcAddressQueryResult as Q;
    let per_thread = match flags {
        f if f == u64::from(F::CU_GET_PROC_ADDRESS_DEFAULT.0) => false,
        f if f == u64::from(F::CU_GET_PROC_ADDRESS_LEGACY_STREAM.0) => false,
        f if f == u64::from(F::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.0) => true,
        _ => {
            return Err((
                CUresult::CUDA_ERROR_INVALID_VALUE,
                Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            ));
        }
    };
    let named: Vec<&Entry> = table().iter().filter(|e| e.name == symbol).collect();
    if named.is_empty() {
        return Err((
            CUresult::CUDA_ERROR_NOT_FOUND,
            Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
        ));
    }
    let best = |pt: bool| {
        named
            .iter()
            .filter(|e| e.per_thread == pt && e.version <= cuda_version)
            .max_by_key(|e| e.version)
            .map(|e| e.ptr)
    };
    let found = if per_thread {
        best(true).or_else(|| best(false))
    } else {
        best(false)
    };
    found.ok_or((
        CUresult::CUDA_ERROR_NOT_FOUND,
        Q::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
    ))
}

fn get_proc(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> CuResult<()> {
    if symbol.is_null() || pfn.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null, and the caller passes a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(symbol) }.to_str().unwrap_or("");
    // A driver hands out only the ABIs it has: asked for a newer CUDA than it is, it
    // answers as itself (a 12.9 driver gives a CUDA 13 runtime the 12.9 ABIs).
    let version = version.min(crate::device::driver_version()?);
    let (ptr, st, rc) = match resolve(name, version, flags) {
        Ok(p) => (
            p,
            CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS,
            Ok(()),
        ),
        Err((e, st)) => {
            if crate::export::tracing() {
                crate::errors::say(&format!(
                    "cuGetProcAddress {name} {version} {flags}: {st:?}"
                ));
            }
            (std::ptr::null(), st, Err(e))
        }
    };
    // SAFETY: `pfn` is non-null and writable by the caller's contract; `status` is
    // optional and written only when non-null.
    unsafe {
        pfn.write(ptr.cast_mut());
        if !status.is_null() {
            status.write(st);
        }
    }
    rc
}

/// `cuGetProcAddress_v2`: works before `cuInit`, as the CUDA 12 runtime relies on.
///
/// # Safety
/// `symbol` must be null or a C string; `pfn` null or writable; `symbolStatus` null or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: cuuint64_t,
    symbolStatus: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    guard(|| get_proc(symbol, pfn, cudaVersion, flags, symbolStatus))
}

/// `cuGetProcAddress` (CUDA 11.3 signature, no status output).
///
/// # Safety
/// `symbol` must be null or a C string; `pfn` null or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    cudaVersion: c_int,
    flags: cuuint64_t,
) -> CUresult {
    guard(|| get_proc(symbol, pfn, cudaVersion, flags, std::ptr::null_mut()))
}

/// `cuGetExportTable`: the driver's private tables that NVIDIA's CUDA runtime asks for
/// ([`crate::export`]); an unknown id is `CUDA_ERROR_INVALID_VALUE` and one line on stderr.
///
/// # Safety
/// `ppExportTable` must be null or writable; `pExportTableId` null or a valid `CUuuid`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(
    ppExportTable: *mut *const c_void,
    pExportTableId: *const CUuuid,
) -> CUresult {
    // SAFETY: the caller's pointers, checked for null inside.
    guard(|| unsafe { crate::export::get(ppExportTable, pExportTableId) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptr_of(name: &str, version: c_int, flags: u64) -> *const c_void {
        resolve(name, version, flags).expect("found")
    }

    #[test]
    fn version_picks_the_abi() {
        assert_eq!(
            ptr_of("cuMemAlloc", 12000, 0),
            cuMemAlloc_v2 as *const c_void
        );
        assert_eq!(
            ptr_of("cuMemAlloc", 3020, 0),
            cuMemAlloc_v2 as *const c_void
        );
        assert_eq!(ptr_of("cuMemAlloc", 3010, 0), cuMemAlloc as *const c_void);
        assert_eq!(
            ptr_of("cuCtxCreate", 11040, 0),
            cuCtxCreate_v3 as *const c_void
        );
        assert_eq!(
            ptr_of("cuGraphInstantiate", 11080, 0),
            cuGraphInstantiate_v2 as *const c_void
        );
        assert_eq!(
            ptr_of("cuGraphInstantiate", 12000, 0),
            cuGraphInstantiateWithFlags as *const c_void
        );
    }

    #[test]
    fn per_thread_flag_picks_ptsz_and_ptds_variants() {
        let pt = CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM.0 as u64;
        assert_eq!(
            ptr_of("cuLaunchKernel", 12000, pt),
            cuLaunchKernel_ptsz as *const c_void
        );
        assert_eq!(
            ptr_of("cuLaunchKernel", 12000, 1),
            cuLaunchKernel as *const c_void
        );
        assert_eq!(
            ptr_of("cuMemcpyHtoD", 12000, pt),
            cuMemcpyHtoD_v2_ptds as *const c_void
        );
        // Before CUDA 7 there were no per-thread variants: the legacy one is returned.
        assert_eq!(
            ptr_of("cuLaunchKernel", 6050, pt),
            cuLaunchKernel as *const c_void
        );
        // Functions without a per-thread variant resolve normally.
        assert_eq!(
            ptr_of("cuMemAlloc", 12000, pt),
            cuMemAlloc_v2 as *const c_void
        );
    }

    #[test]
    fn failures_report_why() {
        use CUdriverProcAddressQueryResult as Q;
        assert_eq!(
            resolve("cuNoSuchThing", 12000, 0).err(),
            Some((
                CUresult::CUDA_ERROR_NOT_FOUND,
                Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
            ))
        );
        assert_eq!(
            resolve("cuMemAlloc_v2", 12000, 0).err(),
            Some((
                CUresult::CUDA_ERROR_NOT_FOUND,
                Q::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
            )),
            "versioned names are not symbols"
        );
        assert_eq!(
            resolve("cuMemAllocAsync", 11000, 0).err(),
            Some((
                CUresult::CUDA_ERROR_NOT_FOUND,
                Q::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
            ))
        );
        assert_eq!(
            resolve("cuInit", 12000, 4).err().map(|e| e.0),
            Some(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn every_entry_is_unique_and_non_null() {
        let t = table();
        for (i, a) in t.iter().enumerate() {
            assert!(!a.ptr.is_null(), "{}", a.name);
            for b in &t[i + 1..] {
                assert!(
                    !(a.name == b.name && a.version == b.version && a.per_thread == b.per_thread),
                    "duplicate {} {}",
                    a.name,
                    a.version
                );
            }
        }
    }
}
