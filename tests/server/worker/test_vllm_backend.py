"""The vLLM serving backend on a real in-process vLLM engine (SmolLM2) under TWP.

One engine for the module, built by ``build_vllm`` exactly as a worker builds it (profile
measured at start). Requests are short and greedy so the module stays near a minute on CPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import pytest

from tests.engine.vllm.model import (
    BUILD,
    KV_CACHE_BYTES,
    MAX_MODEL_LEN,
    embedded_model,
    set_vllm_environment,
)
from tokenpace.core.request import FinishReason
from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.vllm.config import VllmEngineConfig
from tokenpace.policy.twp.policy import TwpPolicy
from tokenpace.profiling.online import OnlineCalibrationConfig
from tokenpace.server.worker.wire import Calibration, Finished, Report, WorkerSpec, WorkItem

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

GREEDY = SamplingParams(ignore_eos=True)


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    """A ``VllmBackend`` running policy twp with a profile measured at start and online
    calibration on (as ``tokenpace serve`` builds it)."""
    pytest.importorskip("vllm", reason="needs the vllm extra (scripts/setup.sh vllm)")
    model = embedded_model()
    with pytest.MonkeyPatch.context() as patch:
        # start_engine writes these into os.environ; setting them here first restores them.
        set_vllm_environment(patch, "twp")
        from tokenpace.server.worker.vllm_backend import build_vllm

        config = VllmEngineConfig(
            model=str(model),
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=8,
            max_num_batched_tokens=512,
            kv_cache_memory_bytes=KV_CACHE_BYTES,
        )
        spec = WorkerSpec(
            engine="vllm",
            engine_config=config,
            policy="twp",
            calibration=Calibration("smollm2-vllm-cpu", 8, 16.0, MAX_MODEL_LEN),
            build_dir=BUILD,
            online_calibration=OnlineCalibrationConfig(),
        )
        built: Any = build_vllm(spec, time.perf_counter)
        yield built
        built.shutdown()


def item(request_id: int, num_prompt: int, max_tokens: int) -> WorkItem:
    prompt = tuple(200 + (13 * request_id + 5 * j) % 3000 for j in range(num_prompt))
    return WorkItem(request_id, prompt, max_tokens, time.perf_counter(), GREEDY)


def run_until_idle(backend: Any, max_steps: int = 200) -> list[Report]:
    reports: list[Report] = []
    for _ in range(max_steps):
        report = backend.step()
        if report is None:
            return reports
        reports.append(report)
    raise AssertionError(f"the engine still had work after {max_steps} steps")


def test_profile_is_measured_at_start_and_sized_to_the_cache(backend: Any) -> None:
    profile = backend.profile
    # The calibration sweep is fitted with the knee at the configured B0 (its r2 recorded).
    assert profile.name == "smollm2-vllm-cpu" and profile.b0 == 8
    assert profile.r2 is not None and profile.r2 <= 1.0
    assert profile.l_min_ms > 0 and profile.prefill_ms_per_token > 0
    assert "measured at start" in profile.notes["source"] and profile.alpha_ms >= 0
    # It records the precision it holds for, which a later --profile must match.
    assert profile.dtype == backend.dtype_choice.dtype
    load = backend.load_state()
    assert profile.num_gpu_blocks == load.num_total_blocks
    assert backend.kv_capacity_tokens == load.num_total_blocks * profile.block_size
    assert load.num_used_blocks == 0 and not backend.has_work


def test_greedy_request_streams_every_token_then_finishes_on_length(backend: Any) -> None:
    max_tokens = 7
    assert backend.add([item(1, 20, max_tokens)]) == []
    assert backend.has_work
    reports = run_until_idle(backend)

    tokens = [t for r in reports for t in r.tokens]
    assert [t[0] for t in tokens] == [1] * max_tokens
    times = [t[2] for t in tokens]
    assert all(a < b for a, b in pairwise(times))
    admitted = [a for r in reports for a in r.admitted]
    assert len(admitted) == 1 and admitted[0][0] == 1
    assert admitted[0][1] <= times[0]
    finished = [f for r in reports for f in r.finished]
    assert finished == [Finished(1, FinishReason.LENGTH, max_tokens)]
    # TWP is in charge: its telemetry comes with every report.
    assert "token_window" in reports[0].load.telemetry
    assert "token_load" in reports[-1].load.telemetry
    assert backend.load_state().num_used_blocks == 0 and not backend.has_work


def test_abort_mid_way_frees_the_cache_at_once(backend: Any) -> None:
    assert backend.add([item(2, 40, 60), item(3, 24, 60)]) == []
    reports = [backend.step() for _ in range(3)]
    num_tokens = {2: 0, 3: 0}
    for report in reports:
        assert report is not None
        for request_id, _, _ in report.tokens:
            num_tokens[request_id] += 1
    assert min(num_tokens.values()) > 0
    load = backend.load_state()
    assert load.num_running == 2 and load.num_used_blocks > 0
    assert 0 < load.outstanding_tokens <= 120

    aborted = backend.abort([2, 99])  # 99 is unknown: ignored
    assert aborted == [Finished(2, FinishReason.ABORT, num_tokens[2])]
    assert backend.has_work
    assert backend.abort_all() == [Finished(3, FinishReason.ABORT, num_tokens[3])]
    load = backend.load_state()
    assert load.num_used_blocks == 0 and load.num_running == 0 and load.num_waiting == 0
    assert load.outstanding_tokens == 0
    assert not backend.has_work and backend.step() is None
    assert backend.abort([2, 3]) == []


def test_prompt_longer_than_the_model_is_refused_not_raised(backend: Any) -> None:
    refused = backend.add([item(4, MAX_MODEL_LEN + 10, 4), item(5, 8, 2)])
    assert len(refused) == 1
    failed = refused[0]
    assert failed.request_id == 4 and failed.reason is None and failed.num_output_tokens == 0
    assert failed.error and f"maximum context length is {MAX_MODEL_LEN}" in failed.error
    # The request beside it runs normally.
    finished = [f for r in run_until_idle(backend) for f in r.finished]
    assert finished == [Finished(5, FinishReason.LENGTH, 2)]


def test_stop_string_ends_the_request_with_stop(backend: Any) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_model())
    prompt = tuple(tokenizer.encode("Count from one to ten: one, two, three,"))
    stopping = SamplingParams(stop=(",",))
    assert backend.add([WorkItem(6, prompt, 40, time.perf_counter(), stopping)]) == []
    reports = run_until_idle(backend)
    (finished,) = [f for r in reports for f in r.finished]
    num_tokens = sum(len(r.tokens) for r in reports)
    assert finished.reason is FinishReason.STOP
    # vLLM reports the token that completed the stop string; the server cuts the text.
    assert finished.num_output_tokens == num_tokens < 40


def test_online_calibration_refits_the_profile_twp_plans_from(backend: Any) -> None:
    """Every step the scheduler runs feeds the estimator; its refit reaches the policy."""
    run_until_idle(backend)
    before = backend.load_state().live_profile
    assert before is not None
    backend.add([item(60 + i, 12, 24) for i in range(3)])
    run_until_idle(backend)
    live = backend.load_state().live_profile
    assert live is not None and live.num_steps >= before.num_steps + 24
    assert live.updated_s is not None and live.b0 == backend.profile.b0
    policy = backend._scheduler.tokenpace_policy
    assert isinstance(policy, TwpPolicy)
    assert policy.config.l_min_ms == live.l_min_ms == backend.live_profile.l_min_ms
    # Within a factor of the start-up measurement: the same engine on the same machine.
    assert 0.25 < live.l_min_ms / backend.profile.l_min_ms < 4


def test_a_profile_of_another_precision_is_refused_before_vllm_starts() -> None:
    pytest.importorskip("vllm", reason="needs the vllm extra (scripts/setup.sh vllm)")
    from dataclasses import replace

    from tokenpace.engine.profile import load_profile
    from tokenpace.server.worker.vllm_backend import build_vllm

    config = VllmEngineConfig(model=str(BUILD / "no-model-needed"), max_model_len=MAX_MODEL_LEN)
    other = "bfloat16" if config.resolved_dtype == "float32" else "float32"
    spec = WorkerSpec(
        engine="vllm",
        engine_config=config,
        policy="twp",
        calibration=Calibration("m", 8, 16.0, MAX_MODEL_LEN),
        profile=replace(load_profile("v100-llama-3.2-3b"), dtype=other),
    )
    with pytest.raises(ValueError, match=f"measured in {other}; vLLM runs in "):
        build_vllm(spec, time.perf_counter)
