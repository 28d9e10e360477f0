"""One vLLM engine per test session, on the embedded SmolLM2 model, with the tokenpace
scheduler in this process. Engine tests skip (with the reason) when vLLM or the model's
conversion dependencies are not installed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.engine.vllm.model import BUILD, KV_CACHE_BYTES, MAX_MODEL_LEN, embedded_model
from tokenpace.engine.vllm.config import VllmEngineConfig, local_environment


@pytest.fixture(scope="session")
def vllm_llm() -> Iterator[Any]:
    """A ``vllm.LLM`` whose scheduler is ``TokenpaceScheduler`` (policy twp at start)."""
    pytest.importorskip("vllm", reason="needs the vllm extra (scripts/setup.sh vllm)")
    model = embedded_model()
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
