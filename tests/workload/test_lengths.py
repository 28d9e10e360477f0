"""Length mixtures: scaling keeps the weights and scales the mean."""

from __future__ import annotations

import pytest

from tokenpace.workload.lengths import LengthMixture


def test_scaled_multiplies_every_bound_and_keeps_at_least_one_token() -> None:
    mixture = LengthMixture(((2, 10), (11, 400)), (0.25, 0.75))
    half = mixture.scaled(0.5)
    assert half == LengthMixture(((1, 5), (6, 200)), (0.25, 0.75))
    assert half.mean == pytest.approx(mixture.mean / 2, rel=0.01)
    assert LengthMixture.fixed((3,), (1.0,)).scaled(0.1).ranges == ((1, 1),)
    with pytest.raises(ValueError, match="factor must be > 0"):
        mixture.scaled(0)
