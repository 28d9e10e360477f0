"""One vLLM engine per test session, on the embedded SmolLM2 model, with the tokenpace
scheduler in this process. Engine tests skip (with the reason) when vLLM or the model's
conversion dependencies are not installed."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.engine.vllm.model import (
    BUILD,
    DTYPE,
    KV_CACHE_BYTES,
    MAX_MODEL_LEN,
    embedded_model,
    set_vllm_environment,
)
from tokenpace.engine.vllm.config import VllmEngineConfig
from tokenpace.engine.vllm.start import shield_llvmlite_from_kernel_scan


@pytest.fixture(scope="session")
def vllm_llm() -> Iterator[Any]:
    """A ``vllm.LLM`` whose scheduler is ``TokenpaceScheduler`` (policy twp at start)."""
    pytest.importorskip("vllm", reason="needs the vllm extra (scripts/setup.sh vllm)")
    model = embedded_model()
    with pytest.MonkeyPatch.context() as patch:
        set_vllm_environment(patch, "twp")
        for folder in ("vllm-cache", "vllm-rpc", "inductor-cache"):
            (BUILD / folder).mkdir(parents=True, exist_ok=True)
        from vllm import LLM

        config = VllmEngineConfig(
            model=str(model),
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=32,
            max_num_batched_tokens=512,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
            dtype=DTYPE,  # KV_CACHE_BYTES is sized for it
        )
        # As in a process that has built a policy: numba loaded before the engine starts.
        importlib.import_module("tokenpace.policy.curve_kernel")
        shield_llvmlite_from_kernel_scan()
        llm = LLM(**config.llm_kwargs())
        yield llm
        llm.llm_engine.engine_core.shutdown()
