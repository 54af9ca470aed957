"""What the framework checks (check_core.py, check_cupy.py, check_cudart.py) share: the
`key value` lines tests/tests/frameworks.rs reads, the `error <step> <type>: <message>`
line of a failed step, and the main that runs one mode. Each script imports it from its
own directory (Python puts a script's directory first on its path).
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
