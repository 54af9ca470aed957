#!/usr/bin/env bash
# JAX (the CUDA 13 plugin from PyPI) on the simulated node, bare and under the shim.
#
# 1. Installs jax[cuda13] into its own virtual environment under target/ (idempotent: a
#    later run reuses it; about 2 GB with NVIDIA's CUDA 13 wheels, see docs/simulator.md).
# 2. Builds the simulated libcuda/NVML, the shim and the tessera CLI (debug profile).
# 3. Runs tests/frameworks/jax_check.py on a fresh simulated node: bare, and under
#    `tessera run --gpu 0 --memory 1Gi` (a manager on the same node), each with XLA's
#    default allocator (its preallocated arena) and with XLA_PYTHON_CLIENT_ALLOCATOR=platform
#    (every array a cuMemAlloc). Each run prints its table; the script exits non-zero if any
#    check failed.
#
# Usage: tests/frameworks/run-jax.sh [--install-only]
# Environment: JAX_VENV (default target/jax-venv), PYTHON (default python3), JAX_SPEC
#              (pip requirement, default `jax[cuda13]==0.10.2`), CARGO_PROFILE_DIR (default
#              target/debug: where the built binaries are).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${JAX_VENV:-$root/target/jax-venv}
python=${PYTHON:-python3}
# Pinned, so CI installs what was measured.
spec=${JAX_SPEC:-jax[cuda13]==0.10.2}
bin=${CARGO_PROFILE_DIR:-$root/target/debug}

. "$root/tests/frameworks/sim-node.sh"

venv_install jax 'import jax; print(jax.__version__)' "$spec"
[[ ${1:-} == --install-only ]] && exit 0

# The CUDA runtime the plugin was built with (jax checks that the driver is at least that new).
sim_node jax 'from importlib.metadata import version; print(version("nvidia-cuda-runtime"))'

for alloc in default platform; do
    conf=()
    [[ $alloc != default ]] && conf=(env XLA_PYTHON_CLIENT_ALLOCATOR=$alloc)
    check "jax_check: bare simulated node, allocator $alloc" \
        "${conf[@]}" "$venv/bin/python" "$root/tests/frameworks/jax_check.py" --simulated --expect-devices 2
done

start_manager jax-check

for alloc in default platform; do
    conf=()
    [[ $alloc != default ]] && conf=(env XLA_PYTHON_CLIENT_ALLOCATOR=$alloc)
    check "jax_check: under tessera run --gpu 0 --memory 1Gi, allocator $alloc" \
        "$bin/tessera" run --socket "$work/manager.sock" --gpu 0 --memory 1Gi -- \
        "${conf[@]}" "$venv/bin/python" "$root/tests/frameworks/jax_check.py" \
        --simulated --expect-devices 1 --expect-total $((1 << 30)) --context "$context"
done

exit $failed
