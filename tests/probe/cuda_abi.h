/*
 * cuda_abi.h: the CUDA driver API and NVML declarations the tests' C clients share
 * (probe.c and memprobe.c here, tests/hook_support/memclient.c, src/bench/poolbench.c,
 * the compute workload in src/bench/compute.rs),
 * written from the APIs' published ABI; no NVIDIA header is needed. One copy, so a
 * struct layout is right (or wrong) for every client at once. `tessera_e2e::cc` puts
 * this directory on the include path, so a client compiled from a copy of its text
 * elsewhere finds it too.
 *
 * The types always; with CUDA_ABI_TYPES_ONLY defined, nothing else (probe.c reaches the
 * driver through function pointers of its own, see PROBE_MODE there). Otherwise also the
 * prototypes of what the linked clients (-lcuda, -lnvidia-ml) call, and cu_check.
 */
#ifndef TESSERA_TESTS_CUDA_ABI_H
#define TESSERA_TESTS_CUDA_ABI_H

#include <stddef.h>
#include <stdio.h>
#include <time.h>

/* ---- driver API types ---- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent, *CUgraph,
    *CUgraphNode, *CUgraphExec, *CUmemoryPool, *CUarray, *CUmipmappedArray;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char reserved[64]; } CUipcEventHandle;
typedef struct { size_t Width, Height; int Format; unsigned NumChannels; } CUDA_ARRAY_DESCRIPTOR;
typedef struct { size_t Width, Height, Depth; int Format; unsigned NumChannels, Flags; } CUDA_ARRAY3D_DESCRIPTOR;
typedef struct { size_t size, alignment; unsigned reserved[4]; } CUDA_ARRAY_MEMORY_REQUIREMENTS;
typedef struct { int type; int id; } CUmemLocation;
typedef struct {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
typedef struct { CUmemLocation location; int flags; } CUmemAccessDesc;
typedef struct {
    int allocType;
    int handleTypes;
    CUmemLocation location;
    void *win32SecurityAttributes;
    size_t maxSize;
    unsigned short usage;
    unsigned char reserved[54];
} CUmemPoolProps;
typedef struct {
    CUmemPoolProps poolProps;
    const CUmemAccessDesc *accessDescs;
    size_t accessDescCount;
    size_t bytesize;
    CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct {
    int resourceType;
    union { void *mipmap; CUarray array; } resource;
    int subresourceType;
    union {
        struct { unsigned level, layer, offsetX, offsetY, offsetZ, extentWidth, extentHeight, extentDepth; } sparseLevel;
        struct { unsigned layer; unsigned long long offset, size; } miptail;
    } subresource;
    int memOperationType;
    int memHandleType;
    union { CUmemGenericAllocationHandle memHandle; } memHandle;
    unsigned long long offset;
    unsigned deviceBitMask, flags, reserved[2];
} CUarrayMapInfo;
typedef struct { int id; char pad[4]; union { char pad[64]; int cooperative; } value; } CUlaunchAttribute;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned numAttrs;
} CUlaunchConfig;
typedef struct {
    CUfunction func;
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void **kernelParams;
    void **extra;
    void *kern;
    CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS;
typedef struct {
    unsigned long long flags;
    CUstream hUploadStream;
    CUgraphNode hErrNode_out;
    int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;

/* ---- NVML types ---- */
typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

/* Monotonic time in nanoseconds, for the clients that time calls. */
static inline double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

#ifndef CUDA_ABI_TYPES_ONLY
/* ---- driver API functions (linked: -lcuda) ---- */
CUresult cuInit(unsigned);
CUresult cuGetErrorName(CUresult, const char **);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxCreate_v2(CUcontext *, unsigned, CUdevice);
CUresult cuCtxDestroy_v2(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuStreamCreate(CUstream *, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuEventCreate(CUevent *, unsigned);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuEventSynchronize(CUevent);
CUresult cuEventDestroy_v2(CUevent);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemPoolCreate(CUmemoryPool *, const CUmemPoolProps *);
CUresult cuMemPoolDestroy(CUmemoryPool);
CUresult cuMemPoolTrimTo(CUmemoryPool, size_t);
CUresult cuMemPoolSetAttribute(CUmemoryPool, int, void *);
CUresult cuMemPoolGetAttribute(CUmemoryPool, int, void *);
CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *, CUdevice);
CUresult cuDeviceGetMemPool(CUmemoryPool *, CUdevice);
CUresult cuDeviceSetMemPool(CUdevice, CUmemoryPool);
CUresult cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *, CUipcMemHandle, unsigned);
CUresult cuIpcCloseMemHandle(CUdeviceptr);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemExportToShareableHandle(void *, CUmemGenericAllocationHandle, int, unsigned long long);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *, void *, int);
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *, void *);
CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *, CUmemGenericAllocationHandle);
CUresult cuMemAddressReserve(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
CUresult cuMemAddressFree(CUdeviceptr, size_t);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemUnmap(CUdeviceptr, size_t);
CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
CUresult cuGraphCreate(CUgraph *, unsigned);
CUresult cuGraphDestroy(CUgraph);
CUresult cuGraphAddMemAllocNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                        CUDA_MEM_ALLOC_NODE_PARAMS *);
CUresult cuGraphAddMemFreeNode(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUdeviceptr);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph, unsigned long long);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
CUresult cuGraphUpload(CUgraphExec, CUstream);
CUresult cuGraphExecDestroy(CUgraphExec);
CUresult cuDeviceGraphMemTrim(CUdevice);
CUresult cuDeviceGetGraphMemAttribute(CUdevice, int, void *);
CUresult cuDeviceSetGraphMemAttribute(CUdevice, int, void *);
CUresult cuStreamBeginCapture_v2(CUstream, int);
CUresult cuStreamEndCapture(CUstream, CUgraph *);
CUresult cuStreamIsCapturing(CUstream, int *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuArrayDestroy(CUarray);
CUresult cuMemMapArrayAsync(CUarrayMapInfo *, unsigned, CUstream);
CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *, CUarray, CUdevice);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   unsigned, unsigned, CUstream, void **);
CUresult cuGraphAddKernelNode_v2(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
                                 const CUDA_KERNEL_NODE_PARAMS *);
CUresult cuIpcGetEventHandle(CUipcEventHandle *, CUevent);
CUresult cuIpcOpenEventHandle(CUevent *, CUipcEventHandle);
CUresult cuEventQuery(CUevent);
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuCtxPushCurrent_v2(CUcontext);
CUresult cuCtxPopCurrent_v2(CUcontext *);
CUresult cuGraphInstantiateWithParams(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);

/* ---- NVML functions (linked: -lnvidia-ml) ---- */
nvmlReturn_t nvmlInit_v2(void);
const char *nvmlErrorString(nvmlReturn_t);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *, nvmlDevice_t *);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned);
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t, unsigned *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t, unsigned *, nvmlProcessInfo_v1_t *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t, nvmlUtilization_t *);

/* 1 when `r` is success; otherwise prints the command's error line,
 * "err <cmd> <CUDA_ERROR_NAME>", and returns 0. */
static inline int cu_check(const char *cmd, CUresult r) {
    if (r == 0) return 1;
    const char *name = NULL;
    if (cuGetErrorName(r, &name) != 0 || !name) name = "CUDA_ERROR_UNKNOWN";
    printf("err %s %s\n", cmd, name);
    return 0;
}
#endif

#endif
