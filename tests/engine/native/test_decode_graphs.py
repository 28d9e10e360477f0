"""Decode steps through per-size buffers and pieces (``decode_graphs``), on the CPU: the
uncaptured pieces, and the first-step check that switches a wrong capture off."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from tokenpace.core.request import Request
from tokenpace.core.sampling import SamplingParams
from tokenpace.core.step import ScheduledChunk
from tokenpace.engine.native import NativeEngine, NativeEngineConfig
from tokenpace.engine.native.decode_graphs import DecodeGraphs, Piece, bucket_sizes

pytestmark = pytest.mark.native

TINY = "random:tiny-llama"


@pytest.fixture(scope="module")
def reference() -> NativeEngine:
    config = NativeEngineConfig(
        model=TINY, device="cpu", dtype="float32", num_threads=1, max_num_seqs=16
    )
    return NativeEngine.load(config, rng=np.random.default_rng(0))


def _twin(engine: NativeEngine, **overrides: object) -> NativeEngine:
    config = NativeEngineConfig(
        model=TINY,
        device="cpu",
        dtype="float32",
        max_num_seqs=16,
        **overrides,  # type: ignore[arg-type]
    )
    return NativeEngine(engine.loaded, config, time.perf_counter, np.random.default_rng(0))


def _decode(engine: NativeEngine) -> tuple[list[list[int]], list[list[float]]]:
    """Five requests prefilled, then decode steps of 5, 3 (two sit one out) and 5 tokens:
    each request's tokens and their logprobs."""
    params = SamplingParams(ignore_eos=True, logprobs=0)
    requests = [Request(100 + i, 4 + 5 * i, 8, 0.0, sampling=params) for i in range(5)]
    for step in range(9):
        live = requests[:3] if step == 3 else requests
        chunks = [
            ScheduledChunk(r, r.num_uncomputed_tokens if r.is_prefilling else 1) for r in live
        ]
        result = engine.execute(chunks)
        for request in live:
            request.output_token_ids.append(result.sampled_token_ids[request.request_id])
            request.token_times_s.append(engine.step_logprobs[request.request_id].logprob)
    for request in requests:
        engine.free(request.request_id)
    return [r.output_token_ids for r in requests], [r.token_times_s for r in requests]


def _flat(rows: list[list[float]]) -> list[float]:
    return [value for row in rows for value in row]


def test_bucket_sizes_cover_every_batch_up_to_the_limit() -> None:
    assert bucket_sizes(1) == (1,)
    assert bucket_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert bucket_sizes(24) == (1, 2, 4, 8, 16, 24)
    with pytest.raises(ValueError, match="max_num_seqs"):
        bucket_sizes(0)


def test_uncaptured_pieces_give_the_fused_forwards_outputs(reference: NativeEngine) -> None:
    pieces = _twin(reference, decode_graphs="eager")
    assert (reference.decode_graphs, pieces.decode_graphs) == ("off", "eager")
    tokens, logprobs = _decode(pieces)
    assert pieces.decode_graph_sizes == (4, 8)  # 3 tokens run in 4 rows, 5 in 8
    expected_tokens, expected_logprobs = _decode(reference)
    assert reference.decode_graph_sizes == ()
    assert tokens == expected_tokens
    np.testing.assert_allclose(_flat(logprobs), _flat(expected_logprobs), rtol=0, atol=1e-5)
    with pieces.decode_graphs_paused():
        assert pieces.decode_graphs == "off"
        assert _decode(pieces)[0] == expected_tokens
    assert (pieces.decode_graphs, pieces.decode_graph_sizes) == ("eager", (4, 8))


def _graphs_on(engine: NativeEngine, capturer: object) -> DecodeGraphs:
    assert engine._fused is not None
    graphs = DecodeGraphs(
        engine._fused,
        bucket_sizes(16),
        torch.device("cpu"),
        capture=True,
        capturer=capturer,  # type: ignore[arg-type]
    )
    engine._decode_graphs = graphs
    return graphs


def test_a_capture_that_agrees_stays_on(reference: NativeEngine) -> None:
    engine = _twin(reference, decode_graphs="off")
    captures: list[int] = []

    def keep(pieces: tuple[Piece, ...], device: torch.device) -> tuple[Piece, ...]:
        captures.append(len(pieces))
        return pieces

    _graphs_on(engine, keep)
    tokens, _ = _decode(engine)
    assert engine.decode_graphs == "captured"
    assert engine.decode_graph_sizes == (4, 8)
    layers = reference.loaded.model.config.num_hidden_layers
    assert captures == [layers + 1, layers + 1]  # one piece between each two attentions
    assert tokens == _decode(reference)[0]


def test_a_capture_that_differs_is_switched_off_keeping_the_outputs(
    reference: NativeEngine,
) -> None:
    engine = _twin(reference, decode_graphs="off")

    def twice(pieces: tuple[Piece, ...], device: torch.device) -> tuple[Piece, ...]:
        # A capture whose second piece adds the first layer's end to the residual twice.
        def again() -> None:
            pieces[1]()
            pieces[1]()

        return (pieces[0], again, *pieces[2:])

    graphs = _graphs_on(engine, twice)
    tokens, logprobs = _decode(engine)
    assert graphs.disabled is not None and "differed" in graphs.disabled
    assert engine.decode_graphs.startswith("off (captured logits of a 8-token step differed")
    assert engine.decode_graph_sizes == (8,)  # the first decode step found it
    expected_tokens, expected_logprobs = _decode(reference)
    assert tokens == expected_tokens
    np.testing.assert_allclose(_flat(logprobs), _flat(expected_logprobs), rtol=0, atol=1e-5)


def test_a_refused_capture_is_switched_off_keeping_the_outputs(reference: NativeEngine) -> None:
    engine = _twin(reference, decode_graphs="off")

    def refused(pieces: tuple[Piece, ...], device: torch.device) -> tuple[Piece, ...]:
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs = _graphs_on(engine, refused)
    tokens, _ = _decode(engine)
    assert graphs.disabled is not None and "not permitted" in graphs.disabled
    assert engine.decode_graphs.startswith("off (capturing a 8-token step failed")
    assert tokens == _decode(reference)[0]


def test_decode_graphs_setting_is_checked(reference: NativeEngine) -> None:
    with pytest.raises(ValueError, match="decode_graphs='on' needs the fused forward on a CUDA"):
        _twin(reference, decode_graphs="on")
    with pytest.raises(ValueError, match="decode_graphs must be auto, on, eager or off"):
        NativeEngineConfig(model=TINY, decode_graphs="always")
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        assert reference._fused is not None
        DecodeGraphs(reference._fused, (1, 2), torch.device("cpu"), capture=True)
