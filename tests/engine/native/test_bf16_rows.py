"""The few-row bfloat16 product: its values, its split, the measured choices, the engine."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from tokenpace.core.cache import default_cache_dir
from tokenpace.engine.native import NativeEngine, NativeEngineConfig
from tokenpace.engine.native import engine as engine_module
from tokenpace.engine.native.bf16_rows import (
    NUMBA_ROWS,
    CompiledRows,
    bf16_rows_product,
    build_compiled_rows,
    compiled_rows_win,
    weight_bits,
)
from tokenpace.engine.native.linear_kernels import (
    FEW_ROWS_PROBE_ROWS,
    PackedLinear,
    UpcastLinear,
    measure_few_rows,
    measure_few_rows_max_bytes,
)

from .conftest import greedy_outputs, kernel_or_skip, scripted_clock
from .test_fused_forward import TINY, assert_mostly_the_same_tokens, needs_packing

pytestmark = pytest.mark.native


def _weight(rows: int, columns: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, columns, generator=generator).to(torch.bfloat16)


def test_the_product_is_the_float32_product_to_rounding() -> None:
    weight, x = _weight(300, 96), _weight(3, 96, seed=1)
    out = bf16_rows_product(x, weight_bits(weight))
    assert out.dtype == torch.bfloat16 and out.shape == (3, 300)
    exact = x.double() @ weight.double().T
    torch.testing.assert_close(out.double(), exact, rtol=2**-7, atol=1e-6)
    # Row by row, the same sums.
    assert torch.equal(bf16_rows_product(x[1:2], weight_bits(weight)), out[1:2])


@pytest.fixture(scope="module")
def compiled() -> CompiledRows:
    kernels = default_cache_dir() / "kernels"
    return kernel_or_skip(build_compiled_rows(kernels, torch.device("cpu"), torch.bfloat16))


@pytest.mark.parametrize("rows", [1, 2, 3, 5])
def test_the_compiled_product_is_the_float32_product_to_rounding(
    compiled: CompiledRows, rows: int
) -> None:
    # 301 outputs (not a multiple of the four read together), 100 inputs (not a multiple of
    # the sixteen lanes).
    weight, x = _weight(301, 100), _weight(rows, 100, seed=rows)
    out = compiled(x, weight, weight_bits(weight))
    assert out.dtype == torch.bfloat16 and out.shape == (rows, 301)
    exact = x.double() @ weight.double().T
    torch.testing.assert_close(out.double(), exact, rtol=2**-7, atol=1e-6)
    numba = NUMBA_ROWS(x, weight, weight_bits(weight))
    torch.testing.assert_close(out.double(), numba.double(), rtol=2**-7, atol=1e-6)
    # Row by row, the same sums; float32 rows give float32 results.
    assert torch.equal(compiled(x[-1:], weight, weight_bits(weight)), out[-1:])
    assert compiled(x.float(), weight, weight_bits(weight)).dtype == torch.float32


def test_the_compiled_product_refuses_other_weights(compiled: CompiledRows) -> None:
    bits = weight_bits(_weight(4, 8))
    with pytest.raises(RuntimeError, match="contiguous 2-d bfloat16 CPU tensor"):
        compiled(_weight(1, 8), torch.zeros(4, 8), bits)
    with pytest.raises(RuntimeError, match="contiguous 2-d bfloat16 CPU tensor"):
        compiled(_weight(1, 4), _weight(4, 8).T, bits)
    with pytest.raises(RuntimeError, match="of the weight's in"):
        compiled(_weight(1, 7), _weight(4, 8), bits)


def test_the_compiled_product_is_taken_only_when_it_is_timed_faster(
    compiled: CompiledRows,
) -> None:
    weights = [_weight(32, 16, seed) for seed in range(2)]
    assert compiled_rows_win(compiled, weights, scripted_clock([0.5], repeats=2), repeats=2)
    assert not compiled_rows_win(compiled, weights, scripted_clock([1.5], repeats=2), repeats=2)


def test_the_engine_reads_few_rows_by_the_compiled_product_keeping_greedy_outputs(
    compiled: CompiledRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    def config(few_rows: int) -> NativeEngineConfig:
        return NativeEngineConfig(
            model=TINY, device="cpu", num_threads=1, dtype="bfloat16", upcast_min_tokens=0,
            pack_weights="off", bf16_rows_max_tokens=few_rows, decode_attention="sdpa",
            elementwise="torch",
        )  # fmt: skip

    numba = NativeEngine.load(config(64), rng=np.random.default_rng(0))
    monkeypatch.setattr(engine_module, "compiled_rows_win", lambda *args: True)
    fast = NativeEngine(
        numba.loaded, config(64), time.perf_counter, np.random.default_rng(0), None, None,
        numba.rows_build,
    )  # fmt: skip
    assert fast.few_rows_product == "compiled"
    slow = NativeEngine(numba.loaded, config(64), time.perf_counter, np.random.default_rng(0))
    assert slow.few_rows_product == "numba"
    assert NativeEngine.load(config(0)).few_rows_product == "none"
    assert_mostly_the_same_tokens(greedy_outputs(fast), greedy_outputs(slow))


def test_only_contiguous_bfloat16_cpu_weights_are_read() -> None:
    with pytest.raises(ValueError, match="bfloat16 CPU weights"):
        weight_bits(torch.zeros(4, 4))
    with pytest.raises(ValueError, match="contiguous"):
        weight_bits(_weight(4, 8).T)
    bits = weight_bits(_weight(4, 8))
    assert bits.dtype == np.uint16 and bits.shape == (4, 8)


def test_few_rows_take_weights_up_to_the_largest_size_before_their_first_loss() -> None:
    small, large = [_weight(8, 16)], [_weight(64, 16)]
    kernel = UpcastLinear(min_rows=4)
    # Probed smallest first.
    assert measure_few_rows_max_bytes(kernel, [large, small], scripted_clock([0.5, 2.0])) == 256
    assert measure_few_rows_max_bytes(kernel, [small, large], scripted_clock([0.5, 0.5])) == 2048
    assert measure_few_rows_max_bytes(kernel, [small, large], scripted_clock([2.0])) == 0


def test_few_rows_reach_the_last_count_that_wins_alone_and_summed() -> None:
    weights = [_weight(32, 16, seed) for seed in range(2)]
    kernel = UpcastLinear(min_rows=4, few_rows_max_bytes=1 << 20)
    # A near tie at one row, a clear win at two, a loss at four.
    assert measure_few_rows(kernel, weights, scripted_clock([1.05, 0.5, 2.0]), 3) == 2
    # A win at four alone, but not summed with the losses before it.
    assert measure_few_rows(kernel, weights, scripted_clock([2.0, 1.5, 0.9]), 3) == 0
    everywhere = scripted_clock([0.5] * len(FEW_ROWS_PROBE_ROWS))
    assert measure_few_rows(kernel, weights, everywhere, 3) == FEW_ROWS_PROBE_ROWS[-1]
    assert measure_few_rows(kernel, [torch.zeros(4, 4)], scripted_clock([]), 3) == 0


@needs_packing
def test_the_packed_kernel_reads_few_rows_of_small_weights_itself() -> None:
    small, large = _weight(48, 32), _weight(96, 32, seed=2)
    kernel = PackedLinear(few_rows=2, few_rows_max_bytes=small.numel() * 2)
    prepared_small, prepared_large = kernel.prepare(small), kernel.prepare(large)
    assert prepared_small.bits is not None and prepared_large.bits is None
    for rows in (1, 2, 3):
        x = _weight(rows, 32, seed=rows)
        few = bf16_rows_product(x, weight_bits(small))
        onednn = torch.nn.functional.linear(x, small)
        assert torch.equal(kernel(x, prepared_small), few if rows <= 2 else onednn)
        assert torch.equal(kernel(x, prepared_large), torch.nn.functional.linear(x, large))


@pytest.mark.parametrize(
    ("pack_weights", "kernel_type"),
    [("off", UpcastLinear), pytest.param("on", PackedLinear, marks=needs_packing)],
)
def test_the_engine_reads_bfloat16_weights_for_few_rows_keeping_greedy_outputs(
    pack_weights: str, kernel_type: type
) -> None:
    def config(few_rows: int) -> NativeEngineConfig:
        return NativeEngineConfig(
            model=TINY, device="cpu", num_threads=1, dtype="bfloat16", upcast_min_tokens=0,
            pack_weights=pack_weights, bf16_rows_max_tokens=few_rows, decode_attention="sdpa",
            elementwise="torch",
        )  # fmt: skip

    reference = NativeEngine.load(config(0), rng=np.random.default_rng(0))
    few = NativeEngine(reference.loaded, config(64), time.perf_counter, np.random.default_rng(0))
    assert (reference.bf16_rows_max_tokens, few.bf16_rows_max_tokens) == (0, 64)
    kernel = few.projection_kernel
    assert isinstance(kernel, UpcastLinear | PackedLinear) and isinstance(kernel, kernel_type)
    assert kernel.few_rows_max_bytes > 0
    assert few.linear_kernel == reference.linear_kernel
    assert_mostly_the_same_tokens(greedy_outputs(few), greedy_outputs(reference))


def test_reading_bfloat16_weights_is_refused_for_float32_ones() -> None:
    config = NativeEngineConfig(model=TINY, device="cpu", dtype="float32", bf16_rows_max_tokens=4)
    with pytest.raises(ValueError, match="bf16_rows_max_tokens needs bfloat16 weights"):
        NativeEngine.load(config, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="bf16_rows_max_tokens must be -1"):
        NativeEngineConfig(bf16_rows_max_tokens=-3)
