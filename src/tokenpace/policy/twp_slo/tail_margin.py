"""The ITL target's margin below the TPOT objective, held where the measured steps put it.

The window and the prefill budget fill each step to the ITL target, the TPOT objective times
``itl_target_fraction``: a margin sized from the profile's step noise, measured on
back-to-back steps of one shape. While serving, a real engine's steps on a shared CPU vary
several times as much, and then with that margin alone a tenth of the inter-token gaps can
pass the objective. ``TailMargin`` widens the margin while the steps measured say so.

p99 ITL pools the gaps between tokens, and a step makes one gap per decoding request, so
the margin counts gaps. It watches the full steps (predicted at ``FULL_STEP_SHARE`` of the
target or more: the ones the window and the budget filled) that decode, and moves the
fraction f by stochastic approximation, each step weighted by its decoding requests over
their running mean (w, at most ``MAX_WEIGHT``): log f falls by ``gain`` x w x (1 - share)
at a step whose measured latency passed the objective and rises by ``gain`` x w x share at
one within it. So f settles where a share ``share`` of the full steps' gaps pass the
objective, whatever the distribution of the steps' noise, without the lag (and overshoot)
of a controller on a smoothed rate. The walk runs up to ``credit`` above the configured
fraction, which f never exceeds (the margin only widens): where fewer than that share pass
(the simulator, a quiet engine), the credit absorbs a rare slow step and f stays at the
configured fraction; where more pass, a few slow steps use it up and f falls. A step that
decodes nothing (prefill alone may pass the objective) makes no gap and is left out. f
never falls below ``floor``.
"""

from __future__ import annotations

import math

# Steps predicted at this share of the ITL target or more are the ones the margin is for.
FULL_STEP_SHARE = 0.8
# The most a step weighs against the mean full step, and the weight of each full step in
# that mean (about 100 steps of memory).
MAX_WEIGHT = 4.0
MEAN_GAIN = 0.01


class TailMargin:
    """The live fraction of the TPOT objective that steps are filled to (module docstring).

    ``ceiling``: the configured fraction, where the margin starts and which it never
    exceeds; ``floor``: the least fraction; ``share``: the share of full steps allowed over
    the objective; ``gain``: the step of log f; ``credit``: how far (log units) the walk
    runs above the ceiling."""

    def __init__(
        self, ceiling: float, floor: float, share: float, gain: float, credit: float
    ) -> None:
        if not 0 < floor <= ceiling <= 1:
            raise ValueError(f"need 0 < floor <= ceiling <= 1, got {floor} and {ceiling}")
        if not 0 < share < 1:
            raise ValueError(f"share must be in (0, 1), got {share}")
        if gain <= 0:
            raise ValueError(f"gain must be positive, got {gain}")
        if credit < 0:
            raise ValueError(f"credit must be >= 0, got {credit}")
        self.share = share
        self.gain = gain
        self._log_ceiling = math.log(ceiling)
        self._log_floor = math.log(floor)
        self._log_top = self._log_ceiling + credit
        self._walk = self._log_top  # log f before the ceiling's clamp
        # Running mean of the decoding requests in a full step (None before the first).
        self._mean_decoding: float | None = None

    @property
    def fraction(self) -> float:
        """The fraction of the TPOT objective that steps are filled to now."""
        return math.exp(min(self._log_ceiling, self._walk))

    def observe(self, over_objective: bool, num_decoding: int, predicted_share: float) -> None:
        """Take one step: whether its measured latency passed the TPOT objective, how many
        requests it decoded, and its predicted latency as a share of the target it was
        filled to. Steps that decode nothing or are predicted under ``FULL_STEP_SHARE`` of
        the target are left out."""
        if num_decoding <= 0 or predicted_share < FULL_STEP_SHARE:
            return
        if self._mean_decoding is None:
            self._mean_decoding = float(num_decoding)
        else:
            self._mean_decoding += MEAN_GAIN * (num_decoding - self._mean_decoding)
        weight = min(MAX_WEIGHT, num_decoding / self._mean_decoding)
        moved = self._walk + self.gain * weight * (self.share - float(over_objective))
        self._walk = min(self._log_top, max(self._log_floor, moved))
