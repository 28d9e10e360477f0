"""A Llama-family forward for the native engine's flattened step, with fewer and larger ops.

transformers' model code spends about as long in Python and small tensor ops per layer as
in the weight reads that bound a small-batch step. This forward runs the same arithmetic on
the same weights with the per-layer work cut down: the query, key and value projections are
one matrix product (their weights concatenated once, the model's own parameters becoming
views of the result, so no memory is added; a kernel that packs weights, such as
``linear_kernels.PackedLinear``, holds its own copy), so are the gate and up projections; RoPE turns
queries and keys together in three elementwise ops; attention is called directly (no
attention-interface dispatch, no keyword plumbing); the final norm and the LM head run on the
sampled rows only. Elementwise arithmetic is the model code's, operation for operation; only
the matrix products are grouped differently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tokenpace.engine.native.attention import StepLayout, attend
from tokenpace.engine.native.linear_kernels import LinearKernel, PreparedWeight, UpcastLinear
from tokenpace.engine.native.small_ops import NO_SMALL_OPS, SmallOps

SUPPORTED_MODEL_TYPES = frozenset({"llama"})


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
    index: int
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: PreparedWeight
    o: PreparedWeight
    gate_up: PreparedWeight
    down: PreparedWeight
    act: Any
    scale: float


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm's arithmetic: float32 statistics, weight applied in the input dtype."""
    x32 = x.to(torch.float32)
    variance = x32.pow(2).mean(-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)


class FusedForward:
    """Logits of a Llama-family model for one flattened step (see the module doc).

    Construction fuses the weights in place (the model stays usable by its own code).
    ``kernel`` computes every projection (default torch's product; see
    ``linear_kernels``), on the weights it prepared at construction. The elementwise work
    between products runs as ``small_ops`` says (on one thread for small steps). Raises
    ValueError with the reason when ``unsupported_reason(model)`` is not None.
    """

    def __init__(
        self, model: Any, kernel: LinearKernel | None = None, small_ops: SmallOps = NO_SMALL_OPS
    ) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the fused forward cannot run this model: {reason}")
        config = model.config
        chosen: LinearKernel = kernel if kernel is not None else UpcastLinear(None)
        prepare = chosen.prepare
        self._linear = chosen
        self._small_ops = small_ops
        self._inner = model.model
        self._lm_head = prepare(model.lm_head.weight)
        self._eps = float(config.rms_norm_eps)
        self._num_heads = int(config.num_attention_heads)
        self._num_kv_heads = int(config.num_key_value_heads)
        self._head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self._layers = [
            _Layer(
                index=i,
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
            for i, layer in enumerate(self._inner.layers)
        ]
        # Per token, the most elements any elementwise operation of a layer touches.
        self._widest = max(
            int(config.hidden_size),
            int(config.intermediate_size),
            (self._num_heads + 2 * self._num_kv_heads) * self._head_dim,
        )

    def __call__(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        sample_rows: torch.Tensor,
        layout: StepLayout,
    ) -> torch.Tensor:
        """``token_ids`` and ``positions`` are ``[tokens]`` in the layout's row order;
        returns the logits ``[len(sample_rows), vocab]`` in the model's dtype."""
        x = self._inner.embed_tokens(token_ids)
        cos, sin = self._inner.rotary_emb(x[None], positions[None])
        half = self._head_dim // 2
        cos = cos[0, :, None, :]
        # rotate_half(v) * sin == cat(v2, v1) * cat(-sin1, sin2): negation is exact.
        sin = torch.cat((-sin[0, :, None, :half], sin[0, :, None, half:]), dim=-1)
        num_tokens = x.shape[0]
        q_heads, kv_heads, dim = self._num_heads, self._num_kv_heads, self._head_dim
        linear = self._linear
        # The elementwise work between the products and attention (see ``small_ops``).
        small = self._small_ops.one_thread(num_tokens * self._widest)
        for layer in self._layers:
            with small:
                h = _rms_norm(x, layer.input_norm, self._eps)
            qkv = linear(h, layer.qkv).view(num_tokens, q_heads + 2 * kv_heads, dim)
            with small:
                qk = qkv[:, : q_heads + kv_heads]
                turned = torch.cat((qk[..., half:], qk[..., :half]), dim=-1)
                qk = qk * cos + turned * sin
            out = attend(
                layer.index,
                qk[:, :q_heads],
                qk[:, q_heads:],
                qkv[:, q_heads + kv_heads :],
                layout,
                layer.scale,
            )
            attended = linear(out.reshape(num_tokens, q_heads * dim), layer.o)
            with small:
                x = x + attended
                h = _rms_norm(x, layer.post_norm, self._eps)
            gate, up = linear(h, layer.gate_up).chunk(2, dim=-1)
            with small:
                activated = layer.act(gate) * up
            projected = linear(activated, layer.down)
            with small:
                x = x + projected
        with small:
            h = _rms_norm(x[sample_rows], self._inner.norm.weight, self._eps)
        return linear(h, self._lm_head)
