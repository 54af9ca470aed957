/* A HIP client for the hip_* tests: runs its arguments as commands against
 * the HIP runtime and prints one line per command as the probe does (`ok <cmd> k=v ...` or
 * `err <cmd> HIP_ERROR_<code> k=v ...`), which `tessera_e2e::Line` parses.
 *
 * Built two ways (see mod.rs): -DHIP_DLOPEN opens libamdhip64.so.5 and
 * looks every function up on that handle (as hip-python does, which the
 * shim's dlsym route must govern); otherwise it links the runtime, so its
 * references carry the runtime's symbol versions (hipMalloc@hip_4.2), which
 * the preloaded shim must still bind.
 *
 * Commands:
 *   meminfo            hipMemGetInfo
 *   totalmem           hipDeviceTotalMem(device 0)
 *   props              totalGlobalMem of hipGetDeviceProperties(device 0)
 *   malloc N           hipMalloc of N bytes, kept
 *   free               hipFree of the most recent one kept
 *   race SEED MAXMIB   hipMalloc of random sizes (1 to MAXMIB MiB) until
 *                      one is refused; prints what it holds
 *   ready              reports, then reads one line of stdin (the test's
 *                      start signal, so that racers start together)
 *   wait               reads stdin until EOF (the test's signal to go on)
 * and, linked only, one allocation of each family, kept until `freeall`:
 *   managed N | ext N | async N | pitch W H | m3d W H D | array W H | vmm N
 *   procaddr N         hipMalloc of N bytes through hipGetProcAddress's pointer
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <unistd.h>

#include <stdarg.h>

/* One reported line: `ok cmd fields` when r is hipSuccess, else
 * `err cmd HIP_ERROR_<r> fields`. */
static void report(const char *cmd, int r, const char *fmt, ...) {
    if (r == 0)
        printf("ok %s ", cmd);
    else
        printf("err %s HIP_ERROR_%d ", cmd, r);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
}

typedef int hipError_t;
typedef hipError_t (*malloc_fn)(void **, size_t);
typedef hipError_t (*free_fn)(void *);
typedef hipError_t (*meminfo_fn)(size_t *, size_t *);
typedef hipError_t (*totalmem_fn)(size_t *, int);
typedef hipError_t (*props_fn)(void *, int);

#ifdef HIP_DLOPEN
#include <dlfcn.h>
static malloc_fn p_hipMalloc;
static free_fn p_hipFree;
static meminfo_fn p_hipMemGetInfo;
static totalmem_fn p_hipDeviceTotalMem;
static props_fn p_hipGetDeviceProperties;
static void *must(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        report("dlsym", 500, "symbol=%s", name);
        exit(2);
    }
    return p;
}
static void resolve(void) {
    void *h = dlopen("libamdhip64.so.5", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        report("dlopen", 500, "why=%s", dlerror());
        exit(2);
    }
    p_hipMalloc = (malloc_fn)must(h, "hipMalloc");
    p_hipFree = (free_fn)must(h, "hipFree");
    p_hipMemGetInfo = (meminfo_fn)must(h, "hipMemGetInfo");
    p_hipDeviceTotalMem = (totalmem_fn)must(h, "hipDeviceTotalMem");
    p_hipGetDeviceProperties = (props_fn)must(h, "hipGetDeviceProperties");
}
#else
hipError_t hipMalloc(void **, size_t);
hipError_t hipFree(void *);
hipError_t hipMemGetInfo(size_t *, size_t *);
hipError_t hipDeviceTotalMem(size_t *, int);
hipError_t hipGetDeviceProperties(void *, int);
#define p_hipMalloc hipMalloc
#define p_hipFree hipFree
#define p_hipMemGetInfo hipMemGetInfo
#define p_hipDeviceTotalMem hipDeviceTotalMem
#define p_hipGetDeviceProperties hipGetDeviceProperties
static void resolve(void) {}
#endif

#define MAX_KEPT 4096
static void *kept[MAX_KEPT];
static int n_kept;

