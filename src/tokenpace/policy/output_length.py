"""Output lengths learned online, for policies that only know a loose ``max_tokens``.

A client's ``max_tokens`` is a cap, not a length: most requests stop earlier on EOS. A policy
sees a request leave ``running`` and, if it finished, how many tokens it produced; it also
sees how far every running request has got. From both the estimator fits, per prompt-length
bucket and pooled over all prompts, the Kaplan-Meier survival curve S(t) = P(L > t) of the
output length L: finished requests are events at their length, running requests are
right-censored at the tokens they have produced (they are known to run longer). Censoring
removes the survivor bias of counting only finished requests, which early in a run are
mostly the short ones. Only the newest ``window`` finished requests of each curve count, so
the estimate follows a changing mix.

The expected remaining output of a request that has produced ``o`` tokens under cap ``m``
is E[min(L, m) - o | L > o] = sum over t in [o, m) of S(t) / S(o). Beyond T, the longest
length seen (finished or running), S is extrapolated at the average hazard seen so far,
-ln S(T) / T per token (``extrapolate_tail``; off: the survivors all run to the cap). With
no finished request, the estimate is ``m - o``: the ``max_tokens`` budget; it is never
more. A bucket's curve is blended with the pooled one by weight n / (n + ``prior_weight``),
n being the bucket's finished requests. Units: tokens.

Error report: the expected total output predicted when a request was last admitted (or
first seen running) against the length it finished with: mean absolute error (tokens),
mean relative error (absolute error over the true length) and bias (predicted minus true),
over every finished request; and the spread of the shortfalls (outputs longer than
predicted), from an exponentially weighted mean of their squares.

For KV admission (``twp.occupancy``) ``still_running`` gives, for offsets t ahead, the
probability S(o + t) / S(o) that a request which has produced o tokens still runs then.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from tokenpace.core.config import option, require_positive
from tokenpace.core.request import FinishReason, Request, RequestStatus
from tokenpace.policy.curve_stack import BucketedCurves, CurveIndex, CurveStack

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
# A figure blended per request: one value, or one row over a forecast grid.
_Blended = TypeVar("_Blended", float, FloatArray)


@dataclass(frozen=True, slots=True)
class OutputLengthConfig:
    """How output lengths are learned."""

    # Log-spaced: chat, long chat, RAG/code prompts tend to differ in answer length.
    bucket_edges: tuple[int, ...] = option(
        (256, 1024, 4096), "Prompt-length bucket edges (tokens): bucket i holds prompts < edge i."
    )
    window: int = option(512, "Newest finished requests each curve remembers.")
    # 32 finished requests: about where a bucket's mean is as trustworthy (standard error
    # ~ std / 6) as the pooled curve's bias from mixing buckets can be large.
    prior_weight: float = option(32.0, "Finished requests at which a bucket weighs half.")
    # The running requests' censoring times move every step; refitting on each finish and
    # every 16 steps keeps the curve current at a fraction of a per-step refit's cost.
    refresh_steps: int = option(16, "Steps between refits when nobody finished.")
    error_ema: float = option(0.05, "Weight of the newest squared shortfall in its EMA.")
    extrapolate_tail: bool = option(
        True, "Beyond the longest length seen, survivors finish at the hazard seen so far."
    )
    compiled: bool = option(
        True,
        "Fits, batch estimates, the KV forecast's rows and the KV reservation's admission "
        "test in compiled loops (numba) where numba is installed: the same values as numpy.",
    )

    def __post_init__(self) -> None:
        require_positive(self, "window", "prior_weight", "refresh_steps", "error_ema")
        if list(self.bucket_edges) != sorted(set(self.bucket_edges)) or any(
            e <= 0 for e in self.bucket_edges
        ):
            raise ValueError(
                f"OutputLengthConfig.bucket_edges must be positive and increasing, got "
                f"{self.bucket_edges}"
            )
        if self.error_ema > 1:
            raise ValueError(f"OutputLengthConfig.error_ema must be <= 1, got {self.error_ema}")


@dataclass(frozen=True, slots=True)
class SurvivalCurve:
    """S(t) = P(L > t) on integers: a step function up to ``tail_start`` T (``survival[k]``
    holds on [``starts[k]``, ``starts[k+1]``), ``area[k]`` is the sum of S(t) for t <
    ``starts[k]``), then S(T) exp(-h (t - T)) with hazard h = ``tail_hazard`` (h = 0: the
    survivors all run to the cap)."""

    starts: IntArray
    survival: FloatArray
    area: FloatArray
    tail_start: int
    tail_hazard: float
    num_events: int
    dense: FloatArray  # S(x) for x = 0 .. tail_start
    cumulative: FloatArray  # the sum of S(t) for t < x, for x = 0 .. tail_start

    @staticmethod
    def fit(
        events: IntArray,
        censored: IntArray,
        extrapolate: bool = True,
        compiled: FitTables | None = None,
    ) -> SurvivalCurve:
        """Kaplan-Meier: ``events`` are finished lengths, ``censored`` lengths known to be
        exceeded (a running request with that many tokens out). The curve is known up to T,
        the longest length seen; with ``extrapolate`` the survivors beyond T then finish at
        the average hazard seen so far, -ln S(T) / T, else all at the cap. ``compiled``
        (``curve_kernel.fit_tables``) computes the same tables in one compiled pass."""
        fit_tables = compiled or _fit_tables
        starts, steps, area, dense, cumulative = fit_tables(events, censored)
        tail_start = int(starts[-1])
        last = float(steps[-1])
        hazard = -math.log(last) / tail_start if extrapolate and 0 < last < 1 else 0.0
        return SurvivalCurve(
            starts, steps, area, tail_start, hazard, len(events), dense, cumulative
        )

    def survival_at(self, x: IntArray) -> FloatArray:
        """S(x) = P(L > x), read from the dense table (and the tail beyond it)."""
        s: FloatArray = self.dense[np.minimum(x, self.tail_start)]
        if self.tail_hazard > 0:
            beyond = x > self.tail_start
            if beyond.any():
                s = s.copy()
                s[beyond] *= np.exp(-self.tail_hazard * (x[beyond] - self.tail_start))
        return s

    def _at_one(self, x: int) -> tuple[float, float]:
        """S(x) and the sum of S(t) for t < x, in scalars (``CurveStack.at``'s arithmetic,
        so the same values)."""
        inside = min(x, self.tail_start)
        s_k = float(self.dense[inside])
        area = float(self.cumulative[inside])
        beyond = float(max(x - self.tail_start, 0))
        h = self.tail_hazard
        if h > 0:
            if beyond == 0.0:
                return s_k, area
            # numpy's exp and expm1, as ``CurveStack.at`` evaluates them.
            area = area + s_k * float(-np.expm1(-h * beyond)) / h
            return s_k * float(np.exp(-h * beyond)), area
        return s_k, area + s_k * beyond

    def still_running(self, produced: IntArray, cap: IntArray, offsets: IntArray) -> FloatArray:
        """``[n, len(offsets)]``: P(min(L, cap) > produced + t | L > produced) for each
        request (``produced``, ``cap``: arrays of n) and each offset t >= 0; where
        S(produced) = 0 (beyond what the curve knows, without a tail) the request runs to
        its cap."""
        return CurveStack.of((self,)).still_running(0, produced, cap, offsets)

    def still_running_one(self, produced: int, cap: int, offsets: IntArray) -> FloatArray:
        """``still_running`` of one request, as a row (the same values)."""
        s_o, _ = self._at_one(produced)
        if s_o > 0:
            row = self.survival_at(produced + offsets) * (1.0 / s_o)
        else:
            row = np.ones(len(offsets))
        result: FloatArray = row * (offsets < cap - produced)
        return result

    def remaining(self, produced: IntArray, cap: IntArray) -> FloatArray:
        """E[min(L, cap) - produced | L > produced]; ``cap - produced`` where S = 0."""
        return CurveStack.of((self,)).remaining(0, produced, cap)

    def remaining_one(self, produced: int, cap: int) -> float:
        """``remaining`` of one request, in scalars: the same value, without the cost of
        arrays of one."""
        s_o, area_o = self._at_one(produced)
        _, area_m = self._at_one(cap)
        budget = float(cap - produced)
        expected = (area_m - area_o) / s_o if s_o > 0 else budget
        return min(max(expected, 1.0), max(budget, 1.0))


# Batches up to this many requests are estimated in one pass over the stacked curves; larger
# ones (a long waiting queue) curve by curve, where reading each element's curve would cost
# more than the operations saved.
_STACKED_MAX = 1024

# Lengths up to this are counted in a table (``np.bincount``); longer ones are sorted.
COUNT_TABLE_MAX = 1 << 16


# (events, censored) -> a Kaplan-Meier fit's tables: the steps' starts, survival and area
# before each, then S(x) and the sum of S(t) for t < x, x = 0 .. T (``SurvivalCurve``).
SurvivalTables = tuple[IntArray, FloatArray, FloatArray, FloatArray, FloatArray]
FitTables = Callable[[IntArray, IntArray], SurvivalTables]


def _fit_tables(events: IntArray, censored: IntArray) -> SurvivalTables:
    """``SurvivalCurve.fit``'s tables, in numpy."""
    lengths, counts = _distinct_counts(events)
    # At risk at length l: the events at l or beyond and the censored at l or beyond.
    events_beyond = len(events) - (np.cumsum(counts) - counts)
    censored = np.sort(censored)
    at_risk = events_beyond + (len(censored) - np.searchsorted(censored, lengths, side="left"))
    survival = np.cumprod(1.0 - counts / at_risk)
    tail_start = int(max(lengths[-1], censored[-1])) if len(censored) else int(lengths[-1])
    num_steps = len(lengths) + 2
    starts = np.empty(num_steps, dtype=np.int64)
    starts[0], starts[1:-1], starts[-1] = 0, lengths, tail_start
    steps = np.empty(num_steps)
    steps[0], steps[1:-1], steps[-1] = 1.0, survival, survival[-1]
    # Each step's width, and 1 for the last (of width 0), which holds T itself.
    widths = np.empty(num_steps, dtype=np.int64)
    widths[:-1] = np.diff(starts)
    widths[-1] = 1
    area = np.empty(num_steps)
    area[0] = 0.0
    np.cumsum(steps[:-1] * widths[:-1], out=area[1:])
    # The step holding each x = 0 .. T.
    step_of = np.repeat(np.arange(num_steps), widths)
    dense = steps[step_of]
    cumulative = area[step_of] + dense * (np.arange(tail_start + 1) - starts[step_of])
    return starts, steps, area, dense, cumulative


