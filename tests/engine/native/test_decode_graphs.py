"""Steps through per-size buffers and pieces (``decode_graphs``), on the CPU: the uncaptured
pieces on prefill, decode and mixed steps, and the first-step check that switches a wrong
capture off."""

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
SIZES_USED = (1, 4, 8, 16, 72)  # the step sizes ``_decode`` runs in


@pytest.fixture(scope="module")
def reference() -> NativeEngine:
    # Decode attention by SDPA and elementwise work by torch on both sides: the pieces are
    # compared, not the attention or the elementwise kernel.
    config = NativeEngineConfig(
        model=TINY, device="cpu", dtype="float32", num_threads=1, max_num_seqs=16,
        decode_attention="sdpa", elementwise="torch",
    )  # fmt: skip
    return NativeEngine.load(config, rng=np.random.default_rng(0))


def _twin(engine: NativeEngine, **overrides: object) -> NativeEngine:
    overrides.setdefault("decode_attention", "sdpa")
    overrides.setdefault("elementwise", "torch")
    config = NativeEngineConfig(
        model=TINY,
        device="cpu",
        dtype="float32",
        max_num_seqs=16,
        **overrides,  # type: ignore[arg-type]
    )
    return NativeEngine(engine.loaded, config, time.perf_counter, np.random.default_rng(0))


def _decode(engine: NativeEngine) -> tuple[list[list[int]], list[list[float]]]:
    """Five requests prefilled in one step, then decode steps of 5, 3 (two sit one out) and
    5 tokens; a sixth request's prompt joins decode steps in two chunks (mixed steps), then
    decodes with the rest: each request's tokens and their logprobs."""
    params = SamplingParams(ignore_eos=True, logprobs=0)
    requests = [Request(100 + i, 4 + 5 * i, 8, 0.0, sampling=params) for i in range(5)]
    late = Request(105, 11, 8, 0.0, sampling=params)
    for step in range(15):
        live = [r for r in requests if r.num_output_tokens < 8]
        if step == 3:
            live = live[:3]
        chunks = [
            ScheduledChunk(r, r.num_uncomputed_tokens if r.is_prefilling else 1) for r in live
        ]
        if step in (4, 5):
            chunks.append(ScheduledChunk(late, 6 if step == 4 else 5))
        if not chunks:
            break
        result = engine.execute(chunks)
        for chunk in chunks:
            request = chunk.request
            token = result.sampled_token_ids.get(request.request_id)
            if token is not None:
                request.output_token_ids.append(token)
                request.token_times_s.append(engine.step_logprobs[request.request_id].logprob)
        if step == 5:
            requests.append(late)
    for request in requests:
        engine.free(request.request_id)
    return [r.output_token_ids for r in requests], [r.token_times_s for r in requests]


def _flat(rows: list[list[float]]) -> list[float]:
    return [value for row in rows for value in row]


def test_bucket_sizes_cover_every_step_up_to_the_limit() -> None:
    assert bucket_sizes(1) == (1,)
    assert bucket_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert bucket_sizes(24) == (1, 2, 4, 8, 16, 24)
    assert bucket_sizes(300) == (1, 2, 4, *range(8, 129, 8), 192, 256, 300)
    with pytest.raises(ValueError, match="max_tokens"):
        bucket_sizes(0)


def test_uncaptured_pieces_give_the_fused_forwards_outputs(reference: NativeEngine) -> None:
    pieces = _twin(reference, decode_graphs="eager")
    assert (reference.decode_graphs, pieces.decode_graphs) == ("off", "eager")
    tokens, logprobs = _decode(pieces)
    # Prefill of 70 tokens in 72 rows; decode steps of 3 in 4, 5 and 6 in 8, the last
    # request's 1 in 1; mixed steps of 11 and 10 tokens in 16.
    assert pieces.decode_graph_sizes == SIZES_USED
    expected_tokens, expected_logprobs = _decode(reference)
    assert reference.decode_graph_sizes == ()
    assert tokens == expected_tokens
    np.testing.assert_allclose(_flat(logprobs), _flat(expected_logprobs), rtol=0, atol=1e-5)
    with pieces.decode_graphs_paused():
        assert pieces.decode_graphs == "off"
        assert _decode(pieces)[0] == expected_tokens
    assert (pieces.decode_graphs, pieces.decode_graph_sizes) == ("eager", SIZES_USED)


def _graphs_on(engine: NativeEngine, capturer: object) -> DecodeGraphs:
    assert engine._fused is not None
    graphs = DecodeGraphs(
        engine._fused,
        bucket_sizes(engine.config.graph_max_tokens),
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
    assert engine.decode_graph_sizes == SIZES_USED
    layers = reference.loaded.model.config.num_hidden_layers
    # One piece between each two attentions, one capture per size.
    assert captures == [layers + 1] * len(SIZES_USED)
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
    assert engine.decode_graphs.startswith("off (captured logits of a 72-token step differed")
    assert engine.decode_graph_sizes == (72,)  # the first step (the prefill) found it
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
    assert engine.decode_graphs.startswith("off (capturing a 72-token step failed")
    assert tokens == _decode(reference)[0]


def test_decode_graphs_setting_is_checked(reference: NativeEngine) -> None:
    with pytest.raises(ValueError, match="decode_graphs='on' needs the fused forward on a CUDA"):
        _twin(reference, decode_graphs="on")
    with pytest.raises(ValueError, match="decode_graphs must be auto, on, eager or off"):
        NativeEngineConfig(model=TINY, decode_graphs="always")
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        assert reference._fused is not None
        DecodeGraphs(reference._fused, (1, 2), torch.device("cpu"), capture=True)
