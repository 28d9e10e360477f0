"""The sweep's passes over decode batch sizes: each size keeps its median pass."""

from __future__ import annotations

import pytest

from tokenpace.profiling.points import DecodePoint, MixedPoint, PrefillPoint
from tokenpace.profiling.probe import EngineFacts, KvFacts
from tokenpace.profiling.sweep import SweepConfig, run_sweep


class ScriptedProbe:
    """A timing probe whose decode passes take scripted times: per batch size, one time per
    call in order (the warm-up pass included)."""

    def __init__(self, decode_ms: dict[int, list[float]]) -> None:
        self._decode_ms = {size: list(times) for size, times in decode_ms.items()}

    @property
    def kv(self) -> KvFacts:
        return KvFacts(block_size=16, num_gpu_blocks=100, max_num_seqs=64, max_model_len=2048)

    @property
    def description(self) -> str:
        return "scripted"

    def facts(self, measure_checkpoints: bool) -> EngineFacts:
        return EngineFacts("scripted", 0, (), {})

    def check(self, config: SweepConfig) -> None:
        pass

    def decode(self, config: SweepConfig, batch_size: int, context: int) -> DecodePoint:
        return DecodePoint(batch_size, context, self._decode_ms[batch_size].pop(0), 0.0)

    def prefill(self, config: SweepConfig, num_tokens: int, context_start: int) -> PrefillPoint:
        return PrefillPoint(num_tokens, context_start, 10.0 + num_tokens)

    def mixed(self, config: SweepConfig) -> MixedPoint:
        return MixedPoint(config.mixed_batch_size, config.mixed_chunk, 20.0, 30.0)


def test_each_batch_size_keeps_its_median_pass() -> None:
    config = SweepConfig(
        batch_sizes=(1, 2, 4), context_lengths=(), context_batch_sizes=(), prefill_chunks=(16,),
        prefill_context_starts=(0,), decode_rounds=3,
    )  # fmt: skip
    # The first time of the smallest and largest size is the untimed warm-up pass.
    probe = ScriptedProbe(
        {
            1: [500.0, 90.0, 40.0, 45.0],  # a slow first pass (warm-up laden)
            2: [30.0, 50.0, 48.0],  # one lucky fast pass
            4: [500.0, 60.0, 61.0, 200.0],  # a burst of contention in the last pass
        }
    )
    sweep = run_sweep(probe, config)
    assert [p.step_ms for p in sweep.decode] == [45.0, 48.0, 61.0]
    # Every timed pass is kept for the residual's noise gate, the warm-up pass is not.
    assert sorted(p.step_ms for p in sweep.decode_passes if p.batch_size == 1) == [40.0, 45.0, 90.0]
    assert len(sweep.decode_passes) == 9


def test_the_mixed_split_must_divide_the_chunk_into_real_prefills() -> None:
    assert SweepConfig(mixed_chunk=64, mixed_split=16).mixed_split == 16
    assert SweepConfig(mixed_batch_size=0, mixed_chunk=16, mixed_split=16).mixed_split == 16
    for split in (0, 3, 64):  # none, not a divisor, chunks of one token (read as decodes)
        with pytest.raises(ValueError, match=f"mixed_split .* got {split} for a 64-token"):
            SweepConfig(mixed_chunk=64, mixed_split=split)
