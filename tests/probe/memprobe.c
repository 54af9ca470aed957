/*
 * memprobe: a CUDA driver API client for the memory routes that outlive a simple
 * allocation: stream-ordered pools, graph memory (nodes and stream capture), IPC memory
 * handles, VMM handles exported as file descriptors and passed between processes, and
 * sparse arrays. It runs inside the thing under test (the simulated driver, or the shim
 * over it) and reports what it saw, one line per command, in the probe's format:
 *
 *     ok <command> key=value ...
 *     err <command> <CUDA_ERROR_...> [key=value ...]
 *
 * It never crashes on an API error; the exit status is 0 unless the script is malformed
 * (an unknown command or missing argument: a "bad ..." line on stderr, status 2).
 *
 * Commands come from the arguments (one per argument) or, without arguments, from stdin.
 * Every object a command makes (pointer, stream, pool, graph, handle, fd) is kept in a
 * numbered slot, reported as h=<slot>; later commands name it as $<slot> (a pointer may
 * take an offset: $3+4096). Plain numbers (decimal or 0x-hex) are taken as they are;
 * stream 0 is the legacy default stream.
 *
 *   init | pid | sleep <ms> | ctx <dev> | ctx-create <dev> | ctx-destroy <$c> | ctx-sync
 *   meminfo | stream | sync <$s> | event-sync <$s>
 *   alloc <bytes> | free <$p> | write <$p> <len> <byte> | read <$p> <len>
 *   alloc-async <bytes> <$s> | alloc-pool <bytes> <$pool> <$s> | free-async <$p> <$s>
 *   pool-create <dev> [maxSize] | pool-default <dev> | pool-current <dev> | pool-set <dev> <$pool>
 *   pool-threshold <$pool> <bytes> | pool-attrs <$pool> | pool-reset-high <$pool>
 *   pool-trim <$pool> <keep> | pool-destroy <$pool>
 *   ipc-get <$p> | ipc-open <hex> | ipc-close <$p>
 *   vmm-create <bytes> <dev> [fd] | vmm-export <$v> | vmm-import <$fd> | vmm-release <$v>
 *   vmm-map <$v> <bytes> | vmm-unmap <$p> <bytes> | vmm-retain <$p> | vmm-props <$v>
 *   fd-listen <path> | fd-accept | fd-send <path> <$fd>
 *   graph-create | graph-alloc <$g> <bytes> <dev> | graph-free <$g> <$p> | graph-inst <$g>
 *   graph-launch <$x> <$s> | graph-upload <$x> <$s> | exec-destroy <$x> | graph-destroy <$g>
 *   graph-trim <dev> | graph-attrs <dev> | graph-reset-high <dev>
 *   capture-begin <$s> | capture-end <$s> | capturing <$s>
 *   array-sparse <w> <h> [deferred] | array-map <$a> <$v> [unmap] | array-reqs <$a> <dev>
 *   array-destroy <$a>
 *   kernel <name> <duration> | launch <$f> <$s>
 *   event-ipc-create | event-ipc-get <$e> | event-ipc-open <hex> | event-record <$e> <$s>
 *   event-query <$e> | event-wait <$s> <$e> | event-synchronize <$e>
 *
 * Linked with -lcuda. The driver's declarations come from cuda_abi.h, written from its
 * published ABI; no NVIDIA header is needed to build this file.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cuda_abi.h"

#define MAX_SLOTS 4096
static unsigned long long slots[MAX_SLOTS];
static int nslots;
static int listen_fd = -1;

static void bad(const char *what, const char *cmd) {
    fprintf(stderr, "bad %s in command %s\n", what, cmd);
    exit(2);
}

static int put_slot(unsigned long long v) {
    if (nslots >= MAX_SLOTS) bad("slot count", "(any)");
    slots[nslots] = v;
    return nslots++;
}

/* $N[+off], or a number. */
static unsigned long long val(const char *cmd, const char *arg) {
    if (!arg) bad("missing argument", cmd);
    if (arg[0] == '$') {
        char *end;
        long n = strtol(arg + 1, &end, 10);
        if (end == arg + 1 || n < 0 || n >= nslots) bad("slot", cmd);
        unsigned long long off = 0;
        if (*end == '+') off = strtoull(end + 1, NULL, 0);
        return slots[n] + off;
    }
    char *end;
    unsigned long long v = strtoull(arg, &end, 0);
    if (end == arg || *end) bad("number", cmd);
    return v;
}

