/* poolbench: times the stream-ordered and graph-memory calls the shim
 * accounts for, inside one process (start-up not counted), for the `hook`
 * section of tessera-bench. Links -lcuda; the driver's declarations come
 * from tests/probe/cuda_abi.h (no NVIDIA header needed).
 *
 *   poolbench <n>   prints one line per measure:
 *   ok <measure> n= ns_per_call=
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_abi.h"

#define CK(x)                                                   \
    do {                                                        \
        CUresult r_ = (x);                                      \
        if (r_) {                                               \
            printf("err %s CUDA_ERROR_%d\n", #x, r_);           \
            exit(1);                                            \
        }                                                       \
    } while (0)

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000;
    CUdevice d;
    CUcontext c;
    CUstream s;
    CUmemoryPool pool;
    CUdeviceptr p;
    CK(cuInit(0));
    CK(cuDeviceGet(&d, 0));
    CK(cuDevicePrimaryCtxRetain(&c, d));
    CK(cuCtxSetCurrent(c));
    CK(cuStreamCreate(&s, 0));
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = 1;
    props.location.type = 1;
    CK(cuMemPoolCreate(&pool, &props));
    unsigned long long keep = ~0ULL;
    CK(cuMemPoolSetAttribute(pool, 4, &keep));

    /* The default pool: allocate and free in stream order, reusing. */
    for (long i = 0; i < 1000; i++) {
        CK(cuMemAllocAsync(&p, 1 << 20, s));
        CK(cuMemFreeAsync(p, s));
    }
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        CK(cuMemAllocAsync(&p, 1 << 20, s));
        CK(cuMemFreeAsync(p, s));
    }
    double t1 = now_ns();
    printf("ok async-pair n=%ld ns_per_call=%.1f\n", n, (t1 - t0) / n);
    CK(cuStreamSynchronize(s));

    /* A pool of its own that keeps everything. */
    for (long i = 0; i < 1000; i++) {
        CK(cuMemAllocFromPoolAsync(&p, 1 << 20, pool, s));
        CK(cuMemFreeAsync(p, s));
    }
    t0 = now_ns();
    for (long i = 0; i < n; i++) {
        CK(cuMemAllocFromPoolAsync(&p, 1 << 20, pool, s));
        CK(cuMemFreeAsync(p, s));
    }
    t1 = now_ns();
    printf("ok pool-pair n=%ld ns_per_call=%.1f\n", n, (t1 - t0) / n);

    /* A graph that allocates 1 MiB and frees it, launched again and again. */
    CUgraph g;
    CUgraphNode a, f;
    CUgraphExec e;
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = 1;
    ap.poolProps.location.type = 1;
    ap.bytesize = 1 << 20;
    CK(cuGraphCreate(&g, 0));
    CK(cuGraphAddMemAllocNode(&a, g, 0, 0, &ap));
    CK(cuGraphAddMemFreeNode(&f, g, &a, 1, ap.dptr));
    CK(cuGraphInstantiateWithFlags(&e, g, 0));
    for (long i = 0; i < 100; i++) CK(cuGraphLaunch(e, s));
    CK(cuStreamSynchronize(s));
    long m = n / 10 > 100 ? n / 10 : 100;
    t0 = now_ns();
    for (long i = 0; i < m; i++) CK(cuGraphLaunch(e, s));
    t1 = now_ns();
    CK(cuStreamSynchronize(s));
    printf("ok graph-launch n=%ld ns_per_call=%.1f\n", m, (t1 - t0) / m);
    return 0;
}
