from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.helpers import request, running
from tokenpace.core.step import ScheduledChunk
from tokenpace.engine.kv_blocks import BlockAccountant
from tokenpace.engine.latency_model import LatencyModel, PrefillChunk, StepShape
from tokenpace.engine.profile import EngineProfile, load_profile, shipped_profiles
from tokenpace.engine.sim import SimEngine


def test_eq2_flat_up_to_b0_then_alpha_per_request(paper_profile: EngineProfile) -> None:
    model = LatencyModel(paper_profile)  # l_min 43, B0 8, alpha 1.0
    assert model.decode_ms(1) == model.decode_ms(8) == 43.0
    assert model.decode_ms(20) == 43.0 + 12 * 1.0


def test_prefill_cost_includes_attention_term_and_mixing(paper_profile: EngineProfile) -> None:
    model = LatencyModel(paper_profile)  # 0.15 ms/token, 0.009 ms/token/kctx, mix 3 ms
    chunk = PrefillChunk(num_tokens=64, context_start=100)
    # mean context 100 + 32.5 = 132.5 -> per token 0.15 + 0.009 * 0.1325
    assert model.prefill_ms(chunk) == pytest.approx(64 * (0.15 + 0.009 * 0.1325))
    alone = model.step_s(0, [chunk])
    mixed = model.step_s(4, [chunk])
    assert mixed - alone == pytest.approx(0.003)  # the mixing overhead only
    assert model.step_s(0, []) == 0.0


def test_every_prefill_chunk_after_the_first_pays_the_chunk_overhead(
    paper_profile: EngineProfile,
) -> None:
    model = LatencyModel(replace(paper_profile, prefill_chunk_overhead_ms=2.0))
    chunk = PrefillChunk(num_tokens=16, context_start=0)
    one = model.step_s(4, [chunk])
    tokens_s = model.prefill_ms(chunk) / 1000
    assert model.step_s(4, [chunk] * 3) - one == pytest.approx(2 * tokens_s + 2 * 0.002)
    assert model.step_s(0, [chunk] * 2) - model.step_s(0, [chunk]) == pytest.approx(
        tokens_s + 0.002
    )
    # The reference profile has none: a step's chunks cost their tokens alone.
    plain = LatencyModel(paper_profile)
    assert plain.step_s(4, [chunk] * 3) - plain.step_s(4, [chunk]) == pytest.approx(2 * tokens_s)


def test_sim_engine_samples_when_prefill_completes_and_tracks_blocks(
    paper_profile: EngineProfile,
) -> None:
    engine = SimEngine(replace(paper_profile, noise_cv=0.0), np.random.default_rng(0))
    r = request(0, prompt=40, max_tokens=5)
    result = engine.execute([ScheduledChunk(r, 32)])
    assert result.sampled_token_ids == {} and result.num_prefill_tokens == 32
    assert engine.num_total_blocks - engine.num_free_blocks == 2
    result = engine.execute([ScheduledChunk(r, 8)])
    assert result.sampled_token_ids == {0: 0}  # prompt complete: first token
    assert engine.num_total_blocks - engine.num_free_blocks == 3  # 40 tokens
    engine.free(0)
    assert engine.num_free_blocks == engine.num_total_blocks


def test_sim_engine_rejects_more_tokens_than_uncomputed(paper_profile: EngineProfile) -> None:
    engine = SimEngine(paper_profile, np.random.default_rng(0))
    with pytest.raises(ValueError, match="cannot compute"):
        engine.execute([ScheduledChunk(running(0, 10, 5, 1), 2)])


def test_noise_has_the_configured_cv(paper_profile: EngineProfile) -> None:
    engine = SimEngine(replace(paper_profile, noise_cv=0.05), np.random.default_rng(1))
    samples = []
    for i in range(2000):
        r = running(i, 10, 5, 1)
        samples.append(engine.execute([ScheduledChunk(r, 1)]).latency_s)
        engine.free(i)
    cv = np.std(samples) / np.mean(samples)
    assert 0.045 < cv < 0.055


def test_block_accountant_refuses_to_exceed_capacity() -> None:
    blocks = BlockAccountant(num_total_blocks=2, block_size=16)
    r = request(0, prompt=40)
    assert not blocks.can_allocate(r, 40)
    with pytest.raises(MemoryError):
        blocks.allocate(r, 40)
    blocks.allocate(r, 32)
    assert blocks.num_free_blocks == 0


