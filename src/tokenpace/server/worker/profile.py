"""An engine profile for the policy, measured on the engine a worker just loaded.

Policies are built from an ``EngineProfile``: TWP reads l_min and B0, ``twp_slo`` also the
per-request decode slope alpha (Eq. 2: l(B) = l_min + alpha (B - B0)+). A served engine
with no fitted profile runs the offline profiling sweep in a reduced configuration
(``calibration_sweep``) through its timing probe and the same fit, with the knee fixed at
the configured B0.
"""

from __future__ import annotations

from dataclasses import replace

from tokenpace.engine.profile import EngineProfile
from tokenpace.profiling.probe import EngineFacts, KvFacts, TimingProbe
from tokenpace.profiling.run import fit_profile
from tokenpace.profiling.sweep import SweepConfig, run_sweep
from tokenpace.server.worker.wire import Calibration

CALIBRATION_CONTEXT_TOKENS = 32
CALIBRATION_STEPS = 4
PREFILL_SCALE = 4


def calibration_sweep(calibration: Calibration, kv: KvFacts) -> SweepConfig:
    """Decode at batch 1, B0 and 2 B0 (at most ``max_num_seqs``) after 32-token prompts
    (fewer when the model's length is short), four timed steps each after one untimed;
    prefills of the prompt length and of four times it (at most half the model's length:
    a 32-token chunk alone adds a few step-noise widths at most, and a noisy machine has
    fitted it at 0 ms per token); no context sweep and no mixed point."""
    limit = min(kv.max_model_len, calibration.max_model_len)
    context = max(2, min(CALIBRATION_CONTEXT_TOKENS, limit // 4))
    longer = max(context, min(PREFILL_SCALE * context, limit // 2))
    b0 = calibration.b0
    return SweepConfig(
        batch_sizes=(1, b0, max(1, min(2 * b0, kv.max_num_seqs))),
        decode_context=context,
        context_lengths=(),
        context_batch_sizes=(),
        prefill_chunks=tuple(sorted({context, longer})),
        prefill_context_starts=(0,),
        mixed_batch_size=0,
        steps_per_point=CALIBRATION_STEPS,
        warmup_steps=1,
        repeats=2,
    )


def measure_profile(probe: TimingProbe, calibration: Calibration, dtype: str = "") -> EngineProfile:
    """Run ``calibration_sweep`` on ``probe`` and fit it (``profiling.run.fit_profile``)
    with the knee at ``calibration.b0``; the profile takes the calibration's name and mean
    output length, and records ``dtype``, the precision the engine runs in (its latencies
    hold for that one only). The engine holds no request afterwards."""
    sweep = run_sweep(probe, calibration_sweep(calibration, probe.kv))
    source = f"measured at start on {probe.description}: the calibration sweep"
    profile, _, _ = fit_profile(
        sweep,
        EngineFacts(calibration.name, 0, (), {}),
        source,
        b0=calibration.b0,
        mean_output_tokens=calibration.mean_output_tokens,
    )
    return replace(profile, dtype=dtype)
