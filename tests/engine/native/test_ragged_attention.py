"""The ragged decode kernel: SDPA's values over each request's own keys, its build and its
place in the engine."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tokenpace.core.cache import default_cache_dir
from tokenpace.engine.native import NativeEngine, NativeEngineConfig
from tokenpace.engine.native.probe import NativeProbe
from tokenpace.engine.native.ragged_attention import (
    RaggedBuild,
    RaggedDecode,
    build_ragged_decode,
    ragged_wins,
)

from .conftest import CACHE_DIR, greedy_outputs, kernel_or_skip, scripted_clock

pytestmark = pytest.mark.native

TINY = "random:tiny-llama"
KERNELS = default_cache_dir() / "kernels"


@pytest.fixture(scope="module")
def kernel() -> RaggedDecode:
    return kernel_or_skip(build_ragged_decode(KERNELS, torch.device("cpu"), torch.float32))


def _reference(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    slots: list[int],
    lengths: list[int],
    scale: float,
) -> torch.Tensor:
    """SDPA of each request alone over its own keys, in float32."""
    rows = []
    for i, (slot, length) in enumerate(zip(slots, lengths, strict=True)):
        rows.append(
            F.scaled_dot_product_attention(
                q[i : i + 1].float(),
                keys[slot : slot + 1, :, :length].float(),
                values[slot : slot + 1, :, :length].float(),
                scale=scale,
            )
        )
    return torch.cat(rows)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_each_request_is_attended_over_its_own_keys(
    kernel: RaggedDecode, dtype: torch.dtype, tolerance: float
) -> None:
    # Slots out of order and not all of the cache's, contexts from 1 key to all positions.
    generator = torch.Generator().manual_seed(0)
    kv_heads, group, dim, positions = 3, 3, 64, 96
    keys = torch.randn(9, kv_heads, positions, dim, generator=generator).to(dtype)
    values = torch.randn(9, kv_heads, positions, dim, generator=generator).to(dtype)
    slots, lengths = [7, 0, 3, 5, 1], [1, 96, 17, 64, 40]
    q = torch.randn(len(slots), kv_heads, group, dim, generator=generator).to(dtype)
    scale = dim**-0.5
    out = kernel(q, keys, values, torch.tensor(slots), torch.tensor(lengths), scale)
    assert out.dtype == dtype and out.shape == q.shape
    expected = _reference(q, keys, values, slots, lengths, scale)
    assert torch.allclose(out.float(), expected, atol=tolerance, rtol=tolerance)
    # A key beyond a request's length never counts: changing it changes nothing.
    keys[7, :, 1:] = 100.0
    again = kernel(q, keys, values, torch.tensor(slots), torch.tensor(lengths), scale)
    assert torch.equal(again, out)


def test_bad_arguments_are_refused(kernel: RaggedDecode) -> None:
    keys = torch.zeros(2, 1, 8, 4)
    q = torch.zeros(1, 1, 2, 4)
    with pytest.raises(RuntimeError, match=r"a length is outside 1 \.\. positions"):
        kernel(q, keys, keys, torch.tensor([0]), torch.tensor([9]), 1.0)
    with pytest.raises(RuntimeError, match="a slot is outside the cache"):
        kernel(q, keys, keys, torch.tensor([2]), torch.tensor([1]), 1.0)
    with pytest.raises(RuntimeError, match="share a dtype"):
        kernel(q.double(), keys, keys, torch.tensor([0]), torch.tensor([1]), 1.0)


def test_the_probe_takes_the_kernel_only_when_it_is_timed_faster(kernel: RaggedDecode) -> None:
    # The probe runs both calls on the engine's shapes; a scripted clock decides who won.
    def wins(kernel_s: float) -> bool:
        clock = scripted_clock([kernel_s], repeats=2)
        return ragged_wins(kernel, 3, 3, 64, torch.float32, 64, clock, repeats=2)

    assert wins(0.5)
    assert not wins(1.5)


def _engine(**overrides: object) -> NativeEngine:
    config = NativeEngineConfig(
        model=TINY,
        device="cpu",
        num_threads=1,
        cache_dir=CACHE_DIR,
        **overrides,  # type: ignore[arg-type]
    )
    return NativeEngine.load(config, rng=np.random.default_rng(0))


def test_the_engine_attends_ragged_with_sdpas_greedy_outputs(kernel: RaggedDecode) -> None:
    # ``kernel``: skipped, with the reason, where the kernel cannot be built.
    ragged = _engine(dtype="float32", decode_attention="ragged", elementwise="torch")
    assert ragged.decode_attention == "ragged" and ragged.ragged_build.kernel is not None
    sdpa = NativeEngine(
        ragged.loaded,
        NativeEngineConfig(model=TINY, device="cpu", decode_attention="sdpa"),
        time.perf_counter,
        np.random.default_rng(0),
    )
    assert sdpa.decode_attention == "sdpa"
    lengths = (5, 40, 23, 61)  # other lengths: the decodes differ in context
    assert greedy_outputs(ragged, lengths, 12) == greedy_outputs(sdpa, lengths, 12)
    # Its profile prices decode attention by the summed context, not padded.
    assert not NativeProbe(ragged).facts(measure_checkpoints=False).decode_attention_padded
    assert NativeProbe(sdpa).facts(measure_checkpoints=False).decode_attention_padded


def test_ragged_without_a_kernel_is_refused_with_the_reason() -> None:
    base = _engine(dtype="float32", decode_attention="sdpa")
    config = NativeEngineConfig(model=TINY, device="cpu", decode_attention="ragged")
    with pytest.raises(ValueError, match=r"decode_attention ragged: the kernel .* float16"):
        NativeEngine(
            base.loaded, config, time.perf_counter, np.random.default_rng(0),
            RaggedBuild(None, "the kernel takes bfloat16 or float32, not float16"),
        )  # fmt: skip
    with pytest.raises(ValueError, match="decode_attention ragged: no ragged decode kernel"):
        NativeEngine(base.loaded, config, time.perf_counter, np.random.default_rng(0))
