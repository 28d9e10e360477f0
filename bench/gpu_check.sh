#!/usr/bin/env bash
# The GPU check: on a CUDA machine, profile the native engine on a Llama-3.2-3B-shaped model
# (random weights from a shipped config; nothing is downloaded), time its batch-1 step
# against the memory-bandwidth roofline, and run TWP against the baselines at the paper's
# scale. Prints one JSON object on its last line; the profile and result land in
# build/gpu_check (or $GPU_CHECK_OUT).
#
#   bench/gpu_check.sh            # CUDA; stops after 10 minutes, result.json kept per scheduler run
#   bench/gpu_check.sh --dry-run  # the same path on the CPU with a tiny model, seconds
#   GPU_CHECK_DRY_RUN=1 bench/gpu_check.sh
#   bench/gpu_check.sh --decode-graphs=off   # the engine without CUDA graphs (auto, on, eager, off)
#   bench/gpu_check.sh --cudnn-attention     # let SDPA use cuDNN (a plan per new shape)
#
# PYTHON picks the interpreter (default: python3 on PATH) and must have tokenpace[native].
set -euo pipefail

args=()
if [[ "${GPU_CHECK_DRY_RUN:-0}" == "1" ]]; then
  args+=(--dry-run)
fi
for arg in "$@"; do
  case "$arg" in
    --dry-run) args+=(--dry-run) ;;
    --decode-graphs=*) args+=(--decode-graphs "${arg#--decode-graphs=}") ;;
    --cudnn-attention) args+=(--cudnn-attention) ;;
    *) echo "gpu_check.sh: unknown argument '$arg' (--dry-run, --decode-graphs=MODE, --cudnn-attention)" >&2; exit 2 ;;
  esac
done

export HF_HUB_OFFLINE=1
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
exec timeout "${GPU_CHECK_TIMEOUT_S:-600}" "${PYTHON:-python3}" -m tokenpace.profiling.gpu_check \
  --out "${GPU_CHECK_OUT:-build/gpu_check}" "${args[@]}"
