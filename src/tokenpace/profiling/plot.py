"""A PNG of the profile fit: decode step time vs batch size, context and prefill chunk."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from tokenpace.engine.latency_model import LatencyModel, PrefillChunk
from tokenpace.engine.profile import EngineProfile
from tokenpace.profiling.points import DecodePoint, PrefillPoint


def plot_fit(
    path: Path,
    profile: EngineProfile,
    decode: Sequence[DecodePoint],
    context: Sequence[DecodePoint],
    prefill: Sequence[PrefillPoint],
) -> None:
    """Write a three-panel figure of ``profile``'s fit to its sweep's points to ``path``
    (matplotlib's Agg backend, no display): Eq. 2 and the latency model (Eq. 2 plus the
    decode residual) against the decode points (context term removed by the caller), the
    context sweep, and the prefill model against the prefill points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    batches = [p.batch_size for p in decode]
    ax.plot(batches, [p.step_ms for p in decode], "o", label="measured (median)")
    grid = list(range(1, max(batches) + 1))
    model = LatencyModel(profile)
    eq2 = LatencyModel(replace(profile, decode_residual_ms=()))
    r2 = f", r2={profile.r2:.3f}" if profile.r2 is not None else ""
    ax.plot(
        grid,
        [eq2.decode_ms(b) for b in grid],
        "--",
        label=f"Eq. 2: l_min={profile.l_min_ms:.1f} ms, B0={profile.b0}, "
        f"alpha={profile.alpha_ms:.2f} ms{r2}",
    )
    if profile.decode_residual_ms:
        ax.plot(grid, [model.decode_ms(b) for b in grid], "-", label="Eq. 2 + residual")
    ax.set_xlabel("decode batch size B")
    ax.set_ylabel("step time (ms)")
    ax.set_title("decode step vs batch")
    ax.legend(fontsize=8)
    ax = axes[1]
    for size in sorted({p.batch_size for p in context}):
        points = [p for p in context if p.batch_size == size]
        ax.plot([p.context for p in points], [p.step_ms for p in points], "o-", label=f"B={size}")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("step time (ms)")
    ax.set_title("decode step vs context")
    ax.legend(fontsize=8)
    ax = axes[2]
    for start in sorted({p.context_start for p in prefill}):
        series = sorted(
            (p for p in prefill if p.context_start == start), key=lambda p: p.num_tokens
        )
        chunks = [p.num_tokens for p in series]
        ax.plot(chunks, [p.step_ms for p in series], "o", label=f"measured, context {start}")
        ax.plot(
            chunks,
            [1000 * model.step_s(0, [PrefillChunk(c, start)]) for c in chunks],
            "x--",
            label=f"fit, context {start}",
        )
    ax.set_xlabel("prefill chunk (tokens)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"prefill: {profile.prefill_ms_per_token:.3f} ms/token")
    ax.legend(fontsize=7)
    fig.suptitle(profile.name)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
