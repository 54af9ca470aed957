"""An inference server's memory pattern on the simulated node (PyTorch's CUDA build), the
way vLLM-style servers size their cache: read torch.cuda.mem_get_info(), let the process
use FRACTION (0.9) of the *total* it reports, reserve everything of that the process does
not use yet as one cache tensor in one go, then serve requests that allocate and free
around it for a fixed time. Prints one table row per check and a last line
`serve_check: N passed, M failed`.

Checks:
- the reservation: after it, what the device charges the process (total - free, the
  allocation's view under the shim) is FRACTION x total within SLACK, and the total is the
  limit (`--expect-total`), never the card's memory: a shim that stopped charging (or a
  server sized from the card) fails;
- serving: requests (a weight-times-activations product through cuBLAS, temporaries of 1 to
  32 MiB) for `--seconds`; the charged memory and torch.cuda.memory_reserved() after the
  warm-up never grow, and stay under the total;
- a request bigger than what is left raises torch.cuda.OutOfMemoryError, and the server
  goes on serving after it.

Usage: serve_check.py [--expect-total BYTES] [--seconds N]
"""

import os
import sys
import time

from torch_common import MI, arg, finish, step

FRACTION = 0.9
# What may come on top of the plan: the allocator's rounding of the cache tensor (2 MiB
# blocks) and cuBLAS's own allocation when the first request runs a GEMM (64 MiB, taken
# from the headroom, which is why it is made before the cache is sized).
SLACK = 8 * MI


def main():
    expect_total = arg("--expect-total")
    seconds = arg("--seconds", 15)

    import torch

    backend = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "native")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), allocator: {backend}")
    print(f"{'check':<28} | {'':<4} | detail")
    print(f"{'-' * 28}-+-{'-' * 4}-+-{'-' * 40}")
    dev = torch.device("cuda")
    state = {}

    def charged():
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return total - free

    def serve_one(size_mib):
        # One request: activations in, a product with the weights (cuBLAS), a result out.
        rows_ = size_mib * MI // (4 * 1024)
        x = torch.empty(rows_, 1024, device=dev)
        y = x @ state["weights"]
        out = y[:1].cpu()
        del x, y
        return out

    def reserve():
        # The model's weights, and one request to warm cuBLAS up, before the cache is sized
        # (as a server loads its model and profiles a forward pass first).
        state["weights"] = torch.empty(1024, 1024, device=dev)
        serve_one(1)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        if expect_total is not None and total != expect_total:
            return False, f"the device reports {total // MI} MiB, not {expect_total // MI} MiB"
        budget = int(FRACTION * total)
        used = total - free
        cache_bytes = budget - used
        state["cache"] = torch.empty(cache_bytes, dtype=torch.uint8, device=dev)
        after = charged()
        state["total"] = total
        ok = budget <= after <= budget + SLACK
        return ok, (
            f"{FRACTION} x {total // MI} MiB = {budget / MI:.0f} MiB; cache {cache_bytes / MI:.0f} MiB "
            f"in one tensor; charged now {after / MI:.1f} MiB"
        )

    step("reserve 0.9 of total", reserve)

    def serve():
        if "cache" not in state:
            return False, "no cache"
        sizes = [1, 4, 16, 32, 8, 2]
        n = 0
        # Warm-up: every request size once, so the allocator holds its blocks.
        for s in sizes:
            serve_one(s)
        base_charged = charged()
        base_reserved = torch.cuda.memory_reserved()
        peak_charged, peak_reserved = base_charged, base_reserved
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            serve_one(sizes[n % len(sizes)])
            n += 1
            if n % 50 == 0:
                peak_charged = max(peak_charged, charged())
                peak_reserved = max(peak_reserved, torch.cuda.memory_reserved())
        peak_charged = max(peak_charged, charged())
        peak_reserved = max(peak_reserved, torch.cuda.memory_reserved())
        ok = peak_charged == base_charged and peak_reserved == base_reserved and peak_charged <= state["total"]
        return ok, (
            f"{n} requests in {seconds} s; charged {base_charged / MI:.1f} -> peak {peak_charged / MI:.1f} MiB, "
            f"reserved {base_reserved / MI:.1f} -> peak {peak_reserved / MI:.1f} MiB"
        )

    step("serve without growth", serve)

    def too_big():
        if "cache" not in state:
            return False, "no cache"
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        # PyTorch gives back its cached free blocks and retries before it fails, so what a
        # request can get is the device's free memory plus those.
        free += torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        ask = free + 64 * MI
        try:
            x = torch.empty(ask, dtype=torch.uint8, device=dev)
            del x
            return False, f"a request of {ask // MI} MiB succeeded with {free // MI} MiB available"
        except torch.cuda.OutOfMemoryError as e:
            serve_one(4)
            return True, f"{ask // MI} MiB with {free // MI} MiB available: OutOfMemoryError ({str(e).split('.')[0]}); served on"

    step("oversized request", too_big)

    return finish("serve_check")


if __name__ == "__main__":
    sys.exit(main())
