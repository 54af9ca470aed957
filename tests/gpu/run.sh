#!/usr/bin/env bash
# Tessera's real-GPU check. Uses binaries built elsewhere (nothing is compiled
# here), needs no network, finishes within five minutes, prints one table and
# exits non-zero when a check fails. See tests/gpu/README.md.
#
#   tests/gpu/run.sh [--bin DIR] [--sim]
#
# --bin DIR  where `tessera` and `libtessera.so` are (default: target/release)
# --sim      run against Tessera's simulated GPU node instead of the driver:
#            the driver and NVML checks run; the PyTorch ones report
#            "not run: no CUDA PyTorch".
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
bin="${TESSERA_BIN:-$here/../../target/release}"
sim=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bin) bin="$2"; shift 2 ;;
        --sim) sim=1; shift ;;
        -h|--help) sed -n 2,12p "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
bin="$(cd "$bin" 2>/dev/null && pwd)" || { echo "no such directory: $bin" >&2; exit 2; }
tessera="$bin/tessera"
hook="$bin/libtessera.so"
[ -f "$hook" ] || hook="$bin/deps/libtessera.so"
for f in "$tessera" "$hook"; do
    [ -f "$f" ] || { echo "missing $f: build with 'cargo build --release' and pass --bin" >&2; exit 2; }
done
py="${PYTHON:-python3}"
command -v "$py" >/dev/null || { echo "python3 is needed" >&2; exit 2; }

work="$(mktemp -d "${TMPDIR:-/tmp}/tessera-gpu.XXXXXX")"
manager_pid=""
cleanup() {
    [ -n "$manager_pid" ] && kill "$manager_pid" 2>/dev/null && wait "$manager_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

manager_args=(--state-dir "$work/state" --socket "$work/manager.sock" --metrics-addr 127.0.0.1:0
              --hook-library "$hook")
if [ "$sim" = 1 ]; then
    # The simulated node: its libcuda.so.1 / libnvidia-ml.so.1 in a lib dir.
    simlib="$work/simlib"
    mkdir -p "$simlib"
    for name in cuda:libtessera_sim_cuda.so nvidia-ml:libtessera_sim_nvml.so; do
        src="$bin/${name#*:}"; [ -f "$src" ] || src="$bin/deps/${name#*:}"
        [ -f "$src" ] || { echo "missing ${name#*:} next to $tessera" >&2; exit 2; }
        ln -s "$src" "$simlib/lib${name%%:*}.so.1"
    done
    export LD_LIBRARY_PATH="$simlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export TESSERA_SIM_STATE="$work/node" TESSERA_SIM_DEVICES=2 TESSERA_SIM_MEMORY=16Gi
    manager_args+=(--nvml-library "$simlib/libnvidia-ml.so.1")
fi
export TESSERA_SOCKET="$work/manager.sock"

"$tessera" manager "${manager_args[@]}" >"$work/manager.log" 2>&1 &
manager_pid=$!
for _ in $(seq 100); do
    [ -S "$work/manager.sock" ] && break
    kill -0 "$manager_pid" 2>/dev/null || break
    sleep 0.1
done
if ! [ -S "$work/manager.sock" ]; then
    echo "the manager did not start:" >&2; cat "$work/manager.log" >&2; exit 1
fi

rows=()
failed=0
missing=()
# record NAME RESULT DETAIL
record() { rows+=("$1|$2|$3"); [ "$2" = FAIL ] && failed=1; [ "$2" = "not run" ] && missing+=("$1"); }
json() { "$py" -c "import json,sys; d=json.loads(sys.stdin.read() or '{}'); print($1)" 2>/dev/null; }

# run_check NAME MEMORY COMPUTE POLICY -> JSON line of checks.py (inside an allocation)
run_check() {
    local check="$1" memory="$2" compute="$3" policy="$4" limit
    limit=$("$py" -c "print(int('$memory'[:-2]) << 30)")
    CHECK_LIMIT_BYTES="$limit" CHECK_SECONDS="${CHECK_SECONDS:-20}" \
        "$tessera" run --gpu 0 --memory "$memory" --compute "$compute" --policy "$policy" \
        -- "$py" "$here/checks.py" "$check" 2>>"$work/checks.log" | tail -n 1
}

verdict() { # JSON -> ok / FAIL / not run
    local ok; ok=$(json "d.get('ok')" <<<"$1")
    case "$ok" in True) echo ok ;; None) echo "not run" ;; *) echo FAIL ;; esac
}

