"""What the PyTorch checks (torch_check.py, train_check.py, serve_check.py, mp_check.py)
share: a result row per check, printed as a table line as it comes; a step that turns an
exception into a failed row and goes on; integer flags; and the closing
`NAME: N passed, N failed` line with the exit status. Each script imports it from its own
directory (Python puts a script's directory first on its path).
"""

import os
import sys
import traceback

MI = 1 << 20
GI = 1 << 30

rows = []


def row(check, ok, detail=""):
    rows.append((check, "ok" if ok else "FAIL", str(detail)))
    print(f"{check:<28} | {'ok' if ok else 'FAIL':<4} | {detail}", flush=True)


def step(check, fn):
    try:
        ok, detail = fn()
    except Exception as e:  # report every failure and go on
        msg = str(e).replace("\n", " ")[:200]
        row(check, False, f"{type(e).__name__}: {msg}")
        if os.environ.get("TORCH_CHECK_TRACE"):
            traceback.print_exc()
        return
    row(check, ok, detail)


def arg(name, default=None):
    if name in sys.argv:
        return int(sys.argv[sys.argv.index(name) + 1])
    return default


def context_arg():
    """`--context BYTES` when given (the harness measured it bare, before starting the
    manager), else measured now by a bare child process (context_size.py): what one CUDA
    context holds on this node, taken from the driver, never assumed."""
    given = arg("--context")
    if given is not None:
        return given
    import context_size

    return context_size.measure()


def finish(name):
    """Prints the summary line and returns the process's exit status."""
    failed = sum(1 for r in rows if r[1] != "ok")
    print(f"{name}: {len(rows) - failed} passed, {failed} failed", flush=True)
    return 1 if failed else 0
