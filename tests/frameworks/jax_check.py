"""JAX (its CUDA 13 plugin from PyPI) on the simulated node, bare and under the shim. Prints
one table row per check, `check | result | detail`, and a last line
`jax_check: N passed, M failed`.

XLA's kernels launch but do not compute on the simulator, so values computed on the device
are not checked; copies are real, so data that only moves is checked byte for byte.

Checks:
- the GPUs JAX sees: `--expect-devices` of them (one under `tessera run --gpu 0`);
- a copy round trip: host -> device -> host, byte-exact;
- a jitted matmul: compiles for the GPU, launches, synchronises, and gives a device array of
  the right shape and type that copies back to the host;
- preallocation (the default allocator, XLA's BFC arena): XLA takes its default fraction
  (0.75) of the memory the device reports when the backend starts; under the shim that is the
  allocation's limit (`--expect-total`), never the card. The device's own count (total - free
  from cuMemGetInfo in XLA's primary context) must show the arena taken (with the context
  (measured, `--context`) and the libraries' own allocations, at most SLACK more) and never more than the total; a
  shim that stopped charging reports the card and fails;
- an oversized array: past what is left, XLA raises its RESOURCE_EXHAUSTED error (a Python
  exception, not a crash), and a small array still allocates after it. With
  `XLA_PYTHON_CLIENT_ALLOCATOR=platform` (no arena) every array is a cuMemAlloc, so past
  the limit it is the shim (or the card) that refuses: the check then asks for the limit
  plus 256 MiB, which a card of 16 GiB would grant if the shim did not enforce it.

Usage: jax_check.py [--expect-devices N] [--expect-total BYTES] [--context BYTES] [--simulated]
  --context BYTES  what one context holds on this node (default: measured by a bare child
               process, tests/frameworks/context_size.py)
  --simulated  the node is the simulated one: JAX starts its CUDA backend only when a GPU's
               device file exists (/dev/nvidia0, /dev/nvidiactl), which a real node (and a
               pod given a GPU) has and the simulated node has not, so the check replaces
               that test (jax._src.hardware_utils.has_visible_nvidia_gpu) by True. Nothing
               else is bypassed: the CUDA plugin's version checks run against the simulated
               driver.
"""

import ctypes
import os
import sys
import time

# The row/step/arg/finish helpers of the framework checks (nothing there imports torch).
from torch_common import MI, arg, context_arg, finish, step

# XLA's default share of the device for its arena (XLA_PYTHON_CLIENT_MEM_FRACTION).
DEFAULT_FRACTION = 0.75
# What the device may charge on top of the arena besides the context (measured, see
# context_size.py): the libraries' own small allocations (cuBLAS's workspace, module globals).
SLACK = 512 * MI


