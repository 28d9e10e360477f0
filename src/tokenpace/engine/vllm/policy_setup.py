"""Building the policy a vLLM scheduler consults, sized to vLLM's own KV cache."""

from __future__ import annotations

from dataclasses import replace

from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.metrics.slo import Slo
from tokenpace.policy import Policy, build_policy
from tokenpace.policy.common import UNCHUNKED


def engine_profile(profile: str, block_size: int, num_blocks: int) -> EngineProfile:
    """The profile ``profile`` (shipped name or JSON path) with its KV facts replaced by the
    engine's: ``block_size`` tokens per block, ``num_blocks`` usable blocks."""
    return replace(load_profile(profile), block_size=block_size, num_gpu_blocks=num_blocks)


def make_policy(name: str, profile: EngineProfile, slo: Slo | None = None) -> Policy:
    """The registered policy ``name`` with its defaults for ``profile`` (and ``slo``, which
    only SLO-targeted policies read). Raises ValueError for a policy that rejects requests
    early: vLLM's scheduler would not carry its rejections out."""
    policy = build_policy(name, profile, slo)
    if getattr(getattr(policy, "config", None), "early_reject", False):
        raise ValueError(
            f"scheduler {name!r} rejects requests early, which the vLLM engine does not carry "
            "out; run it on the native engine or the simulator"
        )
    return policy


def prefill_chunk_tokens(policy: Policy) -> int | None:
    """The prefill chunk C (tokens per request per step) a chunking policy asks for, or None
    when the policy prefills whole prompts or says nothing about chunking.

    A policy declares its chunk as ``policy.config.chunk_tokens`` (TWP does); vLLM enforces
    it through ``long_prefill_token_threshold``.
    """
    config = getattr(policy, "config", None)
    chunk = getattr(config, "chunk_tokens", None)
    if isinstance(chunk, int) and 0 < chunk < UNCHUNKED:
        return chunk
    return None
