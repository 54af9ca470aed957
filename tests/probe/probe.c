/*
 * probe: a small CUDA driver API + NVML client for Tessera's end-to-end tests.
 *
 * It runs inside the thing under test (the simulated driver, or the shim over it) and
 * reports what it saw, one machine-readable line per command:
 *
 *     ok <command> key=value ...
 *     err <command> <CUDA_ERROR_... | NVML_ERROR_... | SYMBOL_MISSING> [key=value ...]
 *
 * It never crashes on an API error; the exit status is 0 unless the script itself is
 * malformed (unknown command, missing argument: a "bad ..." line on stderr, status 2).
 *
 * Three ways of reaching the driver, chosen when compiling (-DPROBE_MODE=n):
 *   1  linked with -lcuda -lnvidia-ml, calling the exported symbols directly;
 *   2  dlopen("libcuda.so.1") / dlopen("libnvidia-ml.so.1") + dlsym on those handles
 *      (what ctypes, cudarc and NVIDIA's Python bindings do);
 *   3  dlopen + dlsym of cuGetProcAddress_v2 only, every other driver function through it
 *      (what the CUDA 12 runtime does). NVML has no such call and is dlopen'd as in 2.
 *
 * The script comes from the arguments (one command per argument) or, without arguments,
 * from stdin (one per line). Commands (addresses are h<N>[+offset] or 0x...):
 *
 *   init | version | count | device <i> | name | uuid | pid | sleep <ms>
 *   ctx | ctx-release | ctx-create | ctx-destroy | sync | meminfo | totalmem
 *   alloc <bytes> [plain|pitch|managed|async|pool|vmm|array|array3d|mipmapped|host]
 *   free <h>
 *   write <addr> <len> <byte> | read <addr> <len> | memset <addr> <len> <byte>
 *   copy <dst> <src> <len>
 *   load <module text; ';' separates lines> | unload
 *   launch <kernel> [n] [kernel|ptsz|ex|coop|graph|stream]
 *   elapsed <kernel> <n>
 *   procaddr <symbol> <cudaVersion> [pt]
 *   bench-launch <n> | bench-alloc <n> [bytes]
 *   nvml-init | nvml-shutdown | nvml-count | nvml-name | nvml-uuid
 *   nvml-meminfo | nvml-meminfo2 | nvml-util | nvml-procs
 *
 * The driver's and NVML's types come from cuda_abi.h, written from their published ABI;
 * no NVIDIA header is needed to build this file.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef PROBE_MODE
#define PROBE_MODE 1
#endif

/* Types only: this probe reaches the driver through its own function pointers. */
#define CUDA_ABI_TYPES_ONLY
#include "cuda_abi.h"

