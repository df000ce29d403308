#!/usr/bin/env bash
# Run the linters and the whole test suite (CPU only) in .venv. Extra arguments go to pytest.
# MEGATRON_ENERGY_TEST_WORKERS sets the number of pytest-xdist workers (default 2; 0 runs in one process).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# pytest-xdist workers, a test file on one worker (tests/file_scheduling.py), the world files first (conftest)
.venv/bin/python -m pytest -n "${MEGATRON_ENERGY_TEST_WORKERS:-2}" --no-loadscope-reorder "$@"
