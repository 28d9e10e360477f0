"""Several survival curves evaluated in one pass, for the expected output of a whole batch.

The estimator (``tokenpace.policy.output_length``) blends each request's prompt-bucket
curve with the pooled one. Evaluating curve by curve costs a dozen array operations per
curve on every step, whatever the batch holds; stacking the curves' tables end to end lets
one gather read every request's figures from its own curve, so the cost is that of one
curve. The arithmetic per element is ``SurvivalCurve``'s, operation for operation, so the
values are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from tokenpace.policy.output_length import SurvivalCurve

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
# Which curve of a stack: one for all elements, or one per element.
CurveIndex = int | IntArray


@dataclass(frozen=True, slots=True)
class CurveStack:
    """Curves numbered 0 .. len - 1, their dense tables end to end: curve c's S(x) and sum
    of S(t) for t < x are at ``base[c] + x`` for x up to its ``tails[c]``, beyond which its
    tail (``hazards[c]``) extends them."""

    base: IntArray
    tails: IntArray
    hazards: FloatArray
    dense: FloatArray
    cumulative: FloatArray
    any_hazard: bool

    @staticmethod
    def of(curves: Sequence[SurvivalCurve]) -> CurveStack:
        """Stack ``curves`` (at least one), in order."""
        if len(curves) == 1:
            # One curve: its own tables, not copies.
            only = curves[0]
            return CurveStack(
                np.zeros(1, dtype=np.int64), np.array([only.tail_start], dtype=np.int64),
                np.array([only.tail_hazard]), only.dense, only.cumulative, only.tail_hazard > 0,
            )  # fmt: skip
        sizes = np.array([len(c.dense) for c in curves], dtype=np.int64)
        base = np.zeros(len(curves), dtype=np.int64)
        np.cumsum(sizes[:-1], out=base[1:])
        hazards = np.array([c.tail_hazard for c in curves], dtype=np.float64)
        return CurveStack(
            base,
            np.array([c.tail_start for c in curves], dtype=np.int64),
            hazards,
            np.concatenate([c.dense for c in curves]),
            np.concatenate([c.cumulative for c in curves]),
            bool((hazards > 0).any()),
        )

    def at(self, curve: CurveIndex, x: IntArray) -> tuple[FloatArray, FloatArray]:
        """S(x) and the sum of S(t) for t < x, element by element on curve ``curve``;
        beyond T, S(T) exp(-h (x - T)) and its sum (S(T) (x - T) where h = 0)."""
        tails = self.tails[curve]
        flat = np.minimum(x, tails)
        flat += self.base[curve]
        s_k = self.dense[flat]
        area = self.cumulative[flat]
        beyond_tokens = x - tails
        if not (beyond_tokens > 0).any():
            # Adding s_k x 0 and scaling by exp(0) = 1 leave both as they are.
            return s_k, area
        beyond = np.maximum(beyond_tokens, 0).astype(np.float64)
        if not self.any_hazard:
            return s_k, area + s_k * beyond
        h = self.hazards[curve]
        scaled = -h * beyond
        # Where a curve has no tail (h = 0) its survivors run on at S(T): s_k x beyond.
        extended = s_k * beyond
        np.divide(s_k * (-np.expm1(scaled)), h, out=extended, where=h > 0)
        return s_k * np.exp(scaled), area + extended

    def remaining(self, curve: CurveIndex, produced: IntArray, cap: IntArray) -> FloatArray:
        """E[min(L, cap) - produced | L > produced] element by element on curve ``curve``:
        the sum of S(t) / S(produced) for t in [produced, cap); ``cap - produced`` where
        S(produced) = 0; within [1, cap - produced] (at least 1): the sum lies in
        [S(o), (m - o) S(o)], so the bounds only absorb rounding."""
        if isinstance(curve, int):
            # One curve for all, as for a long queue: two reads of n, not one of 2n, which
            # would double the temporaries' size (past the allocator's reuse of freed
            # memory, into fresh pages for every one).
            s_o, area_o = self.at(curve, produced)
            area_m = self.at(curve, cap)[1]
        else:
            n = len(produced)
            s, area = self.at(np.concatenate((curve, curve)), np.concatenate((produced, cap)))
            s_o, area_o, area_m = s[:n], area[:n], area[n:]
        budget = (cap - produced).astype(np.float64)
        expected = budget.copy()
        np.divide(area_m - area_o, s_o, out=expected, where=s_o > 0)
        np.maximum(expected, 1.0, out=expected)
        np.maximum(budget, 1.0, out=budget)
        result: FloatArray = np.minimum(expected, budget, out=expected)
        return result

    def survival_at(self, curve: CurveIndex, x: IntArray) -> FloatArray:
        """S(x) element by element on curve ``curve`` (arrays broadcast together;
        ``SurvivalCurve.survival_at``'s arithmetic, so the same values)."""
        tails = self.tails[curve]
        flat = np.minimum(x, tails)
        flat += self.base[curve]
        s: FloatArray = self.dense[flat]
        if self.any_hazard:
            beyond_tokens = x - tails
            beyond = (beyond_tokens > 0) & (self.hazards[curve] > 0)
            if beyond.any():
                h = np.broadcast_to(self.hazards[curve], beyond.shape)[beyond]
                s[beyond] *= np.exp(-h * np.broadcast_to(beyond_tokens, beyond.shape)[beyond])
        return s

    def still_running(
        self, curve: CurveIndex, produced: IntArray, cap: IntArray, offsets: IntArray
    ) -> FloatArray:
        """``[n, len(offsets)]``: P(min(L, cap) > produced + t | L > produced) for each
        request on its curve ``curve`` and each offset t >= 0 of ``offsets``; where
        S(produced) = 0 (beyond what the curve knows, without a tail) the request runs to
        its cap."""
        s_o = self.survival_at(curve, produced)
        per_row = curve if isinstance(curve, int) else curve[:, None]
        ahead = self.survival_at(per_row, produced[:, None] + offsets[None, :])
        known = s_o > 0
        scale = np.divide(1.0, s_o, out=np.zeros_like(s_o), where=known)
        ratio = ahead * scale[:, None]
        ratio[~known] = 1.0
        result: FloatArray = ratio * (offsets[None, :] < (cap - produced)[:, None])
        return result


@dataclass(frozen=True, slots=True)
class BucketedCurves:
    """The estimator's curves as a batch estimate reads them: ``stack`` holds the pooled
    curve (0) and the prompt buckets' own; bucket b (the number of ``edges`` at or below a
    prompt) reads curve ``stack_index[b]`` (0: it has none) blended with the pooled one by
    weight ``weights[b]``. While ``bucketed`` is False no bucket has a curve and prompts
    are not read."""

    stack: CurveStack
    stack_index: IntArray
    weights: FloatArray
    edges: IntArray
    bucketed: bool