/* field, exported symbol, base name for cuGetProcAddress, version asked, per-thread, params */
#define CUDA_API(X) \
    X(cuInit, cuInit, "cuInit", 12000, 0, (unsigned flags)) \
    X(cuDriverGetVersion, cuDriverGetVersion, "cuDriverGetVersion", 12000, 0, (int *v)) \
    X(cuGetErrorName, cuGetErrorName, "cuGetErrorName", 12000, 0, (CUresult e, const char **s)) \
    X(cuDeviceGet, cuDeviceGet, "cuDeviceGet", 12000, 0, (CUdevice *d, int i)) \
    X(cuDeviceGetCount, cuDeviceGetCount, "cuDeviceGetCount", 12000, 0, (int *n)) \
    X(cuDeviceGetName, cuDeviceGetName, "cuDeviceGetName", 12000, 0, (char *s, int len, CUdevice d)) \
    X(cuDeviceGetUuid, cuDeviceGetUuid_v2, "cuDeviceGetUuid", 12000, 0, (CUuuid *u, CUdevice d)) \
    X(cuDeviceTotalMem, cuDeviceTotalMem_v2, "cuDeviceTotalMem", 12000, 0, (size_t *b, CUdevice d)) \
    X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 12000, 0, (CUcontext *c, CUdevice d)) \
    X(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 12000, 0, (CUdevice d)) \
    X(cuCtxSetCurrent, cuCtxSetCurrent, "cuCtxSetCurrent", 12000, 0, (CUcontext c)) \
    X(cuCtxCreate, cuCtxCreate_v2, "cuCtxCreate", 3020, 0, (CUcontext *c, unsigned f, CUdevice d)) \
    X(cuCtxDestroy, cuCtxDestroy_v2, "cuCtxDestroy", 12000, 0, (CUcontext c)) \
    X(cuCtxSynchronize, cuCtxSynchronize, "cuCtxSynchronize", 12000, 0, (void)) \
    X(cuMemGetInfo, cuMemGetInfo_v2, "cuMemGetInfo", 12000, 0, (size_t *f, size_t *t)) \
    X(cuMemAlloc, cuMemAlloc_v2, "cuMemAlloc", 12000, 0, (CUdeviceptr *p, size_t n)) \
    X(cuMemAllocPitch, cuMemAllocPitch_v2, "cuMemAllocPitch", 12000, 0, (CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e)) \
    X(cuMemAllocManaged, cuMemAllocManaged, "cuMemAllocManaged", 12000, 0, (CUdeviceptr *p, size_t n, unsigned f)) \
    X(cuMemFree, cuMemFree_v2, "cuMemFree", 12000, 0, (CUdeviceptr p)) \
    X(cuMemAllocHost, cuMemAllocHost_v2, "cuMemAllocHost", 12000, 0, (void **p, size_t n)) \
    X(cuMemFreeHost, cuMemFreeHost, "cuMemFreeHost", 12000, 0, (void *p)) \
    X(cuMemAllocAsync, cuMemAllocAsync, "cuMemAllocAsync", 12000, 0, (CUdeviceptr *p, size_t n, CUstream s)) \
    X(cuMemFreeAsync, cuMemFreeAsync, "cuMemFreeAsync", 12000, 0, (CUdeviceptr p, CUstream s)) \
    X(cuMemPoolCreate, cuMemPoolCreate, "cuMemPoolCreate", 12000, 0, (CUmemoryPool *p, const CUmemPoolProps *props)) \
    X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 12000, 0, (CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s)) \
    X(cuMemGetAllocationGranularity, cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 12000, 0, (size_t *g, const CUmemAllocationProp *p, int o)) \
    X(cuMemCreate, cuMemCreate, "cuMemCreate", 12000, 0, (CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *p, unsigned long long f)) \
    X(cuMemRelease, cuMemRelease, "cuMemRelease", 12000, 0, (CUmemGenericAllocationHandle h)) \
    X(cuMemAddressReserve, cuMemAddressReserve, "cuMemAddressReserve", 12000, 0, (CUdeviceptr *p, size_t n, size_t a, CUdeviceptr addr, unsigned long long f)) \
    X(cuMemAddressFree, cuMemAddressFree, "cuMemAddressFree", 12000, 0, (CUdeviceptr p, size_t n)) \
    X(cuMemMap, cuMemMap, "cuMemMap", 12000, 0, (CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h, unsigned long long f)) \
    X(cuMemUnmap, cuMemUnmap, "cuMemUnmap", 12000, 0, (CUdeviceptr p, size_t n)) \
    X(cuMemSetAccess, cuMemSetAccess, "cuMemSetAccess", 12000, 0, (CUdeviceptr p, size_t n, const CUmemAccessDesc *d, size_t c)) \
    X(cuArrayCreate, cuArrayCreate_v2, "cuArrayCreate", 12000, 0, (CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d)) \
    X(cuArray3DCreate, cuArray3DCreate_v2, "cuArray3DCreate", 12000, 0, (CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d)) \
    X(cuArrayDestroy, cuArrayDestroy, "cuArrayDestroy", 12000, 0, (CUarray a)) \
    X(cuMipmappedArrayCreate, cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 12000, 0, (CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned l)) \
    X(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 12000, 0, (CUmipmappedArray a)) \
    X(cuMemcpyHtoD, cuMemcpyHtoD_v2, "cuMemcpyHtoD", 12000, 0, (CUdeviceptr d, const void *s, size_t n)) \
    X(cuMemcpyDtoH, cuMemcpyDtoH_v2, "cuMemcpyDtoH", 12000, 0, (void *d, CUdeviceptr s, size_t n)) \
    X(cuMemcpyDtoD, cuMemcpyDtoD_v2, "cuMemcpyDtoD", 12000, 0, (CUdeviceptr d, CUdeviceptr s, size_t n)) \
    X(cuMemsetD8, cuMemsetD8_v2, "cuMemsetD8", 12000, 0, (CUdeviceptr d, unsigned char v, size_t n)) \
    X(cuModuleLoadData, cuModuleLoadData, "cuModuleLoadData", 12000, 0, (CUmodule *m, const void *image)) \
    X(cuModuleUnload, cuModuleUnload, "cuModuleUnload", 12000, 0, (CUmodule m)) \
    X(cuModuleGetFunction, cuModuleGetFunction, "cuModuleGetFunction", 12000, 0, (CUfunction *f, CUmodule m, const char *name)) \
    X(cuLaunchKernel, cuLaunchKernel, "cuLaunchKernel", 12000, 0, (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, void **p, void **e)) \
    X(cuLaunchKernel_ptsz, cuLaunchKernel_ptsz, "cuLaunchKernel", 12000, 1, (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, void **p, void **e)) \
    X(cuLaunchKernelEx, cuLaunchKernelEx, "cuLaunchKernelEx", 12000, 0, (const CUlaunchConfig *c, CUfunction f, void **p, void **e)) \
    X(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 12000, 0, (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sh, CUstream s, void **p)) \
    X(cuStreamCreate, cuStreamCreate, "cuStreamCreate", 12000, 0, (CUstream *s, unsigned f)) \
    X(cuStreamSynchronize, cuStreamSynchronize, "cuStreamSynchronize", 12000, 0, (CUstream s)) \
    X(cuEventCreate, cuEventCreate, "cuEventCreate", 12000, 0, (CUevent *e, unsigned f)) \
    X(cuEventRecord, cuEventRecord, "cuEventRecord", 12000, 0, (CUevent e, CUstream s)) \
    X(cuEventSynchronize, cuEventSynchronize, "cuEventSynchronize", 12000, 0, (CUevent e)) \
    X(cuEventElapsedTime, cuEventElapsedTime, "cuEventElapsedTime", 12000, 0, (float *ms, CUevent a, CUevent b)) \
    X(cuEventDestroy, cuEventDestroy_v2, "cuEventDestroy", 12000, 0, (CUevent e)) \
    X(cuGraphCreate, cuGraphCreate, "cuGraphCreate", 12000, 0, (CUgraph *g, unsigned f)) \
    X(cuGraphAddKernelNode, cuGraphAddKernelNode_v2, "cuGraphAddKernelNode", 12000, 0, (CUgraphNode *n, CUgraph g, const CUgraphNode *d, size_t nd, const CUDA_KERNEL_NODE_PARAMS *p)) \
    X(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", 12000, 0, (CUgraphExec *e, CUgraph g, unsigned long long f)) \
    X(cuGraphLaunch, cuGraphLaunch, "cuGraphLaunch", 12000, 0, (CUgraphExec e, CUstream s)) \
    X(cuGraphExecDestroy, cuGraphExecDestroy, "cuGraphExecDestroy", 12000, 0, (CUgraphExec e)) \
    X(cuGraphDestroy, cuGraphDestroy, "cuGraphDestroy", 12000, 0, (CUgraph g))

#define NVML_API(X) \
    X(nvmlInit_v2, (void)) \
    X(nvmlShutdown, (void)) \
    X(nvmlDeviceGetCount_v2, (unsigned *n)) \
    X(nvmlDeviceGetHandleByIndex_v2, (unsigned i, nvmlDevice_t *d)) \
    X(nvmlDeviceGetName, (nvmlDevice_t d, char *s, unsigned len)) \
    X(nvmlDeviceGetUUID, (nvmlDevice_t d, char *s, unsigned len)) \
    X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t d, nvmlMemory_t *m)) \
    X(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t d, nvmlMemory_v2_t *m)) \
    X(nvmlDeviceGetUtilizationRates, (nvmlDevice_t d, nvmlUtilization_t *u)) \
    X(nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t d, unsigned *n, nvmlProcessInfo_t *p))

