"""Several processes of one job on the simulated node (PyTorch's CUDA build): a parent shares a
CUDA tensor with three workers through torch.multiprocessing (CUDA IPC); two of them, rank 0
and rank 1, exchange tensors of their own by IPC the way tensor-parallel workers do; the
third is killed with SIGKILL while it holds memory and the parent's tensor. Four processes,
one allocation under the shim. Prints one table row per check and a last line
`mp_check: N passed, M failed`.

Checks:
- bytes: each worker reads the parent's tensor, and each rank its peer's, byte for byte
  (copies move real bytes on the simulator; kernels would not);
- charged once: what the device charges (total - free: the allocation's view under the
  shim, the device's bare) is the sum over the four processes of
  torch.cuda.memory_reserved() plus one context each, within SLACK: an IPC tensor is charged
  to its exporter only, and a shim that stopped charging, or charged an import again, fails;
- the limit holds for the sum: rank 0 asking for what the job has left plus 64 MiB gets
  torch.cuda.OutOfMemoryError;
- a killed worker's memory comes back: after the SIGKILL, its memory and context can be
  allocated again (polled with a deadline);
- nobody hangs: the ranks finish their exchange after the kill and every process exits
  within a deadline, the parent included (it frees the tensor the killed worker held).

Usage: mp_check.py [--expect-total BYTES] [--context BYTES]
"""

import os
import signal
import sys
import time
import traceback

from torch_common import MI, arg, context_arg, finish, row

SHARED = 256 * MI
RANK_TENSOR = 64 * MI
VICTIM = 512 * MI
# The allocator's rounding and small allocations of the CUDA runtime per process.
SLACK = 16 * MI
DEADLINE = 120.0


def pattern(torch, n, seed):
    return (torch.arange(n, dtype=torch.int64) * 7 + seed).to(torch.uint8)


def worker(role, inbox, outbox, peer_out, peer_in):
    """rank0, rank1 or victim. Reports ('ready', role, pid, reserved, bytes_ok) on outbox,
    then obeys the parent: 'exchange' (ranks: send a tensor to the peer, check the peer's,
    hold both), 'oom' (rank 0: try past the limit), 'release' (drop what the exchange
    holds), 'done' (exit)."""
    import torch

    try:
        dev = torch.device("cuda")
        shared = inbox.get(timeout=DEADLINE)
        head = pattern(torch, MI, 1)
        ok = bool(torch.equal(shared[:MI].cpu(), head))
        mine = None
        if role == "victim":
            mine = torch.empty(VICTIM, dtype=torch.uint8, device=dev)
            mine[:MI].copy_(head)
        torch.cuda.synchronize()
        outbox.put(("ready", role, os.getpid(), torch.cuda.memory_reserved(), ok))
        held = []
        while True:
            # The victim waits to be killed (a daemon: it dies with the parent in any case).
            cmd = inbox.get() if role == "victim" else inbox.get(timeout=DEADLINE)
            if cmd == "done":
                break
            if cmd == "oom":
                free, total = torch.cuda.mem_get_info()
                free += torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
                try:
                    x = torch.empty(free + 64 * MI, dtype=torch.uint8, device=dev)
                    del x
                    outbox.put(("oom", False, f"{(free + 64 * MI) // MI} MiB succeeded"))
                except torch.cuda.OutOfMemoryError as e:
                    outbox.put(("oom", True, f"{(free + 64 * MI) // MI} MiB with {free // MI} MiB left: {str(e).split('.')[0]}"))
            if cmd == "exchange":
                seed = 10 if role == "rank0" else 20
                t = torch.empty(RANK_TENSOR, dtype=torch.uint8, device=dev)
                t.copy_(pattern(torch, RANK_TENSOR, seed).to(dev))
                torch.cuda.synchronize()
                peer_out.put(t)
                got = peer_in.get(timeout=DEADLINE)
                peer_seed = 20 if role == "rank0" else 10
                good = bool(torch.equal(got.cpu(), pattern(torch, RANK_TENSOR, peer_seed)))
                torch.cuda.synchronize()
                outbox.put(("exchanged", role, good, torch.cuda.memory_reserved()))
                # Both are held until the parent has measured ('release').
                held += [got, t]
                del got, t
            if cmd == "release":
                held.clear()
                torch.cuda.synchronize()
                outbox.put(("released", role))
        del shared
    except Exception as e:  # report, never hang the parent
        outbox.put(("error", role, f"{type(e).__name__}: {e}"))
        traceback.print_exc()


