"""What the profiling tests' scripted timing probes share: the KV facts and engine facts
of a small made-up engine."""

from __future__ import annotations

from tokenpace.profiling.probe import EngineFacts, KvFacts


class ScriptedEngineFacts:
    """``kv``, ``description`` and ``facts`` of a ``TimingProbe`` over no engine."""

    name = "scripted"

    @property
    def kv(self) -> KvFacts:
        return KvFacts(block_size=16, num_gpu_blocks=100, max_num_seqs=64, max_model_len=2048)

    @property
    def description(self) -> str:
        return self.name

    def facts(self, measure_checkpoints: bool) -> EngineFacts:
        return EngineFacts(self.name, 0, (), {})
