"""CuPy-ROCm (`cupy-rocm-5-0` 13.3.0 from PyPI, unmodified) on the simulated AMD node.

Usage: cupy_rocm_check.py EXPECTED_TOTAL_BYTES

Checks, each printed as `ok <what> ...` or `fail <what> ...`; exits 1 if any failed:
- CuPy runs on HIP and sees the node's AMD devices, with their model and architecture;
- `cupy.cuda.runtime.memGetInfo()` reports EXPECTED_TOTAL_BYTES as the total (the
  simulated device's memory bare; the allocation's limit under `tessera run --memory`);
- an array one byte past that total raises CuPy's `OutOfMemoryError`, and an array of a
  quarter of it allocates afterwards;
- an elementwise kernel compiled through CuPy (hiprtc) launches and occupies the device:
  events recorded around a launch are at least its modelled time apart. Its result is
  not checked: the simulated kernels compute nothing (docs/simulator.md, "The AMD
  node").
"""

import sys

from check_common import check, run_expecting_total


def main(expected):
    import cupy

    rt = cupy.cuda.runtime
    check("hip", rt.is_hip, f"runtime={rt.runtimeGetVersion()}")
    n = rt.getDeviceCount()
    p = rt.getDeviceProperties(0)
    name, arch = p["name"].decode(), p["gcnArchName"].decode()
    check("device", n >= 1 and name.startswith("AMD "), f"count={n}", f"name={name!r}", f"arch={arch}")

    free, total = rt.memGetInfo()
    check("meminfo", total == expected, f"free={free}", f"total={total}", f"expected={expected}")

    pool = cupy.get_default_memory_pool()
    try:
        cupy.empty(total + 1, dtype=cupy.uint8)
        check("oom", False, "an array past the total allocated")
    except cupy.cuda.memory.OutOfMemoryError as e:
        check("oom", True, str(e).split("(")[0].strip())
    pool.free_all_blocks()
    try:
        a = cupy.empty(total // 4, dtype=cupy.uint8)
        check("alloc_after_oom", a.nbytes == total // 4, f"bytes={a.nbytes}")
        del a
    except cupy.cuda.memory.OutOfMemoryError as e:
        check("alloc_after_oom", False, str(e))
    pool.free_all_blocks()

    kernel = cupy.ElementwiseKernel("float32 x", "float32 y", "y = x * 2 + 1", "tessera_double_plus_one")
    # 2^26 elements (256 MiB each way): the simulated device's model of a real kernel,
    # 2 us + 5 ps per thread, runs it for at least 337 us.
    n = 1 << 26
    x = cupy.empty(n, dtype=cupy.float32)
    y = kernel(x)  # compiles (hiprtc) and loads it, so the timed launch below is only a launch
    cupy.cuda.Device().synchronize()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    y = kernel(x, y)
    stop.record()
    stop.synchronize()
    ms = cupy.cuda.get_elapsed_time(start, stop)
    modelled_ms = (2_000 + 5 * n / 1000) / 1e6
    # A lower bound whatever the load: the stop event is the kernel's end, which is at
    # least its modelled time after the start event.
    check("kernel", y.shape == x.shape and ms >= modelled_ms, f"elapsed_ms={ms:.3f}", f"modelled_ms={modelled_ms:.3f}")
    del x, y
    pool.free_all_blocks()


if __name__ == "__main__":
    sys.exit(run_expecting_total(main, __doc__))
