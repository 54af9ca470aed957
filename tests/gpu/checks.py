#!/usr/bin/env python3
"""One check of Tessera's real-GPU validation, run *inside* an allocation
(under `tessera run`, so with the shim preloaded) or, for the overhead
baseline, outside one. Prints one JSON object on stdout and exits 0 when
the check ran (its verdict is in the JSON), 3 when it could not run here
(e.g. no CUDA PyTorch), anything else on a crash.

Only the standard library is needed for the driver and NVML checks (ctypes
against libcuda.so.1 / libnvidia-ml.so.1), so they also run against
Tessera's simulated GPU node; the PyTorch checks need torch with CUDA.
"""

import ctypes
import json
import os
import sys
import time

GIB = 1 << 30
NOT_RUN = 3


def out(**kw):
    print(json.dumps(kw), flush=True)


def limit_bytes():
    return int(os.environ["CHECK_LIMIT_BYTES"])


# --- driver API through ctypes -------------------------------------------

def cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuInit.restype = ctypes.c_int
    return lib


def call(lib, name, *args):
    fn = getattr(lib, name)
    fn.restype = ctypes.c_int
    return fn(*args)


def driver_view():
    """cuMemGetInfo shows the limit; allocating past it is refused with
    CUDA_ERROR_OUT_OF_MEMORY (2), and nothing past it was handed out."""
    lib = cuda()
    assert call(lib, "cuInit", 0) == 0, "cuInit failed"
    dev = ctypes.c_int()
    assert call(lib, "cuDeviceGet", ctypes.byref(dev), 0) == 0
    ctx = ctypes.c_void_p()
    assert call(lib, "cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev) == 0
    assert call(lib, "cuCtxSetCurrent", ctx) == 0
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert call(lib, "cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total)) == 0
    limit = limit_bytes()
    chunk = 256 << 20
    held, refused_with = [], None
    while len(held) * chunk <= limit + chunk:
        p = ctypes.c_uint64()
        r = call(lib, "cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(chunk))
        if r != 0:
            refused_with = r
            break
        held.append(p.value)
    got = len(held) * chunk
    for p in held:
        call(lib, "cuMemFree_v2", ctypes.c_uint64(p))
    ok = total.value == limit and refused_with == 2 and got <= limit
    out(check="driver-view", ok=ok, total=total.value, limit=limit,
        allocated_before_refusal=got, refused_with=refused_with)


def nvml_view():
    """NVML inside the allocation reports the allocation's memory."""
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    assert lib.nvmlInit_v2() == 0, "nvmlInit_v2 failed"
    h = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0

    class Mem(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    m = Mem()
    assert lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0
    name = ctypes.create_string_buffer(96)
    lib.nvmlDeviceGetName(h, name, 96)
    lib.nvmlShutdown()
    limit = limit_bytes()
    out(check="nvml-view", ok=m.total == limit and m.used <= limit, total=m.total,
        used=m.used, limit=limit, name=name.value.decode(errors="replace"))


# --- PyTorch ---------------------------------------------------------------

def torch_or_exit():
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        out(check=sys.argv[1], ok=None, reason="not run: no CUDA PyTorch (torch not installed)")
        sys.exit(NOT_RUN)
    if not torch.cuda.is_available():
        out(check=sys.argv[1], ok=None, reason="not run: no CUDA PyTorch (torch.cuda unavailable)")
        sys.exit(NOT_RUN)
    return torch


def torch_oom():
    """PyTorch limited to the allocation gets its own OutOfMemoryError, and
    torch.cuda.mem_get_info() shows the limit."""
    torch = torch_or_exit()
    free, total = torch.cuda.mem_get_info()
    limit = limit_bytes()
    blocks, err = [], None
    try:
        while True:
            blocks.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
            if len(blocks) > 4 * (limit >> 28) + 64:
                break
    except torch.cuda.OutOfMemoryError as e:
        err = type(e).__name__
    got = len(blocks) << 28
    del blocks
    ok = total == limit and err == "OutOfMemoryError" and got <= limit
    out(check="torch-oom", ok=ok, mem_get_info_total=total, limit=limit,
        allocated_before_error=got, error=err)


def torch_loop():
    """The same kernel loop for a fixed time: iterations per second."""
    torch = torch_or_exit()
    seconds = float(os.environ.get("CHECK_SECONDS", "20"))
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(8):
            a = (a @ b).clamp_(-1, 1)
        torch.cuda.synchronize()
        n += 8
    dt = time.monotonic() - t0
    out(check="torch-loop", ok=True, iterations=n, seconds=dt, rate=n / dt)


def torch_launch():
    """A launch-bound loop of tiny kernels: microseconds per launch."""
    torch = torch_or_exit()
    x = torch.zeros(16, device="cuda")
    for _ in range(1000):
        x.add_(1)
    torch.cuda.synchronize()
    n = 50_000
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()
    us = (time.perf_counter() - t0) / n * 1e6
    out(check="torch-launch", ok=True, us_per_launch=us)


CHECKS = {
    "driver-view": driver_view,
    "nvml-view": nvml_view,
    "torch-oom": torch_oom,
    "torch-loop": torch_loop,
    "torch-launch": torch_launch,
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in CHECKS:
        print(f"usage: {sys.argv[0]} {{{'|'.join(CHECKS)}}}", file=sys.stderr)
        sys.exit(2)
    try:
        CHECKS[sys.argv[1]]()
    except AssertionError as e:
        out(check=sys.argv[1], ok=False, reason=f"assertion: {e}")
