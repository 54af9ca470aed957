#!/usr/bin/env bash
# PyTorch (the CUDA build from PyPI) on the simulated node, bare and under the shim.
#
# 1. Installs torch (+ numpy) into its own virtual environment under target/ (idempotent:
#    a later run reuses it; it is several GB, see docs/simulator.md).
# 2. Builds the simulated libcuda/NVML, the shim and the tessera CLI (debug profile).
# 3. Runs tests/frameworks/torch_check.py on a fresh simulated node, four ways: bare and
#    under `tessera run --gpu 0 --memory 1Gi` (a manager on the same node), each with the
#    native caching allocator and with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync.
#    Each run prints its table; the script exits non-zero if any check failed.
#
# Usage: tests/frameworks/run-torch.sh [--install-only]
# Environment: TORCH_VENV (default target/torch-venv), PYTHON (default python3),
#              TORCH_SPEC (pip requirement, default `torch==2.15.0`), CARGO_PROFILE_DIR
#              (default target/debug: where the built binaries are).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${TORCH_VENV:-$root/target/torch-venv}
python=${PYTHON:-python3}
# Pinned, so CI installs what was measured (the PyPI build targets CUDA 13.2).
spec=${TORCH_SPEC:-torch==2.15.0}
bin=${CARGO_PROFILE_DIR:-$root/target/debug}

. "$root/tests/frameworks/sim-node.sh"

venv_install torch 'import torch; print(torch.__version__)' --upgrade-pip "$spec" numpy
[[ ${1:-} == --install-only ]] && exit 0

# torch warns (once per run) when NumPy is missing; quiet that and the simulator's notes
# about export tables it does not know, which are not failures.
filter() { grep -v -e 'UserWarning' -e '_conversion_method_template' || true; }
# The CUDA runtime torch was built with.
sim_node torch 'import torch; print(torch.version.cuda)'


for alloc in native backend:cudaMallocAsync; do
    conf=()
    [[ $alloc != native ]] && conf=(env PYTORCH_CUDA_ALLOC_CONF=$alloc)
    for script in torch_check train_check serve_check; do
        check "$script: bare simulated node, allocator $alloc" \
            "${conf[@]}" "$venv/bin/python" "$root/tests/frameworks/$script.py"
    done
done

check "mp_check: bare simulated node, allocator native" \
    "$venv/bin/python" "$root/tests/frameworks/mp_check.py"

start_manager torch-check

for alloc in native backend:cudaMallocAsync; do
    conf=()
    [[ $alloc != native ]] && conf=(env PYTORCH_CUDA_ALLOC_CONF=$alloc)
    for script in torch_check train_check serve_check; do
        gib=1
        [[ $script == serve_check ]] && gib=2
        check "$script: under tessera run --gpu 0 --memory ${gib}Gi, allocator $alloc" \
            "$bin/tessera" run --socket "$work/manager.sock" --gpu 0 --memory ${gib}Gi -- \
            "${conf[@]}" "$venv/bin/python" "$root/tests/frameworks/$script.py" \
            --expect-total $((gib << 30)) --context "$context"
    done
done

check "mp_check: under tessera run --gpu 0 --memory 4Gi, allocator native" \
    "$bin/tessera" run --socket "$work/manager.sock" --gpu 0 --memory 4Gi -- \
    "$venv/bin/python" "$root/tests/frameworks/mp_check.py" --expect-total $((4 << 30)) \
    --context "$context"

exit $failed
