"""The timing-probe protocol: what an engine offers the profiling sweep.

Each engine's serving backend hands out a probe (``ServingBackend.timing_probe``) that runs
steps of chosen shapes on the loaded engine and times them; the sweep (``sweep.run_sweep``)
decides which shapes, and one fit turns the points into a profile, for an offline
``tokenpace profile`` and a worker's start-up calibration alike.

Step latency, for every engine, is what the policy sees as ``last_step_latency_s``: the
wall time from one step's start to the delivery of its tokens (native: ``execute``; vLLM:
the tokenpace scheduler's ``StepTimer``, update to update while busy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tokenpace.engine.profile import CheckpointTier
from tokenpace.profiling.points import DecodePoint, MixedPoint, PrefillPoint

if TYPE_CHECKING:
    from tokenpace.profiling.sweep import SweepConfig


@dataclass(frozen=True, slots=True)
class KvFacts:
    """The engine's KV cache and batch limits: ``num_gpu_blocks`` usable blocks of
    ``block_size`` tokens, at most ``max_num_seqs`` requests of ``max_model_len`` tokens."""

    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_model_len: int


@dataclass(frozen=True, slots=True)
class EngineFacts:
    """What a profile records about the engine besides step times: its name
    (``<engine>-<model>-<dtype>-<device>``), checkpoint size (bytes), load bandwidth per
    checkpoint tier and notes (measured values, how); ``decode_attention_padded`` when the
    engine attends every decoding request over its batch's longest context, and the rule by
    which it attends the longest few on their own (``decode_attention_peeled``,
    ``decode_attention_call_tokens``; see ``EngineProfile``)."""

    name: str
    checkpoint_bytes: int
    checkpoint_tiers: tuple[CheckpointTier, ...]
    notes: dict[str, str]
    decode_attention_padded: bool = False
    decode_attention_peeled: int = 0
    decode_attention_call_tokens: float = 0.0


class TimingProbe(Protocol):
    """Times steps of one shape at a time on a loaded engine that is otherwise idle; every
    method leaves the engine holding no request. Times are milliseconds."""

    @property
    def kv(self) -> KvFacts: ...

    @property
    def description(self) -> str:
        """The engine, device, precision and model, for the profile's notes."""
        ...

    def facts(self, measure_checkpoints: bool) -> EngineFacts:
        """The engine's facts; ``measure_checkpoints`` also times a load from every
        checkpoint tier it can read (seconds to tens of seconds)."""
        ...

    def check(self, config: SweepConfig) -> None:
        """Raise ValueError naming the first point of ``config`` this engine cannot run
        (context beyond its length limit, too many requests, too few KV blocks)."""
        ...

    def decode(self, config: SweepConfig, batch_size: int, context: int) -> DecodePoint:
        """``batch_size`` requests decoding together at about ``context`` tokens each:
        ``config.warmup_steps`` untimed steps, then the median of
        ``config.steps_per_point`` timed ones."""
        ...

    def prefill(self, config: SweepConfig, num_tokens: int, context_start: int) -> PrefillPoint:
        """A lone ``num_tokens``-token prefill chunk after ``context_start`` cached tokens,
        nothing else in the step; median of ``config.repeats``."""
        ...

    def mixed(self, config: SweepConfig) -> MixedPoint:
        """A ``config.mixed_batch_size`` decode batch at ``config.decode_context`` tokens,
        stepped alone and with one ``config.mixed_chunk``-token prefill chunk, alternately;
        medians of ``config.repeats`` of each."""
        ...