#ifndef HIP_DLOPEN
/* The families, linked: HIP 5.2's declarations, written out (no headers). */
typedef struct { size_t width, height, depth; } hipExtent;
typedef struct { void *ptr; size_t pitch, xsize, ysize; } hipPitchedPtr;
typedef struct { int x, y, z, w, f; } hipChannelFormatDesc;
typedef struct { int type, id; } hipMemLocation;
typedef struct {
    unsigned char compressionType;
    hipMemLocation location;
    int requestedHandleType, type;
    unsigned short usage;
    void *win32HandleMetaData;
} hipMemAllocationProp;
hipError_t hipMallocManaged(void **, size_t, unsigned);
hipError_t hipExtMallocWithFlags(void **, size_t, unsigned);
hipError_t hipMallocAsync(void **, size_t, void *);
hipError_t hipFreeAsync(void *, void *);
hipError_t hipStreamSynchronize(void *);
hipError_t hipMallocPitch(void **, size_t *, size_t, size_t);
hipError_t hipMalloc3D(hipPitchedPtr *, hipExtent);
hipError_t hipMallocArray(void **, const hipChannelFormatDesc *, size_t, size_t, unsigned);
hipError_t hipFreeArray(void *);
hipError_t hipMemCreate(void **, size_t, const hipMemAllocationProp *, unsigned long long);
hipError_t hipMemRelease(void *);
hipError_t hipMemAddressReserve(void **, size_t, size_t, void *, unsigned long long);
hipError_t hipMemAddressFree(void *, size_t);
hipError_t hipMemMap(void *, size_t, size_t, void *, unsigned long long);
hipError_t hipMemUnmap(void *, size_t);
hipError_t hipGetProcAddress(const char *, void **, int, unsigned long long, int *);
hipError_t hipDeviceGetDefaultMemPool(void **, int);
hipError_t hipMemPoolSetAttribute(void *, int, void *);
hipError_t hipMemPoolGetAttribute(void *, int, void *);
hipError_t hipMemPoolTrimTo(void *, size_t);
typedef struct { char reserved[64]; } hipIpcMemHandle_t;
hipError_t hipIpcGetMemHandle(hipIpcMemHandle_t *, void *);
hipError_t hipIpcOpenMemHandle(void **, hipIpcMemHandle_t, unsigned);
hipError_t hipIpcCloseMemHandle(void *);
static void *opened[MAX_KEPT];
static int n_opened;

/* Stream-ordered blocks of the device's default pool, freed by "pfree"
 * without a synchronisation (the pool keeps them). */
static void *pool_blocks[MAX_KEPT];
static int n_pool_blocks;

enum kind { K_PTR, K_ASYNC, K_ARRAY, K_VMM };
static struct { void *p; enum kind k; size_t n; } fam[MAX_KEPT];
static int n_fam;
static void keep(void *p, enum kind k, size_t n) {
    if (n_fam < MAX_KEPT) {
        fam[n_fam].p = p;
        fam[n_fam].k = k;
        fam[n_fam].n = n;
        n_fam++;
    }
}

