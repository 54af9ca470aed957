/* A HIP compute workload for hip_compute.rs: loads the simulator's kernel
 * image `kernel work <N>us`, then for the given time keeps at most `depth`
 * kernels in flight through hipModuleLaunchKernel, as the CUDA workload of
 * tests/src/bench/compute.rs does. Prints `ok ready`, then
 * `ok done launches=<n>`; a failed call prints `err <call> HIP_ERROR_<code>`
 * and exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int hipError_t;
typedef void *hipModule_t;
typedef void *hipFunction_t;
typedef void *hipEvent_t;
typedef void *hipStream_t;
hipError_t hipSetDevice(int);
hipError_t hipModuleLoadData(hipModule_t *, const void *);
hipError_t hipModuleGetFunction(hipFunction_t *, hipModule_t, const char *);
hipError_t hipEventCreate(hipEvent_t *);
hipError_t hipEventRecord(hipEvent_t, hipStream_t);
hipError_t hipEventSynchronize(hipEvent_t);
hipError_t hipDeviceSynchronize(void);
hipError_t hipModuleLaunchKernel(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned,
                                 unsigned, unsigned, hipStream_t, void **, void **);

#define CK(call)                                                  \
    do {                                                          \
        hipError_t r_ = (call);                                   \
        if (r_) {                                                 \
            printf("err %s HIP_ERROR_%d\n", #call, r_);           \
            fflush(stdout);                                       \
            return 1;                                             \
        }                                                         \
    } while (0)

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s <kernel_us> <seconds> <depth>\n", argv[0]);
        return 2;
    }
    long kernel_us = atol(argv[1]);
    double seconds = atof(argv[2]);
    int depth = atoi(argv[3]);
    if (depth < 1 || depth > 256) {
        fprintf(stderr, "depth must be 1..256\n");
        return 2;
    }
    hipModule_t mod;
    hipFunction_t f;
    CK(hipSetDevice(0));
    char image[64];
    snprintf(image, sizeof image, "kernel work %ldus\n", kernel_us);
    CK(hipModuleLoadData(&mod, image));
    CK(hipModuleGetFunction(&f, mod, "work"));
    hipEvent_t ev[256];
    for (int i = 0; i < depth; i++) CK(hipEventCreate(&ev[i]));
    printf("ok ready\n");
    fflush(stdout);
    double end = now_ns() + seconds * 1e9;
    long n = 0;
    while (now_ns() < end) {
        if (n >= depth) CK(hipEventSynchronize(ev[n % depth]));
        CK(hipModuleLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        CK(hipEventRecord(ev[n % depth], NULL));
        n++;
    }
    CK(hipDeviceSynchronize());
    printf("ok done launches=%ld\n", n);
    fflush(stdout);
    return 0;
}
