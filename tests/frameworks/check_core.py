"""cuda.core (NVIDIA's Pythonic CUDA, over cuda.bindings) on the simulated node: each check
prints `key value` lines, which tests/tests/frameworks.rs asserts. A failing step prints
`error <step> <type>: <message>`.

As for CuPy (check_cupy.py): device queries, copies and memsets are asserted byte for
byte; kernels are compiled (NVRTC), loaded, launched and synchronised, but their results
are not checked because kernels do not compute on the simulator; a memory limit shows as
CUDA's out-of-memory error, which cuda.core raises as its `CUDAError`.

Usage: check_core.py basic | kernels | limit
"""

import sys

# No __pycache__ beside the sources for the shared module.
sys.dont_write_bytecode = True
from check_common import MI, error, run, say


def mem_info():
    from cuda.bindings import runtime as cudart

    err, free, total = cudart.cudaMemGetInfo()
    if err != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"cudaMemGetInfo: {err}")
    return free, total


def basic(np):
    from cuda.core import Device, LegacyPinnedMemoryResource, system

    say("device_count", system.get_num_devices())
    d = Device(0)
    d.set_current()
    say("device_name", d.name)
    cc = d.compute_capability
    say("compute_capability", f"{cc.major}.{cc.minor}")
    say("multiprocessors", d.properties.multiprocessor_count)
    say("mem_info", *mem_info())

    s = d.create_stream()
    n = 4 * MI
    host = LegacyPinnedMemoryResource()
    src = host.allocate(n, stream=s)
    back = host.allocate(n, stream=s)
    payload = np.random.default_rng(11).integers(0, 256, size=n, dtype=np.uint8)
    np.from_dlpack(src).view(np.uint8)[:] = payload
    # The device's default memory resource: a stream-ordered pool (cudaMallocAsync).
    a = d.allocate(n, stream=s)
    b = d.allocate(n, stream=s)
    a.copy_from(src, stream=s)
    b.copy_from(a, stream=s)
    back.copy_from(b, stream=s)
    s.sync()
    say("roundtrip_equal", bool((np.from_dlpack(back).view(np.uint8) == payload).all()))
    b.fill(0xAB, stream=s)
    back.copy_from(b, stream=s)
    e = s.record()
    e.sync()
    say("fill_bytes", bool((np.from_dlpack(back).view(np.uint8) == 0xAB).all()))
    for buf in (a, b):
        buf.close(stream=s)
    s.sync()
    d.sync()
    say("synchronized", True)


def kernels(np):
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    d = Device(0)
    d.set_current()
    s = d.create_stream()
    cc = d.compute_capability
    code = r"""
    extern "C" __global__ void tessera_scale(float *a, float k, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) a[i] *= k;
    }
    """
    prog = Program(code, code_type="c++", options=ProgramOptions(arch=f"sm_{cc.major}{cc.minor}"))
    mod = prog.compile("cubin")
    kernel = mod.get_kernel("tessera_scale")
    buf = d.allocate(4096 * 4, stream=s)
    launch(s, LaunchConfig(grid=16, block=256), kernel, buf, np.float32(2.0), np.int32(4096))
    s.sync()
    say("kernel", "launched", "tessera_scale")
    ptx = prog.compile("ptx")
    launch(s, LaunchConfig(grid=16, block=256), ptx.get_kernel("tessera_scale"), buf, np.float32(2.0), np.int32(4096))
    s.sync()
    say("ptx_kernel", "launched", "tessera_scale")


def limit(np):
    from cuda.core import Device

    d = Device(0)
    d.set_current()
    say("mem_info", *mem_info())
    s = d.create_stream()
    chunk = 128 * MI
    held = []
    total = mem_info()[1]
    try:
        while len(held) * chunk <= 2 * total:
            held.append(d.allocate(chunk, stream=s))
        say("oom", "none", len(held) * chunk)
    except Exception as e:  # noqa: BLE001 -- the type and code are what is reported
        code = "CUDA_ERROR_OUT_OF_MEMORY" if "CUDA_ERROR_OUT_OF_MEMORY" in str(e) else "other"
        say("oom", f"{type(e).__module__}.{type(e).__name__}", len(held) * chunk, code)
    for buf in held:
        buf.close(stream=s)
    s.sync()


def load():
    import numpy as np
    import cuda.core  # noqa: F401

    return (np,)


if __name__ == "__main__":
    checks = {"basic": basic, "kernels": kernels, "limit": limit}
    sys.exit(run(checks, load, "basic | kernels | limit"))
