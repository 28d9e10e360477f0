"""The pool's capacity in requests/s, from the engine profile and the length mixtures.

Definition (written into the bench report): capacity is the request rate a pool sustains at
every container's efficient operating point, B0 requests decoding together at l_min per step.
One request then costs a container ``E[out] * l_min / B0`` seconds of decode (its share of the
B0 slots) plus ``E[prefill(p)] + mixed_prefill_overhead`` seconds during which its whole-prompt
prefill stalls the batch, where E[prefill(p)] is the latency model's prefill cost averaged
exactly over the prompt mixture. Pool capacity = num_containers / (that cost). Rates above it
push batches past B0, where ITL grows by alpha per request (paper Eq. 2).
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenpace.engine.latency_model import LatencyModel, PrefillChunk
from tokenpace.engine.profile import EngineProfile
from tokenpace.workload.lengths import LengthMixture
from tokenpace.workload.spec import RequestSpec


def mean_prefill_s(profile: EngineProfile, prompt_lengths: LengthMixture) -> float:
    """Expected seconds to prefill one prompt in one chunk from an empty context."""
    model = LatencyModel(profile)
    total_ms = 0.0
    for (low, high), weight in zip(prompt_lengths.ranges, prompt_lengths.weights, strict=True):
        span = range(low, high + 1)
        mean_ms = sum(model.prefill_ms(PrefillChunk(p, 0)) for p in span) / len(span)
        total_ms += weight * mean_ms
    return total_ms / 1000.0


def container_seconds_per_request(
    profile: EngineProfile, prompt_lengths: LengthMixture, output_lengths: LengthMixture
) -> float:
    """Seconds of one container's time one request costs at the efficient operating point."""
    decode_s = output_lengths.mean * profile.l_min_ms / 1000.0 / profile.b0
    prefill_s = mean_prefill_s(profile, prompt_lengths) + profile.mixed_prefill_overhead_ms / 1000
    return decode_s + prefill_s


def pool_capacity_rps(
    profile: EngineProfile,
    prompt_lengths: LengthMixture,
    output_lengths: LengthMixture,
    num_containers: int,
) -> float:
    """Requests/s the pool serves with every container at B0 (see the module docstring)."""
    if num_containers <= 0:
        raise ValueError(f"num_containers must be positive, got {num_containers}")
    per_request = container_seconds_per_request(profile, prompt_lengths, output_lengths)
    return num_containers / per_request


def pool_capacity_rps_for_specs(
    profile: EngineProfile, specs: Sequence[RequestSpec], num_containers: int
) -> float:
    """The same definition with the expectations taken over ``specs`` (e.g. a trace)."""
    if num_containers <= 0:
        raise ValueError(f"num_containers must be positive, got {num_containers}")
    if not specs:
        raise ValueError("capacity needs at least one request")
    model = LatencyModel(profile)
    decode_ms = sum(s.max_tokens for s in specs) * profile.l_min_ms / profile.b0
    prefill_ms = sum(model.prefill_ms(PrefillChunk(s.num_prompt_tokens, 0)) for s in specs)
    overhead_ms = len(specs) * profile.mixed_prefill_overhead_ms
    per_request_s = (decode_ms + prefill_ms + overhead_ms) / 1000 / len(specs)
    return num_containers / per_request_s
