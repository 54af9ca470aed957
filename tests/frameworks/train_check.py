"""A training step on the simulated node (PyTorch's CUDA build): a small convolutional
network and an MLP, a few AdamW steps under autocast (float16, with a GradScaler),
torch.compile off. Prints one table row per check, `check | result | detail`, and a last
line `train_check: N passed, M failed`.

The forward and backward passes go through cuDNN (convolutions) and cuBLAS/cuBLASLt (the
linear layers, in float16 and float32), whose kernels launch but do not compute on the
simulator: losses and weights are not checked, only that every library call succeeds and
what the memory does.

Checks:
- the conv net and the MLP each take their steps (cuDNN, cuBLAS and cuBLASLt calls succeed);
- memory: what the device charges this process (total - free from mem_get_info, which under
  the shim is the allocation's view) is torch.cuda.memory_reserved(), plus the context, plus
  64 MiB for each cuBLAS handle (cuBLAS 13 allocates that much with cuMemAlloc when a handle
  first runs a GEMM, outside PyTorch's allocator; PyTorch makes one handle per thread that
  runs GEMMs: here the main thread and the autograd thread), plus at most SLACK (small
  allocations of the libraries, module globals, each held as a whole 2 MiB page by the
  driver and so charged by the shim); a shim that stopped charging fails this
  under `--expect-total`, where free + used no longer adds up to the limit;
- out of memory: a batch sized to fill about 1.5 times what mem_get_info says is free raises
  torch.cuda.OutOfMemoryError inside the step; the loop then halves the batch until a step
  succeeds, and the memory comes back afterwards.

Usage: train_check.py [--expect-total BYTES] [--context BYTES]
  --expect-total  the total the device should report (the limit under the shim)
  --context       device memory a context holds on this node (default: measured by a bare
                  child process, tests/frameworks/context_size.py)
The allocator backend comes from PYTORCH_CUDA_ALLOC_CONF, as PyTorch reads it.
"""

import os
import sys
import time

from torch_common import MI, arg, context_arg, finish, step

# cuBLAS 13.4's own allocation per handle (cuMemAlloc_v2 of 64 MiB from libcublas, seen
# under gdb), and the handles a training step makes: PyTorch keeps one per thread, and the
# forward pass (main thread) and the backward pass (autograd thread) each run GEMMs.
CUBLAS_HANDLE = 64 * MI
HANDLES = 2
# What else the libraries allocate beside PyTorch's caching allocator (module globals and
# small buffers): under 1 MiB of bytes with torch 2.15 / cuBLAS 13.4 / cuDNN 9.26, in 8
# allocations, each of which the driver holds as a whole 2 MiB page (an H200 held every
# cuMemAlloc at its size rounded up to 2 MiB; the simulated driver does the same): 16 MiB
# measured, bounded at 10 pages so that a library version with a buffer or two more passes.
PAGE = 2 * MI
SLACK = 10 * PAGE


def main():
    expect_total = arg("--expect-total")
    context = context_arg()

    import torch
    from torch import nn

    backend = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "native")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}), allocator: {backend}")
    print(f"{'check':<28} | {'':<4} | detail")
    print(f"{'-' * 28}-+-{'-' * 4}-+-{'-' * 40}")

    dev = torch.device("cuda")
    torch.backends.cudnn.enabled = True

    def conv_net():
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(32, 10),
        ).to(dev)

    def mlp():
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(3 * 32 * 32, 256),
            nn.ReLU(),
            nn.Linear(256, 128),
            nn.ReLU(),
            nn.Linear(128, 10),
        ).to(dev)

    def train(model, batch, steps):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cuda")
        for _ in range(steps):
            x = torch.randn(batch, 3, 32, 32, device=dev)
            y = torch.randint(0, 10, (batch,), device=dev)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            del x, y, loss
        torch.cuda.synchronize()
        return opt

    def charged():
        free, total = torch.cuda.mem_get_info()
        return total - free

    def memory_matches(what):
        torch.cuda.synchronize()
        used = charged()
        books = torch.cuda.memory_reserved() + context + HANDLES * CUBLAS_HANDLE
        extra = used - books
        ok = 0 <= extra <= SLACK
        return ok, (
            f"{what}: charged {used / MI:.1f} MiB = reserved {torch.cuda.memory_reserved() / MI:.1f} MiB "
            f"+ context {context // MI} + cuBLAS {HANDLES} x {CUBLAS_HANDLE // MI} MiB "
            f"{extra / MI:+.1f} MiB (bound 0..{SLACK // MI} MiB)"
        )

    models = {}

    def run(name, make):
        def go():
            t0 = time.monotonic()
            model = make()
            opt = train(model, 64, 3)
            models[name] = (model, opt)
            n = sum(p.numel() for p in model.parameters())
            return True, f"3 AdamW steps, batch 64, autocast fp16, {n} parameters, {time.monotonic() - t0:.1f} s"

        step(name, go)

    run("conv net steps (cuDNN)", conv_net)
    run("MLP steps (cuBLAS)", mlp)
    step("memory after training", lambda: memory_matches("after the steps"))

    def oom_then_smaller():
        model, _ = models.get("conv net steps (cuDNN)") or (conv_net(), None)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        if expect_total is not None and total != expect_total:
            return False, f"the device reports {total // MI} MiB, not {expect_total // MI} MiB"
        # Input (float32) plus the first convolution's float16 output and its float32 copy
        # for the batch norm: about 12 + 32 + 64 KiB a sample; aim at 1.5 x what is free.
        per_sample = (3 * 4 + 16 * 2 + 16 * 4) * 32 * 32
        batch = int(free * 1.5 / per_sample)
        tries = []
        raised = None
        while batch >= 1:
            try:
                train(model, batch, 1)
                tries.append(f"{batch} ok")
                break
            except torch.cuda.OutOfMemoryError as e:
                raised = raised or str(e).split(".")[0]
                tries.append(f"{batch} OOM")
                torch.cuda.empty_cache()
                batch //= 2
        ok = raised is not None and tries[-1].endswith("ok") and len(tries) >= 2
        return ok, f"batches {', '.join(tries)} (of {free // MI} MiB free): {raised}"

    step("OOM, then a smaller batch", oom_then_smaller)

    def comes_back():
        torch.cuda.empty_cache()
        return memory_matches("after empty_cache")

    step("memory comes back", comes_back)

    return finish("train_check")


if __name__ == "__main__":
    sys.exit(main())
