"""The native engine's timing probe (``profiling.probe.TimingProbe``).

Decode points fill their context without running the model (``NativeEngine.fill_context``):
attention cost depends on context length, not on the values in the cache. A step's latency
is ``execute``'s (forward, sampling and KV bookkeeping, device synchronised).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import count
from pathlib import Path

from tokenpace.core.request import Request
from tokenpace.core.sampling import SamplingParams
from tokenpace.core.step import ScheduledChunk
from tokenpace.engine.native.attention import MAX_PEELED, PEEL_CALL_TOKENS
from tokenpace.engine.native.engine import NativeEngine
from tokenpace.engine.native.loading import gguf_source, load_gguf, load_model
from tokenpace.engine.profile import CheckpointTier
from tokenpace.profiling.points import DecodePoint, MixedPoint, PrefillPoint
from tokenpace.profiling.probe import EngineFacts, KvFacts
from tokenpace.profiling.sweep import SweepConfig, measure_read_bandwidth_gb_s

_GREEDY_NO_EOS = SamplingParams(ignore_eos=True)
# Probe requests take ids far from any served request's.
_FIRST_ID = 1 << 40


class NativeProbe:
    """Times steps of chosen shapes on a loaded ``NativeEngine`` that serves nothing else."""

    def __init__(self, engine: NativeEngine) -> None:
        self._engine = engine
        self._ids = count(_FIRST_ID)

    @property
    def kv(self) -> KvFacts:
        config = self._engine.config
        return KvFacts(
            self._engine.block_size,
            self._engine.num_total_blocks,
            config.max_num_seqs,
            config.max_model_len,
        )

    @property
    def description(self) -> str:
        config, loaded = self._engine.config, self._engine.loaded
        return (
            f"the native engine on {loaded.device} with {config.num_threads} threads, "
            f"{str(loaded.dtype).removeprefix('torch.')}, model {config.model}"
        )

    def facts(self, measure_checkpoints: bool) -> EngineFacts:
        """Name, checkpoint size, the memory read bandwidth and batch-1 roofline, and with
        ``measure_checkpoints`` the load time of the safetensors cache and of the GGUF
        source (dequantising it), as checkpoint tiers."""
        config, loaded, clock = self._engine.config, self._engine.loaded, time.perf_counter
        checkpoint_bytes = sum(
            f.stat().st_size for f in loaded.checkpoint_dir.glob("*.safetensors")
        )
        bandwidth = measure_read_bandwidth_gb_s(loaded.device, clock)
        notes = {
            "memory_read_gb_s": f"{bandwidth:.1f}",
            "roofline_ms": f"{loaded.weight_bytes / bandwidth / 1e6:.2f} "
            "(weight bytes / bandwidth)",
            "num_gpu_blocks": f"The engine's configured KV budget: {config.kv_cache_tokens} "
            f"tokens of {self._engine.kv_bytes_per_token} bytes each.",
        }
        tiers = [CheckpointTier("gpu", 0.0)]
        if measure_checkpoints:
            start = clock()
            load_model(config, clock)
            safetensors_s = clock() - start
            tiers.append(CheckpointTier("host_memory", checkpoint_bytes / safetensors_s / 1e9))
            tiers.append(CheckpointTier("local_ssd", checkpoint_bytes / safetensors_s / 1e9))
            notes["checkpoint_safetensors_s"] = f"{safetensors_s:.2f}"
            gguf = gguf_source(config)
            if gguf is not None:
                start = clock()
                load_gguf(gguf, loaded.dtype)
                gguf_s = clock() - start
                tiers.append(CheckpointTier("remote", checkpoint_bytes / gguf_s / 1e9))
                notes["checkpoint_gguf_s"] = f"{gguf_s:.2f}"
                notes["checkpoint_ratio"] = f"{gguf_s / safetensors_s:.2f} (GGUF / safetensors)"
            notes["checkpoint_tiers"] = (
                "host_memory and local_ssd: load of the cached safetensors directory (page "
                "cache warm; both tiers measure the same path here); remote: dequantising the "
                "GGUF. Bandwidth = checkpoint_bytes / load seconds (engine_init_s = 0)."
            )
        dtype = str(loaded.dtype).removeprefix("torch.")  # what ``auto`` resolved to
        name = f"native-{Path(config.model).name}-{dtype}-{loaded.device.type}"
        if self._engine.decode_attention == "ragged":
            notes["decode_attention_padded"] = (
                "Decode attends each request over its own context (the ragged kernel): its "
                "cost grows with the summed context."
            )
            return EngineFacts(name, checkpoint_bytes, tuple(tiers), notes)
        notes["decode_attention_padded"] = (
            "Decode attends the packed slot rows up to the batch's longest context, masked: "
            f"its cost grows with batch size times the longest context; up to {MAX_PEELED} "
            "of the longest are attended on their own where that saves more than a call's "
            f"cost ({PEEL_CALL_TOKENS} tokens' worth)."
        )
        return EngineFacts(
            name, checkpoint_bytes, tuple(tiers), notes, decode_attention_padded=True,
            decode_attention_peeled=MAX_PEELED, decode_attention_call_tokens=PEEL_CALL_TOKENS,
        )  # fmt: skip

    def check(self, config: SweepConfig) -> None:
        kv = self.kv
        contexts = (config.decode_context, *config.context_lengths)
        longest = max(contexts) + config.warmup_steps + config.steps_per_point + 1
        if longest > kv.max_model_len:
            raise ValueError(
                f"a {max(contexts)}-token context point needs max_model_len >= {longest}, "
                f"the engine has {kv.max_model_len}"
            )
        mixed = config.mixed_batch_size + config.mixed_split
        sizes = (*config.batch_sizes, *config.context_batch_sizes, mixed)
        if max(sizes) > kv.max_num_seqs:
            raise ValueError(
                f"{max(sizes)} requests at once need max_num_seqs >= {max(sizes)}, "
                f"got {kv.max_num_seqs}"
            )

    @contextmanager
    def _batch(self, size: int, context: int) -> Iterator[list[Request]]:
        requests = [
            Request(next(self._ids), context, 1 << 20, 0.0, sampling=_GREEDY_NO_EOS)
            for _ in range(size)
        ]
        try:
            for request in requests:
                self._engine.fill_context(request, context)
                _deliver(request, 0)
            yield requests
        finally:
            for request in requests:
                self._engine.free(request.request_id)

    def _decode_step(self, requests: list[Request], extra: list[ScheduledChunk]) -> float:
        result = self._engine.execute([*(ScheduledChunk(r, 1) for r in requests), *extra])
        sampled = result.sampled_token_ids
        for request in requests:
            _deliver(request, sampled.get(request.request_id, 0))
        return result.latency_s * 1000

    def decode(self, config: SweepConfig, batch_size: int, context: int) -> DecodePoint:
        times = []
        with self._batch(batch_size, context) as requests:
            for step in range(config.warmup_steps + config.steps_per_point):
                ms = self._decode_step(requests, [])
                if step >= config.warmup_steps:
                    times.append(ms)
        mean = statistics.fmean(times)
        cv = statistics.pstdev(times) / mean if mean > 0 else 0.0
        return DecodePoint(batch_size, context, statistics.median(times), cv)

    def prefill(self, config: SweepConfig, num_tokens: int, context_start: int) -> PrefillPoint:
        times = []
        for _ in range(config.repeats):
            request = Request(
                next(self._ids), context_start + num_tokens, 1, 0.0, sampling=_GREEDY_NO_EOS
            )
            try:
                if context_start:
                    self._engine.fill_context(request, context_start)
                result = self._engine.execute([ScheduledChunk(request, num_tokens)])
                times.append(result.latency_s * 1000)
            finally:
                self._engine.free(request.request_id)
        return PrefillPoint(num_tokens, context_start, statistics.median(times))

    def mixed(self, config: SweepConfig) -> MixedPoint:
        split = config.mixed_split
        alone, mixed, divided = [], [], []
        with self._batch(config.mixed_batch_size, config.decode_context) as requests:
            for _ in range(config.warmup_steps):
                self._decode_step(requests, [])
            for _ in range(config.repeats):
                alone.append(self._decode_step(requests, []))
                mixed.append(self._with_prompts(requests, [config.mixed_chunk]))
                if split > 1:
                    chunks = [config.mixed_chunk // split] * split
                    divided.append(self._with_prompts(requests, chunks))
        return MixedPoint(
            config.mixed_batch_size,
            config.mixed_chunk,
            statistics.median(alone),
            statistics.median(mixed),
            split,
            statistics.median(divided) if divided else 0.0,
        )

    def _with_prompts(self, requests: list[Request], prompts: list[int]) -> float:
        """A decode step of ``requests`` that also prefills one fresh prompt of each length
        in ``prompts`` whole (ms)."""
        extra = [Request(next(self._ids), n, 1, 0.0, sampling=_GREEDY_NO_EOS) for n in prompts]
        try:
            chunks = [ScheduledChunk(r, r.num_prompt_tokens) for r in extra]
            return self._decode_step(requests, chunks)
        finally:
            for r in extra:
                self._engine.free(r.request_id)


def _deliver(request: Request, token: int) -> None:
    request.output_token_ids.append(token)
    request.token_times_s.append(0.0)
