"""NVIDIA's shared CUDA runtime, libcudart.so.12 from the nvidia-cuda-runtime-cu12 wheel
(the one PyTorch and most C++ programs load), called through ctypes on the simulated node;
and the simulated driver's version and cuGetProcAddress as the runtime sees them. Prints
`key value` lines for tests/tests/frameworks.rs.

Usage: check_cudart.py basic | limit | procaddr | badtable
(TESSERA_CHECK_CUDART=13: CUDA 13's libcudart.so.13 instead of 12's)
"""

import ctypes
import os
import sys

# No __pycache__ beside the sources for the shared module.
sys.dont_write_bytecode = True
from check_common import MI, say

H2D, D2H = 1, 2


def cudart():
    """CUDA 12's runtime, or CUDA 13's with TESSERA_CHECK_CUDART=13 (the nvidia-cuda-runtime
    wheel, which installs beside the -cu12 one)."""
    if os.environ.get("TESSERA_CHECK_CUDART") == "13":
        import nvidia.cu13 as m

        return ctypes.CDLL(os.path.join(list(m.__path__)[0], "lib", "libcudart.so.13"))
    import nvidia.cuda_runtime as m

    return ctypes.CDLL(os.path.join(list(m.__path__)[0], "lib", "libcudart.so.12"))


def basic():
    rt = cudart()
    n = ctypes.c_int()
    say("get_device_count", rt.cudaGetDeviceCount(ctypes.byref(n)), n.value)
    v, d = ctypes.c_int(), ctypes.c_int()
    rt.cudaRuntimeGetVersion(ctypes.byref(v))
    rt.cudaDriverGetVersion(ctypes.byref(d))
    say("versions", v.value, d.value)
    p = ctypes.c_void_p()
    say("malloc", rt.cudaMalloc(ctypes.byref(p), 4 * MI))
    src = (ctypes.c_ubyte * 4096)(*[(i * 7) & 0xFF for i in range(4096)])
    dst = (ctypes.c_ubyte * 4096)()
    rc1 = rt.cudaMemcpy(p, src, 4096, H2D)
    rc2 = rt.cudaMemcpy(dst, p, 4096, D2H)
    say("memcpy", rc1, rc2, bytes(dst) == bytes(src))
    say("memset", rt.cudaMemset(p, 0x5A, 4096), rt.cudaMemcpy(dst, p, 4096, D2H), set(bytes(dst)) == {0x5A})
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    say("mem_info", rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)), free.value, total.value)
    s = ctypes.c_void_p()
    q = ctypes.c_void_p()
    say(
        "stream_ordered",
        rt.cudaStreamCreate(ctypes.byref(s)),
        rt.cudaMallocAsync(ctypes.byref(q), MI, s),
        rt.cudaFreeAsync(q, s),
        rt.cudaStreamSynchronize(s),
        rt.cudaStreamDestroy(s),
    )
    # What PyTorch's allocator does around cudaMalloc, and stream callbacks.
    mode = ctypes.c_int(2)  # cudaStreamCaptureModeRelaxed
    rc = rt.cudaThreadExchangeStreamCaptureMode(ctypes.byref(mode))
    back = ctypes.c_int(mode.value)
    rc2 = rt.cudaThreadExchangeStreamCaptureMode(ctypes.byref(back))
    say("capture_mode_exchange", rc, mode.value, rc2, back.value)
    called = []
    CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
    cb = CALLBACK(lambda stream, status, user: called.append(status))
    say("stream_callback", rt.cudaStreamAddCallback(None, cb, None, 0), rt.cudaDeviceSynchronize(), called)
    # Managed memory and its hints (cudaMemAdviseSetReadMostly = 1; cudaCpuDeviceId = -1).
    # CUDA 13 takes a cudaMemLocation {type, id} (device: 1, host: 2) where 12 took a device.
    m = ctypes.c_void_p()
    if os.environ.get("TESSERA_CHECK_CUDART") == "13":

        class Location(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

        dev, cpu = Location(1, 0), Location(2, 0)
        advise = lambda: rt.cudaMemAdvise(m, MI, 1, dev)  # noqa: E731
        prefetch = lambda loc: rt.cudaMemPrefetchAsync(m, MI, loc, 0, None)  # noqa: E731
    else:
        dev, cpu = 0, -1
        advise = lambda: rt.cudaMemAdvise(m, MI, 1, dev)  # noqa: E731
        prefetch = lambda loc: rt.cudaMemPrefetchAsync(m, MI, loc, None)  # noqa: E731
    say(
        "managed",
        rt.cudaMallocManaged(ctypes.byref(m), MI, 1),
        advise(),
        prefetch(dev),
        prefetch(cpu),
        rt.cudaDeviceSynchronize(),
        rt.cudaFree(m),
    )
    say("free", rt.cudaFree(p), rt.cudaDeviceSynchronize())


def limit():
    rt = cudart()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total))
    say("mem_info", free.value, total.value)
    held, rc = [], 0
    while len(held) * 128 * MI <= 2 * total.value:
        p = ctypes.c_void_p()
        rc = rt.cudaMalloc(ctypes.byref(p), 128 * MI)
        if rc != 0:
            break
        held.append(p)
    # cudaErrorMemoryAllocation is 2.
    say("oom", rc, len(held) * 128 * MI)
    for p in held:
        rt.cudaFree(p)


def procaddr():
    """Which ABI of cuCtxCreate a CUDA 13 request gets: v4 from a 13.x driver, the 12.x
    default (v3) from a 12.x one."""
    # The runtime loads libcuda first, so the simulated one is the one resolved here.
    rt = cudart()
    n = ctypes.c_int()
    rt.cudaGetDeviceCount(ctypes.byref(n))
    cuda = ctypes.CDLL("libcuda.so.1")
    d = ctypes.c_int()
    cuda.cuDriverGetVersion(ctypes.byref(d))
    say("driver_version", d.value)
    fn = ctypes.c_void_p()
    status = ctypes.c_int()
    rc = cuda.cuGetProcAddress_v2(b"cuCtxCreate", ctypes.byref(fn), 13000, ctypes.c_uint64(0), ctypes.byref(status))
    names = {
        ctypes.cast(getattr(cuda, name), ctypes.c_void_p).value: name
        for name in ("cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4")
    }
    say("cuCtxCreate_at_13000", rc, names.get(fn.value, "other"))


def badtable():
    """An export-table id the driver does not know: an error code each time, never a
    crash (the driver logs one line for it)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    say("init", cuda.cuInit(0))
    table = ctypes.c_void_p(0x10)
    guid = (ctypes.c_ubyte * 16)(*range(0xA0, 0xB0))
    rcs = [cuda.cuGetExportTable(ctypes.byref(table), guid) for _ in range(3)]
    say("unknown_table", *rcs, table.value is None)
    say("null_id", cuda.cuGetExportTable(ctypes.byref(table), None))


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "basic"
    {"basic": basic, "limit": limit, "procaddr": procaddr, "badtable": badtable}[mode]()
    say("done", mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
