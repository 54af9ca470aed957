# Sourced by run-torch.sh, run-jax.sh and run-cupy-rocm.sh: what running a framework on
# the simulated node takes, written once. The caller sets `root`, `venv`, `python`, `spec`
# and `bin` first.
#
#   venv_install NAME VERSION_CMD [--upgrade-pip] PACKAGE...
#       makes the virtual environment (idempotent: a stamp of the requirement; concurrent
#       callers wait for one another), printing what it holds and, when it installed, how
#       long that took and its size.
#   sim_node NAME CUDA_VERSION_CMD
#       builds the simulated driver, the shim and the CLI, copies them into a work folder
#       (removed at exit), points the process at them with the driver version the
#       framework's CUDA runtime needs, and measures one context's size into `context`.
#   start_manager HOSTNAME [FLAG...]
#       starts a manager on that node (stopped at exit), with the NVML library and the
#       shim from $work/lib and any further flags; its socket is $work/manager.sock.
#   cleanup
#       stops that manager and removes $work (sim_node traps it at exit).
#   check TITLE COMMAND...
#       runs one check with its title; a failure sets `failed=1` and the run goes on. Its
#       stderr goes through `filter` (the caller may redefine it; by default unchanged).

# Quiets what a framework prints that is not a failure; run-torch.sh redefines it.
filter() { cat; }

venv_install() {
    local name=$1 version_cmd=$2
    shift 2
    local upgrade_pip=0
    if [[ ${1:-} == --upgrade-pip ]]; then
        upgrade_pip=1
        shift
    fi
    local stamp=$venv/.tessera-$name
    mkdir -p "$(dirname "$venv")"
    exec 9>"$venv.lock"
    flock 9
    if [[ -x $venv/bin/python && -f $stamp && "$(cat "$stamp")" == "$spec" ]]; then
        echo "$name venv: $venv ($("$venv/bin/python" -c "$version_cmd" 2>/dev/null))"
        exec 9>&-
        return
    fi
    local t0=$SECONDS
    rm -rf "$venv"
    "$python" -m venv "$venv"
    local pip=("$venv/bin/python" -m pip install --quiet --no-cache-dir
        --disable-pip-version-check --no-input)
    if [[ $upgrade_pip == 1 ]]; then
        "${pip[@]}" --upgrade pip
    fi
    "${pip[@]}" "$@"
    # Written last: an interrupted install is redone from scratch next time.
    echo "$spec" >"$stamp"
    echo "$name venv: installed $("$venv/bin/python" -c "$version_cmd" 2>/dev/null) in $((SECONDS - t0)) s, $(du -sh "$venv" | cut -f1)"
    exec 9>&-
}

manager_pid=
cleanup() {
    if [[ -n $manager_pid ]]; then
        kill "$manager_pid" 2>/dev/null || true
        wait "$manager_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}

sim_node() {
    local name=$1 cuda_cmd=$2
    (cd "$root" && cargo build --quiet -p tessera-sim-cuda -p tessera-sim-nvml -p tessera-hook -p tessera-cli)
    work=$(mktemp -d "${TMPDIR:-/tmp}/tessera-$name.XXXXXX")
    trap cleanup EXIT
    # The simulated driver's names, copied (a concurrent build may rewrite target/).
    mkdir -p "$work/lib"
    cp "$bin/libtessera_sim_cuda.so" "$work/lib/libcuda.so.1"
    cp "$bin/libtessera_sim_nvml.so" "$work/lib/libnvidia-ml.so.1"
    cp "$bin/libtessera.so" "$work/lib/libtessera.so"
    ln -s libcuda.so.1 "$work/lib/libcuda.so"
    ln -s libnvidia-ml.so.1 "$work/lib/libnvidia-ml.so"
    # The framework's CUDA runtime refuses a driver older than the version it was built for.
    local cuda major minor
    cuda=$("$venv/bin/python" -c "$cuda_cmd")
    major=${cuda%%.*}
    minor=${cuda#*.}
    minor=${minor%%.*}
    export TESSERA_SIM_DRIVER_VERSION=$((major * 1000 + minor * 10))
    export TESSERA_SIM_STATE=$work/node
    export TESSERA_SIM_DEVICES=2 TESSERA_SIM_MEMORY=16Gi
    export LD_LIBRARY_PATH=$work/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # What one CUDA context holds on this node, measured once by a bare process (the
    # checks add it to what a job is charged; under `tessera run` they could not measure
    # it bare).
    context=$("$venv/bin/python" "$root/tests/frameworks/context_size.py")
    echo "context: $((context >> 20)) MiB per process (measured bare)"
}

start_manager() {
    mkdir -p "$work/state"
    "$bin/tessera" manager --state-dir "$work/state" --socket "$work/manager.sock" \
        --nvml-library "$work/lib/libnvidia-ml.so.1" --hook-library "$work/lib/libtessera.so" \
        --metrics-addr off --hostname "$1" "${@:2}" >"$work/manager.log" 2>&1 &
    manager_pid=$!
    for _ in $(seq 100); do
        [[ -S $work/manager.sock ]] && return
        sleep 0.1
    done
    echo "the manager did not start:" >&2
    cat "$work/manager.log" >&2
    exit 1
}

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
