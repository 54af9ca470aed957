"""PyTorch (the CUDA build from PyPI) on the simulated node: prints one table row per check,
`check | result | detail`, and a last line `torch_check: N passed, M failed`.

What the simulator guarantees, and so all that is checked: CUDA is available and reports
the node's devices; copies move real bytes (a host-device round trip is exact); kernels
launch and synchronise (their results are not checked: kernels do not compute on the
simulator); the caching allocator's books (allocated, reserved, cached after free, released
by empty_cache); mem_get_info; and the memory limit as PyTorch's own OutOfMemoryError.

Usage: torch_check.py [--expect-total BYTES]
  --expect-total  the total memory the device should report (the limit under the shim)
The allocator backend comes from PYTORCH_CUDA_ALLOC_CONF, as PyTorch reads it.
"""

import os
import sys
import time

from torch_common import GI, MI, finish, step


def main():
    expect_total = None
    if "--expect-total" in sys.argv:
        expect_total = int(sys.argv[sys.argv.index("--expect-total") + 1])

    t0 = time.monotonic()
    import torch

    backend = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "native")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), allocator: {backend}")
    print(f"{'check':<28} | {'':<4} | detail")
    print(f"{'-' * 28}-+-{'-' * 4}-+-{'-' * 40}")

    step("import", lambda: (True, f"{time.monotonic() - t0:.1f} s"))
    step("cuda.is_available", lambda: (torch.cuda.is_available(), torch.cuda.is_available()))
    step(
        "device",
        lambda: (
            torch.cuda.device_count() >= 1,
            f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}, "
            f"cc {'.'.join(map(str, torch.cuda.get_device_capability(0)))}",
        ),
    )

    def roundtrip():
        host = torch.arange(1 << 20, dtype=torch.int32)
        dev = host.to("cuda")
        back = dev.cpu()
        return bool(torch.equal(host, back)), f"{host.numel() * 4 // MI} MiB host->device->host"

    step("copy round trip", roundtrip)

    def d2d():
        host = torch.arange(1 << 16, dtype=torch.float32)
        a = host.cuda()
        b = torch.empty_like(a)
        b.copy_(a)
        return bool(torch.equal(b.cpu(), host)), "device->device copy"

    step("device copy", d2d)

    def kernels():
        a = torch.ones(1 << 20, device="cuda")
        b = a * 2 + 1
        c = b.sum()
        torch.cuda.synchronize()
        return True, f"elementwise and reduction launched, synchronised (value {c.item():g} not checked)"

    step("kernels launch", kernels)

    def allocator():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        x = torch.empty(64 * MI, dtype=torch.uint8, device="cuda")
        allocated = torch.cuda.memory_allocated() - base
        reserved = torch.cuda.memory_reserved()
        del x
        after_free = torch.cuda.memory_allocated() - base
        cached = torch.cuda.memory_reserved()
        torch.cuda.empty_cache()
        released = torch.cuda.memory_reserved()
        ok = allocated >= 64 * MI and after_free == 0 and reserved >= 64 * MI
        if backend == "native":
            # The native caching allocator keeps the block until empty_cache.
            ok = ok and cached >= 64 * MI and released < cached
        detail = (
            f"alloc {allocated // MI} MiB, reserved {reserved // MI} MiB, "
            f"after free {after_free} B allocated / {cached // MI} MiB reserved, "
            f"after empty_cache {released // MI} MiB"
        )
        return ok, detail

    step("caching allocator", allocator)

    def mem_info():
        free, total = torch.cuda.mem_get_info()
        ok = 0 < free <= total and (expect_total is None or total == expect_total)
        return ok, f"free {free // MI} MiB of {total // MI} MiB"

    step("mem_get_info", mem_info)

    def oom():
        free, total = torch.cuda.mem_get_info()
        try:
            x = torch.empty(total + GI, dtype=torch.uint8, device="cuda")
            del x
            return False, "allocating more than the device has succeeded"
        except torch.cuda.OutOfMemoryError as e:
            first = str(e).split(".")[0]
            return True, f"torch.cuda.OutOfMemoryError past {total // MI} MiB: {first}"

    step("OutOfMemoryError", oom)

    def fits_after_oom():
        x = torch.empty(128 * MI, dtype=torch.uint8, device="cuda")
        x.fill_(0)
        del x
        return True, "128 MiB still allocates after the error"

    step("usable after OOM", fits_after_oom)

    return finish("torch_check")


if __name__ == "__main__":
    sys.exit(main())
