"""Online calibration: refit the profile's step-latency terms from the steps an engine runs.

The model is the one the offline fit and the simulator use (``engine.latency_model``):

    step_ms = l_min + alpha * max(0, B - B0) + p * P + m * [P > 0 and B > 0]

with B the step's decoding requests, P its prefill tokens, the knee B0 fixed at the offline
profile's, and the context (attention) terms, the decode residual (the measured curve's
departure from Eq. 2, a fixed shape) and a prefill-only step's floor (as its excess over
l_min) left at their offline values. Given the step's shape (each decoding request's
context and each prefill chunk's start), its context terms at their offline values are
taken out of the measured latency before the fit, as the other fixed terms are: without
that, l_min would absorb the served steps' mean attention cost, which the published profile
then charges again on top. The four terms
are the exponentially weighted least-squares solution (recursive least squares with a
forgetting factor, solved exactly from its sufficient statistics) with a weak ridge toward
the offline profile (worth ``prior_steps`` steps), so a direction the served steps never
excite (say alpha while every batch stays below B0) keeps its offline value instead of
drifting (RLS "wind-up"), and the first updates, from a handful of steps, stay near it.

Robustness: a residual beyond ``clip_sigmas`` robust spreads of the current fit is clipped
to that bound before it enters the fit, so a lone slow step (a page fault, another process
on the core) moves nothing much. When most of the recent residuals (``shift_votes`` of the
last ``shift_window``) lie beyond the bound on the same side, the engine's speed has
changed (throttling, a noisy neighbour, a clock change): the statistics are discounted by
``shift_discount`` and rescaled by the median measured / predicted ratio of those steps
(a throttled engine is slower in every term), and this step and the next
``shift_window - 1`` enter unclipped, so the fit follows within a few steps instead of the
forgetting factor's memory.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from tokenpace.core.config import option, require_positive
from tokenpace.engine.latency_model import LatencyModel, StepShape
from tokenpace.engine.profile import EngineProfile

# Feature scales: a prefill chunk of this many tokens counts as one unit, so the ridge and
# the statistics weigh the four terms on comparable footing.
_PREFILL_SCALE_TOKENS = 64.0
_MIN_SPREAD_FRACTION = 0.01  # the robust spread never falls below 1% of the predicted step
_MAX_SPEED_RATIO = 10.0  # the largest change of speed one detection rescales by


@dataclass(frozen=True, slots=True)
class OnlineCalibrationConfig:
    """How a serving engine refits its profile from its own steps."""

    forgetting: float = option(
        0.98, "Forgetting factor of the fit per step (memory about 1 / (1 - f) steps)."
    )
    publish_every: int = option(4, "Steps between two profile updates handed to the policy.")
    min_steps: int = option(8, "Steps observed before the first update.")
    clip_sigmas: float = option(4.0, "Residuals beyond this many robust spreads are clipped.")
    spread_ema: float = option(0.05, "Weight of the newest step in the robust spread.")
    shift_window: int = option(5, "Recent residuals inspected for a change of speed.")
    shift_votes: int = option(4, "Residuals beyond the bound, same side, that signal a change.")
    shift_discount: float = option(0.1, "Weight left to past steps when a change is detected.")
    prior_steps: float = option(0.01, "Weight of the offline profile, in steps.")

    def __post_init__(self) -> None:
        require_positive(
            self, "forgetting", "publish_every", "min_steps", "clip_sigmas", "spread_ema",
            "shift_window", "shift_votes", "shift_discount", "prior_steps",
        )  # fmt: skip
        for name in ("forgetting", "spread_ema", "shift_discount"):
            if getattr(self, name) > 1:
                raise ValueError(
                    f"OnlineCalibrationConfig.{name} must be in (0, 1], got {getattr(self, name)}"
                )
        if self.shift_votes > self.shift_window:
            raise ValueError(
                f"OnlineCalibrationConfig.shift_votes ({self.shift_votes}) exceeds "
                f"shift_window ({self.shift_window})"
            )


class TimedStep(Protocol):
    """What the estimator reads of a step (``StepRecord`` and ``StepResult`` both are):
    its latency in seconds, its decoding requests and its prefill tokens."""

    @property
    def latency_s(self) -> float: ...

    @property
    def num_decode_tokens(self) -> int: ...

    @property
    def num_prefill_tokens(self) -> int: ...


@dataclass(frozen=True, slots=True)
class StepSample:
    """A step as an engine that keeps no ``StepRecord`` reports it (vLLM's scheduler):
    latency in seconds, decoding requests, prefill tokens."""

    latency_s: float
    num_decode_tokens: int
    num_prefill_tokens: int


@dataclass(frozen=True, slots=True)
class LiveProfile:
    """The live profile's figures for metrics: milliseconds, B0 in requests, the steps
    observed, the changes of speed detected, and when the profile was last updated
    (``updated_s``, on the clock of the caller; None before the first update)."""

    l_min_ms: float
    alpha_ms: float
    b0: int
    prefill_ms_per_token: float
    mixed_prefill_overhead_ms: float
    num_steps: int
    num_shifts: int
    updated_s: float | None

    @classmethod
    def of(
        cls, profile: EngineProfile, num_steps: int, num_shifts: int, updated_s: float | None
    ) -> LiveProfile:
        return cls(
            profile.l_min_ms, profile.alpha_ms, profile.b0, profile.prefill_ms_per_token,
            profile.mixed_prefill_overhead_ms, num_steps, num_shifts, updated_s,
        )  # fmt: skip


class OnlineProfileEstimator:
    """Refits ``base``'s step-latency terms from observed steps (see the module doc).

    ``observe(step, now_s)`` folds in one step and returns the updated profile when one is
    published (every ``publish_every`` steps once ``min_steps`` were seen), else None;
    ``profile`` is the latest published profile (``base`` until the first). Steps with a
    non-positive latency or no tokens are ignored. No I/O, no clock of its own.
    """

    def __init__(self, base: EngineProfile, config: OnlineCalibrationConfig) -> None:
        self.base = base
        self.config = config
        self.profile = base
        self.num_steps = 0
        self.num_shifts = 0
        self.updated_s: float | None = None
        # The base profile's decode and prefill residuals and prefill floor are a fixed shape
        # around Eq. 2: steps are fitted net of it.
        self._shape = LatencyModel(base)
        self._prior = self._theta_of(base)
        self._ridge = config.prior_steps * np.eye(4)
        self._gram = np.zeros((4, 4))
        self._moment = np.zeros(4)
        self._theta = self._prior.copy()
        self._spread_ms = max(base.noise_cv, 0.02) * base.l_min_ms
        self._recent: deque[tuple[float, float]] = deque(maxlen=config.shift_window)
        self._tracking = 0  # steps left that enter unclipped after a change of speed

    def live(self) -> LiveProfile:
        """The published profile's figures, for metrics."""
        return LiveProfile.of(self.profile, self.num_steps, self.num_shifts, self.updated_s)

    def observe(
        self, step: TimedStep, now_s: float, shape: StepShape | None = None
    ) -> EngineProfile | None:
        """Fold in ``step`` (``shape``: its decode contexts and prefill chunks, whose
        context terms are then taken out at their offline values; None: a step at no
        context)."""
        num_decode, num_prefill = step.num_decode_tokens, step.num_prefill_tokens
        if step.latency_s <= 0 or num_decode + num_prefill <= 0:
            return None
        cfg = self.config
        x = self._features(num_decode, num_prefill)
        fixed_ms = self._fixed_ms(num_decode, num_prefill) + self._context_ms(shape)
        measured_ms = step.latency_s * 1000.0 - fixed_ms
        predicted_ms = float(x @ self._theta)
        residual = measured_ms - predicted_ms
        bound = cfg.clip_sigmas * max(self._spread_ms, _MIN_SPREAD_FRACTION * abs(predicted_ms))
        self._recent.append((residual / bound, measured_ms / max(predicted_ms, 1e-9)))
        ratio = self._shift_ratio() if self._tracking == 0 else None
        if ratio is not None:
            # The past steps keep a small weight, rescaled to the new speed: their relative
            # terms survive, their level does not.
            self.num_shifts += 1
            self._gram *= cfg.shift_discount
            self._moment *= cfg.shift_discount * ratio
            self._recent.clear()
            self._tracking = cfg.shift_window
        if self._tracking > 0:  # after a change of speed: unclipped until the fit caught up
            self._tracking -= 1
            used = residual
        else:
            used = min(bound, max(-bound, residual))
            self._spread_ms += cfg.spread_ema * (abs(used) - self._spread_ms)
        target_ms = predicted_ms + used
        self._gram = cfg.forgetting * self._gram + np.outer(x, x)
        self._moment = cfg.forgetting * self._moment + x * target_ms
        self._theta = np.linalg.solve(
            self._gram + self._ridge, self._moment + self._ridge @ self._prior
        )
        self.num_steps += 1
        if self.num_steps < cfg.min_steps or (self.num_steps - cfg.min_steps) % cfg.publish_every:
            return None
        self.profile = self._profile_of(self._theta)
        self.updated_s = now_s
        return self.profile

    def predict_ms(self, num_decode: int, num_prefill: int) -> float:
        """The current fit's step latency (ms) for a step of this shape."""
        fitted = float(self._features(num_decode, num_prefill) @ self._theta)
        return fitted + self._fixed_ms(num_decode, num_prefill)

    def _fixed_ms(self, num_decode: int, num_prefill: int) -> float:
        """The base profile's fixed shape of a step: the decode residual or prefill floor's
        excess (``LatencyModel.shape_ms``) and the prefill residual at the step's tokens
        (``LatencyModel.step_residual_ms``)."""
        return self._shape.shape_ms(num_decode) + self._shape.step_residual_ms(
            num_decode, num_prefill
        )

    def _context_ms(self, shape: StepShape | None) -> float:
        """The base profile's context terms of ``shape`` (decode and prefill attention):
        its step time over the same step at no context."""
        if shape is None:
            return 0.0
        flat = StepShape(
            tuple(0 for _ in shape.decode_contexts),
            tuple(replace(chunk, context_start=0) for chunk in shape.prefill_chunks),
        )
        return 1000.0 * (self._shape.shape_s(shape) - self._shape.shape_s(flat))

    def _shift_ratio(self) -> float | None:
        """When ``shift_votes`` of the recent residuals lie beyond the bound on one side, the
        median measured / predicted ratio of those steps; else None."""
        votes = self.config.shift_votes
        for side in (1.0, -1.0):
            ratios = [ratio for z, ratio in self._recent if z * side > 1.0]
            if len(ratios) >= votes:
                # Bounded: a fit that predicts near zero must not blow the statistics up.
                return min(_MAX_SPEED_RATIO, max(1 / _MAX_SPEED_RATIO, float(np.median(ratios))))
        return None

    def _features(self, num_decode: int, num_prefill: int) -> np.ndarray:
        b0 = self.base.b0
        mixed = 1.0 if num_prefill > 0 and num_decode > 0 else 0.0
        return np.array(
            [1.0, max(0, num_decode - b0) / b0, num_prefill / _PREFILL_SCALE_TOKENS, mixed]
        )

    def _theta_of(self, profile: EngineProfile) -> np.ndarray:
        return np.array(
            [
                profile.l_min_ms,
                profile.alpha_ms * profile.b0,
                profile.prefill_ms_per_token * _PREFILL_SCALE_TOKENS,
                profile.mixed_prefill_overhead_ms,
            ]
        )

    def _profile_of(self, theta: np.ndarray) -> EngineProfile:
        """``base`` with the fitted terms (each clamped at 0; l_min kept positive; a prefill
        floor moved with l_min)."""
        l_min, alpha_b0, prefill, mixed = (float(v) for v in theta)
        base = self.base
        l_min = max(l_min, 1e-3)
        floor = base.prefill_floor_ms
        return replace(
            base,
            prefill_floor_ms=max(1e-3, floor + l_min - base.l_min_ms) if floor > 0 else 0.0,
            l_min_ms=l_min,
            alpha_ms=max(0.0, alpha_b0 / self.base.b0),
            prefill_ms_per_token=max(0.0, prefill / _PREFILL_SCALE_TOKENS),
            mixed_prefill_overhead_ms=max(0.0, mixed),
        )