typedef CUresult (*PFN_getproc)(const char *, void **, int, unsigned long long, int *);

static struct {
#define FIELD(field, sym, base, ver, pt, params) CUresult (*field) params;
    CUDA_API(FIELD)
#undef FIELD
#define NFIELD(sym, params) nvmlReturn_t (*sym) params;
    NVML_API(NFIELD)
#undef NFIELD
    PFN_getproc getproc;
} api;

#if PROBE_MODE == 1
#define DECL(field, sym, base, ver, pt, params) extern CUresult sym params;
CUDA_API(DECL)
#undef DECL
#define NDECL(sym, params) extern nvmlReturn_t sym params;
NVML_API(NDECL)
#undef NDECL
extern CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
#endif

static void load_api(void) {
#if PROBE_MODE == 1
#define SET(field, sym, base, ver, pt, params) api.field = sym;
    CUDA_API(SET)
#undef SET
#define NSET(sym, params) api.sym = sym;
    NVML_API(NSET)
#undef NSET
    api.getproc = cuGetProcAddress_v2;
#else
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        printf("err load-library libcuda.so.1 msg=%s\n", dlerror());
    } else {
        *(void **)&api.getproc = dlsym(cuda, "cuGetProcAddress_v2");
#if PROBE_MODE == 2
#define SET(field, sym, base, ver, pt, params) *(void **)&api.field = dlsym(cuda, #sym);
        CUDA_API(SET)
#undef SET
#else
        if (api.getproc) {
            int status = 0;
#define SET(field, sym, base, ver, pt, params) \
    if (api.getproc(base, (void **)&api.field, ver, (pt) ? 2 : 0, &status) != 0) api.field = NULL;
            CUDA_API(SET)
#undef SET
        }
#endif
    }
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (nvml) {
#define NSET(sym, params) *(void **)&api.sym = dlsym(nvml, #sym);
        NVML_API(NSET)
#undef NSET
    }
#endif
}

/* ---- reporting ---- */

static const char *cu_name(CUresult r) {
    static char buf[48];
    const char *s = NULL;
    if (api.cuGetErrorName && api.cuGetErrorName(r, &s) == 0 && s) return s;
    snprintf(buf, sizeof buf, "CUDA_ERROR_%d", r);
    return buf;
}

static const char *nvml_name(nvmlReturn_t r) {
    static char buf[48];
    switch (r) {
    case 1: return "NVML_ERROR_UNINITIALIZED";
    case 2: return "NVML_ERROR_INVALID_ARGUMENT";
    case 3: return "NVML_ERROR_NOT_SUPPORTED";
    case 4: return "NVML_ERROR_NO_PERMISSION";
    case 6: return "NVML_ERROR_NOT_FOUND";
    case 7: return "NVML_ERROR_INSUFFICIENT_SIZE";
    case 9: return "NVML_ERROR_DRIVER_NOT_LOADED";
    case 10: return "NVML_ERROR_TIMEOUT";
    case 15: return "NVML_ERROR_GPU_IS_LOST";
    case 999: return "NVML_ERROR_UNKNOWN";
    default: snprintf(buf, sizeof buf, "NVML_ERROR_%d", r); return buf;
    }
}

/* Calls a driver function through the table; reports a missing one instead of crashing.
 * Evaluates to the CUresult, or -1 when the symbol is missing. */
