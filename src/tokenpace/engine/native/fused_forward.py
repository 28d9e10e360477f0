"""A Llama-family forward for the native engine's flattened step, with fewer and larger ops.

transformers' model code spends about as long in Python and small tensor ops per layer as
in the weight reads that bound a small-batch step. This forward runs the same arithmetic on
the same weights with the per-layer work cut down: the query, key and value projections are
one matrix product (their weights concatenated once, the model's own parameters becoming
views of the result, so no memory is added; a kernel that packs weights, such as
``linear_kernels.PackedLinear``, holds its own copy), so are the gate and up projections; RoPE turns
queries and keys together in three elementwise ops; attention is called directly (no
attention-interface dispatch, no keyword plumbing); the final norm and the LM head run on the
sampled rows only. The elementwise work between the products runs as its ``Elementwise``
says: by default torch's operations, the model code's arithmetic operation for operation
(only the matrix products are grouped differently), or the compiled kernel that does each
piece in one pass (``elementwise.CompiledElementwise``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from tokenpace.engine.native.attention import StepLayout, attend
from tokenpace.engine.native.elementwise import Elementwise, LayerWidths, TorchElementwise
from tokenpace.engine.native.linear_kernels import LinearKernel, PreparedWeight, UpcastLinear
from tokenpace.engine.native.small_ops import NO_SMALL_OPS, SmallOps

SUPPORTED_MODEL_TYPES = frozenset({"llama"})
# ``hidden_act`` names of SiLU in transformers' activation table.
SILU_NAMES = frozenset({"silu", "swish"})


def unsupported_reason(model: Any) -> str | None:
    """Why ``model`` cannot take the fused forward, or None when it can."""
    model_type = getattr(model.config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model type {model_type!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)
        if any(p.bias is not None for p in (*projections, mlp.gate_proj, mlp.up_proj)):
            return "biased projections are not fused"
    return None


def _fuse(*linears: Any) -> torch.Tensor:
    """Concatenate the weights of ``linears`` (output rows) and rebind each module's weight
    to its view of the result, so the model keeps working and holds one copy."""
    fused = torch.cat([linear.weight.data for linear in linears], dim=0)
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = fused[start : start + rows]
        start += rows
    return fused


@dataclass(frozen=True, slots=True)
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: PreparedWeight
    o: PreparedWeight
    gate_up: PreparedWeight
    down: PreparedWeight
    act: Any
    scale: float


class FusedForward:
    """Logits of a Llama-family model for one flattened step (see the module doc).

    Construction fuses the weights in place (the model stays usable by its own code).
    ``kernel`` computes every projection (default torch's product; see
    ``linear_kernels``), on the weights it prepared at construction. The elementwise work
    between products runs by ``elementwise`` (default torch's operations), threaded as
    ``small_ops`` says (on one thread for small steps); a layer whose activation is not
    SiLU runs its own activation. Raises ValueError with the reason when
    ``unsupported_reason(model)`` is not None.
    """

    def __init__(
        self,
        model: Any,
        kernel: LinearKernel | None = None,
        small_ops: SmallOps = NO_SMALL_OPS,
        elementwise: Elementwise | None = None,
    ) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the fused forward cannot run this model: {reason}")
        config = model.config
        chosen: LinearKernel = kernel if kernel is not None else UpcastLinear(None)
        prepare = chosen.prepare
        self._linear = chosen
        self._small_ops = small_ops
        self._elementwise: Elementwise = (
            elementwise if elementwise is not None else TorchElementwise()
        )
        self._inner = model.model
        self._lm_head = prepare(model.lm_head.weight)
        self._eps = float(config.rms_norm_eps)
        widths = self.widths(config)
        self._num_heads, self._num_kv_heads = widths.heads, widths.kv_heads
        self._head_dim = widths.head_dim
        # The MLP's activation as transformers' Llama code builds it (``ACT2FN[hidden_act]``).
        self._silu = getattr(config, "hidden_act", None) in SILU_NAMES
        self._layers = [
            _Layer(
                input_norm=layer.input_layernorm.weight,
                post_norm=layer.post_attention_layernorm.weight,
                qkv=prepare(
                    _fuse(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
                ),
                o=prepare(layer.self_attn.o_proj.weight),
                gate_up=prepare(_fuse(layer.mlp.gate_proj, layer.mlp.up_proj)),
                down=prepare(layer.mlp.down_proj.weight),
                act=layer.mlp.act_fn,
                scale=float(layer.self_attn.scaling),
            )
            for layer in self._inner.layers
        ]
        # Per token, the most elements any elementwise operation of a layer touches.
        self._widest = max(
            widths.hidden,
            widths.intermediate,
            (widths.heads + 2 * widths.kv_heads) * widths.head_dim,
        )

    @property
    def elementwise(self) -> str:
        """The name of the way the elementwise work runs (``torch`` or ``compiled``)."""
        return self._elementwise.name

    @staticmethod
    def widths(config: Any) -> LayerWidths:
        """The widths of a layer's elementwise work for a model of ``config``."""
        heads = int(config.num_attention_heads)
        return LayerWidths(
            hidden=int(config.hidden_size),
            heads=heads,
            kv_heads=int(config.num_key_value_heads),
            head_dim=int(getattr(config, "head_dim", None) or config.hidden_size // heads),
            intermediate=int(config.intermediate_size),
        )

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    @property
    def dtype(self) -> torch.dtype:
        """The hidden states' dtype (the embedding's)."""
        dtype: torch.dtype = self._inner.embed_tokens.weight.dtype
        return dtype

    @property
    def attention_width(self) -> int:
        """Elements of one token's attention output (query heads x head size)."""
        return self._num_heads * self._head_dim

    def __call__(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        sample_rows: torch.Tensor,
        layout: StepLayout,
    ) -> torch.Tensor:
        """``token_ids`` and ``positions`` are ``[tokens]`` in the layout's row order;
        returns the logits ``[len(sample_rows), vocab]`` in the model's dtype."""
        small = self.one_thread(token_ids.shape[0])
        x, cos, sin = self.embed(token_ids, positions, small)
        for layer in range(self.num_layers):
            q, k, v = self.before_attention(layer, x, cos, sin, small)
            out = self.attend(layer, q, k, v, layout)
            x = self.after_attention(layer, x, out, small)
        return self.head(x[sample_rows], small)

    def one_thread(self, num_tokens: int) -> AbstractContextManager[None]:
        """The context the elementwise work of a ``num_tokens`` step runs in."""
        return self._small_ops.one_thread(num_tokens * self._widest)

    def embed(
        self, token_ids: torch.Tensor, positions: torch.Tensor, small: AbstractContextManager[None]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The hidden states ``[tokens, hidden]`` of ``token_ids`` and RoPE's cos and sign-
        folded sin ``[tokens, 1, head_dim]`` at ``positions``."""
        x = self._inner.embed_tokens(token_ids)
        cos, sin = self._inner.rotary_emb(x[None], positions[None])
        half = self._head_dim // 2
        # rotate_half(v) * sin == cat(v2, v1) * cat(-sin1, sin2): negation is exact.
        sin = torch.cat((-sin[0, :, None, :half], sin[0, :, None, half:]), dim=-1)
        return x, cos[0, :, None, :], sin

    def before_attention(
        self,
        layer: int,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        small: AbstractContextManager[None],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layer ``layer``'s input norm, query/key/value product and RoPE on ``x``: the
        queries ``[tokens, q_heads, dim]``, keys and values ``[tokens, kv_heads, dim]``."""
        spec = self._layers[layer]
        num_tokens = x.shape[0]
        q_heads, kv_heads, dim = self._num_heads, self._num_kv_heads, self._head_dim
        elementwise = self._elementwise
        with small:
            h = elementwise.rms_norm(x, spec.input_norm, self._eps)
        qkv = self._linear(h, spec.qkv).view(num_tokens, q_heads + 2 * kv_heads, dim)
        v = qkv[:, q_heads + kv_heads :]
        with small:
            qk = elementwise.rope(qkv, cos, sin, q_heads + kv_heads)
        return qk[:, :q_heads], qk[:, q_heads:], v

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: StepLayout
    ) -> torch.Tensor:
        """Write layer ``layer``'s keys and values into the cache and attend (``attend``);
        returns ``[tokens, q_heads, dim]``."""
        return attend(layer, q, k, v, layout, self._layers[layer].scale)

    def after_attention(
        self,
        layer: int,
        x: torch.Tensor,
        attended: torch.Tensor,
        small: AbstractContextManager[None],
    ) -> torch.Tensor:
        """The rest of layer ``layer``: output product and residual, post-attention norm,
        MLP and residual; ``attended`` is ``[tokens, q_heads, dim]`` (or flattened heads)."""
        spec = self._layers[layer]
        linear = self._linear
        flat = attended.reshape(x.shape[0], self.attention_width)
        projected = linear(flat, spec.o)
        with small:
            x, h = self._elementwise.add_rms_norm(x, projected, spec.post_norm, self._eps)
        gate_up = linear(h, spec.gate_up)
        with small:
            if self._silu:
                activated = self._elementwise.silu_mul(gate_up)
            else:
                gate, up = gate_up.chunk(2, dim=-1)
                activated = spec.act(gate) * up
        down = linear(activated, spec.down)
        with small:
            return x + down

    def head(self, x: torch.Tensor, small: AbstractContextManager[None]) -> torch.Tensor:
        """The final norm and LM head on the rows of ``x``: logits ``[rows, vocab]``."""
        with small:
            h = self._elementwise.rms_norm(x, self._inner.norm.weight, self._eps)
        return self._linear(h, self._lm_head)
