"""The interleaved best-of timing both kernel probes decide by."""

from __future__ import annotations

from tokenpace.engine.native.interleaved import Clock, beats


def _clock(pairs: list[tuple[float, float]]) -> Clock:
    """Per repeat, the baseline takes the first time and the candidate the second."""
    times: list[float] = []
    for baseline_s, candidate_s in pairs:
        start = 10.0 * len(times)
        times += [start, start + baseline_s, start + baseline_s + candidate_s]
    return iter(times).__next__


def test_each_side_is_judged_by_its_best_repeat() -> None:
    calls: list[str] = []
    candidate, baseline = (lambda: calls.append("candidate")), (lambda: calls.append("baseline"))
    # The candidate is slower in two repeats of three, but its best (0.5) beats the
    # baseline's best (0.8).
    assert beats(candidate, baseline, _clock([(1.0, 2.0), (0.8, 0.5), (0.9, 3.0)]), 3)
    assert calls == ["baseline", "candidate"] * 3
    # A tie is not a win.
    assert not beats(candidate, baseline, _clock([(1.0, 1.0)]), 1)
    assert not beats(candidate, baseline, _clock([(1.0, 1.5), (0.7, 0.9)]), 2)
