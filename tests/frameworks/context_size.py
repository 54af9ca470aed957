"""What one CUDA context holds on this node: prints the bytes, one line.

Run bare (no shim, outside any allocation): it retains GPU ORDINAL's primary context (0 when
not given) and asks NVML what the driver now holds for this process on that GPU, matched by
UUID so the device order of CUDA and NVML need not agree. That is the figure the manager
measures at start-up and the shim settles every context to, so the checks that add up what a
job is charged (train_check, mp_check, jax_check) take it from here instead of assuming one:
the simulated node holds what it is set to hold (518 MiB by default, the H200's), a real
GPU whatever its driver takes, and the same checks hold on both.

The harnesses (tests/frameworks/run-torch.sh, run-jax.sh, tests/gpu/run.sh) run it once,
before they start the manager, and pass the figure as `--context`: under `tessera run` a
process without the shim is stopped by the manager's backstop, as it should be. Run with no
`--context`, a check calls `measure()` itself, which must then be bare too.

Usage: context_size.py [ORDINAL]
"""

import ctypes
import os
import subprocess
import sys


class ProcessInfo(ctypes.Structure):
    # nvmlProcessInfo_t, the record of nvmlDeviceGetComputeRunningProcesses_v3.
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


def _probe(ordinal):
    cuda = ctypes.CDLL("libcuda.so.1")
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    uuid = (ctypes.c_ubyte * 16)()
    for name, call in (
        ("cuInit", lambda: cuda.cuInit(0)),
        ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(dev), ordinal)),
        ("cuDeviceGetUuid", lambda: cuda.cuDeviceGetUuid(uuid, dev)),
        ("cuDevicePrimaryCtxRetain", lambda: cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)),
        ("nvmlInit_v2", lambda: nvml.nvmlInit_v2()),
    ):
        rc = call()
        if rc != 0:
            raise RuntimeError(f"{name}: error {rc}")
    h = bytes(uuid).hex()
    name = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}".encode()
    handle = ctypes.c_void_p()
    rc = nvml.nvmlDeviceGetHandleByUUID(name, ctypes.byref(handle))
    if rc != 0:
        raise RuntimeError(f"nvmlDeviceGetHandleByUUID({name.decode()}): error {rc}")
    infos = (ProcessInfo * 1024)()
    count = ctypes.c_uint(len(infos))
    rc = nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), infos)
    if rc != 0:
        raise RuntimeError(f"nvmlDeviceGetComputeRunningProcesses_v3: error {rc}")
    mine = [infos[i].usedGpuMemory for i in range(count.value) if infos[i].pid == os.getpid()]
    if not mine or mine[0] == 0:
        raise RuntimeError(f"NVML does not list this process ({os.getpid()}) on {name.decode()}")
    cuda.cuDevicePrimaryCtxRelease_v2(dev)
    return mine[0]


def measure(ordinal=0):
    """The context size, from a bare child process (the shim's LD_PRELOAD removed). A child,
    so the caller's own process never makes a context it did not ask for."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), str(ordinal)],
        env=env, capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"context_size.py failed: {out.stderr.strip()[-300:]}")
    return int(out.stdout.split()[0])


if __name__ == "__main__":
    try:
        print(_probe(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
    except Exception as e:  # one clear line, no traceback
        print(f"context_size: {e}", file=sys.stderr)
        sys.exit(1)
