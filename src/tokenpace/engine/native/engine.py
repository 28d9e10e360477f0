"""The native engine: one forward per step over a flattened mixed batch (the fused Llama
forward where it applies, else the transformers model code)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from tokenpace.core.cache import default_cache_dir
from tokenpace.core.logprobs import TokenLogprob
from tokenpace.core.request import Request
from tokenpace.core.step import ScheduledChunk, StepResult
from tokenpace.engine.attention_plan import peeled
from tokenpace.engine.kv_blocks import BlockAccountant, BlockAccountedEngine
from tokenpace.engine.native import attention
from tokenpace.engine.native.attention import (
    LAYOUT_KWARG,
    MAX_PEELED,
    PEEL_CALL_TOKENS,
    DecodeShape,
    PrefillSpan,
    StepLayout,
    attention_backends,
    attention_context,
    measure_one_thread_decode_max_keys,
    measure_products_max_len,
    score_bias,
)
from tokenpace.engine.native.bf16_rows import (
    NUMBA_ROWS,
    CompiledRows,
    RowsProduct,
    build_compiled_rows,
    compiled_rows_win,
)
from tokenpace.engine.native.compiled import KernelBuild
from tokenpace.engine.native.config import NativeEngineConfig
from tokenpace.engine.native.decode_graphs import DecodeGraphs, bucket_sizes
from tokenpace.engine.native.elementwise import (
    Elementwise,
    ElementwiseBuild,
    build_elementwise,
    compiled_elementwise_wins,
)
from tokenpace.engine.native.fused_forward import FusedForward, unsupported_reason
from tokenpace.engine.native.kv_cache import KVShape, SlotKVCache
from tokenpace.engine.native.linear_kernels import (
    FewRowsKernel,
    LinearKernel,
    PackedLinear,
    UpcastLinear,
    available_memory_bytes,
    float32_copies_fit,
    measure_few_rows,
    measure_few_rows_max_bytes,
    measure_packing_wins,
    measure_upcast_min_rows,
    packing_supported,
)
from tokenpace.engine.native.loading import LoadedModel, load_model
from tokenpace.engine.native.logprobs import token_logprobs
from tokenpace.engine.native.ragged_attention import (
    RaggedBuild,
    RaggedDecode,
    build_ragged_decode,
    ragged_wins,
)
from tokenpace.engine.native.sampler import TokenHistory, sample
from tokenpace.engine.native.small_ops import SmallOps, measure_small_ops_max_elements
from tokenpace.engine.native.stopping import should_stop
from tokenpace.workload.prompt_ids import prompt_ids

Clock = Callable[[], float]


class NativeEngine(BlockAccountedEngine):
    """Implements the Engine protocol on a transformers causal LM (CPU or CUDA).

    Blocks are accounted by a ``BlockAccountant`` (``config.num_blocks`` blocks of
    ``config.block_size`` tokens); storage is a ``SlotKVCache``. ``execute`` runs one forward
    pass: every chunk's tokens, logits only at the last token of requests that complete
    this step, a sampled token for each of them, EOS / stop-string checks. ``latency_s`` is
    the wall time of the whole step on ``clock`` (seconds, device synchronised).
    A request's prompt is its ``prompt_token_ids`` (length ``num_prompt_tokens``), else its
    ``prompt`` text tokenized and fitted to ``num_prompt_tokens``, else synthetic ids.
    After each step, ``step_logprobs`` holds the sampled token's ``TokenLogprob`` of every
    request whose sampling asks for ``logprobs``, and ``step_prompt_logprobs`` the entries
    of the prompt tokens that step's chunk predicted, as (prompt position of the first
    entry, entries in order), for requests that ask for ``prompt_logprobs``; both are
    replaced by the next step.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        config: NativeEngineConfig,
        clock: Clock,
        rng: np.random.Generator,
        ragged: RaggedBuild | None = None,
        elementwise: ElementwiseBuild | None = None,
        rows: KernelBuild[CompiledRows] | None = None,
    ) -> None:
        self.loaded = loaded
        self.config = config
        self._clock = clock
        self._base_seed = int(rng.integers(0, 2**62))
        self._model = loaded.model
        self._model.set_attn_implementation(attention.register())
        self._fused: FusedForward | None = None
        self.upcast_min_rows: int | None = None
        self.bf16_rows_max_tokens = 0
        self._kernel: LinearKernel | None = None
        self.small_ops = SmallOps(self._choose_small_ops_max_elements())
        self.elementwise_build = elementwise or ElementwiseBuild(
            None, "no elementwise kernel was built"
        )
        self.rows_build = rows or KernelBuild(None, "no compiled few-rows product was built")
        if config.fused_forward and unsupported_reason(self._model) is None:
            # The first layer's gate projection: the largest kind of product in a layer.
            probe = self._model.model.layers[0].mlp.gate_proj.weight
            self._kernel = self._choose_kernel(probe)
            self._fused = FusedForward(
                self._model,
                self._kernel,
                self.small_ops,
                self._choose_elementwise(self.elementwise_build),
            )
        elif config.elementwise == "compiled":
            raise ValueError(
                "elementwise compiled: the elementwise kernel runs inside the fused forward, "
                "which is off or cannot run this model"
            )
        model_config = self._model.config
        head_dim = getattr(model_config, "head_dim", None) or (
            model_config.hidden_size // model_config.num_attention_heads
        )
        self._cache = SlotKVCache(
            KVShape(model_config.num_hidden_layers, model_config.num_key_value_heads, head_dim),
            dtype=loaded.dtype,
            device=loaded.device,
            max_slots=config.max_num_seqs,
            max_positions=config.max_model_len,
        )
        self._max_running = config.max_num_seqs
        self.ragged_build = ragged or RaggedBuild(None, "no ragged decode kernel was built")
        self._ragged = self._choose_ragged(self.ragged_build)
        self.decode_products_max_len = (
            None if self._ragged is not None else self._choose_decode_attention()
        )
        self.decode_one_thread_max_keys = self._choose_decode_one_thread()
        self._decode_graphs = self._choose_decode_graphs()
        self._attention_backends = attention_backends(loaded.device.type, config.cudnn_attention)
        self._blocks = BlockAccountant(config.num_blocks, config.block_size)
        self.step_logprobs: dict[int, TokenLogprob] = {}
        self.step_prompt_logprobs: dict[int, tuple[int, list[TokenLogprob]]] = {}

    @classmethod
    def load(
        cls,
        config: NativeEngineConfig,
        clock: Clock = time.perf_counter,
        rng: np.random.Generator | None = None,
    ) -> NativeEngine:
        """Load ``config.model`` (see ``load_model``) and build the engine on it; where
        ``config.decode_attention`` may take the ragged decode kernel, and where
        ``config.elementwise`` may take the compiled elementwise kernel, build it (once per
        machine, whatever the model: cached under the user cache dir's ``kernels``,
        ``core.cache.default_cache_dir``) or learn why it cannot be; likewise the compiled
        few-rows product where ``config.bf16_rows_max_tokens`` may read bfloat16 weights."""
        loaded = load_model(config, clock)
        kernels = default_cache_dir() / "kernels"
        ragged = None
        if config.decode_attention in ("auto", "ragged"):
            ragged = build_ragged_decode(kernels, loaded.device, loaded.dtype)
        elementwise = rows = None
        if config.fused_forward and config.elementwise in ("auto", "compiled"):
            elementwise = build_elementwise(kernels, loaded.device, loaded.dtype)
        if config.fused_forward and config.bf16_rows_max_tokens != 0:
            rows = build_compiled_rows(kernels, loaded.device, loaded.dtype)
        rng = rng if rng is not None else np.random.default_rng(0)
        return cls(loaded, config, clock, rng, ragged, elementwise, rows)

    def _choose_kernel(self, weight: torch.Tensor) -> LinearKernel:
        """The projections' kernel: float32 products from ``upcast_min_rows`` tokens when
        that is configured or measured to win (on packed float32 copies unless
        ``pack_weights`` is off or oneDNN cannot pack them), else packed weights when
        ``pack_weights`` says so (``on``) or they are measured to win (``auto``), else
        torch's product; either way steps of few tokens may read bfloat16 weights
        themselves (``_with_bf16_rows``)."""
        packed_upcast = self._packs_upcast(weight)
        self.upcast_min_rows = self._choose_upcast(weight, packed_upcast)
        kernel: FewRowsKernel
        if self.upcast_min_rows is None and self._choose_packing(weight):
            kernel = PackedLinear()
        else:
            kernel = UpcastLinear(
                self.upcast_min_rows, packed=packed_upcast, small_ops=self.small_ops
            )
        return self._with_bf16_rows(kernel)

    def _with_bf16_rows(self, kernel: FewRowsKernel) -> FewRowsKernel:
        """``kernel`` reading bfloat16 weights themselves, on the calling thread, up to
        ``bf16_rows_max_tokens`` step tokens (``bf16_rows``): with a configured count for
        every weight; with ``-1``, for bfloat16 weights on the CPU, for the weights of at
        most the size measured at one row over every layer's output and gate projections,
        its gate and up projections as the fused forward holds them (one weight), and the
        LM head (``measure_few_rows_max_bytes``), up to the count measured against
        ``kernel`` over those weights (``measure_few_rows``). A positive count is refused,
        naming why, for other weights."""
        setting = self.config.bf16_rows_max_tokens
        readable = self.loaded.device.type == "cpu" and self.loaded.dtype == torch.bfloat16
        if setting > 0 and not readable:
            raise ValueError(
                "NativeEngineConfig.bf16_rows_max_tokens needs bfloat16 weights on the CPU, "
                f"got {self.loaded.dtype} on {self.loaded.device}; use -1 or 0"
            )
        if setting == 0 or not readable:
            return kernel
        layers = self._model.model.layers
        kernel = replace(
            kernel, rows=self._choose_rows([layer.mlp.gate_proj.weight for layer in layers])
        )
        if setting > 0:
            self.bf16_rows_max_tokens = setting
            every_weight = self.loaded.weight_bytes
            return replace(kernel, few_rows=setting, few_rows_max_bytes=every_weight)
        groups = [
            [layer.self_attn.o_proj.weight for layer in layers],
            [layer.mlp.gate_proj.weight for layer in layers],
            [torch.cat((layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight)) for layer in layers],
            [self._model.lm_head.weight],
        ]
        max_bytes = measure_few_rows_max_bytes(kernel, groups, self._clock)
        if not max_bytes:
            return kernel
        limited = replace(kernel, few_rows_max_bytes=max_bytes)
        taken = [w for group in groups for w in group if w.numel() * 2 <= max_bytes]
        self.bf16_rows_max_tokens = measure_few_rows(limited, taken, self._clock)
        return replace(limited, few_rows=self.bf16_rows_max_tokens)

    def _choose_rows(self, weights: list[torch.Tensor]) -> RowsProduct:
        """The few-rows product: the compiled kernel where it was built and a pass of
        one-row products with ``weights`` finds it faster than numba's loop
        (``compiled_rows_win``), else numba's."""
        compiled = self.rows_build.kernel
        if compiled is None or not compiled_rows_win(compiled, weights, self._clock):
            return NUMBA_ROWS
        return compiled

    def _choose_small_ops_max_elements(self) -> int:
        """Up to how many elements a step's elementwise work runs on one thread (see
        ``small_ops``): the configured value, else on the CPU measured at load
        (``measure_small_ops_max_elements``); 0 on other devices, whose kernels do not
        split work over CPU threads."""
        setting = self.config.small_ops_max_elements
        if setting >= 0:
            return setting
        if self.loaded.device.type != "cpu":
            return 0
        return measure_small_ops_max_elements(self._clock)

    def _packs_upcast(self, weight: torch.Tensor) -> bool:
        """Whether float32 products, where they are used, read packed float32 copies: for
        reduced-precision weights on the CPU where oneDNN can pack float32, with ``on``, or
        with ``auto`` where the copies take at most half the available memory
        (``float32_copies_fit``); ``on`` refuses, naming why, where oneDNN cannot."""
        setting = self.config.pack_weights
        if setting == "off" or self.loaded.device.type != "cpu":
            return False
        if weight.dtype == torch.float32:
            return False
        unsupported = packing_supported(torch.float32)
        if setting == "on":
            if unsupported is not None:
                raise ValueError(
                    "NativeEngineConfig.pack_weights='on': this machine cannot pack the "
                    f"float32 copies of upcast products ({unsupported}); use 'auto' or 'off'"
                )
            return True
        return unsupported is None and float32_copies_fit(
            self.loaded.weight_bytes, weight.dtype, available_memory_bytes()
        )

    def _choose_packing(self, weight: torch.Tensor) -> bool:
        """Whether the projections read weights packed into oneDNN's layout: on the CPU,
        always with ``on`` (refused, naming why, where oneDNN cannot pack ``weight``'s
        dtype), with ``auto`` where packing is measured to win (``measure_packing_wins``)
        and, for float32 weights, whose packed copy is as large as the weights, where that
        copy takes at most half the available memory (``float32_copies_fit``)."""
        setting = self.config.pack_weights
        if setting == "off":
            return False
        on_cpu = self.loaded.device.type == "cpu"
        if setting == "on":
            if not on_cpu:
                raise ValueError(
                    "NativeEngineConfig.pack_weights='on' needs the CPU (oneDNN's layout), "
                    f"got {self.loaded.device}"
                )
            unsupported = packing_supported(weight.dtype)
            if unsupported is not None:
                raise ValueError(
                    f"NativeEngineConfig.pack_weights='on': this machine cannot pack "
                    f"{weight.dtype} weights ({unsupported}); use 'auto' or 'off'"
                )
            return True
        if not on_cpu:
            return False
        if weight.dtype == torch.float32 and not float32_copies_fit(
            self.loaded.weight_bytes, weight.dtype, available_memory_bytes()
        ):
            return False
        # Every layer's gate projection: a pass over more bytes than the caches hold.
        gates = [layer.mlp.gate_proj.weight for layer in self._model.model.layers]
        return measure_packing_wins(gates, self._clock)

    @property
    def projection_kernel(self) -> LinearKernel | None:
        """The fused forward's projection kernel; None when the model's own code runs."""
        return self._kernel

    @property
    def few_rows_product(self) -> str:
        """How products of few rows read bfloat16 weights (``bf16_rows``): ``numba`` or
        ``compiled``; ``none`` where they do not."""
        kernel = self._kernel
        if not self.bf16_rows_max_tokens or not isinstance(kernel, UpcastLinear | PackedLinear):
            return "none"
        return kernel.rows.name

    @property
    def linear_kernel(self) -> str:
        """The projection kernel's name (``plain``, ``upcast``, ``upcast-packed`` or
        ``packed``), or ``transformers`` when the model's own code runs."""
        return self._kernel.name if self._kernel is not None else "transformers"

    def _choose_upcast(self, weight: torch.Tensor, packed: bool) -> int | None:
        """From how many step tokens projections run in float32 (None: never): the
        configured value, else measured on this CPU for reduced-precision weights (with the
        float32 product taken from packed copies when ``packed``)."""
        setting = self.config.upcast_min_tokens
        if setting >= 0:
            return setting or None
        if self.loaded.device.type != "cpu" or weight.dtype == torch.float32:
            return None
        return measure_upcast_min_rows(weight, self._clock, packed=packed)

    def _choose_decode_attention(self) -> int | None:
        """Up to which padded context a step's decode attention runs as batched products
        (None: never, the fused SDPA kernel throughout): every context with ``products``,
        none with ``sdpa``, and with ``auto`` the longest where products are measured to
        win (``measure_products_max_len``) on the CPU with float32 KV. Elsewhere SDPA: a
        GPU's fused kernel never materialises the scores, and reduced-precision products
        would round the scores before the softmax."""
        setting = self.config.decode_attention
        if setting != "auto":
            return self.config.max_model_len if setting == "products" else None
        if self.loaded.device.type != "cpu" or self.loaded.dtype != torch.float32:
            return None
        return measure_products_max_len(
            self._decode_shape(), torch.float32, self.config.max_model_len, self._clock
        )

    def _choose_ragged(self, build: RaggedBuild) -> RaggedDecode | None:
        """The ragged decode kernel when ``decode_attention`` is ``ragged`` (refused with
        the build's reason when there is none) or ``auto`` and it is measured to win over
        the padded SDPA call (``ragged_wins``); else None."""
        setting = self.config.decode_attention
        if setting == "ragged" and build.kernel is None:
            raise ValueError(f"decode_attention ragged: {build.reason}")
        if setting not in ("auto", "ragged") or build.kernel is None:
            return None
        if setting == "ragged":
            return build.kernel
        shape = self._decode_shape()
        wins = ragged_wins(
            build.kernel, shape.num_kv_heads, shape.group, shape.head_dim, self.loaded.dtype,
            self.config.max_model_len, self._clock,
        )  # fmt: skip
        return build.kernel if wins else None

    def _choose_elementwise(self, build: ElementwiseBuild) -> Elementwise | None:
        """The compiled elementwise kernel when ``elementwise`` is ``compiled`` (refused
        with the build's reason when there is none) or ``auto`` and it is measured to win
        over torch's operations (``compiled_elementwise_wins``); else None (torch's)."""
        setting = self.config.elementwise
        if setting == "compiled" and build.kernel is None:
            raise ValueError(f"elementwise compiled: {build.reason}")
        if setting == "torch" or build.kernel is None:
            return None
        if setting == "compiled":
            return build.kernel
        widths = FusedForward.widths(self._model.config)
        wins = compiled_elementwise_wins(build.kernel, widths, self.loaded.dtype, self._clock)
        return build.kernel if wins else None

    def _choose_decode_one_thread(self) -> int:
        """Up to how many keys in all a step's padded decode attention runs on the calling
        thread: the configured value, else on the CPU measured at load
        (``measure_one_thread_decode_max_keys``); 0 on other devices."""
        setting = self.config.decode_one_thread_max_keys
        if setting >= 0:
            return setting
        if self.loaded.device.type != "cpu":
            return 0
        return measure_one_thread_decode_max_keys(
            self._decode_shape(), self.loaded.dtype, self.config.max_model_len, self._clock
        )

    def _decode_shape(self) -> DecodeShape:
        shape = self._cache.shape
        group = self._model.config.num_attention_heads // shape.num_kv_heads
        return DecodeShape(shape.num_kv_heads, group, shape.head_dim)

    def _choose_decode_graphs(self) -> DecodeGraphs | None:
        """Steps of up to ``graph_max_tokens`` tokens (decode steps of up to ``max_num_seqs``)
        through per-size buffers (``decode_graphs``): captured as CUDA
        graphs with ``on`` (refused, naming why, off CUDA or without the fused forward)
        and with ``auto`` on CUDA; uncaptured with ``eager``; None otherwise."""
        setting = self.config.decode_graphs
        device = self.loaded.device
        if setting == "on" and (device.type != "cuda" or self._fused is None):
            raise ValueError(
                "NativeEngineConfig.decode_graphs='on' needs the fused forward on a CUDA "
                f"device, got {self.forward_path} on {device}; use 'auto', 'eager' or 'off'"
            )
        if self._fused is None or setting == "off" or (setting == "auto" and device.type != "cuda"):
            return None
        sizes = bucket_sizes(max(self.config.max_num_seqs, self.config.graph_max_tokens))
        return DecodeGraphs(self._fused, sizes, device, capture=setting != "eager")

    @property
    def decode_graphs(self) -> str:
        """How steps the graphs cover run: ``captured`` (CUDA graphs between attentions),
        ``eager`` (the same pieces uncaptured) or ``off`` (the fused forward's own call;
        with the reason in parentheses where captured logits differed and switched the
        graphs off)."""
        graphs = self._decode_graphs
        if graphs is None:
            return "off"
        if graphs.disabled is not None:
            return f"off ({graphs.disabled})"
        return "captured" if graphs.capture else "eager"

    @property
    def sdpa_backends(self) -> str:
        """The SDPA backends attention may use: ``default`` (torch's order) or their names."""
        backends = self._attention_backends
        return "default" if backends is None else ",".join(b.name.lower() for b in backends)

    @contextmanager
    def decode_graphs_paused(self) -> Iterator[None]:
        """Within this context every step runs the fused forward's own call, as with
        ``decode_graphs='off'`` (for comparisons on one loaded model); the graphs built
        so far are kept for after it."""
        saved, self._decode_graphs = self._decode_graphs, None
        try:
            yield
        finally:
            self._decode_graphs = saved

    @property
    def decode_graph_sizes(self) -> tuple[int, ...]:
        """Step sizes whose buffers (and graphs) were built so far."""
        return () if self._decode_graphs is None else self._decode_graphs.built_sizes

    @property
    def decode_attention(self) -> str:
        """How decode attention runs: ``ragged`` (the compiled kernel, each request over
        its own context), else padded: ``sdpa``, or ``products<=N`` (batched products up
        to a context of N keys, SDPA beyond)."""
        if self._ragged is not None:
            return "ragged"
        limit = self.decode_products_max_len
        return "sdpa" if limit is None else f"products<={limit}"

    @property
    def elementwise(self) -> str:
        """How the fused forward's elementwise work runs: ``torch`` or ``compiled``; ``none``
        without the fused forward."""
        return "none" if self._fused is None else self._fused.elementwise

    @property
    def forward_path(self) -> str:
        """``"fused"`` (see ``fused_forward``) or ``"transformers"`` (the model's own code)."""
        return "fused" if self._fused is not None else "transformers"

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    @property
    def kv_bytes_per_token(self) -> int:
        return self._cache.bytes_per_token

    @property
    def num_active_slots(self) -> int:
        return self._cache.num_active

    def free(self, request_id: int) -> None:
        self._blocks.free(request_id)
        self._cache.release(request_id)

    def fill_context(self, request: Request, num_tokens: int) -> None:
        """Profiling aid: mark ``num_tokens`` more tokens of ``request`` as computed without
        running the model (blocks allocated, KV contents left arbitrary), so a sweep can time
        decode steps at long contexts without paying their prefill."""
        _ensure_prompt_ids(request, self.tokenizer)
        self._blocks.allocate(request, num_tokens)
        slot = self._cache.assign(request.request_id)
        end = request.num_computed_tokens + num_tokens
        self._cache.ensure(self._cache.num_active, end)
        request.num_computed_tokens = end
        self._cache.set_length(slot, end)

    def execute(self, chunks: Sequence[ScheduledChunk]) -> StepResult:
        start = self._clock()
        for chunk in chunks:
            self._admit_chunk(chunk)
        num_prefill = sum(c.num_tokens for c in chunks if c.request.is_prefilling)
        num_decode = sum(1 for c in chunks if not c.request.is_prefilling)
        decode = sorted(
            (c for c in chunks if c.num_tokens == 1),
            key=lambda c: self._slot(c.request),
        )
        # Fresh chunks of one length side by side attend in one call (``FreshRun``).
        prefill = sorted(
            (c for c in chunks if c.num_tokens > 1),
            key=lambda c: (c.request.num_computed_tokens > 0, c.num_tokens),
        )
        ordered = [*decode, *prefill]
        token_ids: list[int] = []
        positions: list[int] = []
        sample_rows: list[int] = []
        sampled_requests: list[Request] = []
        # (request, first row, position of its first predicted token, predicted tokens)
        prompt_rows: list[tuple[Request, int, int, list[int]]] = []
        for chunk in ordered:
            request = chunk.request
            first = request.num_computed_tokens
            row = len(token_ids)
            token_ids.extend(_token_ids(request, first, first + chunk.num_tokens))
            positions.extend(range(first, first + chunk.num_tokens))
            if first + chunk.num_tokens == request.num_tokens:
                sample_rows.append(len(token_ids) - 1)
                sampled_requests.append(request)
            if request.sampling.prompt_logprobs is not None:
                # Row i predicts the token at position first + i + 1: within the prompt?
                prompt = request.prompt_token_ids or []
                end = min(first + chunk.num_tokens, len(prompt) - 1)
                if end > first:
                    prompt_rows.append((request, row, first + 1, list(prompt[first + 1 : end + 1])))
        layout = self._layout(decode, prefill)
        extra_rows = [r + i for _, r, _, nexts in prompt_rows for i in range(len(nexts))]
        all_logits = self._forward(token_ids, positions, [*sample_rows, *extra_rows], layout)
        logits = _HostRows(all_logits[: len(sample_rows)])
        self._prompt_logprobs(prompt_rows, _HostRows(all_logits[len(sample_rows) :]).all())
        self.step_logprobs = {}
        for chunk in chunks:
            chunk.request.num_computed_tokens += chunk.num_tokens
            self._cache.set_length(self._slot(chunk.request), chunk.request.num_computed_tokens)
        sampled: dict[int, int] = {}
        stopped: set[int] = set()
        for row, request in enumerate(sampled_requests):
            seed = request.sampling.seed
            if seed is None:
                seed = self._base_seed + request.request_id
            params = request.sampling
            index = params.first_output_index + request.num_output_tokens
            banned = (
                self.loaded.eos_token_ids | frozenset(params.stop_token_ids)
                if index < params.min_tokens
                else frozenset()
            )
            plain = not (banned or params.logit_bias or params.has_penalties)
            if params.is_greedy and plain:
                token = logits.argmax(row)
            else:
                history = None
                if params.has_penalties:
                    history = TokenHistory.of(
                        request.prompt_token_ids or [],
                        request.output_token_ids,
                        params.first_output_index,
                    )
                token = sample(logits.row(row), params, seed, index, banned, history)
            sampled[request.request_id] = token
            if params.logprobs is not None:
                entry = token_logprobs(logits.rows(row, row + 1), [token], params.logprobs)[0]
                self.step_logprobs[request.request_id] = entry
            if should_stop(
                self.tokenizer,
                self.loaded.eos_token_ids,
                request.sampling,
                request.output_token_ids,
                token,
            ):
                stopped.add(request.request_id)
        if self.loaded.device.type == "cuda":
            torch.cuda.synchronize(self.loaded.device)
        return StepResult(
            latency_s=self._clock() - start,
            sampled_token_ids=sampled,
            stopped_ids=frozenset(stopped),
            num_prefill_tokens=num_prefill,
            num_decode_tokens=num_decode,
            num_used_blocks=self._blocks.num_used_blocks,
            num_total_blocks=self._blocks.num_total_blocks,
        )

    def _prompt_logprobs(
        self, prompt_rows: list[tuple[Request, int, int, list[int]]], logits: torch.Tensor
    ) -> None:
        self.step_prompt_logprobs = {}
        offset = 0
        for request, _, start, nexts in prompt_rows:
            rows = logits[offset : offset + len(nexts)]
            offset += len(nexts)
            entries = token_logprobs(rows, nexts, request.sampling.prompt_logprobs or 0)
            self.step_prompt_logprobs[request.request_id] = (start, entries)

    def _admit_chunk(self, chunk: ScheduledChunk) -> None:
        request = chunk.request
        if chunk.num_tokens <= 0 or chunk.num_tokens > request.num_uncomputed_tokens:
            raise ValueError(
                f"request {request.request_id}: cannot compute {chunk.num_tokens} tokens "
                f"({request.num_uncomputed_tokens} uncomputed)"
            )
        _ensure_prompt_ids(request, self.tokenizer)
        self._blocks.allocate(request, chunk.num_tokens)
        self._cache.assign(request.request_id)

    def _slot(self, request: Request) -> int:
        slot = self._cache.slot_of(request.request_id)
        assert slot is not None, f"request {request.request_id} holds no KV slot"
        return slot

    def _layout(self, decode: list[ScheduledChunk], prefill: list[ScheduledChunk]) -> StepLayout:
        device = self.loaded.device
        ends = [c.request.num_computed_tokens + c.num_tokens for c in (*decode, *prefill)]
        self._cache.ensure(self._cache.num_active, max(ends))
        slots = [self._slot(c.request) for c in decode]
        lengths = [c.request.num_computed_tokens + 1 for c in decode]
        span = slots[-1] + 1 if slots else 0
        ragged = self._ragged if decode else None
        peeled_rows: list[int] = []
        bias = None
        if ragged is not None:  # each request over its own keys: nothing padded
            max_len = max(lengths)
            visible = torch.ones((0, max_len), dtype=torch.bool)
            attended_keys = sum(lengths)
        else:
            # The longest few may be attended on their own; the padded call covers the
            # rest up to the longest of them.
            longest_first = sorted(range(len(lengths)), key=lambda i: -lengths[i])
            num_peeled, _ = peeled(
                [lengths[i] for i in longest_first], span, MAX_PEELED, PEEL_CALL_TOKENS
            )
            peeled_rows = longest_first[:num_peeled]
            max_len = lengths[longest_first[num_peeled]] if lengths else 0
            # Slots that sit this step out still see one key: a fully masked row gives NaN.
            span_lengths = torch.ones(span, dtype=torch.long)
            span_lengths[slots] = torch.tensor(lengths, dtype=torch.long)
            visible = torch.arange(max_len)[None, :] < span_lengths[:, None]
            attended_keys = span * max_len
            # One row attends faster through SDPA without a mask than as products.
            limit = self.decode_products_max_len
            if limit is not None and span > 1 and 0 < max_len <= limit:
                bias = score_bias(visible, self._cache.shape.num_kv_heads, self.loaded.dtype)
        spans: list[PrefillSpan] = []
        row = len(decode)
        write_rows = list(range(len(decode)))
        write_slots, write_positions = list(slots), [n - 1 for n in lengths]
        for chunk in prefill:
            start, slot = chunk.request.num_computed_tokens, self._slot(chunk.request)
            prefill_span = PrefillSpan.of(row, chunk.num_tokens, slot, start, device)
            spans.append(prefill_span)
            if not prefill_span.write_by_slice:
                write_rows += range(row, row + chunk.num_tokens)
                write_slots += [slot] * chunk.num_tokens
                write_positions += range(start, start + chunk.num_tokens)
            row += chunk.num_tokens
        return StepLayout(
            cache=self._cache,
            decode_slots=torch.tensor(slots, dtype=torch.long, device=device),
            decode_positions=torch.tensor(
                write_positions[: len(decode)], dtype=torch.long, device=device
            ),
            write_rows=torch.tensor(write_rows, dtype=torch.long, device=device),
            write_slots=torch.tensor(write_slots, dtype=torch.long, device=device),
            write_positions=torch.tensor(write_positions, dtype=torch.long, device=device),
            decode_visible=visible.to(device),
            decode_max_len=max_len,
            decode_is_dense=slots == list(range(span)),
            prefills=tuple(spans),
            decode_peeled=tuple((row, slots[row], lengths[row]) for row in peeled_rows),
            decode_bias=None if bias is None else bias.to(device),
            decode_all_visible=bool(visible.all()),
            decode_one_thread=0 < attended_keys <= self.decode_one_thread_max_keys,
            decode_ragged=ragged,
            decode_lengths=(
                torch.tensor(lengths, dtype=torch.long, device=device)
                if ragged is not None
                else None
            ),
        )

    def _forward(
        self,
        token_ids: list[int],
        positions: list[int],
        sample_rows: list[int],
        layout: StepLayout,
    ) -> torch.Tensor:
        """Logits ``[len(sample_rows), vocab]`` at the given flattened rows: float32 on the
        CPU; on other devices left there (model dtype), for ``_HostRows`` to bring over
        only what sampling needs. Through the decode graphs where they cover the step."""
        device = self.loaded.device
        if self._fused is not None:
            with torch.inference_mode(), attention_context(self._attention_backends):
                ids = torch.tensor(token_ids, dtype=torch.long, device=device)
                at = torch.tensor(positions, dtype=torch.long, device=device)
                graphs = self._decode_graphs
                if graphs is not None and graphs.covers(len(token_ids)):
                    # A decode-only step samples every row in order: no rows to pick.
                    every_row = sample_rows == list(range(len(token_ids)))
                    rows = None if every_row else _device_rows(sample_rows, device)
                    fused = graphs(ids, at, layout, rows)
                else:
                    fused = self._fused(ids, at, _device_rows(sample_rows, device), layout)
                if device.type != "cpu":
                    return fused
                with self.small_ops.one_thread(fused.numel()):
                    return fused.float().cpu()
        with torch.inference_mode(), attention_context(self._attention_backends):
            out = self._model(
                input_ids=torch.tensor([token_ids], dtype=torch.long, device=device),
                position_ids=torch.tensor([positions], dtype=torch.long, device=device),
                logits_to_keep=torch.tensor(sample_rows, dtype=torch.long, device=device),
                use_cache=False,
                **{LAYOUT_KWARG: layout},
            )
        logits: torch.Tensor = out.logits[0]
        return logits.float().cpu() if device.type == "cpu" else logits


