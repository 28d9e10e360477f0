"""Steps through static per-size buffers, the work between attentions replayed as CUDA
graphs.

On a GPU a fused-forward step of a small model is bound by kernel launches, not by the GPU:
a Llama-3.2-3B-shaped model's batch-1 forward took 11.3 ms on an H200 when its kernels were
issued one by one and 3.7 ms when the same forward was replayed as one captured CUDA graph
(batch 128: 11.6 and 5.9 ms), against a weight-read floor of 1.5 ms. A prefill chunk of
16-256 tokens is bound the same way (22-24 ms uncaptured in a later run, about its decode
step's uncaptured time). A graph fixes every shape it was captured with, and attention's
shape follows the step's contexts; so, as vLLM's piecewise graphs do, a step is cut at each
layer's attention: the work between two attentions (the output product, the MLP, the next
layer's norm, query/key/value product and RoPE; the embedding before the first, the final
norm and LM head after the last) is one graph per step size, the attention itself runs as
the engine's usual ``attend`` on the step's real rows with the step's layout (decode rows,
prefill chunks, or both).

A step of ``n`` tokens runs in the smallest size ``T >= n`` (``bucket_sizes``): its token ids
and positions are copied into the first ``n`` rows of static inputs; the other ``T - n``
rows are computed and discarded (every operation between attentions works row by row, so
they do not touch the real rows, and they never reach the KV cache, which only ``attend``
writes). The head runs on all ``T`` rows and the step's sampled rows are taken from its
output. Sizes are captured when first used. ``eager`` runs the same buffers and pieces
without capture, on any device: it checks the piecewise path where no GPU is present.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tokenpace.engine.native.attention import StepLayout
from tokenpace.engine.native.fused_forward import FusedForward

Piece = Callable[[], None]
# Turns a size's pieces (run in order, each reading what the one before left) into their
# captured replays.
Capturer = Callable[[tuple[Piece, ...], torch.device], tuple[Piece, ...]]


def bucket_sizes(max_tokens: int) -> tuple[int, ...]:
    """Step sizes (tokens) that get their own buffers and graphs, up to ``max_tokens``: 1, 2,
    4, every multiple of 8 up to 128, every multiple of 64 above, and ``max_tokens`` itself
    (padding stays under 8 rows where steps are decode batches, under 64 above)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    sizes = {1, 2, 4, *range(8, 129, 8), *range(192, max_tokens + 1, 64), max_tokens}
    return tuple(sorted(size for size in sizes if size <= max_tokens))


@dataclass(slots=True)
class _Buffers:
    """One step size's tensors: inputs copied in; the rest produced by the pieces (the
    captured outputs when pieces are graphs, fresh tensors every step when eager). Each
    layer keeps its own queries, keys and values: a graph writes them where its capture
    put them, so one layer's must not stand for another's."""

    token_ids: torch.Tensor
    positions: torch.Tensor
    attended: torch.Tensor
    qkv: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    produced: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(slots=True)
class _Size:
    buffers: _Buffers
    pieces: tuple[Piece, ...]
    # Captured sizes, until their first step: the same pieces uncaptured on their own
    # buffers, whose logits the first replay must equal.
    check: _Size | None = None