def main():
    expect_total = arg("--expect-total")
    context = context_arg()

    import torch
    import torch.multiprocessing as mp

    backend = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "native")
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), allocator: {backend}")
    print(f"{'check':<28} | {'':<4} | detail")
    print(f"{'-' * 28}-+-{'-' * 4}-+-{'-' * 40}")
    ctx = mp.get_context("spawn")
    dev = torch.device("cuda")

    def charged():
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return total - free, total

    shared = torch.empty(SHARED, dtype=torch.uint8, device=dev)
    shared[:MI].copy_(pattern(torch, MI, 1).to(dev))
    torch.cuda.synchronize()

    inboxes = {r: ctx.Queue() for r in ("rank0", "rank1", "victim")}
    outbox = ctx.Queue()
    a_to_b, b_to_a = ctx.Queue(), ctx.Queue()
    peers = {"rank0": (a_to_b, b_to_a), "rank1": (b_to_a, a_to_b), "victim": (None, None)}
    procs = {}
    for r in inboxes:
        p = ctx.Process(target=worker, args=(r, inboxes[r], outbox, *peers[r]), daemon=True)
        p.start()
        procs[r] = p
        inboxes[r].put(shared)

    def expect(kind, n):
        got = []
        end = time.monotonic() + DEADLINE
        while len(got) < n:
            msg = outbox.get(timeout=max(0.1, end - time.monotonic()))
            if msg[0] == "error":
                raise RuntimeError(f"{msg[1]}: {msg[2]}")
            if msg[0] == kind:
                got.append(msg)
        return got

    state = {}
    try:
        ready = {m[1]: m for m in expect("ready", 3)}
        state["ready"] = ready
        row(
            "parent's tensor in workers",
            all(m[4] for m in ready.values()),
            f"{SHARED // MI} MiB shared with 3 workers by torch.multiprocessing; first MiB byte-exact in "
            + ", ".join(f"{r} {'yes' if m[4] else 'NO'}" for r, m in sorted(ready.items())),
        )
        for r in ("rank0", "rank1"):
            inboxes[r].put("exchange")
        ex = {m[1]: m for m in expect("exchanged", 2)}
        row(
            "ranks exchange by IPC",
            all(m[2] for m in ex.values()),
            f"{RANK_TENSOR // MI} MiB each way, byte-exact: "
            + ", ".join(f"{r} {'yes' if m[2] else 'NO'}" for r, m in sorted(ex.items())),
        )
        used, total = charged()
        reserved = torch.cuda.memory_reserved() + ex["rank0"][3] + ex["rank1"][3] + ready["victim"][3]
        books = reserved + 4 * context
        extra = used - books
        ok = 0 <= extra <= SLACK
        if expect_total is not None and total != expect_total:
            ok = False
        row(
            "charged once",
            ok,
            f"charged {used / MI:.1f} MiB of {total // MI} = reserved of 4 processes {reserved / MI:.1f} "
            f"+ 4 contexts {4 * context // MI} MiB {extra / MI:+.1f} MiB (bound 0..{SLACK // MI} MiB)",
        )
        inboxes["rank0"].put("oom")
        m = expect("oom", 1)[0]
        row("limit holds for the sum", m[1], m[2])

        victim_pid = ready["victim"][2]
        before, _ = charged()
        # What was free while the victim lived: once its memory is back, that much more than
        # this fits. (Read after the kill, free already counts what came back, and asking for
        # it plus the victim's share again could never fit.)
        torch.cuda.empty_cache()
        free_before, _ = torch.cuda.mem_get_info()
        os.kill(victim_pid, signal.SIGKILL)
        procs["victim"].join(DEADLINE)
        want = VICTIM + context
        t0 = time.monotonic()
        back = False
        while time.monotonic() - t0 < DEADLINE:
            try:
                x = torch.empty(free_before + want - SLACK, dtype=torch.uint8, device=dev)
                del x
                torch.cuda.empty_cache()
                back = True
                break
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                time.sleep(0.2)
        after, _ = charged()
        row(
            "killed worker's memory back",
            back and before - after >= want - SLACK,
            f"SIGKILL of a worker holding {VICTIM // MI} MiB + its context: charged {before / MI:.0f} -> "
            f"{after / MI:.0f} MiB, allocatable again after {time.monotonic() - t0:.1f} s",
        )

        for r in ("rank0", "rank1"):
            inboxes[r].put("release")
        expect("released", 2)
        for r in ("rank0", "rank1"):
            inboxes[r].put("done")
        t0 = time.monotonic()
        for r in ("rank0", "rank1"):
            procs[r].join(DEADLINE)
        alive = [r for r, p in procs.items() if p.is_alive()]
        del shared
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        row(
            "nobody hangs",
            not alive,
            f"ranks exited {time.monotonic() - t0:.1f} s after 'done'; parent freed the tensor the killed worker held"
            + (f"; still alive: {alive}" if alive else ""),
        )
    except Exception as e:  # noqa: BLE001
        row("multi-process run", False, f"{type(e).__name__}: {str(e)[:200]}")
        traceback.print_exc()
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()

    return finish("mp_check")


if __name__ == "__main__":
    sys.exit(main())
