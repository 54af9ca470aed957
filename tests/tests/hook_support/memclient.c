/* memclient: a small CUDA driver client for the memory-isolation tests of
 * the shim (hook_pools, hook_graph_memory, hook_ipc, hook_race). It links
 * -lcuda and reads one command per line (or per argument) and answers one
 * line each, in the probe's format: "ok <cmd> key=value ..." or
 * "err <cmd> <CUDA_ERROR_NAME>". Objects it makes are kept in numbered
 * tables and named by number in later commands.
 *
 * The driver's and NVML's declarations come from tests/probe/cuda_abi.h,
 * written from their published ABI; no NVIDIA header is needed.
 *
 *   init                           cuInit, primary context of device 0 current
 *   ctx <dev>                      make device <dev>'s primary context current
 *   ctx-create <dev>               cuCtxCreate_v2 on <dev> (made current) -> c=
 *   ctx-destroy <c>                cuCtxDestroy_v2
 *   stream <dev>                   a stream in device <dev>'s primary context -> s=
 *   pool <dev> <threshold>         cuMemPoolCreate on <dev>, release threshold -> p=
 *   default-pool <dev> <threshold> the device's default pool, threshold set -> p=
 *   set-pool <dev> <p>             cuDeviceSetMemPool
 *   async <bytes> <s>              cuMemAllocAsync on stream <s> (-1: null) -> h=
 *   from-pool <bytes> <p> <s>      cuMemAllocFromPoolAsync -> h=
 *   alloc <bytes>                  cuMemAlloc -> h=
 *   free-async <h> <s>             cuMemFreeAsync
 *   free <h>                       cuMemFree
 *   sync | sync-stream <s>         cuCtxSynchronize / cuStreamSynchronize
 *   trim <p> <keep>                cuMemPoolTrimTo
 *   destroy-pool <p>               cuMemPoolDestroy
 *   pool-usage <p>                 reserved= used= (the driver's attributes)
 *   meminfo                        free= total= (cuMemGetInfo)
 *   graph-node <bytes> <dev>       a graph with one allocation node, instantiated -> e= h=
 *   graph-upload <bytes> <dev> <s> a graph with one allocation node, instantiated with
 *                                  CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD on <s> -> e= h=
 *   capture <bytes> <s>            capture cuMemAllocAsync on <s>, instantiate -> e= h=
 *   launch <e> <s>                 cuGraphLaunch
 *   upload <e> <s>                 cuGraphUpload
 *   graph-trim <dev>               cuDeviceGraphMemTrim
 *   exec-destroy <e>               cuGraphExecDestroy
 *   ipc-get <h>                    cuIpcGetMemHandle -> handle=<hex>
 *   ipc-open <hex>                 cuIpcOpenMemHandle_v2 -> h=
 *   ipc-close <h>                  cuIpcCloseMemHandle
 *   vmm-export <bytes> <dev>       cuMemCreate (POSIX fd shareable) + export -> v= fd= pid=
 *   vmm-import <pid> <fd> <bytes>  open /proc/<pid>/fd/<fd>, import, map -> v= h=
 *   vmm-release <v>                cuMemRelease
 *   sparse <width> <bytes> <dev> [deferred]
 *                                  sparse (or deferred-mapping) 2D array, a VMM allocation
 *                                  mapped onto its first tile, the handle released -> a= v=
 *   array-unmap <a>                unmap that tile
 *   array-destroy <a>              cuArrayDestroy
 *   nvml-init                      nvmlInit_v2
 *   nvml-count                     n=
 *   nvml-index <i>                 handle by index -> uuid= index=
 *   nvml-uuid <uuid>               handle by UUID -> index=
 *   nvml-pci <bus id>              handle by PCI bus id -> uuid=
 *   nvml-procs <i> <v>             running compute processes (v = 1, 2 or 3) -> n= pids=pid:bytes,...
 *   nvml-gprocs <i>                running graphics processes (v3) -> n=
 *   nvml-util <i>                  gpu= memory=
 *   env-unset <name> | env-set <name> <value>   the process's own environment (before cuInit)
 *   cu-init                        cuInit alone
 *   dev-count                      cuDeviceGetCount -> n=
 *   dev-get <ordinal>              cuDeviceGet -> d= uuid= (cuDeviceGetUuid_v2)
 *   dev-uuid <handle>              cuDeviceGetUuid_v2 of a raw CUdevice -> uuid=
 *   dev-pci <bus id>               cuDeviceGetByPCIBusId -> d=
 *   retain <handle> <route>        cuDevicePrimaryCtxRetain on a raw CUdevice, the function
 *                                  found by <route>: link, dlsym (dlopen libcuda.so.1) or
 *                                  procaddr (cuGetProcAddress_v2)
 *   create <handle> <route>        cuCtxCreate_v2 the same way -> c=
 *   sleep <ms>
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

CUresult cuDeviceGetCount(int *);
CUresult cuDeviceGetUuid_v2(CUuuid *, CUdevice);
CUresult cuDeviceGetByPCIBusId(CUdevice *, const char *);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

/* `name` found by `route`: "link" (the linked symbol `linked`), "dlsym"
 * (looked up on a dlopen'd libcuda.so.1) or "procaddr" (cuGetProcAddress_v2
 * of `base` at CUDA `version`, the ABI of `name`). */
