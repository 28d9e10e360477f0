"""Token-length distributions: mixtures of uniform ranges or of fixed values."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True, slots=True)
class LengthMixture:
    """With probability ``weights[i]`` draw uniformly from ``ranges[i]`` (inclusive).
    A fixed value v is the range (v, v)."""

    ranges: tuple[tuple[int, int], ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.ranges) != len(self.weights) or not self.ranges:
            raise ValueError("LengthMixture needs one weight per range")
        if abs(sum(self.weights) - 1.0) > 1e-9 or min(self.weights) < 0:
            raise ValueError(f"LengthMixture weights must sum to 1, got {self.weights}")
        for low, high in self.ranges:
            if not 0 < low <= high:
                raise ValueError(f"LengthMixture range ({low}, {high}) is invalid")

    @classmethod
    def fixed(cls, values: Sequence[int], weights: Sequence[float]) -> LengthMixture:
        return cls(tuple((v, v) for v in values), tuple(weights))

    def sample(self, rng: np.random.Generator, n: int) -> npt.NDArray[np.int64]:
        component = rng.choice(len(self.ranges), size=n, p=np.asarray(self.weights))
        lows = np.array([r[0] for r in self.ranges])[component]
        highs = np.array([r[1] for r in self.ranges])[component]
        return rng.integers(lows, highs + 1).astype(np.int64)

    @property
    def largest(self) -> int:
        """The longest length the mixture can draw."""
        return max(high for _, high in self.ranges)

    @property
    def mean(self) -> float:
        return float(
            sum(w * (lo + hi) / 2 for (lo, hi), w in zip(self.ranges, self.weights, strict=True))
        )

    def scaled(self, factor: float) -> LengthMixture:
        """The same weights with every range bound multiplied by ``factor`` and rounded
        (at least 1 token); the mean scales by about ``factor``."""
        if not factor > 0:
            raise ValueError(f"LengthMixture.scaled factor must be > 0, got {factor}")
        ranges = []
        for low, high in self.ranges:
            new_low = max(1, round(low * factor))
            ranges.append((new_low, max(new_low, round(high * factor))))
        return LengthMixture(tuple(ranges), self.weights)
