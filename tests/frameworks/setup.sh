#!/usr/bin/env bash
# Installs the framework tests' Python packages (requirements.txt, next to this script)
# into a virtual environment and prints its path. Idempotent: when the environment was
# made from the same requirements and Python, it returns at once. Concurrent callers wait
# for one another (flock), so parallel tests install once.
#
#   tests/frameworks/setup.sh            # -> target/frameworks-venv
#   TESSERA_FRAMEWORKS_VENV=/some/dir tests/frameworks/setup.sh
#   PYTHON=python3.12 tests/frameworks/setup.sh
#
# Needs python3 (3.9 or newer, with its venv module) and access to PyPI on the first run.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
venv=${TESSERA_FRAMEWORKS_VENV:-$repo/target/frameworks-venv}
python=${PYTHON:-python3}
requirements=$here/requirements.txt

if ! command -v "$python" >/dev/null; then
    echo "setup.sh: $python not found (set PYTHON to a Python 3 interpreter)" >&2
    exit 1
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

# What the environment is made from: the requirements and the interpreter's version.
want="$(sha256sum "$requirements" | cut -d' ' -f1) $("$python" -c 'import sys; print(sys.version.split()[0])')"
stamp=$venv/.tessera-requirements
if [[ -x $venv/bin/python && -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
    echo "$venv"
    exit 0
fi

rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-input \
    -r "$requirements" >&2
# Written last: an interrupted install is redone from scratch next time.
echo "$want" >"$stamp"
echo "$venv"