class DecodeGraphs:
    """Logits of steps of ``forward``'s model (see the module doc).

    ``capture`` replays each piece as captured by ``capturer`` (default
    ``capture_cuda_graphs``, which needs a CUDA device); without it the pieces run eagerly
    on the same buffers. A size's first captured step also runs
    uncaptured and compares: logits that differ, or a capture the device refuses, switch
    the graphs off for good (``disabled``, the reason; ``covers`` is then False and the
    engine runs its fused forward). ``__call__`` returns a view of a buffer that the next
    step of the same size overwrites: consume it first.
    """

    def __init__(
        self,
        forward: FusedForward,
        sizes: tuple[int, ...],
        device: torch.device,
        capture: bool,
        capturer: Capturer | None = None,
    ) -> None:
        if capture and capturer is None and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, got {device}")
        if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
            raise ValueError(f"sizes must be positive and increasing, got {sizes}")
        self._forward = forward
        self.sizes = sizes
        self._device = device
        self.capture = capture
        self._capturer = capturer if capturer is not None else capture_cuda_graphs
        self.disabled: str | None = None
        self._built: dict[int, _Size] = {}

    @property
    def built_sizes(self) -> tuple[int, ...]:
        """The step sizes built so far."""
        return tuple(sorted(self._built))

    def covers(self, num_tokens: int) -> bool:
        """Whether a step of ``num_tokens`` tokens fits a size (never once ``disabled``)."""
        return self.disabled is None and 0 < num_tokens <= self.sizes[-1]

    def __call__(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        layout: StepLayout,
        sample_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (model dtype, on the device) of a step of ``n`` tokens (``token_ids``,
        ``positions``: ``[n]`` on the device, in the layout's row order; decode tokens,
        prefill chunks or both): at ``sample_rows`` (``[k]``, a new tensor), or ``[n, vocab]``
        for every row when None (a view that the next step of the same size overwrites:
        consume it first)."""
        n = int(token_ids.shape[0])
        if not self.covers(n):
            raise ValueError(f"a step of {n} tokens fits no size of {self.sizes}")
        rows = next(s for s in self.sizes if s >= n)
        size = self._size(rows)
        logits = self._run(size, token_ids, positions, layout)
        if size.check is not None:
            # Attention writes this step's keys and values twice, the uncaptured pieces'
            # last: the cache ends as after one uncaptured step.
            expected = self._run(size.check, token_ids, positions, layout)
            size.check = None
            if not torch.equal(logits, expected):
                worst = float((logits.float() - expected.float()).abs().max())
                self.disabled = (
                    f"captured logits of a {rows}-token step differed from uncaptured ones "
                    f"(largest difference {worst:.3g})"
                )
                logits = expected
        return logits if sample_rows is None else logits.index_select(0, sample_rows)

    def _run(
        self, size: _Size, token_ids: torch.Tensor, positions: torch.Tensor, layout: StepLayout
    ) -> torch.Tensor:
        n = int(token_ids.shape[0])
        buffers, forward = size.buffers, self._forward
        buffers.token_ids[:n].copy_(token_ids)
        buffers.positions[:n].copy_(positions)
        for layer, piece in enumerate(size.pieces[:-1]):
            piece()
            q, k, v = buffers.qkv[layer]
            out = forward.attend(layer, q[:n], k[:n], v[:n], layout)
            buffers.attended[:n].copy_(out.reshape(n, -1))
        size.pieces[-1]()
        return buffers.produced["logits"][:n]

    def _size(self, rows: int) -> _Size:
        built = self._built.get(rows)
        if built is None:
            try:
                built = self._build(rows, self.capture)
            except RuntimeError as error:
                # A capture the device refused: this step runs the pieces uncaptured, and
                # no later step comes here (``covers`` is False once disabled).
                self.disabled = f"capturing a {rows}-token step failed: {error}"
                return self._build(rows, capture=False)
            if self.capture:
                built.check = self._build(rows, capture=False)
            self._built[rows] = built
        return built

    def _build(self, rows: int, capture: bool) -> _Size:
        device = self._device
        forward = self._forward
        buffers = _Buffers(
            token_ids=torch.zeros(rows, dtype=torch.long, device=device),
            positions=torch.zeros(rows, dtype=torch.long, device=device),
            attended=torch.zeros(rows, forward.attention_width, dtype=forward.dtype, device=device),
            qkv={},
        )
        pieces = tuple(self._piece(buffers, index) for index in range(forward.num_layers + 1))
        if capture:
            pieces = self._capturer(pieces, device)
        return _Size(buffers, pieces)

    def _piece(self, buffers: _Buffers, index: int) -> Piece:
        """Piece ``index``: the embedding (0) or the end of layer ``index - 1``, then the
        start of layer ``index`` (its queries, keys and values stored as layer
        ``index``'s) or, after the last layer, the head."""
        forward = self._forward
        last = forward.num_layers
        produced = buffers.produced
        small = forward.one_thread(int(buffers.token_ids.shape[0]))

        def run() -> None:
            if index == 0:
                x, cos, sin = forward.embed(buffers.token_ids, buffers.positions, small)
                produced["cos"], produced["sin"] = cos, sin
            else:
                x = forward.after_attention(index - 1, produced["x"], buffers.attended, small)
            produced["x"] = x
            if index == last:
                produced["logits"] = forward.head(x, small)
                return
            buffers.qkv[index] = forward.before_attention(
                index, x, produced["cos"], produced["sin"], small
            )

        return run


def capture_cuda_graphs(pieces: tuple[Piece, ...], device: torch.device) -> tuple[Piece, ...]:
    """Each piece captured as a CUDA graph in one memory pool, in order (each reads the
    outputs the previous one's capture left in place); returns their replays. A warm-up
    pass on a side stream first, as torch's graph capture asks."""
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for piece in pieces:
            piece()
    current.wait_stream(side)
    pool = torch.cuda.graph_pool_handle()
    replays = []
    for piece in pieces:
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA calls (a metrics scrape, say) do not break it.
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            piece()
        replays.append(graph.replay)
    return tuple(replays)
