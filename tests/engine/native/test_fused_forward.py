"""The fused forward and the float32 products on a tiny random Llama, and the shipped configs."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tokenpace.core.request import Request
from tokenpace.core.step import ScheduledChunk
from tokenpace.engine.native import NativeEngine, NativeEngineConfig, attention
from tokenpace.engine.native.linear_kernels import (
    PACKING_PROBE_ROWS,
    PROBE_ROWS,
    PackedLinear,
    UpcastLinear,
    available_memory_bytes,
    float32_copies_fit,
    measure_packing_wins,
    measure_upcast_min_rows,
    pack_float32,
    packed_upcast_linear,
    packing_supported,
    upcast_linear,
)
from tokenpace.engine.native.loading import load_model
from tokenpace.engine.native.random_model import shipped_configs
from tokenpace.engine.native.small_ops import OneThread

from .conftest import greedy_outputs

pytestmark = pytest.mark.native

TINY = "random:tiny-llama"

# oneDNN packs float32 weights wherever torch has it (no special instructions needed).
FLOAT32_PACKING_UNSUPPORTED = packing_supported(torch.float32)
needs_float32_packing = pytest.mark.skipif(
    FLOAT32_PACKING_UNSUPPORTED is not None,
    reason=f"this machine cannot pack float32 weights: {FLOAT32_PACKING_UNSUPPORTED}",
)


def _engine(**overrides: object) -> NativeEngine:
    """An engine on the tiny model; decode attention by SDPA and elementwise work by torch
    unless ``overrides`` say otherwise, so that engines compared on another choice attend
    and round alike."""
    overrides.setdefault("decode_attention", "sdpa")
    overrides.setdefault("elementwise", "torch")
    config = NativeEngineConfig(model=TINY, device="cpu", num_threads=1, **overrides)  # type: ignore[arg-type]
    return NativeEngine.load(config, rng=np.random.default_rng(0))


def _twin(engine: NativeEngine, **overrides: object) -> NativeEngine:
    """Another engine on ``engine``'s loaded model, configured by ``overrides`` (decode
    attention by SDPA and elementwise work by torch unless they say otherwise)."""
    overrides.setdefault("decode_attention", "sdpa")
    overrides.setdefault("elementwise", "torch")
    config = NativeEngineConfig(model=TINY, device="cpu", **overrides)  # type: ignore[arg-type]
    return NativeEngine(engine.loaded, config, time.perf_counter, np.random.default_rng(0))


def test_fused_and_transformers_paths_agree_on_mixed_steps() -> None:
    fused = _engine(dtype="float32")
    plain = _twin(fused, dtype="float32", fused_forward=False)
    assert (fused.forward_path, plain.forward_path) == ("fused", "transformers")
    assert greedy_outputs(fused) == greedy_outputs(plain)


@pytest.mark.parametrize(
    ("pack_weights", "kernel"),
    [
        pytest.param("auto", "upcast-packed", marks=needs_float32_packing),
        ("off", "upcast"),
    ],
)
def test_upcast_products_keep_bfloat16_greedy_outputs(pack_weights: str, kernel: str) -> None:
    native = _engine(dtype="bfloat16", upcast_min_tokens=0, pack_weights="off")
    upcast = _twin(native, upcast_min_tokens=1, pack_weights=pack_weights)
    assert (native.upcast_min_rows, upcast.upcast_min_rows) == (None, 1)
    assert (native.linear_kernel, upcast.linear_kernel) == ("plain", kernel)
    assert_mostly_the_same_tokens(greedy_outputs(upcast), greedy_outputs(native))


def assert_mostly_the_same_tokens(outputs: list[list[int]], reference: list[list[int]]) -> None:
    """At least half of the tokens agree, position by position. Random weights give
    near-uniform logits, where one rounding step can flip a choice; a wrong product would
    agree about once in the vocabulary size (1 / 32768)."""
    pairs = [
        (a, b)
        for out, ref in zip(outputs, reference, strict=True)
        for a, b in zip(out, ref, strict=True)
    ]
    assert sum(a == b for a, b in pairs) >= 0.5 * len(pairs)


def test_upcast_linear_is_the_float32_product_in_blocks() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3000, 96, generator=generator).to(torch.bfloat16)  # several blocks
    x = torch.randn(5, 96, generator=generator).to(torch.bfloat16)
    expected = (x.float() @ weight.float().T).to(torch.bfloat16)
    out = upcast_linear(x, weight)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)
    dispatch = UpcastLinear(min_rows=4)
    prepared = dispatch.prepare(weight)
    assert prepared.packed is None
    assert torch.equal(dispatch(x, prepared), expected)
    assert torch.equal(dispatch(x[:3], prepared), torch.nn.functional.linear(x[:3], weight))


@needs_float32_packing
def test_packed_upcast_is_the_float32_product_up_to_its_summation_order() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(3000, 96, generator=generator).to(torch.bfloat16)
    x = torch.randn(5, 96, generator=generator).to(torch.bfloat16)
    exact = x.double() @ weight.double().T
    copy = pack_float32(weight)
    out = packed_upcast_linear(x, copy)
    assert out.dtype == torch.bfloat16
    # float32 sums of 96 exact products, then bfloat16 rounding: within one bfloat16 step
    # (a relative 2^-8) of the exact value, and nearly always the float32 product's rounding.
    assert torch.allclose(out.double(), exact, rtol=2**-7, atol=1e-5)
    expected = (x.float() @ weight.float().T).to(torch.bfloat16)
    assert (out == expected).float().mean() >= 0.99
    dispatch = UpcastLinear(min_rows=4, packed=True)
    prepared = dispatch.prepare(weight)
    assert prepared.packed is not None and prepared.plain is weight
    assert torch.equal(dispatch(x, prepared), out)
    assert torch.equal(dispatch(x[:3], prepared), torch.nn.functional.linear(x[:3], weight))
    assert UpcastLinear(min_rows=None, packed=True).prepare(weight).packed is None


def test_measured_crossover_is_the_first_of_a_winning_tail() -> None:
    """A scripted clock: the float32 product is faster from 8 rows on (and at 1 row, which
    is not a tail); measurement returns 8."""
    times: list[float] = []
    for rows in PROBE_ROWS:
        native, upcast = 1.0, (0.5 if rows >= 8 or rows == 1 else 2.0)
        for _ in range(3):  # each repeat reads the clock at start, middle and end
            start = 10.0 * len(times)
            times += [start, start + native, start + native + upcast]
    weight = torch.zeros(8, 8, dtype=torch.bfloat16)
    assert measure_upcast_min_rows(weight, iter(times).__next__) == 8
    assert measure_upcast_min_rows(weight.float(), iter(times).__next__) is None
    if FLOAT32_PACKING_UNSUPPORTED is None:
        assert measure_upcast_min_rows(weight, iter(times).__next__, packed=True) == 8


def test_float32_copies_are_packed_only_where_they_fit_in_half_the_free_memory(
    tmp_path: Path,
) -> None:
    # 100 bytes of bfloat16 weights have 200 bytes of float32 copies.
    assert float32_copies_fit(100, torch.bfloat16, 400)
    assert not float32_copies_fit(100, torch.bfloat16, 399)
    assert not float32_copies_fit(100, torch.bfloat16, None)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  4096 kB\nMemFree:  512 kB\nMemAvailable:  1024 kB\n")
    assert available_memory_bytes(meminfo) == 1024 * 1024
    meminfo.write_text("MemTotal:  4096 kB\n")
    assert available_memory_bytes(meminfo) is None
    assert available_memory_bytes(tmp_path / "missing") is None


# Packing needs torch with oneDNN and, for bfloat16, AVX-512 BW/VL/DQ or AVX-NE-CONVERT.
PACKING_UNSUPPORTED = packing_supported(torch.bfloat16)
needs_packing = pytest.mark.skipif(
    PACKING_UNSUPPORTED is not None,
    reason=f"this machine cannot pack bfloat16 weights: {PACKING_UNSUPPORTED}",
)


@needs_packing
def test_packed_linear_is_torchs_bfloat16_product_bit_for_bit() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 96, generator=generator).to(torch.bfloat16)
    packed = PackedLinear()
    prepared = packed.prepare(weight)
    for rows in (1, 5, 64):
        x = torch.randn(rows, 96, generator=generator).to(torch.bfloat16)
        out = packed(x, prepared)
        assert out.dtype == torch.bfloat16
        assert torch.equal(out, torch.nn.functional.linear(x, weight))


@needs_packing
def test_packed_weights_keep_the_greedy_outputs_exactly() -> None:
    # Without the few-row product, which sums in its own order.
    plain = _engine(
        dtype="bfloat16", upcast_min_tokens=0, pack_weights="off", bf16_rows_max_tokens=0
    )
    packed = _twin(plain, upcast_min_tokens=0, pack_weights="on", bf16_rows_max_tokens=0)
    assert (plain.linear_kernel, packed.linear_kernel) == ("plain", "packed")
    assert greedy_outputs(packed) == greedy_outputs(plain)


def test_decode_attention_by_products_keeps_the_greedy_outputs() -> None:
    sdpa = _engine(dtype="float32", decode_attention="sdpa")
    products = _twin(sdpa, dtype="float32", decode_attention="products")
    assert (sdpa.decode_attention, products.decode_attention) == ("sdpa", "products<=2048")
    assert greedy_outputs(products) == greedy_outputs(sdpa)


def test_padded_decode_attention_is_measured_only_on_cpu_with_float32_kv() -> None:
    # Without the ragged kernel (a twin is handed none): bfloat16 KV keeps SDPA.
    base = _engine(dtype="bfloat16")
    assert _twin(base, decode_attention="auto").decode_attention == "sdpa"
    float32 = _engine(dtype="float32")
    measured = _twin(float32, dtype="float32", decode_attention="auto").decode_products_max_len
    assert measured is None or 0 < measured <= 2048
    with pytest.raises(ValueError, match="decode_attention must be auto, sdpa, products or ragged"):
        NativeEngineConfig(model=TINY, decode_attention="flash")


def test_a_bad_packing_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="pack_weights must be auto, on or off"):
        NativeEngineConfig(model=TINY, pack_weights="always")


@needs_float32_packing
def test_packed_float32_weights_give_the_float32_products_to_rounding() -> None:
    plain = _engine(dtype="float32", pack_weights="off")
    packed = _twin(plain, dtype="float32", pack_weights="on")
    assert (plain.linear_kernel, packed.linear_kernel) == ("plain", "packed")
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(300, 96, generator=generator)
    prepared = PackedLinear().prepare(weight)
    for rows in (1, 5, 64):
        x = torch.randn(rows, 96, generator=generator)
        torch.testing.assert_close(PackedLinear()(x, prepared), x @ weight.T)
    pairs = [
        (a, b)
        for out, ref in zip(greedy_outputs(packed), greedy_outputs(plain), strict=True)
        for a, b in zip(out, ref, strict=True)
    ]
    # As with the upcast products: near-uniform logits of random weights, where one
    # rounding step can flip a choice; a wrong product would agree about once in 32768.
    assert sum(a == b for a, b in pairs) >= 0.5 * len(pairs)


@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(torch.float32, marks=needs_float32_packing),
        pytest.param(torch.bfloat16, marks=needs_packing),
    ],
)
def test_packing_wins_only_when_faster_at_every_probed_row_count(dtype: torch.dtype) -> None:
    """A scripted clock: a packed pass takes ``packed_s`` against 1 s for torch's."""

    def clock(packed_s: list[float]) -> object:
        times: list[float] = []
        for seconds in packed_s:
            for _ in range(3):  # each repeat reads the clock at start, middle and end
                start = 10.0 * len(times)
                times += [start, start + 1.0, start + 1.0 + seconds]
        return iter(times).__next__

    weights = [torch.zeros(8, 8, dtype=dtype), torch.zeros(16, 8, dtype=dtype)]
    faster = [0.5] * len(PACKING_PROBE_ROWS)
    assert measure_packing_wins(weights, clock(faster))  # type: ignore[arg-type]
    slower_once = [0.5] * (len(PACKING_PROBE_ROWS) - 1) + [2.0]
    assert not measure_packing_wins(weights, clock(slower_once))  # type: ignore[arg-type]
    assert not measure_packing_wins([], clock(faster))  # type: ignore[arg-type]