static void *entry(const char *route, const char *name, const char *base, int version, void *linked) {
    if (!strcmp(route, "dlsym")) {
        void *h = dlopen("libcuda.so.1", RTLD_NOW);
        return h ? dlsym(h, name) : 0;
    }
    if (!strcmp(route, "procaddr")) {
        void *f = 0;
        int status = 0;
        if (cuGetProcAddress_v2(base, &f, version, 0, &status)) return 0;
        return f;
    }
    return linked;
}

static void uuid_str(const CUuuid *u, char *out) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    sprintf(out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
            b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int ncheck(const char *cmd, nvmlReturn_t r) {
    if (r == 0) return 1;
    static const char *names[] = {"NVML_SUCCESS", "NVML_ERROR_UNINITIALIZED", "NVML_ERROR_INVALID_ARGUMENT",
                                  "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_ALREADY_INITIALIZED",
                                  "NVML_ERROR_NOT_FOUND", "NVML_ERROR_INSUFFICIENT_SIZE"};
    if (r > 0 && r < 8) printf("err %s %s\n", cmd, names[r]);
    else printf("err %s NVML_ERROR_%d\n", cmd, r);
    return 0;
}
#define NK(call) ncheck(cmd, (call))

static nvmlDevice_t nvml_index(const char *cmd, unsigned i) {
    nvmlDevice_t d = 0;
    if (!NK(nvmlDeviceGetHandleByIndex_v2(i, &d))) return 0;
    return d;
}

#define MAXN 4096
static CUcontext ctxs[16], made[64];
static int nmade;
static CUstream streams[MAXN];
static CUmemoryPool pools[MAXN];
static CUdeviceptr ptrs[MAXN];
static CUgraphExec execs[MAXN];
static CUmemGenericAllocationHandle vmms[MAXN];
static CUarray arrays[MAXN];
static int nstreams, npools, nptrs, nexecs, nvmms, narrays;

#define CK(call) cu_check(cmd, (call))

static CUstream stream_of(long s) { return (s < 0 || s >= nstreams) ? 0 : streams[s]; }

static CUresult ctx_of(int dev) {
    if (dev < 0 || dev >= 16) return 101; /* CUDA_ERROR_INVALID_DEVICE */
    if (!ctxs[dev]) {
        CUdevice d;
        CUresult r = cuDeviceGet(&d, dev);
        if (r) return r;
        r = cuDevicePrimaryCtxRetain(&ctxs[dev], d);
        if (r) return r;
    }
    return 0;
}

/* A new graph with one allocation node of `bytes` on device `dev` (`p` its
 * parameters; the driver returns the node's address in p->dptr). */
static CUresult alloc_graph(CUgraph *g, CUDA_MEM_ALLOC_NODE_PARAMS *p, long long bytes, long long dev) {
    CUgraphNode n;
    memset(p, 0, sizeof *p);
    p->poolProps.allocType = 1;
    p->poolProps.location.type = 1;
    p->poolProps.location.id = (int)dev;
    p->bytesize = (size_t)bytes;
    CUresult r = cuGraphCreate(g, 0);
    return r ? r : cuGraphAddMemAllocNode(&n, *g, 0, 0, p);
}

static void run(char *line) {
    char cmd[64] = "";
    long long a = 0, b = 0, c = 0;
    char word[256] = "";
    if (sscanf(line, "%63s", cmd) != 1) return;
    const char *rest = line + strlen(cmd);
    if (!strcmp(cmd, "init")) {
        if (CK(cuInit(0)) && CK(ctx_of(0)) && CK(cuCtxSetCurrent(ctxs[0]))) printf("ok init pid=%d\n", getpid());
    } else if (!strcmp(cmd, "ctx")) {
        sscanf(rest, "%lld", &a);
        if (CK(ctx_of(a)) && CK(cuCtxSetCurrent(ctxs[a]))) printf("ok ctx dev=%lld\n", a);
    } else if (!strcmp(cmd, "ctx-create")) {
        sscanf(rest, "%lld", &a);
        CUdevice d;
        if (nmade < 64 && CK(cuDeviceGet(&d, (int)a)) && CK(cuCtxCreate_v2(&made[nmade], 0, d)))
            printf("ok ctx-create c=%d\n", nmade++);
    } else if (!strcmp(cmd, "ctx-destroy")) {
        sscanf(rest, "%lld", &a);
        if (CK(cuCtxDestroy_v2(made[a]))) printf("ok ctx-destroy\n");
    } else if (!strcmp(cmd, "stream")) {
        sscanf(rest, "%lld", &a);
        CUcontext old;
        if (CK(ctx_of(a)) && CK(cuCtxPushCurrent_v2(ctxs[a]))) {
            int ok = CK(cuStreamCreate(&streams[nstreams], 0));
            cuCtxPopCurrent_v2(&old);
            if (ok) printf("ok stream s=%d\n", nstreams++);
        }
    } else if (!strcmp(cmd, "pool") || !strcmp(cmd, "default-pool")) {
        sscanf(rest, "%lld %lld", &a, &b);
        unsigned long long t = (unsigned long long)b;
        int ok;
        if (!strcmp(cmd, "pool")) {
            CUmemPoolProps p;
            memset(&p, 0, sizeof p);
            p.allocType = 1; /* PINNED */
            p.location.type = 1; /* DEVICE */
            p.location.id = (int)a;
            ok = CK(cuMemPoolCreate(&pools[npools], &p));
        } else {
            CUdevice d;
            ok = CK(cuDeviceGet(&d, (int)a)) && CK(cuDeviceGetDefaultMemPool(&pools[npools], d));
        }
        if (ok && CK(cuMemPoolSetAttribute(pools[npools], 4 /* RELEASE_THRESHOLD */, &t)))
            printf("ok %s p=%d\n", cmd, npools++);
    } else if (!strcmp(cmd, "set-pool")) {
        sscanf(rest, "%lld %lld", &a, &b);
        CUdevice d;
        if (CK(cuDeviceGet(&d, (int)a)) && CK(cuDeviceSetMemPool(d, pools[b]))) printf("ok set-pool\n");
    } else if (!strcmp(cmd, "async")) {
        sscanf(rest, "%lld %lld", &a, &b);
        if (CK(cuMemAllocAsync(&ptrs[nptrs], (size_t)a, stream_of(b)))) printf("ok async h=%d\n", nptrs++);
    } else if (!strcmp(cmd, "from-pool")) {
        sscanf(rest, "%lld %lld %lld", &a, &b, &c);
        if (CK(cuMemAllocFromPoolAsync(&ptrs[nptrs], (size_t)a, pools[b], stream_of(c))))
            printf("ok from-pool h=%d\n", nptrs++);
    } else if (!strcmp(cmd, "alloc")) {
        sscanf(rest, "%lld", &a);
        if (CK(cuMemAlloc_v2(&ptrs[nptrs], (size_t)a))) printf("ok alloc h=%d\n", nptrs++);
    } else if (!strcmp(cmd, "free-async")) {
        sscanf(rest, "%lld %lld", &a, &b);
        if (CK(cuMemFreeAsync(ptrs[a], stream_of(b)))) printf("ok free-async\n");
    } else if (!strcmp(cmd, "free")) {
        sscanf(rest, "%lld", &a);
        if (CK(cuMemFree_v2(ptrs[a]))) printf("ok free\n");
    } else if (!strcmp(cmd, "sync")) {
        if (CK(cuCtxSynchronize())) printf("ok sync\n");
    } else if (!strcmp(cmd, "sync-stream")) {
        sscanf(rest, "%lld", &a);
        if (CK(cuStreamSynchronize(stream_of(a)))) printf("ok sync-stream\n");
    } else if (!strcmp(cmd, "trim")) {
        sscanf(rest, "%lld %lld", &a, &b);
        if (CK(cuMemPoolTrimTo(pools[a], (size_t)b))) printf("ok trim\n");
    } else if (!strcmp(cmd, "destroy-pool")) {
        sscanf(rest, "%lld", &a);
        if (CK(cuMemPoolDestroy(pools[a]))) printf("ok destroy-pool\n");
    } else if (!strcmp(cmd, "pool-usage")) {
        sscanf(rest, "%lld", &a);
        unsigned long long r = 0, u = 0;
        if (CK(cuMemPoolGetAttribute(pools[a], 5, &r)) && CK(cuMemPoolGetAttribute(pools[a], 7, &u)))
            printf("ok pool-usage reserved=%llu used=%llu\n", r, u);
    } else if (!strcmp(cmd, "meminfo")) {
        size_t f = 0, t = 0;
        if (CK(cuMemGetInfo_v2(&f, &t))) printf("ok meminfo free=%zu total=%zu\n", f, t);
    } else if (!strcmp(cmd, "graph-node")) {
        sscanf(rest, "%lld %lld", &a, &b);
        CUgraph g;
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        if (CK(alloc_graph(&g, &p, a, b)) && CK(cuGraphInstantiateWithFlags(&execs[nexecs], g, 0))) {
            ptrs[nptrs] = p.dptr;
            printf("ok graph-node e=%d h=%d\n", nexecs++, nptrs++);
        }
    } else if (!strcmp(cmd, "graph-upload")) {
        sscanf(rest, "%lld %lld %lld", &a, &b, &c);
        CUgraph g;
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        CUDA_GRAPH_INSTANTIATE_PARAMS ip;
        memset(&ip, 0, sizeof ip);
        ip.flags = 2; /* UPLOAD */
        ip.hUploadStream = stream_of(c);
        if (CK(alloc_graph(&g, &p, a, b)) && CK(cuGraphInstantiateWithParams(&execs[nexecs], g, &ip))) {
            ptrs[nptrs] = p.dptr;
            printf("ok graph-upload e=%d h=%d result=%d\n", nexecs++, nptrs++, ip.result_out);
        }
    } else if (!strcmp(cmd, "capture")) {
        sscanf(rest, "%lld %lld", &a, &b);
        CUgraph g;
        CUstream s = stream_of(b);
        if (CK(cuStreamBeginCapture_v2(s, 2 /* RELAXED */)) && CK(cuMemAllocAsync(&ptrs[nptrs], (size_t)a, s)) &&
            CK(cuStreamEndCapture(s, &g)) && CK(cuGraphInstantiateWithFlags(&execs[nexecs], g, 0)))
            printf("ok capture e=%d h=%d\n", nexecs++, nptrs++);
    } else if (!strcmp(cmd, "launch") || !strcmp(cmd, "upload")) {
        sscanf(rest, "%lld %lld", &a, &b);
        CUresult r = !strcmp(cmd, "launch") ? cuGraphLaunch(execs[a], stream_of(b)) : cuGraphUpload(execs[a], stream_of(b));
        if (CK(r)) printf("ok %s\n", cmd);
    } else if (!strcmp(cmd, "graph-trim")) {
        sscanf(rest, "%lld", &a);
        CUdevice d;
        if (CK(cuDeviceGet(&d, (int)a)) && CK(cuDeviceGraphMemTrim(d))) printf("ok graph-trim\n");
    } else if (!strcmp(cmd, "exec-destroy")) {
        sscanf(rest, "%lld", &a);
        if (CK(cuGraphExecDestroy(execs[a]))) printf("ok exec-destroy\n");
    } else if (!strcmp(cmd, "ipc-get")) {
        sscanf(rest, "%lld", &a);
        CUipcMemHandle h;
        if (CK(cuIpcGetMemHandle(&h, ptrs[a]))) {
            printf("ok ipc-get handle=");
            for (int i = 0; i < 64; i++) printf("%02x", (unsigned char)h.reserved[i]);
            printf("\n");
        }
    } else if (!strcmp(cmd, "ipc-open")) {
        sscanf(rest, "%255s", word);
        CUipcMemHandle h;
        memset(&h, 0, sizeof h);
        for (int i = 0; i < 64 && word[2 * i] && word[2 * i + 1]; i++) {
            unsigned v;
            sscanf(word + 2 * i, "%2x", &v);
            h.reserved[i] = (char)v;
        }
        if (CK(cuIpcOpenMemHandle_v2(&ptrs[nptrs], h, 1))) printf("ok ipc-open h=%d\n", nptrs++);
    } else if (!strcmp(cmd, "ipc-close")) {
        sscanf(rest, "%lld", &a);
        if (CK(cuIpcCloseMemHandle(ptrs[a]))) printf("ok ipc-close\n");
    } else if (!strcmp(cmd, "vmm-export")) {
        sscanf(rest, "%lld %lld", &a, &b);
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        p.type = 1;
        p.requestedHandleTypes = 1; /* POSIX_FILE_DESCRIPTOR */
        p.location.type = 1;
        p.location.id = (int)b;
        int fd = -1;
        if (CK(cuMemCreate(&vmms[nvmms], (size_t)a, &p, 0)) &&
            CK(cuMemExportToShareableHandle(&fd, vmms[nvmms], 1, 0)))
            printf("ok vmm-export v=%d fd=%d pid=%d\n", nvmms++, fd, getpid());
    } else if (!strcmp(cmd, "vmm-import")) {
        sscanf(rest, "%lld %lld %lld", &a, &b, &c);
        char path[64];
        snprintf(path, sizeof path, "/proc/%lld/fd/%lld", a, b);
        int fd = open(path, O_RDWR);
        if (fd < 0) fd = open(path, O_RDONLY);
        CUdeviceptr va;
        if (fd < 0) {
            printf("err vmm-import open\n");
        } else if (CK(cuMemImportFromShareableHandle(&vmms[nvmms], (void *)(uintptr_t)fd, 1)) &&
                   CK(cuMemAddressReserve(&va, (size_t)c, 0, 0, 0)) && CK(cuMemMap(va, (size_t)c, 0, vmms[nvmms], 0))) {
            ptrs[nptrs] = va;
            printf("ok vmm-import v=%d h=%d\n", nvmms++, nptrs++);
        }
    } else if (!strcmp(cmd, "vmm-release")) {
        sscanf(rest, "%lld", &a);
        if (CK(cuMemRelease(vmms[a]))) printf("ok vmm-release\n");
    } else if (!strcmp(cmd, "sparse")) {
        word[0] = 0;
        sscanf(rest, "%lld %lld %lld %255s", &a, &b, &c, word);
        CUDA_ARRAY3D_DESCRIPTOR d;
        memset(&d, 0, sizeof d);
        d.Width = (size_t)a;
        d.Height = (size_t)a;
        d.Format = 0x03; /* UNSIGNED_INT32 */
        d.NumChannels = 1;
        d.Flags = strcmp(word, "deferred") ? 64 /* SPARSE */ : 128 /* DEFERRED_MAPPING */;
        CUmemAllocationProp p;
        memset(&p, 0, sizeof p);
        p.type = 1;
        p.location.type = 1;
        p.location.id = (int)c;
        p.allocFlags.usage = 1; /* CU_MEM_CREATE_USAGE_TILE_POOL */
        CUarrayMapInfo m;
        memset(&m, 0, sizeof m);
        if (CK(cuArray3DCreate_v2(&arrays[narrays], &d)) && CK(cuMemCreate(&vmms[nvmms], (size_t)b, &p, 0))) {
            m.resourceType = 0x00; /* CU_RESOURCE_TYPE_ARRAY */
            m.resource.array = arrays[narrays];
            m.subresourceType = 0; /* SPARSE_LEVEL */
            m.subresource.sparseLevel.extentWidth = 128;
            m.subresource.sparseLevel.extentHeight = 128;
            m.subresource.sparseLevel.extentDepth = 1;
            m.memOperationType = 1; /* MAP */
            m.memHandleType = 0; /* GENERIC */
            m.memHandle.memHandle = vmms[nvmms];
            m.deviceBitMask = 1;
            if (CK(cuMemMapArrayAsync(&m, 1, 0)) && CK(cuCtxSynchronize()) && CK(cuMemRelease(vmms[nvmms])))
                printf("ok sparse a=%d v=%d\n", narrays++, nvmms++);
        }
    } else if (!strcmp(cmd, "array-unmap")) {
        sscanf(rest, "%lld", &a);
        CUarrayMapInfo m;
        memset(&m, 0, sizeof m);
        m.resourceType = 0x00;
        m.resource.array = arrays[a];
        m.subresourceType = 0;
        m.subresource.sparseLevel.extentWidth = 128;
        m.subresource.sparseLevel.extentHeight = 128;
        m.subresource.sparseLevel.extentDepth = 1;
        m.memOperationType = 2; /* UNMAP */
        m.memHandleType = 0;
        m.deviceBitMask = 1;
        if (CK(cuMemMapArrayAsync(&m, 1, 0)) && CK(cuCtxSynchronize())) printf("ok array-unmap\n");
    } else if (!strcmp(cmd, "array-destroy")) {
        sscanf(rest, "%lld", &a);
        if (CK(cuArrayDestroy(arrays[a]))) printf("ok array-destroy\n");
    } else if (!strcmp(cmd, "nvml-init")) {
        if (NK(nvmlInit_v2())) printf("ok nvml-init\n");
    } else if (!strcmp(cmd, "nvml-count")) {
        unsigned n = 0;
        if (NK(nvmlDeviceGetCount_v2(&n))) printf("ok nvml-count n=%u\n", n);
    } else if (!strcmp(cmd, "nvml-index")) {
        sscanf(rest, "%lld", &a);
        nvmlDevice_t d = nvml_index(cmd, (unsigned)a);
        char u[96];
        unsigned i = 0;
        if (d && NK(nvmlDeviceGetUUID(d, u, sizeof u)) && NK(nvmlDeviceGetIndex(d, &i)))
            printf("ok nvml-index uuid=%s index=%u\n", u, i);
    } else if (!strcmp(cmd, "nvml-uuid") || !strcmp(cmd, "nvml-pci")) {
        sscanf(rest, "%255s", word);
        nvmlDevice_t d = 0;
        unsigned i = 0;
        char u[96];
        nvmlReturn_t r = !strcmp(cmd, "nvml-uuid") ? nvmlDeviceGetHandleByUUID(word, &d)
                                                   : nvmlDeviceGetHandleByPciBusId_v2(word, &d);
        if (NK(r) && NK(nvmlDeviceGetIndex(d, &i)) && NK(nvmlDeviceGetUUID(d, u, sizeof u)))
            printf("ok %s index=%u uuid=%s\n", cmd, i, u);
    } else if (!strcmp(cmd, "nvml-procs") || !strcmp(cmd, "nvml-gprocs")) {
        sscanf(rest, "%lld %lld", &a, &b);
        nvmlDevice_t d = nvml_index(cmd, (unsigned)a);
        nvmlProcessInfo_t p[64];
        nvmlProcessInfo_v1_t p1[64];
        unsigned n = 64;
        nvmlReturn_t r;
        if (!d) return;
        if (!strcmp(cmd, "nvml-gprocs")) r = nvmlDeviceGetGraphicsRunningProcesses_v3(d, &n, p);
        else if (b == 1) r = nvmlDeviceGetComputeRunningProcesses(d, &n, p1);
        else if (b == 2) r = nvmlDeviceGetComputeRunningProcesses_v2(d, &n, p);
        else r = nvmlDeviceGetComputeRunningProcesses_v3(d, &n, p);
        if (NK(r)) {
            printf("ok %s n=%u pids=", cmd, n);
            for (unsigned i = 0; i < n; i++)
                printf("%s%u:%llu", i ? "," : "", b == 1 ? p1[i].pid : p[i].pid,
                       b == 1 ? p1[i].usedGpuMemory : p[i].usedGpuMemory);
            printf("\n");
        }
    } else if (!strcmp(cmd, "nvml-util")) {
        sscanf(rest, "%lld", &a);
        nvmlDevice_t d = nvml_index(cmd, (unsigned)a);
        nvmlUtilization_t u;
        if (d && NK(nvmlDeviceGetUtilizationRates(d, &u))) printf("ok nvml-util gpu=%u memory=%u\n", u.gpu, u.memory);
    } else if (!strcmp(cmd, "env-unset")) {
        sscanf(rest, "%255s", word);
        unsetenv(word);
        printf("ok env-unset\n");
    } else if (!strcmp(cmd, "env-set")) {
        char value[256] = "";
        sscanf(rest, "%255s %255s", word, value);
        setenv(word, value, 1);
        printf("ok env-set\n");
    } else if (!strcmp(cmd, "cu-init")) {
        if (CK(cuInit(0))) printf("ok cu-init\n");
    } else if (!strcmp(cmd, "dev-count")) {
        int n = -1;
        if (CK(cuDeviceGetCount(&n))) printf("ok dev-count n=%d\n", n);
    } else if (!strcmp(cmd, "dev-get") || !strcmp(cmd, "dev-uuid")) {
        sscanf(rest, "%lld", &a);
        CUdevice d = (CUdevice)a;
        CUuuid u;
        char text[64];
        if ((!strcmp(cmd, "dev-uuid") || CK(cuDeviceGet(&d, (int)a))) && CK(cuDeviceGetUuid_v2(&u, d))) {
            uuid_str(&u, text);
            printf("ok %s d=%d uuid=%s\n", cmd, (int)d, text);
        }
    } else if (!strcmp(cmd, "dev-pci")) {
        sscanf(rest, "%255s", word);
        CUdevice d = -1;
        if (CK(cuDeviceGetByPCIBusId(&d, word))) printf("ok dev-pci d=%d\n", (int)d);
    } else if (!strcmp(cmd, "retain") || !strcmp(cmd, "create")) {
        char route[32] = "link";
        sscanf(rest, "%lld %31s", &a, route);
        int retain = !strcmp(cmd, "retain");
        void *f = retain ? entry(route, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 12000,
                                 (void *)cuDevicePrimaryCtxRetain)
                         : entry(route, "cuCtxCreate_v2", "cuCtxCreate", 3020, (void *)cuCtxCreate_v2);
        CUcontext ctx = 0;
        if (!f) {
            printf("err %s NOT_FOUND\n", cmd);
        } else if (retain) {
            if (CK(((CUresult(*)(CUcontext *, CUdevice))f)(&ctx, (CUdevice)a))) printf("ok retain\n");
        } else if (nmade < 64 && CK(((CUresult(*)(CUcontext *, unsigned, CUdevice))f)(&ctx, 0, (CUdevice)a))) {
            made[nmade] = ctx;
            printf("ok create c=%d\n", nmade++);
        }
    } else if (!strcmp(cmd, "sleep")) {
        sscanf(rest, "%lld", &a);
        struct timespec ts = {a / 1000, (a % 1000) * 1000000};
        nanosleep(&ts, 0);
        printf("ok sleep\n");
    } else {
        printf("err %s UNKNOWN_COMMAND\n", cmd);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1) {
        for (int i = 1; i < argc; i++) run(argv[i]);
        return 0;
    }
    char line[1024];
    while (fgets(line, sizeof line, stdin)) run(line);
    return 0;
}
