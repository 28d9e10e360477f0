"""Which of two ways of computing the same thing is faster, timed on a shared machine."""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], float]


def beats(
    candidate: Callable[[], object], baseline: Callable[[], object], clock: Clock, repeats: int
) -> bool:
    """Whether ``candidate`` runs faster than ``baseline``, each side's time its best of
    ``repeats`` runs timed by ``best_times``."""
    candidate_s, baseline_s = best_times(candidate, baseline, clock, repeats)
    return candidate_s < baseline_s


def best_times(
    candidate: Callable[[], object], baseline: Callable[[], object], clock: Clock, repeats: int
) -> tuple[float, float]:
    """(``candidate``'s, ``baseline``'s) best time of ``repeats`` runs, the two interleaved
    so that a busy machine slows both alike (the clock is read at the start, between the
    two and at the end of each repeat, the baseline first)."""
    best_baseline = best_candidate = float("inf")
    for _ in range(repeats):
        start = clock()
        baseline()
        middle = clock()
        candidate()
        best_baseline = min(best_baseline, middle - start)
        best_candidate = min(best_candidate, clock() - middle)
    return best_candidate, best_baseline
