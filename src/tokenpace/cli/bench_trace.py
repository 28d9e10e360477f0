"""``tokenpace bench --trace``: a pool part that replays a request trace."""

from __future__ import annotations

from dataclasses import replace

from tokenpace.bench.capacity import Capacity, CapacityJob, KneeProblem, measure_capacities
from tokenpace.bench.matrix import MatrixConfig
from tokenpace.bench.presets import PlanOptions, capacity_entry, pool_part
from tokenpace.cli.bench_options import BenchOptions
from tokenpace.cli.spec import UsageError
from tokenpace.pool.capacity import pool_capacity_rps_for_specs
from tokenpace.workload.empirical import EmpiricalWorkload
from tokenpace.workload.spec import ReplayWorkload
from tokenpace.workload.traces import Trace, TraceOptions, load_trace, time_scale_for_rate

MIN_KNEE_REQUESTS = 500


def trace_options(options: BenchOptions) -> TraceOptions:
    """The replay window and time scale the ``--trace-*`` flags ask for."""
    try:
        return TraceOptions(
            time_scale=options.trace_speedup or 1.0, start_s=options.trace_start,
            end_s=options.trace_end, max_requests=options.trace_max_requests,
        )  # fmt: skip
    except ValueError as error:
        raise UsageError(f"--trace options: {error}") from None


def measure_trace_knee(trace: Trace, plan: PlanOptions) -> Capacity:
    """The pool's knee for the trace's own lengths, measured like the scenarios' knees on
    as many Poisson arrivals as the replay holds (at least MIN_KNEE_REQUESTS, so that a
    short replay can still be overloaded), resampling its (prompt, output) pairs."""
    cap = max(s.max_tokens for s in trace.specs)
    lengths = tuple((s.num_prompt_tokens, s.max_tokens) for s in trace.specs)
    workload = EmpiricalWorkload(
        name="trace", rate_per_s=1.0, lengths=lengths, max_tokens=cap,
        num_requests=max(MIN_KNEE_REQUESTS, len(trace.specs)),
    )  # fmt: skip
    estimate = pool_capacity_rps_for_specs(plan.profile, trace.specs, plan.pool.num_containers)
    problem = KneeProblem(plan.profile, plan.pool.num_containers, workload, plan.slo, plan.search)
    return measure_capacities({"trace": CapacityJob(problem, estimate)}, plan.cache_dir)["trace"]


def load_replay(options: BenchOptions, plan: PlanOptions) -> tuple[Trace, Capacity | None]:
    """The trace to replay and, without ``--trace-speedup``, the knee its time scale was
    set from (the mean arrival rate is ``--trace-load`` x that knee)."""
    assert options.trace is not None
    window = trace_options(options)
    try:
        trace = load_trace(options.trace, options.trace_format, window)
        if not trace.specs:
            raise ValueError(f"{options.trace}: no request left in the replay window")
        if options.trace_speedup is not None:
            return trace, None
        knee = measure_trace_knee(trace, plan)
        scale = time_scale_for_rate(trace, options.trace_load * knee.knee_rps)
        window = replace(window, time_scale=scale)
        return load_trace(options.trace, options.trace_format, window), knee
    except (FileNotFoundError, ValueError) as error:
        raise UsageError(f"--trace: {error}") from None


def trace_part(options: BenchOptions, plan: PlanOptions) -> tuple[MatrixConfig, str]:
    """A pool part replaying the trace with its output lengths as true lengths and the
    trace's largest output as every client's ``max_tokens``, and the report's note on it."""
    assert options.trace is not None
    trace, knee = load_replay(options, plan)
    cap = max(s.max_tokens for s in trace.specs)
    report = trace.report
    note = (
        f"Trace `{report.path}` ({report.trace_format}): {report.num_rows} rows, "
        f"{report.num_failed} failed requests skipped, {report.num_outside_window} outside the "
        f"window, {report.num_kept} replayed over {report.span_s:.0f} s "
        f"({trace.mean_rate_per_s:.2f} req/s); every request stops at its traced output "
        f"length and asks for max_tokens {cap}."
    )
    name = f"trace:{options.trace.stem}"
    specs = tuple(replace(s, max_tokens=cap, output_tokens=s.max_tokens) for s in trace.specs)
    capacity = {name: capacity_entry(knee, trace.mean_rate_per_s)} if knee is not None else None
    pool = plan.pool
    if knee is not None:
        pool = replace(pool, target_per_instance=max(1.0, knee.concurrency_per_container))
    workloads = (ReplayWorkload(name=name, specs=specs),)
    return pool_part(plan, workloads, pool, None, capacity), note
