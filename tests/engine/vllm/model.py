"""The embedded model and engine sizes shared by the vLLM engine tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tokenpace.engine.dtype import DTYPE_BYTES, resolve_dtype
from tokenpace.engine.vllm.config import local_environment
from tokenpace.engine.vllm.settings import ENV_POLICY

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "build"
MODEL_DIR = BUILD / "native-cache" / "smollm2-135m-instruct"
# The engines' precision: the project's rule for ``auto`` (bfloat16 where the CPU computes
# it natively, else float32: a 512-token bfloat16 prefill took seconds on an AVX2 CPU).
DTYPE = resolve_dtype("auto", "cpu")
# A small KV cache (about 48 blocks of 32 tokens in any precision) so a test can exhaust it
# and see vLLM preempt under the policy's admissions.
KV_CACHE_BYTES = 18 * 2**20 * DTYPE_BYTES[DTYPE]
MAX_MODEL_LEN = 512


def embedded_model() -> Path:
    """The embedded GGUF converted once to a safetensors directory (shared with the native
    engine's cache)."""
    if (MODEL_DIR / "config.json").is_file():
        return MODEL_DIR
    pytest.importorskip("gguf", reason="converting the embedded model needs the gguf package")
    pytest.importorskip("accelerate", reason="loading a GGUF in transformers needs accelerate")
    try:
        from tokenpace.engine.native.loading import convert_gguf, embedded_gguf_path
    except ImportError as error:
        pytest.skip(f"the GGUF converter is unavailable: {error}")
    try:
        gguf = embedded_gguf_path()
    except FileNotFoundError as error:
        pytest.skip(str(error))
    return convert_gguf(gguf, MODEL_DIR)


def set_vllm_environment(patch: pytest.MonkeyPatch, policy: str) -> None:
    """Point vLLM at the build folder (keeping what the environment already sets, except
    that the engine core always runs in this process) and name the policy to start with;
    ``patch`` restores everything afterwards."""
    for name, value in local_environment(BUILD).items():
        if name not in os.environ or name == "VLLM_ENABLE_V1_MULTIPROCESSING":
            patch.setenv(name, value)
    patch.setenv(ENV_POLICY, policy)
