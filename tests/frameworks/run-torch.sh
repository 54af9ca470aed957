#!/usr/bin/env bash
# PyTorch (the CUDA build from PyPI) on the simulated node, bare and under the shim.
#
# Installs torch into its own virtual environment under target/ (idempotent: a second run
# reuses it), builds the simulated libraries and the tessera CLI, then runs
# tests/frameworks/torch_check.py twice — on the bare simulated node and under
# `tessera run --memory 1Gi` — and prints one table per run.
#
# Usage: tests/frameworks/run-torch.sh [--install-only]
# Environment: TORCH_VENV (default target/torch-venv), PYTHON (default python3),
#              TORCH_SPEC (pip requirement, default `torch`).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${TORCH_VENV:-$root/target/torch-venv}
python=${PYTHON:-python3}
spec=${TORCH_SPEC:-torch}

install() {
    if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c 'import torch' 2>/dev/null; then
        echo "torch venv: $venv (already installed: $("$venv/bin/python" -c 'import torch; print(torch.__version__)'))"
        return
    fi
    local t0=$SECONDS
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet "$spec"
    echo "torch venv: installed $("$venv/bin/python" -c 'import torch; print(torch.__version__)') in $((SECONDS - t0)) s, $(du -sh "$venv" | cut -f1)"
}

install
[[ ${1:-} == --install-only ]] && exit 0
