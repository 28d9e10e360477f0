"""The embedded model and engine sizes shared by the vLLM engine tests."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "build"
MODEL_DIR = BUILD / "native-cache" / "smollm2-135m-instruct"
# A small KV cache (about 48 blocks of 32 tokens) so a test can exhaust it and see vLLM
# preempt under the policy's admissions.
KV_CACHE_BYTES = 36 * 2**20
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