def _device_rows(rows: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long, device=device)


class _HostRows:
    """A step's logits ``[rows, vocab]`` as sampling reads them: on the CPU the float32
    tensor itself; on another device, greedy choices taken there in one call for all rows
    (one small copy instead of every row's vocabulary), and a row brought over (float32)
    only when sampling or logprobs need it."""

    def __init__(self, logits: torch.Tensor) -> None:
        self._logits = logits
        self._on_cpu = logits.device.type == "cpu"
        self._argmax: list[int] | None = None

    def argmax(self, row: int) -> int:
        """The row's first largest logit (numpy's argmax on the CPU, a fraction of torch's
        cost there; torch's, which also takes the first of equal maxima, elsewhere)."""
        if self._on_cpu:
            return int(self._logits[row].numpy().argmax())
        if self._argmax is None:
            self._argmax = self._logits.argmax(dim=-1).tolist()
        return self._argmax[row]

    def row(self, row: int) -> torch.Tensor:
        """Row ``row`` (``[vocab]``, float32, CPU)."""
        return self.rows(row, row + 1)[0]

    def rows(self, start: int, end: int) -> torch.Tensor:
        """Rows ``start .. end - 1`` (float32, CPU)."""
        if self._on_cpu:
            return self._logits[start:end]
        return self._logits[start:end].float().cpu()

    def all(self) -> torch.Tensor:
        """Every row (float32, CPU)."""
        return self.rows(0, int(self._logits.shape[0]))