@pytest.mark.skipif(PACKING_UNSUPPORTED is None, reason="this machine can pack bfloat16 weights")
def test_packing_where_the_cpu_cannot_is_refused_by_name_or_left_off() -> None:
    plain = _engine(dtype="bfloat16", upcast_min_tokens=0, pack_weights="off")
    with pytest.raises(ValueError, match="pack_weights='on': this machine cannot pack"):
        _twin(plain, upcast_min_tokens=0, pack_weights="on")
    auto = _twin(plain, upcast_min_tokens=0, pack_weights="auto")
    assert auto.linear_kernel == "plain"
    assert not measure_packing_wins([torch.zeros(8, 8, dtype=torch.bfloat16)])


def test_random_model_has_no_tokenizer_and_refuses_text() -> None:
    config = NativeEngineConfig(model=TINY, device="cpu", num_threads=1)
    loaded = load_model(config, time.perf_counter)
    assert (loaded.tier, loaded.tokenizer) == ("random", None)
    engine = NativeEngine(loaded, config, time.perf_counter, np.random.default_rng(0))
    request = Request(1, 4, 2, 0.0, prompt="hello")
    with pytest.raises(ValueError, match="no tokenizer"):
        engine.execute([ScheduledChunk(request, 4)])


def test_shipped_configs_and_a_bad_name() -> None:
    assert {"llama-3.2-3b", "tiny-llama"} <= set(shipped_configs())
    with pytest.raises(FileNotFoundError, match=r"valid: .*llama-3\.2-3b"):
        load_model(NativeEngineConfig(model="random:nope", device="cpu"), time.perf_counter)


def test_upcast_setting_is_validated() -> None:
    with pytest.raises(ValueError, match="upcast_min_tokens"):
        NativeEngineConfig(upcast_min_tokens=-2)


def test_small_decode_attention_on_one_thread_keeps_the_outputs_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    split = _engine(dtype="float32", decode_one_thread_max_keys=0)
    alone = _twin(split, dtype="float32", decode_one_thread_max_keys=10**6)
    entered: list[OneThread] = []

    class Counted(OneThread):
        def __enter__(self) -> None:
            entered.append(self)
            super().__enter__()

    monkeypatch.setattr(attention, "OneThread", Counted)
    reference = greedy_outputs(split)
    assert entered == []
    assert greedy_outputs(alone) == reference
    # Every step but the first prefills decodes at least one request.
    assert len(entered) >= 5
    with pytest.raises(ValueError, match="decode_one_thread_max_keys must be -1"):
        NativeEngineConfig(decode_one_thread_max_keys=-2)
