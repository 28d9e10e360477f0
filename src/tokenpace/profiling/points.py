"""What the profiling sweep measures: one dataclass per kind of point (times in ms)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DecodePoint:
    """Median decode step time (ms) of ``batch_size`` requests at ``context`` tokens;
    ``cv`` is the coefficient of variation of the timed steps."""

    batch_size: int
    context: int
    step_ms: float
    cv: float


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    """Median time (ms) of a step computing one prefill chunk and nothing else; ``spread``:
    the range of its passes over that median (0 for one pass)."""

    num_tokens: int
    context_start: int
    step_ms: float
    spread: float = 0.0


@dataclass(frozen=True, slots=True)
class IdlePoint:
    """One lone prefill step (ms) timed after the engine sat idle ``gap_s`` seconds
    (``after_idle_ms``), and the same step again at once (``warm_ms``)."""

    gap_s: float
    after_idle_ms: float
    warm_ms: float


@dataclass(frozen=True, slots=True)
class MixedPoint:
    """Decode step time (ms) of ``batch_size`` requests without and with one prefill chunk
    of ``chunk`` tokens; ``split_ms``: with the same tokens as ``split_chunks`` chunks of
    ``chunk // split_chunks`` tokens, one per request (``split_chunks`` 1: not measured)."""

    batch_size: int
    chunk: int
    decode_ms: float
    mixed_ms: float
    split_chunks: int = 1
    split_ms: float = 0.0

    @property
    def split_chunk(self) -> int:
        """Tokens of each chunk of the split step."""
        return self.chunk // self.split_chunks
