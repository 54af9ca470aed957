"""CuPy on the simulated node: each check prints `key value` lines, which
tests/tests/frameworks.rs asserts. A failing step prints `error <step> <type>: <message>`
and the script goes on where it can, so one run reports everything.

What the simulator guarantees, and so all that is asserted: device queries answer with
the node's configuration; copies and memsets move real bytes; kernels compile, load,
launch and synchronise, but do not compute (their output bytes are whatever the memory
held), so no kernel result is checked; memory limits are enforced with CUDA's
out-of-memory error, which CuPy raises as its own `OutOfMemoryError`.

Usage: check_cupy.py basic | kernels | limit default|async
"""

import sys

# No __pycache__ beside the sources for the shared module.
sys.dont_write_bytecode = True
from check_common import MI, error, run, say


def basic(cupy, np):
    rt = cupy.cuda.runtime
    say("runtime_version", rt.runtimeGetVersion())
    say("driver_version", rt.driverGetVersion())
    say("device_count", rt.getDeviceCount())
    p = rt.getDeviceProperties(0)
    say("device_name", p["name"].decode())
    say("total_global_mem", p["totalGlobalMem"])
    say("compute_capability", f"{p['major']}.{p['minor']}")
    say("multiprocessors", p["multiProcessorCount"])
    free, total = rt.memGetInfo()
    say("mem_info", free, total)

    # Host -> device -> host: every byte back.
    host = np.random.default_rng(7).integers(0, 256, size=4 * MI, dtype=np.uint8)
    dev = cupy.asarray(host)
    say("roundtrip_equal", bool((dev.get() == host).all()))
    # Device -> device.
    other = cupy.empty_like(dev)
    other.data.copy_from_device(dev.data, dev.nbytes)
    say("d2d_equal", bool((other.get() == host).all()))
    # cupy.zeros is a memset: real bytes.
    z = cupy.zeros(MI, dtype=cupy.float32)
    say("zeros_are_zero", bool((z.get() == 0).all()))
    # Streams and events.
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        a = cupy.asarray(np.arange(1000, dtype=np.int64))
        e = s.record()
    e.synchronize()
    s.synchronize()
    cupy.cuda.Device(0).synchronize()
    say("stream_copy_equal", bool((a.get() == np.arange(1000)).all()))
    # The second device, from threads of their own (each thread's runtime state and the
    # device's primary context).
    if rt.getDeviceCount() > 1:
        import threading

        ok = []

        def work(d):
            with cupy.cuda.Device(d):
                b = cupy.asarray(np.arange(100) + d)
                cupy.cuda.get_current_stream().synchronize()
                ok.append(b.device.id == d and bool((b.get() == np.arange(100) + d).all()))

        threads = [threading.Thread(target=work, args=(i % 2,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        say("two_devices_from_threads", len(ok), all(ok))
    # The stream-ordered pool (cudaMallocAsync).
    pool = cupy.cuda.MemoryAsyncPool()
    ptr = pool.malloc(MI)
    ptr.copy_from_host(host.ctypes.data, MI)
    back = np.empty(MI, dtype=np.uint8)
    ptr.copy_to_host(back.ctypes.data, MI)
    say("async_pool_equal", bool((back == host[:MI]).all()))


def kernels(cupy, np):
    x = cupy.asarray(np.arange(4096, dtype=np.float32))
    double_it = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 2", "tessera_double")
    y = double_it(x)
    cupy.cuda.Device(0).synchronize()
    say("elementwise", "launched", y.shape[0], y.dtype)
    add_one = cupy.RawKernel(
        r"""
        extern "C" __global__ void tessera_add_one(float *a, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) a[i] += 1.0f;
        }
        """,
        "tessera_add_one",
    )
    add_one((16,), (256,), (x, np.int32(4096)))
    cupy.cuda.get_current_stream().synchronize()
    say("rawkernel", "launched", add_one.attributes["max_threads_per_block"] > 0)
    # Kernels do not compute here; the input a copy put there is still what was copied
    # unless the kernel wrote it, which the simulator never does.
    say("kernel_input_bytes_unchanged", bool((x.get() == np.arange(4096)).all()))
    # cupy.sort runs Thrust kernels precompiled into CuPy's own fat binaries, which the
    # statically linked runtime registers and loads itself (with cuLibraryLoadData of
    # the registered __fatBinC_Wrapper_t), not CuPy through cuModuleLoadData as above.
    s = cupy.sort(x)
    cupy.cuda.Device(0).synchronize()
    say("runtime_registered_kernel", "launched", s.shape[0])
    # Stream capture into a CUDA graph (a kernel and a device-to-device copy), launched
    # twice; the copy's bytes are real.
    stream = cupy.cuda.Stream(non_blocking=True)
    host = np.arange(4096, dtype=np.float32)
    g_in = cupy.asarray(host)
    g_copy = cupy.zeros(4096, dtype=cupy.float32)
    with stream:
        stream.begin_capture()
        g_out = double_it(g_in)
        g_copy.data.copy_from_device_async(g_in.data, g_in.nbytes, stream)
        graph = stream.end_capture()
    # Captured work does not run until the graph is launched.
    say("graph_before_launch_zero", bool((g_copy.get() == 0).all()))
    graph.launch(stream)
    graph.launch(stream)
    stream.synchronize()
    say("graph", "launched", g_out.shape[0], bool((g_copy.get() == host).all()))


def limit(cupy, np, which):
    rt = cupy.cuda.runtime
    free, total = rt.memGetInfo()
    say("mem_info", free, total)
    if which == "async":
        pool = cupy.cuda.MemoryAsyncPool()
        cupy.cuda.set_allocator(pool.malloc)
    else:
        pool = cupy.get_default_memory_pool()
    chunk = 128 * MI
    held = []
    try:
        while len(held) * chunk <= 2 * total:
            held.append(cupy.empty(chunk, dtype=cupy.uint8))
        say("oom", "none", len(held) * chunk)
    except Exception as e:  # noqa: BLE001 -- the type is what is reported
        say("oom", f"{type(e).__module__}.{type(e).__name__}", len(held) * chunk)
    # After freeing, the memory is usable again (the pool gives it back or reuses it).
    del held
    cupy.cuda.Device(0).synchronize()
    if which == "default":
        pool.free_all_blocks()
    try:
        again = cupy.empty(4 * chunk, dtype=cupy.uint8)
        say("realloc_after_free", "ok", again.nbytes)
    except Exception as e:  # noqa: BLE001
        error("realloc_after_free", e)


def load():
    import cupy
    import numpy as np

    return (cupy, np)


if __name__ == "__main__":
    checks = {"basic": basic, "kernels": kernels, "limit": limit}
    sys.exit(run(checks, load, "basic | kernels | limit default|async"))
