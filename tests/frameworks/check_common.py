"""What the framework checks share. For check_core.py, check_cupy.py and check_cudart.py:
the `key value` lines tests/tests/frameworks.rs reads, the `error <step> <type>: <message>`
line of a failed step, and the main that runs one mode. For the ROCm checks that
run-cupy-rocm.sh runs (cupy_rocm_check.py, hip_python_check.py): the `ok <what> ...` /
`fail <what> ...` lines and their main, given the expected total memory. Each script
imports it from its own directory (Python puts a script's directory first on its path).
"""

import sys
import traceback

MI = 1 << 20


def say(key, *values):
    print(key, *values, flush=True)


def error(step, e):
    msg = str(e).replace("\n", " ")[:300]
    say("error", step, f"{type(e).__module__}.{type(e).__name__}: {msg}")


def run(checks, load, usage):
    """Runs the check named by the first argument ("basic" when none) with the modules
    `load()` returns and the remaining arguments, and prints `done <mode>` after it. The
    exit status: 0; 1 when the imports or the check raised (reported as an error line);
    2 for an unknown mode."""
    mode = sys.argv[1] if len(sys.argv) > 1 else "basic"
    try:
        modules = load()
    except Exception as e:  # noqa: BLE001
        error("import", e)
        return 1
    check = checks.get(mode)
    if check is None:
        say("error", "usage", usage)
        return 2
    try:
        check(*modules, *sys.argv[2:])
    except Exception as e:  # noqa: BLE001
        error(mode, e)
        traceback.print_exc()
        return 1
    say("done", mode)
    return 0


# The checks that failed, by name (the ROCm checks' `check`).
failures = []


def check(what, good, *details):
    """Prints `ok <what> ...` or `fail <what> ...` and remembers a failure."""
    print("ok" if good else "fail", what, *details, flush=True)
    if not good:
        failures.append(what)


def run_expecting_total(body, usage):
    """The ROCm checks' main: `body(expected)` with the one argument, the total memory in
    bytes the runtime must report. The exit status: 0; 1 when a check failed; 2 (with
    `usage` on stderr) when the argument is missing or not a number."""
    if len(sys.argv) != 2 or not sys.argv[1].isdigit():
        print(usage, file=sys.stderr)
        return 2
    body(int(sys.argv[1]))
    return 1 if failures else 0
