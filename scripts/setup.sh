#!/usr/bin/env bash
# Set up a development environment: find a Python >= 3.12 (3.12 preferred: megatron-core 0.19's own CI
# version), build .venv, install megatron_energy editable with its dev extra (pytest, ruff, mypy, lowtime, mkdocs).
# Run from anywhere; idempotent.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

is_suitable() {
  "$1" -c 'import sys, venv; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

find_python() {
  local candidate
  if [ -n "${MEGATRON_ENERGY_PYTHON:-}" ]; then
    is_suitable "$MEGATRON_ENERGY_PYTHON" && { echo "$MEGATRON_ENERGY_PYTHON"; return 0; }
    echo "MEGATRON_ENERGY_PYTHON=$MEGATRON_ENERGY_PYTHON is not a Python >= 3.12" >&2
    return 1
  fi
  for candidate in python3.12 python3.13 python3.14 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && is_suitable "$(command -v "$candidate")"; then
      command -v "$candidate"; return 0
    fi
  done
  local pyenv_root="${PYENV_ROOT:-}"
  if [ -z "$pyenv_root" ] && command -v pyenv >/dev/null 2>&1; then pyenv_root="$(pyenv root)"; fi
  [ -n "$pyenv_root" ] || pyenv_root="$HOME/.pyenv"
  for candidate in $(ls -d "$pyenv_root"/versions/3.1[2-9]*/bin/python3 2>/dev/null | sort -V); do
    if is_suitable "$candidate"; then echo "$candidate"; return 0; fi
  done
  return 1
}

if ! python="$(find_python)"; then
  cat >&2 <<'MSG'
error: no Python >= 3.12 found (megatron-core 0.19 requires it).
Looked on PATH (python3.12, python3.13, python3.14, python3, python) and under $PYENV_ROOT/versions.
Install one, e.g. `pyenv install 3.12` or your distribution's python3.12 + python3.12-venv,
or point MEGATRON_ENERGY_PYTHON at an interpreter, then rerun scripts/setup.sh.
MSG
  exit 1
fi
echo "setup: using $python ($("$python" --version 2>&1))"

if [ -x .venv/bin/python ] && ! is_suitable .venv/bin/python; then
  echo "setup: .venv has an older Python; rebuilding it"
  rm -rf .venv
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel
.venv/bin/python -m pip install --quiet -e ".[dev]"
.venv/bin/python -c "import megatron.core, zeus, pynvml, networkx, megatron_energy; print('setup: ok')"
