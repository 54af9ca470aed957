#!/usr/bin/env bash
# CuPy-ROCm (`cupy-rocm-5-0` 13.3.0 from PyPI, unmodified) and hip-python (AMD's
# bindings, which open libamdhip64.so themselves) on the simulated AMD node.
#
# 1. Installs both into their own virtual environment under target/ (idempotent: a later
#    run reuses it; about 450 MB with NumPy).
# 2. Builds the simulated HIP runtime and the stub ROCm libraries (debug profile) and
#    installs them under the names CuPy-ROCm's modules link: libamdhip64.so.5 (and
#    Hygon's libgalaxyhip.so.5, the same file), libhipblas.so.0, librocblas.so.0, ...
# 3. Runs tests/frameworks/cupy_rocm_check.py bare on a fresh mixed node (one NVIDIA GPU,
#    then two AMD Instinct MI210s): HIP sees the AMD ones, memGetInfo shows a device's
#    memory, an array past it raises OutOfMemoryError and a smaller one allocates after,
#    and a kernel compiled and launched through CuPy runs; then
#    tests/frameworks/hip_python_check.py: hipMemGetInfo shows it, hipMalloc past it is
#    hipErrorOutOfMemory and a smaller one succeeds after.
# 4. Runs both checks under `tessera run --gpu 1 --memory 1Gi` (a manager on a second
#    node, one NVIDIA GPU and one AMD GPU: GPU 1 is the AMD one; the shim governs HIP,
#    hip-python's lookups on its own handle included): the total is 1 GiB, past it is
#    out of memory, a smaller allocation and CuPy's kernel arrays fit beside the
#    process's device context.
#
# Usage: tests/frameworks/run-cupy-rocm.sh [--install-only]
# Environment: CUPY_ROCM_VENV (default target/cupy-rocm-venv), PYTHON (default python3),
#              CUPY_ROCM_SPEC (default `cupy-rocm-5-0==13.3.0`), HIP_PYTHON_SPEC (default
#              `hip-python==6.2.0.499.16`, the oldest on PyPI), CARGO_PROFILE_DIR
#              (default target/debug: where the built libraries are).
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${CUPY_ROCM_VENV:-$root/target/cupy-rocm-venv}
python=${PYTHON:-python3}
# Pinned: the symbol lists in sim/hip and sim/hip-stubs are this wheel's (regen.sh).
spec=${CUPY_ROCM_SPEC:-cupy-rocm-5-0==13.3.0}
# hip-python is built for ROCm 6; the calls its check makes have the same ABI in ROCm 5.
hip_python=${HIP_PYTHON_SPEC:-hip-python==6.2.0.499.16}
bin=${CARGO_PROFILE_DIR:-$root/target/debug}

install() {
    local stamp=$venv/.tessera-cupy-rocm
    if [[ -x $venv/bin/python && -f $stamp && "$(cat "$stamp")" == "$spec $hip_python" ]]; then
        echo "cupy-rocm venv: $venv"
        return
    fi
    local t0=$SECONDS
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-input "$spec" "$hip_python"
    echo "$spec $hip_python" >"$stamp"
    echo "cupy-rocm venv: installed $spec and $hip_python in $((SECONDS - t0)) s, $(du -sh "$venv" | cut -f1)"
}

install
[[ ${1:-} == --install-only ]] && exit 0

(cd "$root" && cargo build --quiet -p tessera-sim-hip -p tessera-sim-hip-stubs \
    -p tessera-sim-nvml -p tessera-sim-rocm-smi -p tessera-hook -p tessera-cli)

work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-cupy-rocm.XXXXXX")
# cleanup and start_manager; this script installs its own venv (two requirements in one
# stamp) and node (the HIP runtime, not sim_node's CUDA driver).
source "$root/tests/frameworks/sim-node.sh"
trap cleanup EXIT

# The runtime's names, copied (a concurrent build may rewrite target/). One stub library
# serves every ROCm math and communication soname; the loader maps it once.
mkdir -p "$work/lib" "$work/rocm/include"
cp "$bin/libtessera_sim_hip.so" "$work/lib/libamdhip64.so.5"
# hip-python opens this name.
ln -s libamdhip64.so.5 "$work/lib/libamdhip64.so"
ln -s libamdhip64.so.5 "$work/lib/libgalaxyhip.so.5"
cp "$bin/libtessera_sim_hip_stubs.so" "$work/lib/libtessera_sim_hip_stubs.so"
for name in libhipblas.so.0 librocblas.so.0 librocsolver.so.0 librocfft.so.0 libhipfft.so \
    libhipsparse.so.0 libhiprand.so.1 librccl.so.1 libroctx64.so.1; do
    ln -s libtessera_sim_hip_stubs.so "$work/lib/$name"
done

memory=$((16 << 30))
export TESSERA_SIM_STATE=$work/node
export TESSERA_SIM_GPUS=nvidia,amd,amd TESSERA_SIM_MEMORY=$memory
export LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# CuPy needs a ROCm root to pass hiprtc an include directory, which the simulated hiprtc
# does not read; its kernel cache goes to the run's own directory.
export ROCM_HOME=$work/rocm CUPY_CACHE_DIR=$work/cupy-cache
# The check's kernel bound is the default duration model's.
unset TESSERA_SIM_KERNEL_TIME

status=0
# run_check LABEL CHECK_SCRIPT EXPECTED_TOTAL [COMMAND PREFIX...]: one check, labelled.
run_check() {
    local label=$1 script=$2 expected=$3
    shift 3
    echo "== $label"
    if ! "$@" "$venv/bin/python" "$root/tests/frameworks/$script" "$expected"; then
        echo "FAILED: $label" >&2
        status=1
    fi
}

run_check "cupy-rocm bare (device memory $((memory >> 30)) GiB)" cupy_rocm_check.py "$memory"
run_check "hip-python bare" hip_python_check.py "$memory"

# Under tessera run, on a node of its own: one NVIDIA GPU (index 0) and one AMD GPU
# (index 1, the one HIP sees). Each process's device context holds 64 MiB there, and the
# manager charges that much for one, so that the check's 2 x 256 MiB kernel arrays fit
# within 1 GiB beside it (at the default 518 MiB they would not).
cp "$bin/deps/libtessera_sim_nvml.so" "$work/lib/libnvidia-ml.so.1"
cp "$bin/deps/libtessera_sim_rocm_smi.so" "$work/lib/librocm_smi64.so.5"
cp "$bin/libtessera.so" "$work/lib/libtessera.so"
export TESSERA_SIM_STATE=$work/node-run TESSERA_SIM_GPUS=nvidia,amd
export TESSERA_SIM_CONTEXT_MEMORY=64Mi
start_manager cupy-rocm-check --rocm-smi-library "$work/lib/librocm_smi64.so.5" \
    --context-overhead 64Mi
for check in cupy_rocm_check.py hip_python_check.py; do
    run_check "${check%_check.py} under tessera run --gpu 1 --memory 1Gi" "$check" $((1 << 30)) \
        "$bin/tessera" run --socket "$work/manager.sock" --gpu 1 --memory 1Gi --
done
exit $status