def test_profiles_load_by_name_and_report_bad_input(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert "v100-llama-3.2-3b" in shipped_profiles()
    with pytest.raises(FileNotFoundError, match="no profile named 'nope'"):
        load_profile("nope")
    bad = tmp_path / "p.json"
    bad.write_text('{"name": "x"}')
    with pytest.raises(ValueError, match="missing keys"):
        load_profile(bad)
    profile = load_profile("v100-llama-3.2-3b")
    again = tmp_path / "again.json"
    again.write_text(profile.to_json())
    assert load_profile(again) == profile


def test_decode_residual_is_interpolated_and_held_beyond_the_sweep(
    paper_profile: EngineProfile,
) -> None:
    profile = replace(paper_profile, decode_residual_ms=((1, -5.0), (8, 0.0), (16, 4.0)))
    model = LatencyModel(profile)  # Eq. 2: 43 ms up to B0 8, +1 ms per request beyond
    assert model.decode_ms(1) == pytest.approx(38.0)
    assert model.decode_ms(4) == pytest.approx(43.0 - 5.0 * 4 / 7)
    assert model.decode_ms(12) == pytest.approx(43.0 + 4 + 2.0)
    assert model.decode_ms(40) == pytest.approx(43.0 + 32 + 4.0)  # last value held
    # A prefill-only step pays the floor at the smallest swept batch.
    assert model.step_s(0, [PrefillChunk(10, 0)]) == pytest.approx(
        (38.0 + model.prefill_ms(PrefillChunk(10, 0))) / 1000
    )


def test_decode_residual_round_trips_and_is_validated(paper_profile: EngineProfile) -> None:
    profile = replace(paper_profile, decode_residual_ms=((1, -2.5), (4, 1.0)))
    import json

    assert EngineProfile.from_dict(json.loads(profile.to_json())) == profile
    with pytest.raises(ValueError, match="increasing order"):
        replace(paper_profile, decode_residual_ms=((4, 1.0), (2, 0.0)))


def test_padded_decode_attention_counts_the_longest_context(paper_profile: EngineProfile) -> None:
    summed = replace(paper_profile, decode_attention_ms_per_kctx=5.0)
    padded = replace(summed, decode_attention_padded=True)
    # Four requests at contexts 100, 100, 100 and 700: 1,000 tokens summed, 4 x 700 padded.
    base = LatencyModel(paper_profile).step_s(4, [])
    assert LatencyModel(summed).step_s(4, [], 1000, 700) - base == pytest.approx(0.005)
    assert LatencyModel(padded).step_s(4, [], 1000, 700) - base == pytest.approx(0.014)
    # The simulator gives the model the batch's longest context.
    engine = SimEngine(padded, np.random.default_rng(0))
    reqs = [running(i, prompt, 16, 1) for i, prompt in enumerate((100, 700))]
    step = engine.execute([ScheduledChunk(r, 1) for r in reqs])
    noiseless = LatencyModel(padded).step_s(2, [], 800, 700)
    assert step.latency_s == pytest.approx(noiseless, rel=5 * padded.noise_cv + 1e-9)


def test_a_step_shape_read_before_the_step_prices_it_as_the_simulator_does(
    paper_profile: EngineProfile,
) -> None:
    profile = replace(paper_profile, noise_cv=0.0, decode_attention_ms_per_kctx=2.0)
    engine = SimEngine(profile, np.random.default_rng(0))
    decoding = [running(i, 100 * (i + 1), 50, 3) for i in range(4)]
    fresh, started = request(10, prompt=300), request(11, prompt=200)
    engine.execute([ScheduledChunk(started, 64)])
    chunks = [ScheduledChunk(r, 1) for r in decoding]
    chunks += [ScheduledChunk(fresh, 128), ScheduledChunk(started, 100)]
    shape = StepShape.of(chunks)
    assert shape.decode_contexts == (102, 202, 302, 402)
    assert shape.prefill_chunks == (PrefillChunk(128, 0), PrefillChunk(100, 64))
    latency_s = engine.execute(chunks).latency_s
    assert LatencyModel(profile).shape_s(shape) == pytest.approx(latency_s)
