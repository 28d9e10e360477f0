"""``tokenpace bench --engine native|vllm``: the CPU-scale parts on a real engine and the
SLO they are judged by."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tokenpace.bench.capacity import KneeProblem, paced_ceiling
from tokenpace.bench.cpu_scale import (
    KV_PRESSURE_LENGTH_SCALE,
    KV_PRESSURE_OUTPUT_LENGTHS,
    KV_PRESSURE_PROMPT_LENGTHS,
    NUM_REQUESTS,
    CpuKvPressure,
    cpu_kv_pressure,
    cpu_workloads,
    kv_pressure_requests_held,
    main_load_factor,
    simulated_knee,
)
from tokenpace.bench.matrix import MatrixConfig
from tokenpace.bench.presets import MAIN_SCHEDULERS, ROUTING_BASELINES, PlanOptions
from tokenpace.cli.bench_options import DEFAULT_PROFILE, BenchOptions
from tokenpace.engine.profile import EngineProfile, load_profile
from tokenpace.metrics.slo import (
    DEFAULT_TPOT_MS,
    DEFAULT_TTFT_MS,
    Slo,
    scaled_slo,
    tpot_scale,
    ttft_scale,
)
from tokenpace.workload.main_experiment import PoissonWorkload
from tokenpace.workload.scenarios import KV_PRESSURE_BLOCKS


def bench_slo(options: BenchOptions, profile: EngineProfile) -> Slo:
    """``--slo-ttft-ms`` and ``--slo-tpot-ms``; one not given is the default, on a real
    engine scaled to ``profile`` against the reference profile (``scaled_slo``)."""
    # The simulator's profile is its own reference: the defaults stand.
    reference = load_profile(DEFAULT_PROFILE) if options.engine != "sim" else profile
    return scaled_slo(profile, reference, options.slo_ttft_ms, options.slo_tpot_ms)


def slo_origin(options: BenchOptions, profile: EngineProfile, reference: EngineProfile) -> str:
    """Where a real-engine run's SLO comes from, for the report."""
    given = [
        flag for flag, value in (("--slo-ttft-ms", options.slo_ttft_ms),
                                 ("--slo-tpot-ms", options.slo_tpot_ms))
        if value is not None
    ]  # fmt: skip
    scaled = (
        f"the default {DEFAULT_TTFT_MS:.0f}/{DEFAULT_TPOT_MS:.0f} ms scaled by "
        f"{ttft_scale(profile, reference):.2f} (TTFT: the larger of the l_min and the prefill "
        f"cost ratios to {reference.name}) and {tpot_scale(profile, reference):.2f} (TPOT: the "
        f"l_min ratio)"
    )
    if len(given) == 2:
        return "as given"
    if given:
        return f"{given[0]} as given, the other {scaled}"
    return scaled


def kv_pressure_note(kv: CpuKvPressure, reference: EngineProfile) -> str:
    """The report's account of every scaling in the CPU-scale ``kv_pressure``."""
    return (
        f"`kv_pressure`: the scenario's conversation lengths with every range bound scaled by "
        f"{KV_PRESSURE_LENGTH_SCALE:g} (means {KV_PRESSURE_PROMPT_LENGTHS.mean:.0f} and "
        f"{KV_PRESSURE_OUTPUT_LENGTHS.mean:.0f} tokens), on a KV cache of "
        f"{kv.kv_cache_tokens} tokens ({kv.profile.num_gpu_blocks} blocks, in the engine and "
        f"in the policies' profile): {kv_pressure_requests_held(reference):.1f} requests of "
        f"the mean footprint, as {KV_PRESSURE_BLOCKS} blocks hold at the scenario's lengths; "
        f"{kv.workload.rate_per_s:.2f} req/s (1.2x its knee), {kv.workload.max_requests} "
        f"requests."
    )


def paced_ceilings_note(runs: Sequence[tuple[EngineProfile, PoissonWorkload]], slo: Slo) -> str:
    """The report's paced ceilings (``bench.capacity.paced_ceiling``, one server) of each
    (profile, workload) against its offered rate."""
    cells = []
    for profile, workload in runs:
        paced = paced_ceiling(KneeProblem(profile, 1, workload, slo))
        cells.append(
            f"`{workload.name}` {paced.rps:.2f} req/s ({paced.tok_s:.0f} output tok/s) "
            f"against {workload.rate_per_s:.2f} req/s offered"
        )
    return (
        "Paced ceilings (the steady state with every step within the TPOT objective, on the "
        "engine's profile: no scheduler that holds every inter-token gap within the "
        "objective serves more): " + "; ".join(cells) + "."
    )


def real_engine_parts(options: BenchOptions, plan: PlanOptions) -> tuple[list[MatrixConfig], str]:
    """The single-server parts on a real engine at CPU scale (``bench.cpu_scale``): ``main``
    and ``high`` on the engine as it is, then (native engine only) ``kv_pressure`` on its
    own small KV cache; and the report's note. Sets the process environment the engine
    needs (``prepare_process``): call it from the command's process only."""
    from tokenpace.bench.engine_runner import prepare_process

    prepare_process(options.engine)
    reference = load_profile(DEFAULT_PROFILE)
    names = plan.schedulers or MAIN_SCHEDULERS
    profile, slo = plan.profile, plan.slo
    knee = simulated_knee(slo, plan.cache_dir)
    workloads = cpu_workloads(profile, reference, knee)
    part = MatrixConfig(
        schedulers=tuple(n for n in names if n not in ROUTING_BASELINES),
        workloads=workloads, seeds=plan.seeds, profile=profile,
        slo=slo, runner=options.engine, engine=options.engine, prompts=plan.prompts,
        online_calibration=options.calibration,
    )  # fmt: skip
    notes = [
        f"Engine `{options.engine}` at CPU scale, profile {profile.name} (l_min "
        f"{profile.l_min_ms:.1f} ms, prefill {profile.prefill_ms_per_token:.2f} ms/token; "
        f"{reference.name}: {reference.l_min_ms:.1f} ms, "
        f"{reference.prefill_ms_per_token:.2f} ms/token). SLO: TTFT {slo.ttft_ms:.0f} ms, "
        f"TPOT {slo.tpot_ms:.0f} ms ({slo_origin(options, profile, reference)}).",
        f"`main` runs the paper's mixtures at the same multiple of capacity as 18 req/s on "
        f"{reference.name} ({main_load_factor(reference):.2f}x), `high` at "
        f"{workloads[1].rate_per_s:.2f} req/s (1.2x its knee, measured on the simulator with "
        f"the engine's profile under this SLO), {NUM_REQUESTS} requests each.",
        "Online calibration: "
        + (
            "each run refits its policy's profile from the steps it serves, from the fitted "
            "profile on (as `tokenpace serve` does by default)."
            if options.online_calibration
            else "off; the policies plan with the fitted profile throughout."
        ),
    ]
    runs = [(profile, workload) for workload in workloads]
    if options.engine != "native":
        notes.append("`kv_pressure` runs on the native engine only (it resizes the KV cache).")
        notes.append(paced_ceilings_note(runs, slo))
        return [part], " ".join(notes)
    kv = cpu_kv_pressure(profile, reference, knee)
    kv_part = replace(
        part, workloads=(kv.workload,), profile=kv.profile, kv_cache_tokens=kv.kv_cache_tokens
    )
    notes.append(kv_pressure_note(kv, reference))
    notes.append(paced_ceilings_note([*runs, (kv.profile, kv.workload)], slo))
    return [part, kv_part], " ".join(notes)