def _ensure_prompt_ids(request: Request, tokenizer: Any) -> None:
    """Give ``request`` prompt token ids of length ``num_prompt_tokens``: its own ids (which
    must have that length), its tokenized prompt text cut or padded with synthetic ids to
    that length (workloads count prompt tokens with their own tokenizer), or synthetic ids."""
    n = request.num_prompt_tokens
    if request.prompt_token_ids is None:
        encode = None if tokenizer is None else tokenizer.encode
        try:
            ids = prompt_ids(n, request.request_id, request.prompt, encode)
        except ValueError as error:
            raise ValueError(f"request {request.request_id}: {error}") from None
        request.prompt_token_ids = ids
    if len(request.prompt_token_ids) != n:
        raise ValueError(
            f"request {request.request_id}: prompt has {len(request.prompt_token_ids)} tokens, "
            f"num_prompt_tokens says {n}"
        )


def _token_ids(request: Request, first: int, end: int) -> list[int]:
    """Token ids at positions ``first .. end - 1`` of prompt + output."""
    prompt = request.prompt_token_ids
    assert prompt is not None
    tokens = prompt[first:end]
    if end > len(prompt):
        start_out = max(0, first - len(prompt))
        tokens = [*tokens, *request.output_token_ids[start_out : end - len(prompt)]]
    return tokens
