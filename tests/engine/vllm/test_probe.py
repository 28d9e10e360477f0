"""The engine the vLLM profiling sweep runs on holds the sweep's KV in every precision."""

from __future__ import annotations

from pathlib import Path

from tokenpace.engine.vllm.probe import PROFILE_KV_BYTES_16BIT, profile_engine_config


def test_float32_gets_twice_the_kv_bytes_of_16_bit_precisions(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    model = str(tmp_path)
    sizes = {
        dtype: profile_engine_config(model, dtype).kv_cache_memory_bytes
        for dtype in ("bfloat16", "float16", "float32")
    }
    assert sizes == {
        "bfloat16": PROFILE_KV_BYTES_16BIT,
        "float16": PROFILE_KV_BYTES_16BIT,
        "float32": 2 * PROFILE_KV_BYTES_16BIT,
    }
    resolved = profile_engine_config(model, "auto").resolved_dtype
    assert profile_engine_config(model, "auto").kv_cache_memory_bytes == sizes[resolved]