def driver_mem_info(device_ordinal):
    """(free, total) from the driver in the device's primary context, the one XLA uses
    (retaining it again adds nothing). Under the shim this is the allocation's view."""
    cuda = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    for name, rc in (
        ("cuInit", cuda.cuInit(0)),
        ("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), device_ordinal)),
        ("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)),
        ("cuCtxPushCurrent", cuda.cuCtxPushCurrent_v2(ctx)),
    ):
        if rc != 0:
            raise RuntimeError(f"{name}: CUresult {rc}")
    try:
        rc = cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        if rc != 0:
            raise RuntimeError(f"cuMemGetInfo: CUresult {rc}")
    finally:
        popped = ctypes.c_void_p()
        cuda.cuCtxPopCurrent_v2(ctypes.byref(popped))
        cuda.cuDevicePrimaryCtxRelease_v2(dev)
    return free.value, total.value


def main():
    expect_devices = arg("--expect-devices")
    expect_total = arg("--expect-total")
    # Before JAX starts: measured bare, by a child, when the harness did not pass it.
    context = context_arg()
    allocator = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default")
    preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() not in ("false", "0")
    arena = allocator == "default" and preallocate

    t0 = time.monotonic()
    import jax
    import numpy as np

    if "--simulated" in sys.argv:
        # Before the first backend query, which is when JAX looks for the device files.
        from jax._src import hardware_utils

        hardware_utils.has_visible_nvidia_gpu = lambda: True

    print(f"jax {jax.__version__}, import {time.monotonic() - t0:.1f} s, allocator: {allocator}")
    print(f"{'check':<28} | {'':<4} | detail")
    print(f"{'-' * 28}-+-{'-' * 4}-+-{'-' * 40}")
    state = {}

    def devices():
        gpus = jax.devices("gpu")
        state["dev"] = gpus[0]
        kinds = sorted({d.device_kind for d in gpus})
        ok = expect_devices is None or len(gpus) == expect_devices
        return ok, f"{len(gpus)} x {', '.join(kinds)} ({jax.default_backend()} backend)"

    step("GPUs visible", devices)
    if "dev" not in state:
        return finish("jax_check")
    dev = state["dev"]

    def round_trip():
        host = np.arange(1 << 20, dtype=np.uint32)
        back = np.asarray(jax.device_put(host, dev))
        return bool(np.array_equal(host, back)), "4 MiB host->device->host, byte-exact"

    step("copy round trip", round_trip)

    def matmul():
        f = jax.jit(lambda a, b: a @ b)
        a = jax.device_put(np.ones((256, 512), np.float32), dev)
        b = jax.device_put(np.ones((512, 128), np.float32), dev)
        y = f(a, b)
        y.block_until_ready()
        host = np.asarray(y)
        on_gpu = y.devices() == {dev}
        ok = host.shape == (256, 128) and host.dtype == np.float32 and on_gpu
        return ok, f"jit(a @ b) 256x512 @ 512x128 -> {host.shape} {host.dtype} on {dev}, launched and synchronised (values not checked)"

    step("jitted matmul", matmul)

    def preallocation():
        stats = dev.memory_stats() or {}
        limit = stats.get("bytes_limit")
        free, total = driver_mem_info(dev.local_hardware_id)
        charged = total - free
        state["total"] = total
        if expect_total is not None and total != expect_total:
            return False, f"the device reports {total // MI} MiB, not {expect_total // MI} MiB"
        if not arena:
            ok = limit is None or limit <= total
            return ok, f"no arena ({allocator}, preallocate {preallocate}); charged {charged / MI:.0f} of {total // MI} MiB"
        want = DEFAULT_FRACTION * total
        # XLA sizes the arena from the free memory when it is less than the fraction of the total.
        ok = (
            limit is not None
            and want - context - SLACK <= limit <= want
            and limit <= charged <= min(limit + context + SLACK, total)
        )
        return ok, (
            f"arena {limit / MI:.0f} MiB = {DEFAULT_FRACTION} x {total // MI} MiB reported "
            f"({want / MI:.0f}); charged {charged / MI:.0f} MiB (bound: the arena + context "
            f"{context // MI} MiB + {SLACK // MI} MiB)"
        )

    step("preallocation", preallocation)

    def oversized():
        if "total" not in state:
            return False, "no total"
        stats = dev.memory_stats() or {}
        if arena:
            ask = stats["bytes_limit"] - stats.get("bytes_in_use", 0) + 64 * MI
        else:
            ask = state["total"] + 256 * MI
        try:
            x = jax.device_put(np.zeros(ask // 4, np.float32), dev)
            x.block_until_ready()
            del x
            return False, f"{ask // MI} MiB allocated of {state['total'] // MI} MiB"
        except Exception as e:  # XLA's error type moved between releases: check its text
            msg, kind = str(e), type(e).__name__
            if "RESOURCE_EXHAUSTED" not in msg:
                raise
        small = jax.device_put(np.ones(1 << 20, np.float32), dev)
        ok = bool(np.array_equal(np.asarray(small), np.ones(1 << 20, np.float32)))
        first = msg.strip().splitlines()[0][:90]
        return ok, f"{ask // MI} MiB: {kind} ({first}); 4 MiB allocates after it"

    step("oversized array", oversized)
    return finish("jax_check")


if __name__ == "__main__":
    sys.exit(main())
