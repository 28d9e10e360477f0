"""The compiled elementwise kernel: torch's values piece by piece, its build, its probe and
its place in the engine."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from tokenpace.core.cache import default_cache_dir
from tokenpace.engine.native import LoadedModel, NativeEngine, NativeEngineConfig
from tokenpace.engine.native.elementwise import (
    CompiledElementwise,
    ElementwiseBuild,
    LayerWidths,
    TorchElementwise,
    build_elementwise,
    compiled_elementwise_wins,
)

from .conftest import CACHE_DIR, greedy_outputs, kernel_or_skip, scripted_clock

pytestmark = pytest.mark.native

TINY = "random:tiny-llama"
KERNELS = default_cache_dir() / "kernels"
# SmolLM2-135M's widths: hidden 576, 9 query and 3 KV heads of 64, MLP 1,536.
WIDTHS = LayerWidths(hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536)


@pytest.fixture(scope="module")
def kernel() -> CompiledElementwise:
    return kernel_or_skip(build_elementwise(KERNELS, torch.device("cpu"), torch.float32))


def _inputs(dtype: torch.dtype, tokens: int = 37) -> dict[str, torch.Tensor]:
    """Inputs of one layer's pieces at ``WIDTHS``, with activations of a trained model's
    spread (a few large values among small ones)."""
    generator = torch.Generator().manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale).to(dtype)

    positions = torch.arange(tokens, dtype=torch.float32) + 300
    inverse = 1.0 / (10000 ** (torch.arange(0, 64, 2).float() / 64))
    angles = positions[:, None] * inverse[None]
    angles = torch.cat((angles, angles), dim=-1)
    sin = angles.sin().to(dtype)[:, None, :]
    return {
        "x": rand(tokens, WIDTHS.hidden, scale=4.0),
        "delta": rand(tokens, WIDTHS.hidden),
        "weight": (torch.rand(WIDTHS.hidden, generator=generator) + 0.5).to(dtype),
        "qkv": rand(tokens, 15, 64, scale=2.0),
        "cos": angles.cos().to(dtype)[:, None, :],
        "sin": torch.cat((-sin[..., :32], sin[..., 32:]), dim=-1),
        "gate_up": rand(tokens, 2 * WIDTHS.intermediate, scale=3.0),
    }


def _pieces(
    elementwise: TorchElementwise | CompiledElementwise, inputs: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    x, delta, weight = inputs["x"], inputs["delta"], inputs["weight"]
    total, normed = elementwise.add_rms_norm(x, delta, weight, 1e-5)
    return {
        "rms_norm": elementwise.rms_norm(x, weight, 1e-5),
        "add": total,
        "add_rms_norm": normed,
        "rope": elementwise.rope(inputs["qkv"].clone(), inputs["cos"], inputs["sin"], 12),
        "silu_mul": elementwise.silu_mul(inputs["gate_up"]),
    }


def test_bfloat16_pieces_are_torchs_but_for_rare_last_bits_of_norms_and_silu() -> None:
    bfloat16_kernel = kernel_or_skip(
        build_elementwise(KERNELS, torch.device("cpu"), torch.bfloat16)
    )
    inputs = _inputs(torch.bfloat16)
    x_before = inputs["x"].clone()
    compiled, plain = _pieces(bfloat16_kernel, inputs), _pieces(TorchElementwise(), inputs)
    assert torch.equal(inputs["x"], x_before)  # add_rms_norm leaves its input alone
    for name in ("add", "rope"):
        # Products and sums rounded one by one, as torch's: exact on any CPU.
        assert compiled[name].dtype == torch.bfloat16
        assert torch.equal(compiled[name], plain[name]), name
    for name in ("rms_norm", "add_rms_norm", "silu_mul"):
        # The norms' sum of squares is summed in another order, and SiLU's exponential is
        # the kernel's own polynomial (torch's differs by CPU too): a rounding may move,
        # by one step.
        got, expected = compiled[name].float(), plain[name].float()
        assert compiled[name].dtype == torch.bfloat16
        differing = got != expected
        assert differing.float().mean() <= 1e-3, name
        assert torch.all((got - expected).abs()[differing] <= expected.abs()[differing] / 64)


def test_float32_pieces_agree_with_torchs_to_rounding(kernel: CompiledElementwise) -> None:
    inputs = _inputs(torch.float32)
    compiled, plain = _pieces(kernel, inputs), _pieces(TorchElementwise(), inputs)
    for name, expected in plain.items():
        assert compiled[name].shape == expected.shape
        assert torch.allclose(compiled[name], expected, rtol=1e-6, atol=1e-6), name
    # Exact where no sum is reordered and no exponential is taken.
    assert torch.equal(compiled["add"], plain["add"])
    assert torch.equal(compiled["rope"], plain["rope"])


def test_rope_turns_only_the_named_heads_in_place(kernel: CompiledElementwise) -> None:
    inputs = _inputs(torch.float32, tokens=4)
    qkv = inputs["qkv"].clone()
    turned = kernel.rope(qkv, inputs["cos"], inputs["sin"], 12)
    assert turned.shape == (4, 12, 64)
    assert turned.data_ptr() == qkv.data_ptr()
    assert torch.equal(qkv[:, 12:], inputs["qkv"][:, 12:])  # the values are not turned
    assert not torch.equal(qkv[:, :12], inputs["qkv"][:, :12])


def test_bad_arguments_are_refused(kernel: CompiledElementwise) -> None:
    x = torch.zeros(2, 8)
    with pytest.raises(RuntimeError, match="CPU tensor of the first one's dtype"):
        kernel.rms_norm(x, torch.ones(8, dtype=torch.bfloat16), 1e-5)
    with pytest.raises(RuntimeError, match=r"weight \[width\]"):
        kernel.rms_norm(x, torch.ones(7), 1e-5)
    with pytest.raises(RuntimeError, match="delta must be shaped as x"):
        kernel.add_rms_norm(x, torch.zeros(2, 7), torch.ones(8), 1e-5)
    with pytest.raises(RuntimeError, match="bfloat16 or float32 only"):
        kernel.silu_mul(torch.zeros(2, 8, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="qkv must be contiguous"):
        kernel.rope(torch.zeros(4, 2, 3, 8)[:, :, 0], torch.zeros(4, 1, 8), torch.zeros(4, 1, 8), 1)
    with pytest.raises(RuntimeError, match="bad rotated heads"):
        kernel.rope(torch.zeros(4, 3, 8), torch.zeros(4, 1, 8), torch.zeros(4, 1, 8), 4)


def test_the_probe_takes_the_kernel_only_when_it_is_timed_faster(
    kernel: CompiledElementwise,
) -> None:
    # The probe runs a layer's work both ways; a scripted clock decides who won.
    def wins(kernel_s: float) -> bool:
        clock = scripted_clock([kernel_s], repeats=2)
        return compiled_elementwise_wins(kernel, WIDTHS, torch.float32, clock, repeats=2)

    assert wins(0.5)
    assert not wins(1.5)


def _twin(loaded: LoadedModel, build: ElementwiseBuild | None, **overrides: object) -> NativeEngine:
    config = NativeEngineConfig(
        device="cpu", num_threads=1, cache_dir=CACHE_DIR, decode_attention="sdpa",
        **overrides,  # type: ignore[arg-type]
    )  # fmt: skip
    return NativeEngine(loaded, config, time.perf_counter, np.random.default_rng(0), None, build)


def test_the_engine_runs_the_kernel_with_torchs_greedy_outputs(
    kernel: CompiledElementwise,
) -> None:
    # ``kernel``: skipped, with the reason, where the kernel cannot be built.
    config = NativeEngineConfig(
        model=TINY, device="cpu", num_threads=1, dtype="float32", decode_attention="sdpa",
        elementwise="compiled",
    )  # fmt: skip
    compiled = NativeEngine.load(config, rng=np.random.default_rng(0))
    assert compiled.elementwise == "compiled"
    assert compiled.elementwise_build.kernel is not None
    plain = _twin(compiled.loaded, compiled.elementwise_build, elementwise="torch")
    assert plain.elementwise == "torch"
    lengths = (5, 40, 23, 61)
    assert greedy_outputs(compiled, lengths, 12) == greedy_outputs(plain, lengths, 12)


def test_compiled_without_a_kernel_or_a_fused_forward_is_refused_with_the_reason(
    loaded: LoadedModel,
) -> None:
    with pytest.raises(ValueError, match=r"elementwise compiled: the kernel takes .* float16"):
        _twin(
            loaded, ElementwiseBuild(None, "the kernel takes bfloat16 or float32, not float16"),
            elementwise="compiled",
        )  # fmt: skip
    with pytest.raises(ValueError, match="elementwise compiled: no elementwise kernel"):
        _twin(loaded, None, elementwise="compiled")
    with pytest.raises(ValueError, match=r"elementwise compiled: .* fused forward, which is off"):
        _twin(loaded, None, elementwise="compiled", fused_forward=False)
    with pytest.raises(ValueError, match="elementwise must be auto, torch or compiled"):
        NativeEngineConfig(elementwise="fast")
