"""Autoscaling rule: instances = ceil(load / target per instance), within [min, max]."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Autoscaler:
    """Concurrency-based scaling, as Knative-style serverless platforms do it.

    ``load`` is the number of outstanding requests in the pool (waiting or running);
    ``target_per_instance`` how many one instance should carry. Zero load with
    ``min_instances = 0`` gives zero instances: the pool scales to zero once idle
    containers pass their keep-alive.
    """

    target_per_instance: float
    min_instances: int
    max_instances: int

    def desired(self, load: int) -> int:
        """Instances wanted for ``load`` outstanding requests."""
        wanted = math.ceil(load / self.target_per_instance) if load > 0 else 0
        return max(self.min_instances, min(self.max_instances, wanted))
