#!/usr/bin/env bash
# Makes a Python virtual environment (default .venv) with fanin's Python package installed in it:
#
#   scripts/pyvenv.sh [DIR]          then DIR/bin/python, or `. DIR/bin/activate`
#
# The environment sees its interpreter's own packages (--system-site-packages), so numpy and torch
# come from there, not from PyPI. The interpreter is $PYTHON if set, else the first of python3 and
# /usr/bin/python3 that has numpy and torch (then one with numpy only). So it works with Debian's
# Python, whose pip refuses to install outside a venv (PEP 668), and where python3 is another
# Python without them (pyenv, say) but Debian's has them. Installing the package builds the Go SDK
# as a C library with `go build`, which needs Go 1.26.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}

has() { command -v "$1" >/dev/null 2>&1 && "$1" -c "import $2" >/dev/null 2>&1; }
py=${PYTHON:-}
if [ -n "$py" ] && ! has "$py" numpy; then
  echo "pyvenv: PYTHON=$py is not a Python that can import numpy" >&2
  exit 1
fi
if [ -z "$py" ]; then
  for mods in "numpy, torch" numpy; do
    for c in python3 /usr/bin/python3; do
      if has "$c" "$mods"; then py=$c; break 2; fi
    done
  done
fi
if [ -z "$py" ]; then
  echo "pyvenv: no python3 with numpy (tried python3 and /usr/bin/python3)." >&2
  echo "  Debian: apt-get install python3-numpy python3-venv python3-setuptools python3-torch" >&2
  echo "  or set PYTHON to an interpreter that has numpy (and torch, for fanin.torch)." >&2
  exit 1
fi
if ! "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "pyvenv: $py has no torch: fanin.torch and examples/pytorch will not run (Debian: apt-get install python3-torch)" >&2
fi
if ! "$py" -m venv --system-site-packages "$venv"; then
  echo "pyvenv: $py -m venv failed (Debian: apt-get install python3-venv)" >&2
  exit 1
fi
# With setuptools in reach, pip needs nothing from PyPI to build the package.
isolation=--no-build-isolation
"$venv/bin/python" -c 'import setuptools' >/dev/null 2>&1 || isolation=
echo "pyvenv: $venv from $py ($("$py" --version 2>&1)); pip install ./sdk/python builds libfanin with go build (first time: minutes)"
start=$(date +%s)
"$venv/bin/pip" install -q $isolation ./sdk/python
echo "pyvenv: fanin installed in $venv in $(($(date +%s) - start)) s: run $venv/bin/python, or . $venv/bin/activate"
