"""Choosing the policy and profile through the environment; version pinning."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenpace.engine.vllm.config import SCHEDULER_CLS, VllmEngineConfig
from tokenpace.engine.vllm.policy_setup import engine_profile, make_policy, prefill_chunk_tokens
from tokenpace.engine.vllm.settings import SchedulerSettings
from tokenpace.engine.vllm.version import UnsupportedVllmError, is_supported, require_supported_vllm


def test_defaults_when_nothing_is_set() -> None:
    settings = SchedulerSettings.from_env({})
    assert settings.policy == "twp"
    assert settings.step_log_path is None


def test_environment_overrides() -> None:
    settings = SchedulerSettings.from_env(
        {
            "TOKENPACE_POLICY": "fcfs",
            "TOKENPACE_PROFILE": "v100-llama-3.2-3b",
            "TOKENPACE_STEP_LOG": "/tmp/steps.jsonl",
            "TOKENPACE_STEP_LOG_MAX": "10",
        }
    )
    assert settings.policy == "fcfs"
    assert settings.step_log_path == Path("/tmp/steps.jsonl")
    assert settings.max_step_records == 10


def test_unknown_policy_lists_the_choices() -> None:
    with pytest.raises(ValueError, match=r"valid choices: .*twp"):
        SchedulerSettings.from_env({"TOKENPACE_POLICY": "nope"})


def test_malformed_number_names_the_variable() -> None:
    with pytest.raises(ValueError, match="TOKENPACE_STEP_LOG_MAX"):
        SchedulerSettings.from_env({"TOKENPACE_STEP_LOG_MAX": "many"})


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("0.32.0", True),
        ("0.32.3+cpu", True),
        ("0.33.0", True),
        ("0.31.9", False),
        ("0.34.0", True),
        ("0.35.0", False),
        ("1", False),
    ],
)
def test_supported_versions(version: str, ok: bool) -> None:
    assert is_supported(version) is ok


def test_unsupported_version_fails_with_one_sentence() -> None:
    with pytest.raises(
        UnsupportedVllmError, match=r"supports vLLM 0\.32\.x, 0\.33\.x, 0\.34\.x; found 0\.9\.2"
    ):
        require_supported_vllm("0.9.2")


def test_profile_takes_kv_facts_from_the_engine() -> None:
    profile = engine_profile("v100-llama-3.2-3b", block_size=32, num_blocks=363)
    assert (profile.block_size, profile.num_gpu_blocks) == (32, 363)


def test_twp_chunk_maps_to_vllm_and_unchunked_policies_do_not() -> None:
    profile = engine_profile("v100-llama-3.2-3b", 32, 100)
    assert prefill_chunk_tokens(make_policy("twp", profile)) == 64
    for name in ("fcfs", "priority", "dynamic_batch", "vllm_default"):
        assert prefill_chunk_tokens(make_policy(name, profile)) is None


def test_a_policy_that_rejects_early_is_refused_on_vllm() -> None:
    profile = engine_profile("v100-llama-3.2-3b", 32, 100)
    assert make_policy("twp_slo", profile).name == "twp_slo"
    with pytest.raises(ValueError, match="rejects requests early"):
        make_policy("twp_slo-early_reject", profile)


def test_engine_config_validates_and_names_the_scheduler() -> None:
    config = VllmEngineConfig(model="/models/x")
    assert config.llm_kwargs()["scheduler_cls"] == SCHEDULER_CLS
    assert VllmEngineConfig(model="/m", async_scheduling=True).scheduler_cls.endswith(
        "Async" + "Scheduler"
    )
    with pytest.raises(ValueError, match="dtype"):
        VllmEngineConfig(model="/m", dtype="int4")
    with pytest.raises(ValueError, match="model"):
        VllmEngineConfig()


def test_slo_from_the_environment() -> None:
    settings = SchedulerSettings.from_env(
        {"TOKENPACE_SLO_TTFT_MS": "500", "TOKENPACE_SLO_TPOT_MS": ""}
    )
    assert settings.slo.ttft_ms == 500.0
    assert settings.slo.tpot_ms == 100.0
    with pytest.raises(ValueError, match="TOKENPACE_SLO_TPOT_MS"):
        SchedulerSettings.from_env({"TOKENPACE_SLO_TPOT_MS": "fast"})