static void ok_slot(const char *cmd, unsigned long long v) {
    int h = put_slot(v);
    printf("ok %s h=%d val=0x%llx\n", cmd, h, v);
}

static void ok(const char *cmd) { printf("ok %s\n", cmd); }

static void pool_props(CUmemPoolProps *p, int dev, size_t max) {
    memset(p, 0, sizeof *p);
    p->allocType = 1; /* PINNED */
    p->location.type = 1; /* DEVICE */
    p->location.id = dev;
    p->maxSize = max;
}

static void run(int argc, char **a) {
    const char *cmd = a[0];
    const char *a1 = argc > 1 ? a[1] : NULL, *a2 = argc > 2 ? a[2] : NULL,
               *a3 = argc > 3 ? a[3] : NULL;
    CUresult r;
    if (!strcmp(cmd, "init")) {
        if (cu_check(cmd, cuInit(0))) ok(cmd);
    } else if (!strcmp(cmd, "pid")) {
        printf("ok pid pid=%d\n", (int)getpid());
    } else if (!strcmp(cmd, "sleep")) {
        struct timespec ts = {0, 0};
        unsigned long long ms = val(cmd, a1);
        ts.tv_sec = ms / 1000;
        ts.tv_nsec = (ms % 1000) * 1000000;
        nanosleep(&ts, NULL);
        ok(cmd);
    } else if (!strcmp(cmd, "ctx")) {
        CUcontext c;
        if (cu_check(cmd, cuDevicePrimaryCtxRetain(&c, (int)val(cmd, a1))) && cu_check(cmd, cuCtxSetCurrent(c)))
            ok_slot(cmd, (unsigned long long)(uintptr_t)c);
    } else if (!strcmp(cmd, "ctx-create")) {
        CUcontext c;
        if (cu_check(cmd, cuCtxCreate_v2(&c, 0, (int)val(cmd, a1)))) ok_slot(cmd, (unsigned long long)(uintptr_t)c);
    } else if (!strcmp(cmd, "ctx-destroy")) {
        if (cu_check(cmd, cuCtxDestroy_v2((CUcontext)(uintptr_t)val(cmd, a1)))) ok(cmd);
    } else if (!strcmp(cmd, "ctx-sync")) {
        if (cu_check(cmd, cuCtxSynchronize())) ok(cmd);
    } else if (!strcmp(cmd, "meminfo")) {
        size_t f, t;
        if (cu_check(cmd, cuMemGetInfo_v2(&f, &t))) printf("ok meminfo free=%zu total=%zu\n", f, t);
    } else if (!strcmp(cmd, "stream")) {
        CUstream s;
        if (cu_check(cmd, cuStreamCreate(&s, 1))) ok_slot(cmd, (unsigned long long)(uintptr_t)s);
    } else if (!strcmp(cmd, "sync")) {
        if (cu_check(cmd, cuStreamSynchronize((CUstream)(uintptr_t)val(cmd, a1)))) ok(cmd);
    } else if (!strcmp(cmd, "event-sync")) {
        CUevent e;
        CUstream s = (CUstream)(uintptr_t)val(cmd, a1);
        if (!cu_check(cmd, cuEventCreate(&e, 0))) return;
        r = cuEventRecord(e, s);
        if (r == 0) r = cuEventSynchronize(e);
        cuEventDestroy_v2(e);
        if (cu_check(cmd, r)) ok(cmd);
    } else if (!strcmp(cmd, "alloc")) {
        CUdeviceptr p;
        if (cu_check(cmd, cuMemAlloc_v2(&p, val(cmd, a1)))) ok_slot(cmd, p);
    } else if (!strcmp(cmd, "free")) {
        if (cu_check(cmd, cuMemFree_v2(val(cmd, a1)))) ok(cmd);
    } else if (!strcmp(cmd, "write")) {
        size_t n = val(cmd, a2);
        unsigned char *buf = malloc(n ? n : 1);
        memset(buf, (int)val(cmd, a3), n);
        r = cuMemcpyHtoD_v2(val(cmd, a1), buf, n);
        free(buf);
        if (cu_check(cmd, r)) ok(cmd);
    } else if (!strcmp(cmd, "read")) {
        size_t n = val(cmd, a2);
        unsigned char *buf = calloc(n ? n : 1, 1);
        r = cuMemcpyDtoH_v2(buf, val(cmd, a1), n);
        if (cu_check(cmd, r)) {
            unsigned long long sum = 0;
            for (size_t i = 0; i < n; i++) sum += buf[i];
            printf("ok read sum=%llu first=%u\n", sum, n ? buf[0] : 0);
        }
        free(buf);
    } else if (!strcmp(cmd, "alloc-async")) {
        CUdeviceptr p;
        if (cu_check(cmd, cuMemAllocAsync(&p, val(cmd, a1), (CUstream)(uintptr_t)val(cmd, a2)))) ok_slot(cmd, p);
    } else if (!strcmp(cmd, "alloc-pool")) {
        CUdeviceptr p;
        if (cu_check(cmd, cuMemAllocFromPoolAsync(&p, val(cmd, a1), (CUmemoryPool)(uintptr_t)val(cmd, a2),
                                                (CUstream)(uintptr_t)val(cmd, a3))))
            ok_slot(cmd, p);
    } else if (!strcmp(cmd, "free-async")) {
        if (cu_check(cmd, cuMemFreeAsync(val(cmd, a1), (CUstream)(uintptr_t)val(cmd, a2)))) ok(cmd);
    } else if (!strcmp(cmd, "pool-create")) {
        CUmemPoolProps props;
        CUmemoryPool p;
        pool_props(&props, (int)val(cmd, a1), a2 ? val(cmd, a2) : 0);
        if (cu_check(cmd, cuMemPoolCreate(&p, &props))) ok_slot(cmd, (unsigned long long)(uintptr_t)p);
    } else if (!strcmp(cmd, "pool-default") || !strcmp(cmd, "pool-current")) {
        CUmemoryPool p;
        r = !strcmp(cmd, "pool-default") ? cuDeviceGetDefaultMemPool(&p, (int)val(cmd, a1))
                                          : cuDeviceGetMemPool(&p, (int)val(cmd, a1));
        if (cu_check(cmd, r)) ok_slot(cmd, (unsigned long long)(uintptr_t)p);
    } else if (!strcmp(cmd, "pool-set")) {
        if (cu_check(cmd, cuDeviceSetMemPool((int)val(cmd, a1), (CUmemoryPool)(uintptr_t)val(cmd, a2)))) ok(cmd);
    } else if (!strcmp(cmd, "pool-threshold")) {
        unsigned long long v = val(cmd, a2);
        if (cu_check(cmd, cuMemPoolSetAttribute((CUmemoryPool)(uintptr_t)val(cmd, a1), 4, &v))) ok(cmd);
    } else if (!strcmp(cmd, "pool-reset-high")) {
        CUmemoryPool p = (CUmemoryPool)(uintptr_t)val(cmd, a1);
        unsigned long long zero = 0;
        r = cuMemPoolSetAttribute(p, 6, &zero);
        if (r == 0) r = cuMemPoolSetAttribute(p, 8, &zero);
        if (cu_check(cmd, r)) ok(cmd);
    } else if (!strcmp(cmd, "pool-attrs")) {
        CUmemoryPool p = (CUmemoryPool)(uintptr_t)val(cmd, a1);
        int reuse[3];
        unsigned long long v[5];
        /* REUSE_* are 1..3 (int); RELEASE_THRESHOLD 4, RESERVED_CURRENT 5, RESERVED_HIGH 6,
         * USED_CURRENT 7, USED_HIGH 8 (cuuint64_t). */
        for (int i = 0; i < 3; i++)
            if (!cu_check(cmd, cuMemPoolGetAttribute(p, i + 1, &reuse[i]))) return;
        for (int i = 0; i < 5; i++)
            if (!cu_check(cmd, cuMemPoolGetAttribute(p, i + 4, &v[i]))) return;
        printf("ok pool-attrs threshold=%llu reserved=%llu reserved_high=%llu used=%llu used_high=%llu "
               "reuse_follow=%d reuse_opportunistic=%d reuse_internal=%d\n",
               v[0], v[1], v[2], v[3], v[4], reuse[0], reuse[1], reuse[2]);
    } else if (!strcmp(cmd, "pool-trim")) {
        if (cu_check(cmd, cuMemPoolTrimTo((CUmemoryPool)(uintptr_t)val(cmd, a1), val(cmd, a2)))) ok(cmd);
    } else if (!strcmp(cmd, "pool-destroy")) {
        if (cu_check(cmd, cuMemPoolDestroy((CUmemoryPool)(uintptr_t)val(cmd, a1)))) ok(cmd);
    } else if (!strcmp(cmd, "ipc-get")) {
        CUipcMemHandle h;
        if (!cu_check(cmd, cuIpcGetMemHandle(&h, val(cmd, a1)))) return;
        printf("ok ipc-get handle=");
        for (int i = 0; i < 64; i++) printf("%02x", (unsigned char)h.reserved[i]);
        printf("\n");
    } else if (!strcmp(cmd, "ipc-open")) {
        CUipcMemHandle h;
        CUdeviceptr p;
        if (!a1 || strlen(a1) != 128) bad("handle", cmd);
        for (int i = 0; i < 64; i++) {
            unsigned x;
            if (sscanf(a1 + 2 * i, "%2x", &x) != 1) bad("handle", cmd);
            h.reserved[i] = (char)x;
        }
        if (cu_check(cmd, cuIpcOpenMemHandle_v2(&p, h, 1))) ok_slot(cmd, p);
    } else if (!strcmp(cmd, "ipc-close")) {
        if (cu_check(cmd, cuIpcCloseMemHandle(val(cmd, a1)))) ok(cmd);
    } else if (!strcmp(cmd, "vmm-create")) {
        CUmemAllocationProp prop;
        CUmemGenericAllocationHandle h;
        memset(&prop, 0, sizeof prop);
        prop.type = 1;
        prop.location.type = 1;
        prop.location.id = (int)val(cmd, a2);
        if (a3 && !strcmp(a3, "fd")) prop.requestedHandleTypes = 1; /* POSIX fd */
        if (cu_check(cmd, cuMemCreate(&h, val(cmd, a1), &prop, 0))) ok_slot(cmd, h);
    } else if (!strcmp(cmd, "vmm-export")) {
        int fd = -1;
        if (cu_check(cmd, cuMemExportToShareableHandle(&fd, val(cmd, a1), 1, 0))) ok_slot(cmd, (unsigned)fd);
    } else if (!strcmp(cmd, "vmm-import")) {
        CUmemGenericAllocationHandle h;
        if (cu_check(cmd, cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)val(cmd, a1), 1))) ok_slot(cmd, h);
    } else if (!strcmp(cmd, "vmm-release")) {
        if (cu_check(cmd, cuMemRelease(val(cmd, a1)))) ok(cmd);
    } else if (!strcmp(cmd, "vmm-map")) {
        CUmemGenericAllocationHandle h = val(cmd, a1);
        size_t n = val(cmd, a2);
        CUmemAllocationProp prop;
        CUdeviceptr p;
        if (!cu_check(cmd, cuMemGetAllocationPropertiesFromHandle(&prop, h))) return;
        if (!cu_check(cmd, cuMemAddressReserve(&p, n, 0, 0, 0))) return;
        if (!cu_check(cmd, cuMemMap(p, n, 0, h, 0))) return;
        CUmemAccessDesc d = {{1, prop.location.id}, 3};
        if (cu_check(cmd, cuMemSetAccess(p, n, &d, 1))) ok_slot(cmd, p);
    } else if (!strcmp(cmd, "vmm-unmap")) {
        CUdeviceptr p = val(cmd, a1);
        size_t n = val(cmd, a2);
        if (cu_check(cmd, cuMemUnmap(p, n)) && cu_check(cmd, cuMemAddressFree(p, n))) ok(cmd);
    } else if (!strcmp(cmd, "vmm-retain")) {
        CUmemGenericAllocationHandle h;
        if (cu_check(cmd, cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)val(cmd, a1)))) ok_slot(cmd, h);
    } else if (!strcmp(cmd, "vmm-props")) {
        CUmemAllocationProp prop;
        if (cu_check(cmd, cuMemGetAllocationPropertiesFromHandle(&prop, val(cmd, a1))))
            printf("ok vmm-props dev=%d types=%d type=%d\n", prop.location.id, prop.requestedHandleTypes, prop.type);
    } else if (!strcmp(cmd, "fd-listen")) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        if (!a1 || strlen(a1) >= sizeof addr.sun_path) bad("path", cmd);
        strcpy(addr.sun_path, a1);
        listen_fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&addr, sizeof addr) || listen(listen_fd, 1)) {
            printf("err fd-listen OS_ERROR\n");
            return;
        }
        ok(cmd);
    } else if (!strcmp(cmd, "fd-accept")) {
        int c = listen_fd < 0 ? -1 : accept(listen_fd, NULL, NULL);
        char byte;
        char ctl[CMSG_SPACE(sizeof(int))];
        struct iovec iov = {&byte, 1};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
        if (c < 0 || recvmsg(c, &m, 0) != 1) {
            printf("err fd-accept OS_ERROR\n");
            return;
        }
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        int fd;
        if (!cm || cm->cmsg_type != SCM_RIGHTS) {
            printf("err fd-accept OS_ERROR\n");
            return;
        }
        memcpy(&fd, CMSG_DATA(cm), sizeof fd);
        close(c);
        ok_slot(cmd, (unsigned)fd);
    } else if (!strcmp(cmd, "fd-send")) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        int fd = (int)val(cmd, a2);
        if (!a1 || strlen(a1) >= sizeof addr.sun_path) bad("path", cmd);
        strcpy(addr.sun_path, a1);
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        char byte = 'f';
        char ctl[CMSG_SPACE(sizeof(int))];
        memset(ctl, 0, sizeof ctl);
        struct iovec iov = {&byte, 1};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof fd);
        if (s < 0 || connect(s, (struct sockaddr *)&addr, sizeof addr) || sendmsg(s, &m, 0) != 1) {
            printf("err fd-send OS_ERROR\n");
            if (s >= 0) close(s);
            return;
        }
        close(s);
        ok(cmd);
    } else if (!strcmp(cmd, "graph-create")) {
        CUgraph g;
        if (cu_check(cmd, cuGraphCreate(&g, 0))) ok_slot(cmd, (unsigned long long)(uintptr_t)g);
    } else if (!strcmp(cmd, "graph-alloc")) {
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        CUgraphNode n;
        memset(&p, 0, sizeof p);
        pool_props(&p.poolProps, (int)val(cmd, a3), 0);
        p.bytesize = val(cmd, a2);
        if (cu_check(cmd, cuGraphAddMemAllocNode(&n, (CUgraph)(uintptr_t)val(cmd, a1), NULL, 0, &p)))
            ok_slot(cmd, p.dptr);
    } else if (!strcmp(cmd, "graph-free")) {
        CUgraphNode n;
        if (cu_check(cmd, cuGraphAddMemFreeNode(&n, (CUgraph)(uintptr_t)val(cmd, a1), NULL, 0, val(cmd, a2)))) ok(cmd);
    } else if (!strcmp(cmd, "graph-inst")) {
        CUgraphExec x;
        if (cu_check(cmd, cuGraphInstantiateWithFlags(&x, (CUgraph)(uintptr_t)val(cmd, a1), 0)))
            ok_slot(cmd, (unsigned long long)(uintptr_t)x);
    } else if (!strcmp(cmd, "graph-launch")) {
        if (cu_check(cmd, cuGraphLaunch((CUgraphExec)(uintptr_t)val(cmd, a1), (CUstream)(uintptr_t)val(cmd, a2)))) ok(cmd);
    } else if (!strcmp(cmd, "graph-upload")) {
        if (cu_check(cmd, cuGraphUpload((CUgraphExec)(uintptr_t)val(cmd, a1), (CUstream)(uintptr_t)val(cmd, a2)))) ok(cmd);
    } else if (!strcmp(cmd, "exec-destroy")) {
        if (cu_check(cmd, cuGraphExecDestroy((CUgraphExec)(uintptr_t)val(cmd, a1)))) ok(cmd);
    } else if (!strcmp(cmd, "graph-destroy")) {
        if (cu_check(cmd, cuGraphDestroy((CUgraph)(uintptr_t)val(cmd, a1)))) ok(cmd);
    } else if (!strcmp(cmd, "graph-trim")) {
        if (cu_check(cmd, cuDeviceGraphMemTrim((int)val(cmd, a1)))) ok(cmd);
    } else if (!strcmp(cmd, "graph-attrs")) {
        unsigned long long v[4];
        for (int i = 0; i < 4; i++)
            if (!cu_check(cmd, cuDeviceGetGraphMemAttribute((int)val(cmd, a1), i, &v[i]))) return;
        printf("ok graph-attrs used=%llu used_high=%llu reserved=%llu reserved_high=%llu\n", v[0], v[1], v[2], v[3]);
    } else if (!strcmp(cmd, "graph-reset-high")) {
        unsigned long long zero = 0;
        r = cuDeviceSetGraphMemAttribute((int)val(cmd, a1), 1, &zero);
        if (r == 0) r = cuDeviceSetGraphMemAttribute((int)val(cmd, a1), 3, &zero);
        if (cu_check(cmd, r)) ok(cmd);
    } else if (!strcmp(cmd, "capture-begin")) {
        if (cu_check(cmd, cuStreamBeginCapture_v2((CUstream)(uintptr_t)val(cmd, a1), 2 /* relaxed */))) ok(cmd);
    } else if (!strcmp(cmd, "capture-end")) {
        CUgraph g;
        if (cu_check(cmd, cuStreamEndCapture((CUstream)(uintptr_t)val(cmd, a1), &g))) ok_slot(cmd, (unsigned long long)(uintptr_t)g);
    } else if (!strcmp(cmd, "capturing")) {
        int st = -1;
        if (cu_check(cmd, cuStreamIsCapturing((CUstream)(uintptr_t)val(cmd, a1), &st))) printf("ok capturing status=%d\n", st);
    } else if (!strcmp(cmd, "array-sparse")) {
        CUDA_ARRAY3D_DESCRIPTOR d = {val(cmd, a1), val(cmd, a2), 0, 0x20 /* FLOAT */, 1, 0};
        CUarray arr;
        d.Flags = (a3 && !strcmp(a3, "deferred")) ? 0x80 : 0x40;
        if (cu_check(cmd, cuArray3DCreate_v2(&arr, &d))) ok_slot(cmd, (unsigned long long)(uintptr_t)arr);
    } else if (!strcmp(cmd, "array-map")) {
        CUarrayMapInfo m;
        memset(&m, 0, sizeof m);
        m.resourceType = 0; /* ARRAY */
        m.resource.array = (CUarray)(uintptr_t)val(cmd, a1);
        m.subresourceType = 0; /* SPARSE_LEVEL */
        m.memOperationType = (a3 && !strcmp(a3, "unmap")) ? 2 : 1;
        m.memHandleType = 0;
        m.memHandle.memHandle = val(cmd, a2);
        m.deviceBitMask = 1;
        if (cu_check(cmd, cuMemMapArrayAsync(&m, 1, NULL))) ok(cmd);
    } else if (!strcmp(cmd, "array-reqs")) {
        CUDA_ARRAY_MEMORY_REQUIREMENTS q;
        if (cu_check(cmd, cuArrayGetMemoryRequirements(&q, (CUarray)(uintptr_t)val(cmd, a1), (int)val(cmd, a2))))
            printf("ok array-reqs size=%zu alignment=%zu\n", q.size, q.alignment);
    } else if (!strcmp(cmd, "array-destroy")) {
        if (cu_check(cmd, cuArrayDestroy((CUarray)(uintptr_t)val(cmd, a1)))) ok(cmd);
    } else if (!strcmp(cmd, "kernel")) {
        char text[256];
        CUmodule m;
        CUfunction f;
        if (!a1 || !a2) bad("missing argument", cmd);
        snprintf(text, sizeof text, "kernel %s %s\n", a1, a2);
        if (cu_check(cmd, cuModuleLoadData(&m, text)) && cu_check(cmd, cuModuleGetFunction(&f, m, a1)))
            ok_slot(cmd, (unsigned long long)(uintptr_t)f);
    } else if (!strcmp(cmd, "launch")) {
        if (cu_check(cmd, cuLaunchKernel((CUfunction)(uintptr_t)val(cmd, a1), 1, 1, 1, 1, 1, 1, 0,
                                       (CUstream)(uintptr_t)val(cmd, a2), NULL, NULL)))
            ok(cmd);
    } else if (!strcmp(cmd, "event-ipc-create")) {
        CUevent e;
        if (cu_check(cmd, cuEventCreate(&e, 0x2 | 0x4 /* DISABLE_TIMING | INTERPROCESS */)))
            ok_slot(cmd, (unsigned long long)(uintptr_t)e);
    } else if (!strcmp(cmd, "event-ipc-get")) {
        CUipcEventHandle h;
        if (!cu_check(cmd, cuIpcGetEventHandle(&h, (CUevent)(uintptr_t)val(cmd, a1)))) return;
        printf("ok event-ipc-get handle=");
        for (int i = 0; i < 64; i++) printf("%02x", (unsigned char)h.reserved[i]);
        printf("\n");
    } else if (!strcmp(cmd, "event-ipc-open")) {
        CUipcEventHandle h;
        CUevent e;
        if (!a1 || strlen(a1) != 128) bad("handle", cmd);
        for (int i = 0; i < 64; i++) {
            unsigned x;
            if (sscanf(a1 + 2 * i, "%2x", &x) != 1) bad("handle", cmd);
            h.reserved[i] = (char)x;
        }
        if (cu_check(cmd, cuIpcOpenEventHandle(&e, h))) ok_slot(cmd, (unsigned long long)(uintptr_t)e);
    } else if (!strcmp(cmd, "event-record")) {
        if (cu_check(cmd, cuEventRecord((CUevent)(uintptr_t)val(cmd, a1), (CUstream)(uintptr_t)val(cmd, a2)))) ok(cmd);
    } else if (!strcmp(cmd, "event-query")) {
        if (cu_check(cmd, cuEventQuery((CUevent)(uintptr_t)val(cmd, a1)))) ok(cmd);
    } else if (!strcmp(cmd, "event-wait")) {
        if (cu_check(cmd, cuStreamWaitEvent((CUstream)(uintptr_t)val(cmd, a1), (CUevent)(uintptr_t)val(cmd, a2), 0))) ok(cmd);
    } else if (!strcmp(cmd, "event-synchronize")) {
        if (cu_check(cmd, cuEventSynchronize((CUevent)(uintptr_t)val(cmd, a1)))) ok(cmd);
    } else {
        bad("command", cmd);
    }
}

static void run_line(char *line) {
    char *args[8];
    int n = 0;
    for (char *t = strtok(line, " \t\r\n"); t && n < 8; t = strtok(NULL, " \t\r\n")) args[n++] = t;
    if (n == 0) return;
    run(n, args);
    fflush(stdout);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1) {
        for (int i = 1; i < argc; i++) {
            char *copy = strdup(argv[i]);
            run_line(copy);
            free(copy);
        }
        return 0;
    }
    char line[4096];
    while (fgets(line, sizeof line, stdin)) run_line(line);
    return 0;
}
