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


# --- processes together: burst, race, accounting, start-up -------------------

MIB = 1 << 20
PAGE = 2 * MIB
OOM = 2


def context(lib):
    """cuInit and the primary context of device 0 made current: (0, ctx) or
    (error, None) when the context was refused (out of memory inside a full
    allocation is an honest answer, not a failure)."""
    r = call(lib, "cuInit", 0)
    if r != 0:
        return r, None
    dev = ctypes.c_int()
    r = call(lib, "cuDeviceGet", ctypes.byref(dev), 0)
    if r != 0:
        return r, None
    ctx = ctypes.c_void_p()
    r = call(lib, "cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    if r != 0:
        return r, None
    return call(lib, "cuCtxSetCurrent", ctx), ctx


def alloc(lib, size):
    p = ctypes.c_uint64()
    r = call(lib, "cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(size))
    return r, p.value


def barrier(name):
    """Waits until CHECK_RACERS processes have reached barrier `name` in the
    directory CHECK_BARRIER (when set): every process has its context before
    any exits. The rolling variants (CHECK_INDEX set, no barrier) judge the
    other window, processes exiting while others still allocate (the driver
    frees an exited process's memory after the process is gone; the manager
    returns its quota only once NVML no longer lists it: docs/security.md,
    "The exit window")."""
    bar, n = os.environ.get("CHECK_BARRIER"), int(os.environ.get("CHECK_RACERS", "0"))
    if not bar:
        return
    open(os.path.join(bar, f"{name}.{os.getpid()}"), "w").close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if sum(f.startswith(name + ".") for f in os.listdir(bar)) >= n:
            return
        time.sleep(0.01)


def ctx_hold():
    """One process of the burst (as ctx.py on the H200): context, 64 MiB,
    held until every process of the burst has its own (or was refused),
    then CHECK_HOLD seconds more; report. A context or allocation refused
    with out-of-memory is reported as refused (the allocation is full)."""
    lib = cuda()
    r, _ = context(lib)
    if r == 0:
        r, p = alloc(lib, 64 * MIB)
    barrier("held")
    time.sleep(float(os.environ.get("CHECK_HOLD", "4")))
    # Exits holding its context and its 64 MiB: the driver frees them as the
    # process goes, while the rolling burst's later processes still start.
    out(check="ctx-hold", ok=r in (0, OOM), refused=r if r else None, pid=os.getpid())


def race():
    """One racer: random cuMemAlloc_v2 of 1 B..64 MiB and frees for
    CHECK_SECONDS; out-of-memory is expected, any other error is not. With
    CHECK_INDEX=i (of CHECK_RACERS=n) it runs i/n of that and exits holding
    what it has, without waiting for the others: racers leave one by one
    while the rest still allocate."""
    import random  # noqa: PLC0415
    lib = cuda()
    index = os.environ.get("CHECK_INDEX")
    r, _ = context(lib)
    if r != 0:
        # Refused its context (the others filled the allocation first): it
        # still reaches the barrier the others wait at before they exit.
        if not index:
            barrier("done")
        out(check="race", ok=r == OOM, refused=r)
        return
    rng = random.Random(os.getpid())
    seconds = float(os.environ.get("CHECK_SECONDS", "4"))
    if index:
        seconds *= int(index) / int(os.environ.get("CHECK_RACERS", "16"))
    end = time.monotonic() + seconds
    live, allocs, refused, other = [], 0, 0, None
    while time.monotonic() < end:
        if not live or rng.random() < 0.6:
            r, p = alloc(lib, rng.randint(1, 64 * MIB))
            if r == 0:
                live.append(p)
                allocs += 1
            elif r == OOM:
                refused += 1
            else:
                other = r
                break
        else:
            call(lib, "cuMemFree_v2", ctypes.c_uint64(live.pop(rng.randrange(len(live)))))
    if not index:
        for p in live:
            call(lib, "cuMemFree_v2", ctypes.c_uint64(p))
        barrier("done")
    out(check="race", ok=other is None, allocs=allocs, refused=refused, error=other,
        held=len(live) if index else 0)


class ProcInfo(ctypes.Structure):
    # nvmlProcessInfo_t (v2 layout), what nvmlDeviceGetComputeRunningProcesses_v3 fills.
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class MemInfo(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def nvml_device():
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    assert lib.nvmlInit_v2() == 0, "nvmlInit_v2 failed"
    h = ctypes.c_void_p()
    assert lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
    return lib, h


def nvml_pid_memory(lib, h, pid):
    n = ctypes.c_uint(256)
    procs = (ProcInfo * 256)()
    if lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(n), procs) != 0:
        return None
    return sum(procs[i].usedGpuMemory for i in range(n.value) if procs[i].pid == pid)


def nvml_pid():
    """Unshimmed: what NVML shows process argv[2] holding on device 0."""
    lib, h = nvml_device()
    print(json.dumps({"used": nvml_pid_memory(lib, h, int(sys.argv[2]))}), flush=True)


def nvml_sampler():
    """Unshimmed: device 0's memory in use every 5 ms until the file
    argv[2] exists; the growth is the largest figure less the first."""
    lib, h = nvml_device()
    m = MemInfo()
    first, peak, samples = None, 0, 0
    print("ready", flush=True)
    while not os.path.exists(sys.argv[2]):
        if lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0:
            first = m.used if first is None else first
            peak = max(peak, m.used)
            samples += 1
        time.sleep(0.005)
    out(check="nvml-sampler", ok=samples > 0, baseline=first, peak=peak,
        growth=peak - (first or 0), samples=samples)


def nvml_settle():
    """Unshimmed: waits (up to argv[2] seconds) until device 0's memory in use
    is back to argv[3] bytes or less: the driver has torn down what the
    processes of the checks before held when they exited. Prints the figure."""
    lib, h = nvml_device()
    m = MemInfo()
    deadline = time.monotonic() + float(sys.argv[2])
    while lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m)) == 0 and m.used > int(sys.argv[3]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    out(check="nvml-settle", ok=m.used <= int(sys.argv[3]), used=m.used)


def bare_env():
    """This environment without the shim and outside any allocation (the
    simulated node's own variables kept)."""
    return {k: v for k, v in os.environ.items()
            if (k != "LD_PRELOAD" and not k.startswith("TESSERA_")) or k.startswith("TESSERA_SIM")}


def accounting():
    """40 cuMemAlloc_v2 of random sizes (1 B..64 MiB): what the shim charged
    for them (cuMemGetInfo inside the allocation) against what NVML shows
    the process holding for them (read by a child without the shim), equal
    within one 2 MiB page."""
    import random  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    lib = cuda()
    r, _ = context(lib)
    assert r == 0, f"context refused: {r}"

    def charged():
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        assert call(lib, "cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total)) == 0
        return total.value - free.value

    def nvml():
        o = subprocess.run([sys.executable, __file__, "nvml-pid", str(os.getpid())],
                           env=bare_env(), capture_output=True, text=True, check=True)
        return json.loads(o.stdout.strip().splitlines()[-1])["used"]

    c0, n0 = charged(), nvml()
    rng = random.Random(int(os.environ.get("CHECK_SEED", "1")))
    asked, held = 0, []
    for _ in range(40):
        size = rng.randint(1, 64 * MIB)
        r, p = alloc(lib, size)
        assert r == 0, f"cuMemAlloc_v2({size}) = {r}"
        asked += size
        held.append(p)
    c1, n1 = charged(), nvml()
    for p in held:
        call(lib, "cuMemFree_v2", ctypes.c_uint64(p))
    dc, dn = c1 - c0, n1 - n0
    out(check="accounting", ok=abs(dc - dn) <= PAGE, asked=asked, charged=dc, nvml=dn)


def startup_client():
    """A CUDA client's start: init, context, memory info, NVML."""
    lib = cuda()
    r, _ = context(lib)
    assert r == 0, f"context: {r}"
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert call(lib, "cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total)) == 0
    nvml_device()
    out(check="startup-client", ok=True)


def startup():
    """Start-up with `tessera run` against bare, in pairs (run after run,
    alternating first), medians of each: run outside any allocation."""
    import statistics  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    tessera = os.environ["TESSERA"]
    pairs = int(os.environ.get("CHECK_PAIRS", "9"))
    client = [sys.executable, __file__, "startup-client"]
    ran = [tessera, "run", "--gpu", "0", "--memory", "1Gi", "--"] + client

    def timed(cmd, env):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, env=env, capture_output=True)
        return (time.perf_counter() - t0) * 1e3, r.returncode, r.stderr.decode(errors="replace")

    # A bare client has a context outside any allocation: the manager's
    # backstop may stop it (SIGKILL) if a pass samples it; that pair is
    # measured again, and the count reported.
    bare, under, stopped, i = [], [], 0, 0
    while len(bare) < pairs and i < 3 * pairs:
        order = (0, 1) if i % 2 == 0 else (1, 0)
        got = {}
        for which in order:
            got[which] = timed(client, bare_env()) if which == 0 else timed(ran, os.environ.copy())
        i += 1
        if got[0][1] != 0 or got[1][1] != 0:
            stopped += got[0][1] != 0
            assert got[1][1] == 0, \
                f"the client under tessera run failed: {got[1][1]}: {got[1][2][-300:]!r}"
            continue
        bare.append(got[0][0])
        under.append(got[1][0])
    assert bare, "no pair completed"
    diffs = [u - b for u, b in zip(under, bare)]
    out(check="startup", ok=True, bare_ms=statistics.median(bare),
        run_ms=statistics.median(under), added_ms=statistics.median(diffs), pairs=len(bare),
        bare_stopped=stopped)


def cupy_fill():
    """CuPy limited to the allocation: its memory info shows the limit and
    filling it ends in cupy's OutOfMemoryError, no more than the limit
    handed out."""
    try:
        import cupy  # noqa: PLC0415
        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        out(check="cupy-fill", ok=None, reason=f"not run: no CuPy with CUDA ({type(e).__name__})")
        sys.exit(NOT_RUN)
    cupy.cuda.set_allocator(None)
    free, total = cupy.cuda.runtime.memGetInfo()
    limit = limit_bytes()
    blocks, err = [], None
    try:
        while len(blocks) < 4 * (limit >> 26) + 64:
            blocks.append(cupy.empty(64 << 20, dtype=cupy.uint8))
    except cupy.cuda.memory.OutOfMemoryError as e:
        err = type(e).__name__
    got = len(blocks) << 26
    del blocks
    out(check="cupy-fill", ok=total == limit and err == "OutOfMemoryError" and got <= limit,
        total=total, allocated_before_error=got, error=err)


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


def torch_loop_sync():
    """The loop of a training step that reads its loss every step (`.item()`,
    a synchronisation each step): iterations per second."""
    torch = torch_or_exit()
    seconds = float(os.environ.get("CHECK_SECONDS", "20"))
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        a = (a @ b).clamp_(-1, 1)
        a.sum().item()
        n += 1
    dt = time.monotonic() - t0
    out(check="torch-loop-sync", ok=True, iterations=n, seconds=dt, rate=n / dt)


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
    "torch-loop-sync": torch_loop_sync,
    "ctx-hold": ctx_hold,
    "race": race,
    "nvml-pid": nvml_pid,
    "nvml-sampler": nvml_sampler,
    "nvml-settle": nvml_settle,
    "accounting": accounting,
    "startup-client": startup_client,
    "startup": startup,
    "cupy-fill": cupy_fill,
}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in CHECKS:
        print(f"usage: {sys.argv[0]} {{{'|'.join(CHECKS)}}}", file=sys.stderr)
        sys.exit(2)
    try:
        CHECKS[sys.argv[1]]()
    except AssertionError as e:
        out(check=sys.argv[1], ok=False, reason=f"assertion: {e}")
