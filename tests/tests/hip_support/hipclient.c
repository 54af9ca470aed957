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
        } else {
            report("unknown", 1, "command=%s", c);
            return 2;
        }
    }
    return 0;
}