def _distinct_counts(values: IntArray) -> tuple[IntArray, IntArray]:
    """The distinct values of ``values`` (positive integers), ascending, and how often each
    occurs: ``np.unique(values, return_counts=True)``, by a count table when the values are
    small enough (a few microseconds instead of a sort)."""
    if int(values.max()) > COUNT_TABLE_MAX:
        distinct, counts = np.unique(values, return_counts=True)
        return distinct.astype(np.int64, copy=False), counts.astype(np.int64, copy=False)
    table = np.bincount(values)
    distinct = np.flatnonzero(table).astype(np.int64, copy=False)
    return distinct, table[distinct].astype(np.int64, copy=False)


class LengthWindow:
    """The newest ``capacity`` lengths, in a ring buffer: ``values`` holds them (in no
    particular order, which the Kaplan-Meier fit does not read) and ``total`` their sum."""

    def __init__(self, capacity: int) -> None:
        self._values = np.zeros(capacity, dtype=np.int64)
        self._count = 0
        self._next = 0
        self.total = 0

    def __len__(self) -> int:
        return self._count

    def append(self, length: int) -> None:
        """Add ``length``, forgetting the oldest when full."""
        if self._count == len(self._values):
            self.total -= int(self._values[self._next])
        else:
            self._count += 1
        self._values[self._next] = length
        self._next = (self._next + 1) % len(self._values)
        self.total += length

    @property
    def values(self) -> IntArray:
        """The lengths held (read-only view, valid until the next ``append``)."""
        view = self._values[: self._count]
        view.flags.writeable = False
        return view