#define CU(cmd, field, ...) \
    (api.field ? api.field(__VA_ARGS__) : (printf("err %s SYMBOL_MISSING symbol=%s\n", cmd, #field), -1))
#define NV(cmd, sym, ...) \
    (api.sym ? api.sym(__VA_ARGS__) : (printf("err %s SYMBOL_MISSING symbol=%s\n", cmd, #sym), -1))

/* Runs a driver call; on failure prints the err line and evaluates to 0. */
#define CHECK(cmd, call) check_cu(cmd, (call))
static int check_cu(const char *cmd, CUresult r) {
    if (r == 0) return 1;
    if (r != -1) printf("err %s %s\n", cmd, cu_name(r));
    return 0;
}
#define NCHECK(cmd, call) check_nv(cmd, (call))
static int check_nv(const char *cmd, nvmlReturn_t r) {
    if (r == 0) return 1;
    if (r != -1) printf("err %s %s\n", cmd, nvml_name(r));
    return 0;
}

/* ---- state ---- */

#define MAX_HANDLES 4096
struct handle {
    int used;
    char kind[16];
    CUdeviceptr ptr;
    size_t bytes;
    void *host;
    CUarray array;
    CUmipmappedArray mip;
    CUmemGenericAllocationHandle vmm;
};
static struct handle handles[MAX_HANDLES];
static int nhandles;
static int device;
static CUcontext created_ctx;
static CUmodule module;
static CUmemoryPool pools[64];
static nvmlDevice_t nvml_dev(int i, const char *cmd) {
    nvmlDevice_t d = NULL;
    if (!NCHECK(cmd, NV(cmd, nvmlDeviceGetHandleByIndex_v2, (unsigned)i, &d))) return NULL;
    return d;
}

static void bad(const char *line) {
    fprintf(stderr, "bad %s\n", line);
    exit(2);
}

static unsigned long long num(const char *s, const char *line) {
    char *end = NULL;
    if (!s) bad(line);
    unsigned long long v = strtoull(s, &end, 0);
    if (end == s || *end) bad(line);
    return v;
}

/* h<N>[+off] or a number. */
static CUdeviceptr addr(const char *s, const char *line) {
    if (!s) bad(line);
    if (s[0] == 'h') {
        char *end = NULL;
        long h = strtol(s + 1, &end, 10);
        if (end == s + 1 || h < 0 || h >= nhandles || !handles[h].used) bad(line);
        unsigned long long off = 0;
        if (*end == '+') off = num(end + 1, line);
        else if (*end) bad(line);
        return handles[h].ptr + off;
    }
    return num(s, line);
}

static int new_handle(void) {
    if (nhandles >= MAX_HANDLES) return -1;
    memset(&handles[nhandles], 0, sizeof handles[nhandles]);
    return nhandles++;
}

/* ---- commands ---- */

static void cmd_alloc(char *line, char *a1, char *a2) {
    size_t bytes = num(a1, line);
    const char *kind = a2 ? a2 : "plain";
    int h = new_handle();
    if (h < 0) { printf("err alloc TOO_MANY_HANDLES\n"); return; }
    struct handle *x = &handles[h];
    snprintf(x->kind, sizeof x->kind, "%s", kind);
    size_t got = bytes;
    int ok = 0;
    if (!strcmp(kind, "plain")) {
        ok = CHECK("alloc", CU("alloc", cuMemAlloc, &x->ptr, bytes));
    } else if (!strcmp(kind, "pitch")) {
        size_t pitch = 0, height = (bytes + 511) / 512;
        ok = CHECK("alloc", CU("alloc", cuMemAllocPitch, &x->ptr, &pitch, 512, height ? height : 1, 4));
        got = pitch * (height ? height : 1);
    } else if (!strcmp(kind, "managed")) {
        ok = CHECK("alloc", CU("alloc", cuMemAllocManaged, &x->ptr, bytes, 1));
    } else if (!strcmp(kind, "async")) {
        ok = CHECK("alloc", CU("alloc", cuMemAllocAsync, &x->ptr, bytes, NULL));
    } else if (!strcmp(kind, "pool")) {
        if (device < 0 || device >= 64) bad(line);
        if (!pools[device]) {
            CUmemPoolProps p;
            memset(&p, 0, sizeof p);
            p.allocType = 1;
            p.location.type = 1;
            p.location.id = device;
            if (!CHECK("alloc", CU("alloc", cuMemPoolCreate, &pools[device], &p))) { nhandles--; return; }
        }
        ok = CHECK("alloc", CU("alloc", cuMemAllocFromPoolAsync, &x->ptr, bytes, pools[device], NULL));
    } else if (!strcmp(kind, "vmm")) {
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        p.type = 1;
        p.location.type = 1;
        p.location.id = device;
        size_t g = 0;
        if (CHECK("alloc", CU("alloc", cuMemGetAllocationGranularity, &g, &p, 0)) && g) {
            got = (bytes + g - 1) / g * g;
            if (got == 0) got = g;
            if (CHECK("alloc", CU("alloc", cuMemCreate, &x->vmm, got, &p, 0ULL))) {
                if (CHECK("alloc", CU("alloc", cuMemAddressReserve, &x->ptr, got, 0, 0ULL, 0ULL))) {
                    CUmemAccessDesc d = {{1, device}, 3};
                    if (CHECK("alloc", CU("alloc", cuMemMap, x->ptr, got, 0, x->vmm, 0ULL)) &&
                        CHECK("alloc", CU("alloc", cuMemSetAccess, x->ptr, got, &d, 1))) {
                        ok = 1;
                    }
                }
                if (!ok) CU("alloc", cuMemRelease, x->vmm);
            }
        }
    } else if (!strcmp(kind, "array")) {
        CUDA_ARRAY_DESCRIPTOR d = {bytes < 65536 ? bytes : 65536, 0, 1, 1};
        d.Height = (bytes + d.Width - 1) / (d.Width ? d.Width : 1);
        if (d.Height == 1) d.Height = 0;
        got = d.Width * (d.Height ? d.Height : 1);
        ok = CHECK("alloc", CU("alloc", cuArrayCreate, &x->array, &d));
    } else if (!strcmp(kind, "array3d") || !strcmp(kind, "mipmapped")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {bytes < 1024 ? bytes : 1024, 1, 1, 1, 1, 0};
        d.Height = (bytes + d.Width - 1) / (d.Width ? d.Width : 1);
        if (d.Height > 1024) d.Height = 1024;
        size_t plane = d.Width * d.Height;
        d.Depth = plane ? (bytes + plane - 1) / plane : 1;
        got = d.Width * d.Height * d.Depth;
        if (!strcmp(kind, "array3d")) ok = CHECK("alloc", CU("alloc", cuArray3DCreate, &x->array, &d));
        else ok = CHECK("alloc", CU("alloc", cuMipmappedArrayCreate, &x->mip, &d, 1));
    } else if (!strcmp(kind, "host")) {
        ok = CHECK("alloc", CU("alloc", cuMemAllocHost, &x->host, bytes));
        x->ptr = (CUdeviceptr)(uintptr_t)x->host;
    } else {
        bad(line);
    }
    if (!ok) { nhandles--; return; }
    x->used = 1;
    x->bytes = got;
    printf("ok alloc h=%d kind=%s ptr=0x%llx bytes=%zu\n", h, kind, x->ptr, got);
}

static void cmd_free(char *line, char *a1) {
    long h = (long)num(a1, line);
    if (h < 0 || h >= nhandles || !handles[h].used) bad(line);
    struct handle *x = &handles[h];
    int ok = 0;
    const char *k = x->kind;
    if (!strcmp(k, "plain") || !strcmp(k, "pitch") || !strcmp(k, "managed")) {
        ok = CHECK("free", CU("free", cuMemFree, x->ptr));
    } else if (!strcmp(k, "async") || !strcmp(k, "pool")) {
        ok = CHECK("free", CU("free", cuMemFreeAsync, x->ptr, NULL)) &&
             CHECK("free", CU("free", cuStreamSynchronize, NULL));
    } else if (!strcmp(k, "vmm")) {
        ok = CHECK("free", CU("free", cuMemUnmap, x->ptr, x->bytes)) &&
             CHECK("free", CU("free", cuMemRelease, x->vmm)) &&
             CHECK("free", CU("free", cuMemAddressFree, x->ptr, x->bytes));
    } else if (!strcmp(k, "array") || !strcmp(k, "array3d")) {
        ok = CHECK("free", CU("free", cuArrayDestroy, x->array));
    } else if (!strcmp(k, "mipmapped")) {
        ok = CHECK("free", CU("free", cuMipmappedArrayDestroy, x->mip));
    } else if (!strcmp(k, "host")) {
        ok = CHECK("free", CU("free", cuMemFreeHost, x->host));
    }
    if (ok) {
        x->used = 0;
        printf("ok free h=%ld\n", h);
    }
}

static CUfunction function(const char *cmd, const char *name) {
    CUfunction f = NULL;
    if (!module) { printf("err %s NO_MODULE\n", cmd); return NULL; }
    if (!CHECK(cmd, CU(cmd, cuModuleGetFunction, &f, module, name))) return NULL;
    return f;
}

static int launch_one(const char *how, CUfunction f, CUstream s) {
    if (!strcmp(how, "kernel") || !strcmp(how, "stream"))
        return CHECK("launch", CU("launch", cuLaunchKernel, f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    if (!strcmp(how, "ptsz"))
        return CHECK("launch", CU("launch", cuLaunchKernel_ptsz, f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    if (!strcmp(how, "coop"))
        return CHECK("launch", CU("launch", cuLaunchCooperativeKernel, f, 1, 1, 1, 1, 1, 1, 0, s, NULL));
    if (!strcmp(how, "ex")) {
        CUlaunchConfig c;
        memset(&c, 0, sizeof c);
        c.gridDimX = c.gridDimY = c.gridDimZ = 1;
        c.blockDimX = c.blockDimY = c.blockDimZ = 1;
        c.hStream = s;
        return CHECK("launch", CU("launch", cuLaunchKernelEx, &c, f, NULL, NULL));
    }
    return -1;
}

static void cmd_launch(char *line, char *a1, char *a2, char *a3) {
    if (!a1) bad(line);
    long n = a2 ? (long)num(a2, line) : 1;
    const char *how = a3 ? a3 : "kernel";
    if (strcmp(how, "kernel") && strcmp(how, "ptsz") && strcmp(how, "ex") && strcmp(how, "coop") &&
        strcmp(how, "graph") && strcmp(how, "stream"))
        bad(line);
    CUfunction f = function("launch", a1);
    if (!f) return;
    CUstream s = NULL;
    if (!strcmp(how, "stream") && !CHECK("launch", CU("launch", cuStreamCreate, &s, 0))) return;
    if (!strcmp(how, "graph")) {
        CUgraph g = NULL;
        CUgraphExec e = NULL;
        if (!CHECK("launch", CU("launch", cuGraphCreate, &g, 0))) return;
        CUgraphNode prev = NULL;
        for (long i = 0; i < n; i++) {
            CUDA_KERNEL_NODE_PARAMS p;
            memset(&p, 0, sizeof p);
            p.func = f;
            p.gridDimX = p.gridDimY = p.gridDimZ = 1;
            p.blockDimX = p.blockDimY = p.blockDimZ = 1;
            CUgraphNode node = NULL;
            if (!CHECK("launch", CU("launch", cuGraphAddKernelNode, &node, g, prev ? &prev : NULL, prev ? 1 : 0, &p))) return;
            prev = node;
        }
        if (!CHECK("launch", CU("launch", cuGraphInstantiateWithFlags, &e, g, 0ULL))) return;
        if (!CHECK("launch", CU("launch", cuGraphLaunch, e, NULL))) return;
        CU("launch", cuGraphExecDestroy, e);
        CU("launch", cuGraphDestroy, g);
    } else {
        for (long i = 0; i < n; i++) {
            int r = launch_one(how, f, s);
            if (r != 1) return;
        }
        if (s && !CHECK("launch", CU("launch", cuStreamSynchronize, s))) return;
    }
    printf("ok launch kernel=%s n=%ld how=%s\n", a1, n, how);
}

static void cmd_elapsed(char *line, char *a1, char *a2) {
    long n = (long)num(a2, line);
    CUfunction f = function("elapsed", a1);
    if (!f) return;
    CUevent a = NULL, b = NULL;
    float ms = 0;
    if (!CHECK("elapsed", CU("elapsed", cuEventCreate, &a, 0)) || !CHECK("elapsed", CU("elapsed", cuEventCreate, &b, 0))) return;
    if (!CHECK("elapsed", CU("elapsed", cuEventRecord, a, NULL))) return;
    for (long i = 0; i < n; i++)
        if (!CHECK("elapsed", CU("elapsed", cuLaunchKernel, f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL))) return;
    if (!CHECK("elapsed", CU("elapsed", cuEventRecord, b, NULL))) return;
    if (!CHECK("elapsed", CU("elapsed", cuEventSynchronize, b))) return;
    if (!CHECK("elapsed", CU("elapsed", cuEventElapsedTime, &ms, a, b))) return;
    CU("elapsed", cuEventDestroy, a);
    CU("elapsed", cuEventDestroy, b);
    printf("ok elapsed ms=%.3f\n", ms);
}

static void cmd_bench(char *line, char *a1) {
    long n = (long)num(a1, line);
    if (!module) {
        if (!CHECK("bench-launch", CU("bench-launch", cuModuleLoadData, &module, "kernel probe_noop 0"))) return;
    }
    CUfunction f = NULL;
    if (CU("bench-launch", cuModuleGetFunction, &f, module, "probe_noop") != 0) {
        /* The loaded module has no noop: load one just for this. */
        CUmodule m = NULL;
        if (!CHECK("bench-launch", CU("bench-launch", cuModuleLoadData, &m, "kernel probe_noop 0"))) return;
        if (!CHECK("bench-launch", CU("bench-launch", cuModuleGetFunction, &f, m, "probe_noop"))) return;
    }
    /* Warm up, then time. */
    for (long i = 0; i < 1000 && i < n; i++)
        if (!CHECK("bench-launch", CU("bench-launch", cuLaunchKernel, f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL))) return;
    double t0 = now_ns();
    for (long i = 0; i < n; i++)
        if (!CHECK("bench-launch", CU("bench-launch", cuLaunchKernel, f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL))) return;
    double t1 = now_ns();
    if (!CHECK("bench-launch", CU("bench-launch", cuCtxSynchronize))) return;
    printf("ok bench-launch n=%ld ns_per_call=%.1f\n", n, n ? (t1 - t0) / n : 0.0);
}

/* Times n cuMemAlloc/cuMemFree pairs of `bytes` (default 4096). */
static void cmd_bench_alloc(char *line, char *a1, char *a2) {
    long n = (long)num(a1, line);
    size_t bytes = a2 ? num(a2, line) : 4096;
    CUdeviceptr p = 0;
    for (long i = 0; i < 1000 && i < n; i++)
        if (!CHECK("bench-alloc", CU("bench-alloc", cuMemAlloc, &p, bytes)) ||
            !CHECK("bench-alloc", CU("bench-alloc", cuMemFree, p))) return;
    double t0 = now_ns();
    for (long i = 0; i < n; i++)
        if (!CHECK("bench-alloc", CU("bench-alloc", cuMemAlloc, &p, bytes)) ||
            !CHECK("bench-alloc", CU("bench-alloc", cuMemFree, p))) return;
    double t1 = now_ns();
    printf("ok bench-alloc n=%ld bytes=%zu ns_per_pair=%.1f\n", n, bytes, n ? (t1 - t0) / n : 0.0);
}

static void cmd_procaddr(char *line, char *a1, char *a2, char *a3) {
    if (!a1) bad(line);
    int ver = (int)num(a2, line);
    unsigned long long flags = 0;
    if (a3) {
        if (!strcmp(a3, "pt")) flags = 2;
        else flags = num(a3, line);
    }
    if (!api.getproc) { printf("err procaddr SYMBOL_MISSING symbol=cuGetProcAddress_v2\n"); return; }
    void *p = NULL;
    int status = -1;
    CUresult r = api.getproc(a1, &p, ver, flags, &status);
    if (r) {
        printf("err procaddr %s symbol=%s status=%d\n", cu_name(r), a1, status);
        return;
    }
    Dl_info info;
    int found = p && dladdr(p, &info);
    const char *sym = (found && info.dli_sname) ? info.dli_sname : "?";
    /* The object the pointer lies in (the driver, or a shim in front of it). */
    const char *obj = (found && info.dli_fname) ? info.dli_fname : "?";
    const char *slash = strrchr(obj, '/');
    printf("ok procaddr symbol=%s status=%d resolved=%s lib=%s\n", a1, status, sym, slash ? slash + 1 : obj);
}

static void run(char *line) {
    char copy[8192];
    snprintf(copy, sizeof copy, "%s", line);
    char *save = NULL;
    char *cmd = strtok_r(line, " \t\r\n", &save);
    if (!cmd || cmd[0] == '#') return;
    char *a1 = strtok_r(NULL, " \t\r\n", &save);
    char *a2 = strtok_r(NULL, " \t\r\n", &save);
    char *a3 = strtok_r(NULL, " \t\r\n", &save);
    line = copy;

    if (!strcmp(cmd, "init")) {
        double t0 = now_ns();
        if (CHECK(cmd, CU(cmd, cuInit, 0))) printf("ok init ns=%.0f\n", now_ns() - t0);
    } else if (!strcmp(cmd, "version")) {
        int v = 0;
        if (CHECK(cmd, CU(cmd, cuDriverGetVersion, &v))) printf("ok version driver=%d\n", v);
    } else if (!strcmp(cmd, "count")) {
        int n = 0;
        if (CHECK(cmd, CU(cmd, cuDeviceGetCount, &n))) printf("ok count n=%d\n", n);
    } else if (!strcmp(cmd, "device")) {
        device = (int)num(a1, line);
        printf("ok device index=%d\n", device);
    } else if (!strcmp(cmd, "pid")) {
        printf("ok pid pid=%d\n", (int)getpid());
    } else if (!strcmp(cmd, "sleep")) {
        unsigned long long ms = num(a1, line);
        struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        printf("ok sleep ms=%llu\n", ms);
    } else if (!strcmp(cmd, "name")) {
        char name[256] = {0};
        if (CHECK(cmd, CU(cmd, cuDeviceGetName, name, sizeof name, device))) printf("ok name dev=%d name=%s\n", device, name);
    } else if (!strcmp(cmd, "uuid")) {
        CUuuid u;
        if (CHECK(cmd, CU(cmd, cuDeviceGetUuid, &u, device))) {
            const unsigned char *b = (const unsigned char *)u.bytes;
            printf("ok uuid dev=%d uuid=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", device,
                   b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        }
    } else if (!strcmp(cmd, "ctx")) {
        CUcontext c = NULL;
        if (CHECK(cmd, CU(cmd, cuDevicePrimaryCtxRetain, &c, device)) && CHECK(cmd, CU(cmd, cuCtxSetCurrent, c)))
            printf("ok ctx dev=%d\n", device);
    } else if (!strcmp(cmd, "ctx-release")) {
        if (CHECK(cmd, CU(cmd, cuDevicePrimaryCtxRelease, device))) printf("ok ctx-release dev=%d\n", device);
    } else if (!strcmp(cmd, "ctx-create")) {
        if (CHECK(cmd, CU(cmd, cuCtxCreate, &created_ctx, 0, device))) printf("ok ctx-create dev=%d\n", device);
    } else if (!strcmp(cmd, "ctx-destroy")) {
        if (CHECK(cmd, CU(cmd, cuCtxDestroy, created_ctx))) {
            created_ctx = NULL;
            printf("ok ctx-destroy\n");
        }
    } else if (!strcmp(cmd, "sync")) {
        if (CHECK(cmd, CU(cmd, cuCtxSynchronize))) printf("ok sync\n");
    } else if (!strcmp(cmd, "meminfo")) {
        size_t f = 0, t = 0;
        if (CHECK(cmd, CU(cmd, cuMemGetInfo, &f, &t))) printf("ok meminfo free=%zu total=%zu\n", f, t);
    } else if (!strcmp(cmd, "totalmem")) {
        size_t t = 0;
        if (CHECK(cmd, CU(cmd, cuDeviceTotalMem, &t, device))) printf("ok totalmem bytes=%zu\n", t);
    } else if (!strcmp(cmd, "alloc")) {
        cmd_alloc(line, a1, a2);
    } else if (!strcmp(cmd, "free")) {
        cmd_free(line, a1);
    } else if (!strcmp(cmd, "write") || !strcmp(cmd, "memset")) {
        CUdeviceptr p = addr(a1, line);
        size_t n = num(a2, line);
        unsigned char v = (unsigned char)num(a3, line);
        if (!strcmp(cmd, "memset")) {
            if (CHECK(cmd, CU(cmd, cuMemsetD8, p, v, n))) printf("ok memset\n");
        } else {
            unsigned char *buf = malloc(n ? n : 1);
            if (!buf) { printf("err write HOST_OUT_OF_MEMORY\n"); return; }
            memset(buf, v, n);
            if (CHECK(cmd, CU(cmd, cuMemcpyHtoD, p, buf, n))) printf("ok write\n");
            free(buf);
        }
    } else if (!strcmp(cmd, "read")) {
        CUdeviceptr p = addr(a1, line);
        size_t n = num(a2, line);
        unsigned char *buf = calloc(n ? n : 1, 1);
        if (!buf) { printf("err read HOST_OUT_OF_MEMORY\n"); return; }
        if (CHECK(cmd, CU(cmd, cuMemcpyDtoH, buf, p, n))) {
            unsigned long long sum = 0;
            for (size_t i = 0; i < n; i++) sum += buf[i];
            printf("ok read first=0x%02x last=0x%02x sum=%llu\n", n ? buf[0] : 0, n ? buf[n - 1] : 0, sum);
        }
        free(buf);
    } else if (!strcmp(cmd, "copy")) {
        CUdeviceptr d = addr(a1, line), s = addr(a2, line);
        size_t n = num(a3, line);
        if (CHECK(cmd, CU(cmd, cuMemcpyDtoD, d, s, n))) printf("ok copy\n");
    } else if (!strcmp(cmd, "load")) {
        /* The module text is the rest of the original line after the command word. */
        const char *start = copy;
        while (*start == ' ' || *start == '\t') start++;
        start += 4;
        while (*start == ' ' || *start == '\t') start++;
        if (!*start) bad(line);
        char text[8192];
        snprintf(text, sizeof text, "%s", start);
        size_t len = strlen(text);
        while (len && (text[len - 1] == '\n' || text[len - 1] == '\r')) text[--len] = 0;
        CUmodule m = NULL;
        if (CHECK(cmd, CU(cmd, cuModuleLoadData, &m, text))) {
            module = m;
            printf("ok load\n");
        }
    } else if (!strcmp(cmd, "unload")) {
        if (CHECK(cmd, CU(cmd, cuModuleUnload, module))) {
            module = NULL;
            printf("ok unload\n");
        }
    } else if (!strcmp(cmd, "launch")) {
        cmd_launch(line, a1, a2, a3);
    } else if (!strcmp(cmd, "elapsed")) {
        cmd_elapsed(line, a1, a2);
    } else if (!strcmp(cmd, "bench-launch")) {
        cmd_bench(line, a1);
    } else if (!strcmp(cmd, "bench-alloc")) {
        cmd_bench_alloc(line, a1, a2);
    } else if (!strcmp(cmd, "procaddr")) {
        cmd_procaddr(line, a1, a2, a3);
    } else if (!strcmp(cmd, "nvml-init")) {
        if (NCHECK(cmd, NV(cmd, nvmlInit_v2))) printf("ok nvml-init\n");
    } else if (!strcmp(cmd, "nvml-shutdown")) {
        if (NCHECK(cmd, NV(cmd, nvmlShutdown))) printf("ok nvml-shutdown\n");
    } else if (!strcmp(cmd, "nvml-count")) {
        unsigned n = 0;
        if (NCHECK(cmd, NV(cmd, nvmlDeviceGetCount_v2, &n))) printf("ok nvml-count n=%u\n", n);
    } else if (!strcmp(cmd, "nvml-name") || !strcmp(cmd, "nvml-uuid")) {
        nvmlDevice_t d = nvml_dev(device, cmd);
        char s[128] = {0};
        if (!d) return;
        if (!strcmp(cmd, "nvml-name")) {
            if (NCHECK(cmd, NV(cmd, nvmlDeviceGetName, d, s, sizeof s))) printf("ok nvml-name dev=%d name=%s\n", device, s);
        } else if (NCHECK(cmd, NV(cmd, nvmlDeviceGetUUID, d, s, sizeof s))) {
            printf("ok nvml-uuid dev=%d uuid=%s\n", device, s);
        }
    } else if (!strcmp(cmd, "nvml-meminfo")) {
        nvmlDevice_t d = nvml_dev(device, cmd);
        nvmlMemory_t m;
        if (d && NCHECK(cmd, NV(cmd, nvmlDeviceGetMemoryInfo, d, &m)))
            printf("ok nvml-meminfo dev=%d total=%llu free=%llu used=%llu\n", device, m.total, m.free, m.used);
    } else if (!strcmp(cmd, "nvml-meminfo2")) {
        nvmlDevice_t d = nvml_dev(device, cmd);
        nvmlMemory_v2_t m;
        memset(&m, 0, sizeof m);
        m.version = (unsigned)sizeof m | (2u << 24);
        if (d && NCHECK(cmd, NV(cmd, nvmlDeviceGetMemoryInfo_v2, d, &m)))
            printf("ok nvml-meminfo2 dev=%d total=%llu reserved=%llu free=%llu used=%llu\n", device, m.total, m.reserved,
                   m.free, m.used);
    } else if (!strcmp(cmd, "nvml-util")) {
        nvmlDevice_t d = nvml_dev(device, cmd);
        nvmlUtilization_t u;
        if (d && NCHECK(cmd, NV(cmd, nvmlDeviceGetUtilizationRates, d, &u)))
            printf("ok nvml-util dev=%d gpu=%u memory=%u\n", device, u.gpu, u.memory);
    } else if (!strcmp(cmd, "nvml-procs")) {
        nvmlDevice_t d = nvml_dev(device, cmd);
        nvmlProcessInfo_t p[64];
        unsigned n = 64;
        if (d && NCHECK(cmd, NV(cmd, nvmlDeviceGetComputeRunningProcesses_v3, d, &n, p))) {
            printf("ok nvml-procs dev=%d n=%u pids=", device, n);
            for (unsigned i = 0; i < n; i++) printf("%s%u:%llu", i ? "," : "", p[i].pid, p[i].usedGpuMemory);
            printf("\n");
        }
    } else {
        bad(line);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    load_api();
    if (argc > 1) {
        for (int i = 1; i < argc; i++) {
            char line[8192];
            snprintf(line, sizeof line, "%s", argv[i]);
            run(line);
        }
    } else {
        char line[8192];
        while (fgets(line, sizeof line, stdin)) run(line);
    }
    return 0;
}