# 1. The driver's view inside a 4 GiB allocation, and the refusal past it.
r=$(run_check driver-view 4Gi 100% burst)
record "driver: cuMemGetInfo shows 4 GiB, OOM past it" "$(verdict "$r")" \
    "$(json "f\"total={d.get('total',0)/2**30:.2f}GiB allocated_before_refusal={d.get('allocated_before_refusal',0)/2**30:.2f}GiB error={d.get('refused_with')}\"" <<<"$r")"

# 2. NVML's view inside the allocation.
r=$(run_check nvml-view 4Gi 100% burst)
record "nvml: memory info shows 4 GiB" "$(verdict "$r")" \
    "$(json "f\"total={d.get('total',0)/2**30:.2f}GiB used={d.get('used',0)/2**30:.2f}GiB name={d.get('name','?')}\"" <<<"$r")"

# 3. PyTorch limited to 4 GiB: its own OOM error, mem_get_info shows the limit.
r=$(run_check torch-oom 4Gi 100% burst)
record "torch: OOM at 4 GiB, mem_get_info" "$(verdict "$r")" \
    "$(json "d.get('reason') or f\"mem_get_info total={d.get('mem_get_info_total',0)/2**30:.2f}GiB allocated_before_error={d.get('allocated_before_error',0)/2**30:.2f}GiB error={d.get('error')}\"" <<<"$r")"

# 4. Two processes, same loop, 30% and 70% guaranteed: throughput ratio.
CHECK_SECONDS=20 run_check torch-loop 8Gi 30% guaranteed >"$work/loop30" &
p30=$!
CHECK_SECONDS=20 run_check torch-loop 8Gi 70% guaranteed >"$work/loop70" &
p70=$!
wait $p30 $p70
r30=$(cat "$work/loop30"); r70=$(cat "$work/loop70")
if [ "$(verdict "$r30")" = ok ] && [ "$(verdict "$r70")" = ok ]; then
    share=$("$py" -c "import json; a=json.loads('''$r30''')['rate']; b=json.loads('''$r70''')['rate']; print(f'{a/(a+b):.3f}')")
    res=$("$py" -c "print('ok' if abs($share-0.30) <= 0.05 else 'FAIL')")
    record "torch: 30%/70% guaranteed split" "$res" "30% process got $share of the combined throughput (target 0.300 ±0.05)"
else
    record "torch: 30%/70% guaranteed split" "$(verdict "$r30")" "$(json "d.get('reason','')" <<<"$r30")"
fi

# 5. Shim overhead on a launch-bound loop, with and without the shim.
r_with=$(run_check torch-launch 4Gi 100% burst)
if [ "$(verdict "$r_with")" = ok ]; then
    r_without=$("$py" "$here/checks.py" torch-launch 2>>"$work/checks.log" | tail -n 1)
    detail=$("$py" -c "import json; w=json.loads('''$r_with''')['us_per_launch']; o=json.loads('''$r_without''')['us_per_launch']; print(f'{w:.2f} us/launch with the shim, {o:.2f} without, ratio {w/o:.3f}')")
    record "torch: launch-bound loop overhead" ok "$detail"
else
    record "torch: launch-bound loop overhead" "$(verdict "$r_with")" "$(json "d.get('reason','')" <<<"$r_with")"
fi

printf '\n%-46s %-8s %s\n' "check" "result" "measured"
printf '%-46s %-8s %s\n' "-----" "------" "--------"
for row in "${rows[@]}"; do
    IFS='|' read -r name res detail <<<"$row"
    printf '%-46s %-8s %s\n' "$name" "$res" "$detail"
done
if [ ${#missing[@]} -gt 0 ]; then
    printf '\nMISSING FIGURES: %d check(s) did not run here (%s).\n' "${#missing[@]}" "$(IFS=,; echo "${missing[*]}")"
    echo "They need a GPU and PyTorch with CUDA; these results are incomplete, not passed."
fi
if [ "$failed" = 1 ]; then
    echo; echo "FAILED. Manager log: "; tail -n 20 "$work/manager.log"; tail -n 20 "$work/checks.log"
    exit 1
fi
exit 0
