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

install() {
    local stamp=$venv/.tessera-torch
    if [[ -x $venv/bin/python && -f $stamp && "$(cat "$stamp")" == "$spec" ]]; then
        echo "torch venv: $venv ($("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
        return
    fi
    local t0=$SECONDS
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-input --upgrade pip
    "$venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-input "$spec" numpy
    echo "$spec" >"$stamp"
    echo "torch venv: installed $("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null) in $((SECONDS - t0)) s, $(du -sh "$venv" | cut -f1)"
}

install
[[ ${1:-} == --install-only ]] && exit 0

(cd "$root" && cargo build --quiet -p tessera-sim-cuda -p tessera-sim-nvml -p tessera-hook -p tessera-cli)

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-torch.XXXXXX")
manager_pid=
cleanup() {
    if [[ -n $manager_pid ]]; then
        kill "$manager_pid" 2>/dev/null || true
        wait "$manager_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# The simulated driver's names, copied (a concurrent build may rewrite target/).
mkdir -p "$work/lib"
cp "$bin/libtessera_sim_cuda.so" "$work/lib/libcuda.so.1"
cp "$bin/libtessera_sim_nvml.so" "$work/lib/libnvidia-ml.so.1"
cp "$bin/libtessera.so" "$work/lib/libtessera.so"
ln -s libcuda.so.1 "$work/lib/libcuda.so"
ln -s libnvidia-ml.so.1 "$work/lib/libnvidia-ml.so"

# The driver version torch was built for (its CUDA runtime refuses an older driver).
cuda=$("$venv/bin/python" -c 'import torch; print(torch.version.cuda)' 2>/dev/null)
major=${cuda%%.*}
minor=${cuda#*.}
minor=${minor%%.*}
export TESSERA_SIM_DRIVER_VERSION=$((major * 1000 + minor * 10))
export TESSERA_SIM_STATE=$work/node
export TESSERA_SIM_DEVICES=2 TESSERA_SIM_MEMORY=16Gi
export LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# torch warns (once per run) when NumPy is missing; quiet that and the simulator's notes
# about export tables it does not know, which are not failures.
filter() { grep -v -e 'UserWarning' -e '_conversion_method_template' || true; }

# What one CUDA context holds on this node, measured once by a bare process (the checks add
# it to what a job is charged; under `tessera run` they could not measure it bare).
context=$("$venv/bin/python" "$root/tests/frameworks/context_size.py")
echo "context: $((context >> 20)) MiB per process (measured bare)"

failed=0
check() {
    local title=$1
    shift
    echo
    echo "== $title"
    set +e
    "$@" 2> >(filter >&2)
    local rc=$?
    set -e
    [[ $rc == 0 ]] || failed=1
}

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

mkdir -p "$work/state"
"$bin/tessera" manager --state-dir "$work/state" --socket "$work/manager.sock" \
    --nvml-library "$work/lib/libnvidia-ml.so.1" --hook-library "$work/lib/libtessera.so" \
    --metrics-addr off --hostname torch-check >"$work/manager.log" 2>&1 &
manager_pid=$!
for _ in $(seq 100); do
    [[ -S $work/manager.sock ]] && break
    sleep 0.1
done
if [[ ! -S $work/manager.sock ]]; then
    echo "the manager did not start:" >&2
    cat "$work/manager.log" >&2
    exit 1
fi

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