def grid_step(offsets: IntArray) -> int:
    """The spacing d of a forecast grid 0, d, 2d, .. (1 for a grid of one offset)."""
    return int(offsets[1] - offsets[0]) if len(offsets) > 1 else 1


@dataclass(frozen=True, slots=True)
class StillRunning:
    """The probabilities that n requests still run at each offset of a forecast grid,
    stored once per distinct row: request j's row is ``rows[row_of[j]]``
    (``[len(rows), offsets]``). ``representatives`` (set by ``group``): each row's
    produced tokens, cap and prompt bucket."""

    rows: FloatArray
    row_of: IntArray
    representatives: tuple[IntArray, IntArray, IntArray] = (
        np.zeros(0, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
        np.zeros(0, dtype=np.int64),
    )

    @staticmethod
    def group(
        produced: IntArray, caps: IntArray, step: int, num_offsets: int, bucket: IntArray
    ) -> StillRunning:
        """Requests grouped by (bucket, produced rounded down to a multiple of ``step``,
        tokens left rounded up to one, at most ``num_offsets`` steps); ``rows`` empty."""
        progress = produced // step
        left = np.clip(-(-(caps - produced) // step), 0, num_offsets)
        span = int(progress.max(initial=0)) + 1
        key = (bucket * span + progress) * (num_offsets + 1) + left
        # The keys are small integers: a count per key finds the distinct ones in order.
        present = np.flatnonzero(np.bincount(key))
        row_at = np.zeros(int(present[-1]) + 1 if len(present) else 0, dtype=np.int64)
        row_at[present] = np.arange(len(present))
        rep_left = present % (num_offsets + 1)
        rep_progress = present // (num_offsets + 1)
        rep_produced = (rep_progress % span) * step
        return StillRunning(
            np.zeros((len(present), num_offsets)),
            row_at[key],
            (rep_produced, rep_produced + rep_left * step, rep_progress // span),
        )

    @staticmethod
    def to_caps(produced: IntArray, caps: IntArray, offsets: IntArray) -> StillRunning:
        """Requests running to their caps (the ``max_tokens`` budgets), one bucket."""
        buckets = np.zeros(len(produced), dtype=np.int64)
        grid = StillRunning.group(produced, caps, grid_step(offsets), len(offsets), buckets)
        return grid.until_cap(offsets)

    def until_cap(self, offsets: IntArray) -> StillRunning:
        """These groups running to their caps (the ``max_tokens`` budgets)."""
        produced, caps, _ = self.representatives
        rows = (offsets[None, :] < (caps - produced)[:, None]).astype(np.float64)
        return StillRunning(rows, self.row_of, self.representatives)

    def dense(self) -> FloatArray:
        """``[n, offsets]``: every request's row."""
        dense: FloatArray = self.rows[self.row_of]
        return dense


@dataclass(slots=True)
class _Tracked:
    request: Request
    predicted_total: float


@dataclass(slots=True)
class ErrorStats:
    """Prediction errors of finished requests (tokens)."""

    count: int = 0
    sum_abs: float = 0.0
    sum_rel: float = 0.0
    sum_signed: float = 0.0
    shortfall_ema: float = 0.0

    def add(self, predicted: float, actual: int, ema: float) -> None:
        error = predicted - actual
        self.count += 1
        self.sum_abs += abs(error)
        self.sum_rel += abs(error) / max(1, actual)
        self.sum_signed += error
        square = max(0.0, -error) ** 2
        if self.count == 1:
            self.shortfall_ema = square
        else:
            self.shortfall_ema += ema * (square - self.shortfall_ema)

    @property
    def spread(self) -> float:
        """The shortfalls' spread: sqrt(2 x mean squared shortfall) (outputs longer than
        predicted), which is the RMS error for symmetric errors and 0 while every
        prediction is an upper bound (the max_tokens budget)."""
        return math.sqrt(2.0 * self.shortfall_ema)


class OutputLengthEstimator:
    """Learns output lengths from the running requests a policy sees each step.

    Call ``observe(running, step_index)`` at the start of every plan (it learns from the
    requests that left ``running`` finished) and ``admitted(requests)`` with the requests
    the plan admits. ``remaining`` then gives expected remaining output tokens (always
    within [1, max_tokens - produced]). A refit (after a finish, or every ``refresh_steps``)
    keeps its inputs and fits when an estimate is next asked for, so a step that asks none
    pays none; the curves are the same either way.
    """

    def __init__(self, config: OutputLengthConfig) -> None:
        self.config = config
        self.errors = ErrorStats()
        self._edges = np.array(config.bucket_edges, dtype=np.int64)
        num_buckets = len(config.bucket_edges) + 1
        self._events = [LengthWindow(config.window) for _ in range(num_buckets)]
        self._pooled = LengthWindow(config.window)
        self._tracked: dict[int, _Tracked] = {}
        self._curves: list[SurvivalCurve | None] = [None] * num_buckets
        self._pooled_curve: SurvivalCurve | None = None
        # The curves stacked for batch estimates (``_stacked``), None until first read.
        self._stack: BucketedCurves | None = None
        # The last refit's inputs until a reader asks for the curves (``_fit_due``): the
        # running requests' produced and prompt tokens, the pooled and the buckets' lengths.
        self._due: tuple[IntArray, IntArray, IntArray, list[IntArray]] | None = None
        self._dirty = False
        self._fitted_step: int | None = None
        self._running_ids: list[int] = []
        self._edge_list = list(config.bucket_edges)
        self._bucketed = False
        # still_running_row's rows since the last refit, for the grid (step, offsets).
        self._rows: dict[tuple[int, int, int], FloatArray] = {}
        # remaining_of's values since the last refit, per (bucket, produced, cap).
        self._remaining_of: dict[tuple[int, int, int], float] = {}
        # smallest_fresh's values since the last refit, per smallest cap.
        self._smallest_fresh: dict[int, float] = {}
        self._row_grid = (0, 0)
        self._compiled = _compiled_curves() if config.compiled else None

    @property
    def compiled(self) -> bool:
        """Whether curves are fitted and batch estimates (``remaining``) computed in the
        compiled loops (``tokenpace.policy.curve_kernel``) rather than in numpy: the same
        values."""
        return self._compiled is not None

    @property
    def num_observed(self) -> int:
        return self.errors.count

    @property
    def mean_output(self) -> float | None:
        """The mean length of the newest ``window`` finished requests; None before any."""
        if not self._pooled:
            return None
        return self._pooled.total / len(self._pooled)

    @property
    def fitted(self) -> bool:
        """False until a refit has a finished request to learn from (its curves may still
        be due): until then every estimate is the budget left, ``max(max_tokens -
        produced, 1)``."""
        return self._pooled_curve is not None or self._due is not None

    def observe(
        self,
        running: Sequence[Request],
        step_index: int,
        running_ids: Sequence[int] | None = None,
        produced: IntArray | None = None,
        prompts: IntArray | None = None,
    ) -> None:
        """Learn from tracked requests no longer in ``running`` (those that finished; aborted
        or preempted ones teach nothing), start tracking new running ones, refit if due.
        ``running_ids``, ``produced`` and ``prompts`` (ids, output tokens and prompt tokens
        of ``running``, in order) save reading them again when the caller has them."""
        ids = list(running_ids) if running_ids is not None else [r.request_id for r in running]
        if ids != self._running_ids:
            # A request leaves running finished, aborted or preempted, and its status says
            # which; one may also join behind the policy's back (reconciled here).
            present = set(ids)
            for request_id in [i for i in self._tracked if i not in present]:
                self._forget(request_id)
            joined = present - self._tracked.keys()
            if joined:
                self.admitted(r for r in running if r.request_id in joined)
            self._running_ids = ids
        if self._dirty or (
            self._fitted_step is not None
            and step_index - self._fitted_step >= self.config.refresh_steps
        ):
            self._refit(running, step_index, produced, prompts)

    def admitted(self, requests: Iterable[Request]) -> None:
        """Track ``requests`` (just admitted) with their predicted total output."""
        # One at a time: ``remaining_of`` gives ``remaining``'s values, and a step admits few.
        for request in requests:
            total = len(request.token_times_s) + self.remaining_of(request)
            self._tracked[request.request_id] = _Tracked(request, total)

    def remaining(self, prompts: IntArray, produced: IntArray, caps: IntArray) -> FloatArray:
        """Expected remaining output tokens of requests with these prompt lengths, tokens
        produced and ``max_tokens`` caps (arrays of equal length)."""
        self._fit_due()
        if self._pooled_curve is None or not len(prompts):
            budget: FloatArray = np.maximum(caps - produced, 1).astype(np.float64)
            return budget
        if self._compiled is not None:
            return self._compiled.remaining(self._stacked(), prompts, produced, caps)
        buckets = np.searchsorted(self._edges, prompts, side="right") if self._bucketed else prompts
        return self._blended(buckets, produced, caps, CurveStack.remaining)

    def _blended(
        self,
        buckets: IntArray,
        produced: IntArray,
        caps: IntArray,
        figure: Callable[[CurveStack, CurveIndex, IntArray, IntArray], FloatArray],
    ) -> FloatArray:
        """``figure`` of requests in prompt buckets ``buckets`` with these tokens produced
        and caps, on the pooled curve blended with the bucket's own by weight n / (n +
        prior_weight): one pass over the stacked curves, each request on the pooled curve
        and on its bucket's. ``buckets`` is not read while no bucket has a curve."""
        curves = self._stacked()
        stack, stack_index, weights = curves.stack, curves.stack_index, curves.weights
        n = len(produced)
        if not self._bucketed:
            return figure(stack, 0, produced, caps)
        if n > _STACKED_MAX:
            # Curve by curve: reading each element's curve from the stack would cost more
            # than the few operations per curve it saves.
            result = figure(stack, 0, produced, caps)
            for b, index in enumerate(stack_index.tolist()):
                at = np.flatnonzero(buckets == b) if index else ()
                if not len(at):
                    continue
                own = figure(stack, index, produced[at], caps[at])
                weight = float(weights[b])
                result[at] = weight * own + (1.0 - weight) * result[at]
            return result
        # Every request on both curves: one whose bucket has none reads the pooled curve
        # twice with weight 0, which leaves the pooled figure as it is (0 x own + pooled).
        values = figure(
            stack,
            np.concatenate((np.zeros(n, dtype=np.int64), stack_index[buckets])),
            np.concatenate((produced, produced)),
            np.concatenate((caps, caps)),
        )
        weight_of = weights[buckets]
        if values.ndim > 1:
            weight_of = weight_of[:, None]
        blended: FloatArray = weight_of * values[n:] + (1.0 - weight_of) * values[:n]
        return blended

    def still_running(
        self, prompts: IntArray, produced: IntArray, caps: IntArray, offsets: IntArray
    ) -> StillRunning:
        """The probability that each request (columns as in ``remaining``) is still running
        t tokens from now, for each offset t of the grid 0, d, 2d, .. (``offsets``). Each
        request's progress is rounded down to a multiple of d and its tokens left up to
        one: requests of one prompt bucket that fall together then share a row, computed
        once (exact for d = 1). Before a curve is fitted: 1 until the cap, 0 from there."""
        self._fit_due()
        pooled = self._pooled_curve
        if pooled is None:
            return StillRunning.to_caps(produced, caps, offsets)
        if self._compiled is not None:
            rows, row_of, rep_produced, rep_caps, rep_bucket = self._compiled.forecast_rows(
                self._stacked(), prompts, produced, caps, offsets
            )
            return StillRunning(rows, row_of, (rep_produced, rep_caps, rep_bucket))
        bucket = (
            np.searchsorted(self._edges, prompts, side="right")
            if self._bucketed
            else np.zeros(len(prompts), dtype=np.int64)
        )
        grid = StillRunning.group(produced, caps, grid_step(offsets), len(offsets), bucket)
        rep_produced, rep_caps, rep_bucket = grid.representatives
        rows = self._blended(
            rep_bucket, rep_produced, rep_caps,
            lambda stack, curve, at_produced, at_cap: stack.still_running(
                curve, at_produced, at_cap, offsets
            ),
        )  # fmt: skip
        return StillRunning(rows, grid.row_of, grid.representatives)

    def still_running_row(
        self, prompt: int, produced: int, cap: int, offsets: IntArray, budget: bool = False
    ) -> FloatArray:
        """One request's row of ``still_running`` (the same rounding and blend; with
        ``budget``, or before a curve is fitted, ``StillRunning.to_caps``'s row), for a
        caller that tests candidates one at a time: rows are kept per (prompt bucket,
        rounded progress, rounded tokens left) until the next refit or a new grid, so the
        candidates of one step that share a key pay for it once. Read-only."""
        step, num_offsets = grid_step(offsets), len(offsets)
        progress = produced // step
        left = min(max(-(-(cap - produced) // step), 0), num_offsets)
        if (step, num_offsets) != self._row_grid:
            self._rows.clear()
            self._row_grid = (step, num_offsets)
        if not budget:
            self._fit_due()
        curve = None if budget else self._pooled_curve
        if curve is None:
            # Running to the cap: the row depends on the tokens left only.
            key = (-1, 0, left)
        else:
            bucket = self._bucket_key(prompt)
            key = (bucket, progress, left)
        row = self._rows.get(key)
        if row is None:
            if curve is None:
                row = (offsets < left * step).astype(np.float64)
            else:
                rep_produced, rep_cap = progress * step, (progress + left) * step
                row = self._blend_one(
                    key[0], curve.still_running_one(rep_produced, rep_cap, offsets),
                    lambda own: own.still_running_one(rep_produced, rep_cap, offsets),
                )  # fmt: skip
            row.flags.writeable = False
            self._rows[key] = row
        return row

    def _blend_one(
        self, bucket: int, pooled: _Blended, own: Callable[[SurvivalCurve], _Blended]
    ) -> _Blended:
        """``_blended`` of one request in prompt bucket ``bucket`` (a ``_bucket_key``):
        ``pooled`` (the pooled curve's figure) blended with ``own(curve)``, the bucket
        curve's, by the same arithmetic; ``pooled`` when the bucket has no curve."""
        curve = self._curves[bucket] if self._bucketed else None
        if curve is None:
            return pooled
        weight = self._weight(curve)
        blended: _Blended = weight * own(curve) + (1.0 - weight) * pooled
        return blended

    def _weight(self, curve: SurvivalCurve) -> float:
        """A bucket curve's weight in the blend: n / (n + prior_weight)."""
        return curve.num_events / (curve.num_events + self.config.prior_weight)

    def _bucket_key(self, prompt: int) -> int:
        """The prompt bucket the per-request caches (``still_running_row``, ``remaining_of``)
        key on: ``prompt``'s bucket once a bucket has its own curve, else 0 (the pooled curve
        alone decides)."""
        return bisect.bisect_right(self._edge_list, prompt) if self._bucketed else 0

    def remaining_of(self, request: Request) -> float:
        """``remaining`` of one request, kept per (prompt bucket, produced, cap) until the
        next refit: a gate asks it of one waiting request after another, and those share
        a few caps and produced nothing yet."""
        produced = len(request.token_times_s)
        self._fit_due()
        pooled = self._pooled_curve
        if pooled is None:
            return float(max(request.max_tokens - produced, 1))
        prompt = request.num_prompt_tokens
        bucket = self._bucket_key(prompt)
        key = (bucket, produced, request.max_tokens)
        value = self._remaining_of.get(key)
        if value is None:
            cap = request.max_tokens
            value = self._blend_one(
                bucket, pooled.remaining_one(produced, cap),
                lambda own: own.remaining_one(produced, cap),
            )  # fmt: skip
            self._remaining_of[key] = value
        return value

    def smallest_fresh(self, smallest_cap: int) -> float:
        """A lower bound of the expected output of any request not yet started whose cap is
        at least ``smallest_cap``: the estimate is monotone in the cap and a blend lies
        between its curves."""
        self._fit_due()
        if self._pooled_curve is None:
            return float(smallest_cap)
        value = self._smallest_fresh.get(smallest_cap)
        if value is None:
            curves = [self._pooled_curve, *(c for c in self._curves if c is not None)]
            value = min(c.remaining_one(0, smallest_cap) for c in curves)
            self._smallest_fresh[smallest_cap] = value
        return value

    def telemetry(self) -> dict[str, float]:
        errors = self.errors
        n = max(1, errors.count)
        return {
            "output_observed": float(errors.count),
            "output_mae_tokens": errors.sum_abs / n,
            "output_mre": errors.sum_rel / n,
            "output_bias_tokens": errors.sum_signed / n,
            "output_spread_tokens": errors.spread,
        }

    def _forget(self, request_id: int) -> None:
        """Stop tracking a request; learn its length if it finished."""
        entry = self._tracked.pop(request_id)
        request = entry.request
        if request.status is RequestStatus.FINISHED and (
            request.finish_reason is not FinishReason.ABORT
        ):
            self._learn(request, entry.predicted_total)

    def _learn(self, request: Request, predicted_total: float) -> None:
        length = len(request.token_times_s)
        if length <= 0:
            return
        bucket = int(np.searchsorted(self._edges, request.num_prompt_tokens, side="right"))
        self._events[bucket].append(length)
        self._pooled.append(length)
        self.errors.add(predicted_total, length, self.config.error_ema)
        self._dirty = True

    def _refit(
        self,
        running: Sequence[Request],
        step_index: int,
        produced: IntArray | None,
        prompts: IntArray | None,
    ) -> None:
        self._dirty = False
        self._fitted_step = step_index
        self._rows.clear()
        self._remaining_of.clear()
        self._smallest_fresh.clear()
        if not self._pooled:
            return
        if produced is None or prompts is None:
            prompts, produced, _ = request_columns(running)
        # Fitted when first read: a step that asks for no estimate pays for no fit. The
        # inputs are copied, so the curves are this step's whenever they are read.
        self._due = (
            produced.copy(), prompts.copy(), self._pooled.values.copy(),
            [events.values.copy() for events in self._events],
        )  # fmt: skip

    def _fit_due(self) -> None:
        """Fit the curves of the last refit, if not yet done (every reader calls this)."""
        if self._due is None:
            return
        produced, prompts, pooled, per_bucket = self._due
        self._due = None
        buckets = np.searchsorted(self._edges, prompts, side="right")
        tail = self.config.extrapolate_tail
        compiled = self._compiled.fit_tables if self._compiled is not None else None
        self._pooled_curve = SurvivalCurve.fit(pooled, produced, tail, compiled)
        for b, events in enumerate(per_bucket):
            self._curves[b] = (
                SurvivalCurve.fit(events, produced[buckets == b], tail, compiled)
                if len(events)
                else None
            )
        self._bucketed = any(c is not None for c in self._curves)
        self._stack = None

    def _stacked(self) -> BucketedCurves:
        """The fitted curves stacked, built when first read after a fit (a policy that
        reads one request at a time never pays for it): the pooled curve is the stack's
        0, each bucket's own curve follows; per bucket, its curve's index in the stack (0:
        it has none) and its blend weight."""
        if self._stack is not None:
            return self._stack
        assert self._pooled_curve is not None, "stacked only once a curve is fitted"
        own_curves: list[SurvivalCurve] = []
        stack_index = np.zeros(len(self._curves), dtype=np.int64)
        weights = np.zeros(len(self._curves))
        for b, curve in enumerate(self._curves):
            if curve is not None:
                own_curves.append(curve)
                stack_index[b] = len(own_curves)
                weights[b] = self._weight(curve)
        self._stack = BucketedCurves(
            CurveStack.of([self._pooled_curve, *own_curves]), stack_index, weights,
            self._edges, self._bucketed,
        )  # fmt: skip
        return self._stack


_BlendedRemaining = Callable[[BucketedCurves, IntArray, IntArray, IntArray], FloatArray]
_ForecastRows = Callable[
    [BucketedCurves, IntArray, IntArray, IntArray, IntArray],
    tuple[FloatArray, IntArray, IntArray, IntArray, IntArray],
]


@dataclass(frozen=True, slots=True)
class _CompiledCurves:
    """``curve_kernel``'s compiled loops: a batch's blended estimates and a curve's fit."""

    remaining: _BlendedRemaining
    fit_tables: FitTables
    forecast_rows: _ForecastRows


def _compiled_curves() -> _CompiledCurves | None:
    """The compiled loops, None where numba is not installed. Their module compiles them
    (or loads them from numba's cache) on its first import."""
    try:
        from tokenpace.policy import curve_kernel
    except ImportError:
        return None
    return _CompiledCurves(
        curve_kernel.blended_remaining, curve_kernel.fit_tables, curve_kernel.forecast_rows
    )


def ints_of(*values: int) -> IntArray:
    """An int64 array of ``values``."""
    return np.array(values, dtype=np.int64)


def request_columns(requests: Sequence[Request]) -> tuple[IntArray, IntArray, IntArray]:
    """Prompt lengths, tokens produced and max_tokens of ``requests``."""
    prompts = np.array([r.num_prompt_tokens for r in requests], dtype=np.int64)
    produced = np.array([len(r.token_times_s) for r in requests], dtype=np.int64)
    caps = np.array([r.max_tokens for r in requests], dtype=np.int64)
    return prompts, produced, caps
