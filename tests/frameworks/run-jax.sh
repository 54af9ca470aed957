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

version() { "$venv/bin/python" -c 'import jax; print(jax.__version__)' 2>/dev/null; }

install() {
    local stamp=$venv/.tessera-jax
    mkdir -p "$(dirname "$venv")"
    exec 9>"$venv.lock"
    flock 9
    if [[ -x $venv/bin/python && -f $stamp && "$(cat "$stamp")" == "$spec" ]]; then
        echo "jax venv: $venv ($(version))"
        return
    fi
    local t0=$SECONDS
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-input "$spec"
    # Written last: an interrupted install is redone from scratch next time.
    echo "$spec" >"$stamp"
    echo "jax venv: installed $(version) in $((SECONDS - t0)) s, $(du -sh "$venv" | cut -f1)"
}

install
[[ ${1:-} == --install-only ]] && exit 0

(cd "$root" && cargo build --quiet -p tessera-sim-cuda -p tessera-sim-nvml -p tessera-hook -p tessera-cli)

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-jax.XXXXXX")
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

# The driver version of the CUDA runtime the plugin was built with (jax checks that the
# driver is at least that new).
cuda=$("$venv/bin/python" -c 'from importlib.metadata import version; print(version("nvidia-cuda-runtime"))')
major=${cuda%%.*}
minor=${cuda#*.}
minor=${minor%%.*}
export TESSERA_SIM_DRIVER_VERSION=$((major * 1000 + minor * 10))
export TESSERA_SIM_STATE=$work/node
export TESSERA_SIM_DEVICES=2 TESSERA_SIM_MEMORY=16Gi
export LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

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
    "$@"
    local rc=$?
    set -e
    [[ $rc == 0 ]] || failed=1
}

for alloc in default platform; do
    conf=()
    [[ $alloc != default ]] && conf=(env XLA_PYTHON_CLIENT_ALLOCATOR=$alloc)
    check "jax_check: bare simulated node, allocator $alloc" \
        "${conf[@]}" "$venv/bin/python" "$root/tests/frameworks/jax_check.py" --simulated --expect-devices 2
done

mkdir -p "$work/state"
"$bin/tessera" manager --state-dir "$work/state" --socket "$work/manager.sock" \
    --nvml-library "$work/lib/libnvidia-ml.so.1" --hook-library "$work/lib/libtessera.so" \
    --metrics-addr off --hostname jax-check >"$work/manager.log" 2>&1 &
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

for alloc in default platform; do
    conf=()
    [[ $alloc != default ]] && conf=(env XLA_PYTHON_CLIENT_ALLOCATOR=$alloc)
    check "jax_check: under tessera run --gpu 0 --memory 1Gi, allocator $alloc" \
        "$bin/tessera" run --socket "$work/manager.sock" --gpu 0 --memory 1Gi -- \
        "${conf[@]}" "$venv/bin/python" "$root/tests/frameworks/jax_check.py" \
        --simulated --expect-devices 1 --expect-total $((1 << 30)) --context "$context"
done

exit $failed
