"""hip-python (AMD's own bindings, from PyPI) on the simulated AMD node.

Usage: hip_python_check.py EXPECTED_TOTAL_BYTES

hip-python opens `libamdhip64.so` itself and looks each function up on that handle, so
`LD_PRELOAD` alone does not come between it and the runtime. Checks, printed as
`ok <what> ...` or `fail <what> ...`; exits 1 if any failed:
- `hipMemGetInfo` reports EXPECTED_TOTAL_BYTES as the total;
- `hipMalloc` of one byte past it is `hipErrorOutOfMemory`, and of a quarter of it
  succeeds afterwards (and is freed).
"""

import sys

from check_common import check, run_expecting_total


def main(expected):
    from hip import hip

    err, n = hip.hipGetDeviceCount()
    check("device", err == hip.hipError_t.hipSuccess and n >= 1, f"count={n}")
    err, free, total = hip.hipMemGetInfo()
    check("meminfo", err == hip.hipError_t.hipSuccess and total == expected,
          f"free={free}", f"total={total}", f"expected={expected}")
    err, _ = hip.hipMalloc(total + 1)
    check("oom", err == hip.hipError_t.hipErrorOutOfMemory, f"error={err}")
    err, ptr = hip.hipMalloc(total // 4)
    check("alloc_after_oom", err == hip.hipError_t.hipSuccess, f"error={err}")
    if err == hip.hipError_t.hipSuccess:
        (err,) = hip.hipFree(ptr)
        check("free", err == hip.hipError_t.hipSuccess, f"error={err}")


if __name__ == "__main__":
    sys.exit(run_expecting_total(main, __doc__))