/* One family command at argv[*i]; 0 when `c` is none of them. */
static int family(const char *c, char **argv, int argc, int *i) {
    void *p = NULL;
    int r;
    if (!strcmp(c, "managed") && *i + 1 < argc) {
        size_t n = strtoull(argv[++*i], NULL, 0);
        r = hipMallocManaged(&p, n, 1);
        if (!r) keep(p, K_PTR, n);
        report(c, r, "bytes=%zu", n);
    } else if (!strcmp(c, "ext") && *i + 1 < argc) {
        size_t n = strtoull(argv[++*i], NULL, 0);
        r = hipExtMallocWithFlags(&p, n, 0);
        if (!r) keep(p, K_PTR, n);
        report(c, r, "bytes=%zu", n);
    } else if (!strcmp(c, "async") && *i + 1 < argc) {
        size_t n = strtoull(argv[++*i], NULL, 0);
        r = hipMallocAsync(&p, n, NULL);
        if (!r) r = hipStreamSynchronize(NULL);
        if (!r) keep(p, K_ASYNC, n);
        report(c, r, "bytes=%zu", n);
    } else if (!strcmp(c, "pitch") && *i + 2 < argc) {
        size_t w = strtoull(argv[++*i], NULL, 0), h = strtoull(argv[++*i], NULL, 0), pitch = 0;
        r = hipMallocPitch(&p, &pitch, w, h);
        if (!r) keep(p, K_PTR, 0);
        report(c, r, "pitch=%zu", pitch);
    } else if (!strcmp(c, "m3d") && *i + 3 < argc) {
        hipExtent e;
        e.width = strtoull(argv[++*i], NULL, 0);
        e.height = strtoull(argv[++*i], NULL, 0);
        e.depth = strtoull(argv[++*i], NULL, 0);
        hipPitchedPtr pp;
        memset(&pp, 0, sizeof pp);
        r = hipMalloc3D(&pp, e);
        if (!r) keep(pp.ptr, K_PTR, 0);
        report(c, r, "pitch=%zu", pp.pitch);
    } else if (!strcmp(c, "array") && *i + 2 < argc) {
        size_t w = strtoull(argv[++*i], NULL, 0), h = strtoull(argv[++*i], NULL, 0);
        hipChannelFormatDesc d = {32, 0, 0, 0, 2}; /* one float channel */
        r = hipMallocArray(&p, &d, w, h, 0);
        if (!r) keep(p, K_ARRAY, 0);
        report(c, r, "bytes=%zu", w * h * 4);
    } else if (!strcmp(c, "vmm") && *i + 1 < argc) {
        size_t n = strtoull(argv[++*i], NULL, 0);
        hipMemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = 1;          /* hipMemAllocationTypePinned */
        prop.location.type = 1; /* hipMemLocationTypeDevice */
        prop.location.id = 0;
        void *h = NULL, *va = NULL;
        r = hipMemCreate(&h, n, &prop, 0);
        if (!r) r = hipMemAddressReserve(&va, n, 0, NULL, 0);
        if (!r) r = hipMemMap(va, n, 0, h, 0);
        /* Released while mapped: the mapping keeps it until unmapped. */
        if (!r) r = hipMemRelease(h);
        if (!r) keep(va, K_VMM, n);
        report(c, r, "bytes=%zu", n);
    } else if (!strcmp(c, "procaddr") && *i + 1 < argc) {
        size_t n = strtoull(argv[++*i], NULL, 0);
        void *fp = NULL;
        r = hipGetProcAddress("hipMalloc", &fp, 50200, 0, NULL);
        if (!r) r = ((malloc_fn)fp)(&p, n);
        if (!r) keep(p, K_PTR, n);
        report(c, r, "bytes=%zu", n);
    } else if (!strcmp(c, "threshold") && *i + 1 < argc) {
        /* The default pool keeps up to this many freed bytes. */
        unsigned long long t = strtoull(argv[++*i], NULL, 0);
        void *pool = NULL;
        r = hipDeviceGetDefaultMemPool(&pool, 0);
        if (!r) r = hipMemPoolSetAttribute(pool, 4 /* ReleaseThreshold */, &t);
        report(c, r, "bytes=%llu", t);
    } else if (!strcmp(c, "pasync") && *i + 1 < argc) {
        size_t n = strtoull(argv[++*i], NULL, 0);
        r = hipMallocAsync(&p, n, NULL);
        if (!r && n_pool_blocks < MAX_KEPT) pool_blocks[n_pool_blocks++] = p;
        report(c, r, "bytes=%zu", n);
    } else if (!strcmp(c, "pfree")) {
        r = 0;
        while (n_pool_blocks && !r) r = hipFreeAsync(pool_blocks[--n_pool_blocks], NULL);
        report(c, r, "left=%d", n_pool_blocks);
    } else if (!strcmp(c, "sync")) {
        r = hipStreamSynchronize(NULL);
        report(c, r, "stream=0");
    } else if (!strcmp(c, "trim") && *i + 1 < argc) {
        size_t keep_bytes = strtoull(argv[++*i], NULL, 0);
        void *pool = NULL;
        r = hipDeviceGetDefaultMemPool(&pool, 0);
        if (!r) r = hipMemPoolTrimTo(pool, keep_bytes);
        report(c, r, "keep=%zu", keep_bytes);
    } else if (!strcmp(c, "pattr")) {
        unsigned long long reserved = 0, used = 0;
        void *pool = NULL;
        r = hipDeviceGetDefaultMemPool(&pool, 0);
        if (!r) r = hipMemPoolGetAttribute(pool, 5 /* ReservedMemCurrent */, &reserved);
        if (!r) r = hipMemPoolGetAttribute(pool, 7 /* UsedMemCurrent */, &used);
        report(c, r, "reserved=%llu used=%llu", reserved, used);
    } else if (!strcmp(c, "export") && *i + 1 < argc) {
        /* hipMalloc n bytes (freed by "free") and its IPC handle, in hex. */
        size_t n = strtoull(argv[++*i], NULL, 0);
        hipIpcMemHandle_t h;
        char hex[129];
        memset(&h, 0, sizeof h);
        r = hipMalloc(&p, n);
        if (!r && n_kept < MAX_KEPT) kept[n_kept++] = p;
        if (!r) r = hipIpcGetMemHandle(&h, p);
        for (int k = 0; k < 64; k++) sprintf(hex + 2 * k, "%02x", (unsigned char)h.reserved[k]);
        report(c, r, "bytes=%zu handle=%s", n, hex);
    } else if (!strcmp(c, "import")) {
        /* A handle in hex, read from stdin (it is known only once the
         * exporter has run). */
        char line[256];
        hipIpcMemHandle_t h;
        memset(&h, 0, sizeof h);
        if (!fgets(line, sizeof line, stdin)) return report(c, 1, "stdin=closed"), 1;
        for (int k = 0; k < 64; k++) {
            unsigned v = 0;
            if (sscanf(line + 2 * k, "%2x", &v) != 1) break;
            h.reserved[k] = (char)v;
        }
        r = hipIpcOpenMemHandle(&p, h, 0 /* hipIpcMemLazyEnablePeerAccess */);
        if (!r && n_opened < MAX_KEPT) opened[n_opened++] = p;
        report(c, r, "opened=%d", n_opened);
    } else if (!strcmp(c, "iclose")) {
        r = n_opened ? hipIpcCloseMemHandle(opened[--n_opened]) : -1;
        report(c, r, "opened=%d", n_opened);
    } else if (!strcmp(c, "freeall")) {
        r = 0;
        for (int k = 0; k < n_fam && !r; k++) {
            switch (fam[k].k) {
            case K_PTR: r = hipFree(fam[k].p); break;
            case K_ASYNC:
                r = hipFreeAsync(fam[k].p, NULL);
                if (!r) r = hipStreamSynchronize(NULL);
                break;
            case K_ARRAY: r = hipFreeArray(fam[k].p); break;
            case K_VMM:
                r = hipMemUnmap(fam[k].p, fam[k].n);
                if (!r) r = hipMemAddressFree(fam[k].p, fam[k].n);
                break;
            }
        }
        report(c, r, "count=%d", n_fam);
        n_fam = 0;
    } else {
        return 0;
    }
    return 1;
}
#else
static int family(const char *c, char **argv, int argc, int *i) {
    (void)c, (void)argv, (void)argc, (void)i;
    return 0;
}
#endif

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    resolve();
    for (int i = 1; i < argc; i++) {
        const char *c = argv[i];
        if (!strcmp(c, "meminfo")) {
            size_t f = 0, t = 0;
            int r = p_hipMemGetInfo(&f, &t);
            report("meminfo", r, "free=%zu total=%zu", f, t);
        } else if (!strcmp(c, "totalmem")) {
            size_t t = 0;
            int r = p_hipDeviceTotalMem(&t, 0);
            report("totalmem", r, "bytes=%zu", t);
        } else if (!strcmp(c, "props")) {
            /* Larger than any hipDeviceProp_t; totalGlobalMem follows
             * char name[256] in HIP 5's layout. */
            static unsigned char prop[8192];
            int r = p_hipGetDeviceProperties(prop, 0);
            size_t t;
            memcpy(&t, prop + 256, sizeof t);
            report("props", r, "total=%zu", t);
        } else if (!strcmp(c, "malloc") && i + 1 < argc) {
            size_t n = strtoull(argv[++i], NULL, 0);
            void *p = NULL;
            int r = p_hipMalloc(&p, n);
            if (r == 0 && n_kept < MAX_KEPT)
                kept[n_kept++] = p;
            report("malloc", r, "bytes=%zu", n);
        } else if (!strcmp(c, "free")) {
            int r = n_kept ? p_hipFree(kept[--n_kept]) : -1;
            report("free", r, "kept=%d", n_kept);
        } else if (!strcmp(c, "race") && i + 2 < argc) {
            unsigned seed = (unsigned)strtoul(argv[++i], NULL, 0);
            size_t max_mib = strtoull(argv[++i], NULL, 0);
            size_t held = 0, asked = 0;
            int r = 0;
            while (n_kept < MAX_KEPT) {
                seed = seed * 1103515245u + 12345u;
                /* 1 byte to MAXMIB MiB, not page-aligned on purpose. */
                size_t n = 1 + (size_t)((seed >> 8) % (max_mib << 20));
                void *p = NULL;
                r = p_hipMalloc(&p, n);
                asked = n;
                if (r != 0)
                    break;
                kept[n_kept++] = p;
                held += n;
            }
            /* Refused is how a race ends: reported ok, with the code. */
            report("race", 0, "code=%d held=%zu count=%d refused=%zu", r, held, n_kept, asked);
        } else if (!strcmp(c, "ready")) {
            char buf[256];
            report("ready", 0, "pid=%d", (int)getpid());
            if (!fgets(buf, sizeof buf, stdin))
                return 3;
        } else if (!strcmp(c, "wait")) {
            char buf[256];
            while (fgets(buf, sizeof buf, stdin)) {
            }
            report("wait", 0, "done=1");
        } else if (family(c, argv, argc, &i)) {
        } else {
            report("unknown", 1, "command=%s", c);
            return 2;
        }
    }
    return 0;
}
