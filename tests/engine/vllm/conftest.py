"""One vLLM engine per test session, on the embedded SmolLM2 model, with the tokenpace
scheduler in this process. Engine tests skip (with the reason) when vLLM or the model's
conversion dependencies are not installed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tokenpace.engine.vllm.config import VllmEngineConfig, local_environment

ROOT = Path(__file__).resolve().parents[3]
BUILD = ROOT / "build"
MODEL_DIR = BUILD / "native-cache" / "smollm2-135m-instruct"
# A small KV cache (about 48 blocks of 32 tokens) so a test can exhaust it and see vLLM
# preempt under the policy's admissions.
KV_CACHE_BYTES = 36 * 2**20
MAX_MODEL_LEN = 512


def _embedded_model() -> Path:
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


@pytest.fixture(scope="session")
def vllm_llm() -> Iterator[Any]:
    """A ``vllm.LLM`` whose scheduler is ``TokenpaceScheduler`` (policy twp at start)."""
    pytest.importorskip("vllm", reason="needs the vllm extra (scripts/setup.sh vllm)")
    model = _embedded_model()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in local_environment(BUILD).items():
            if name not in os.environ or name == "VLLM_ENABLE_V1_MULTIPROCESSING":
                patch.setenv(name, value)
        patch.setenv("TOKENPACE_POLICY", "twp")
        for folder in ("vllm-cache", "vllm-rpc", "inductor-cache"):
            (BUILD / folder).mkdir(parents=True, exist_ok=True)
        from vllm import LLM

        config = VllmEngineConfig(
            model=str(model),
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=32,
            max_num_batched_tokens=512,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
        )
        llm = LLM(**config.llm_kwargs())
        yield llm
        llm.llm_engine.engine_core.shutdown()
