"""Pool configuration: size, warmth, autoscaling bounds, checkpoint caches, migration."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpace.core.config import option, require_positive
from tokenpace.pool.checkpoint import TIER_ORDER


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """Every knob of the simulated serverless pool (one container per GPU server)."""

    num_containers: int = option(4, "Containers (one per GPU server) in the pool.")
    initial_warm: int = option(
        1, "Containers warm at time 0 (ids 0..initial_warm-1); the rest start cold."
    )
    keep_alive_s: float = option(
        2.0,
        "Idle seconds after which a warm container with no work goes cold (short, so that "
        "containers go cold between bursts and cold starts are paid).",
    )
    initial_tier: str = option(
        "local_ssd",
        "Where the checkpoint sits for containers that start cold: host_memory, local_ssd "
        "or remote.",
    )
    host_cache_bytes: int = option(
        64_000_000_000, "Host-memory checkpoint cache per server (bytes, LRU)."
    )
    ssd_cache_bytes: int = option(
        512_000_000_000, "Local-SSD checkpoint cache per server (bytes, LRU)."
    )
    min_instances: int = option(
        0, "Autoscaler floor on warm+loading containers (0 allows scale to zero)."
    )
    max_instances: int = option(0, "Autoscaler ceiling; 0 means num_containers.")
    target_per_instance: float = option(
        8.0, "Autoscaler target of outstanding requests per instance (B0 by default)."
    )
    scale_down_window_s: float = option(
        5.0,
        "The autoscaler drains surplus instances only when the load of this many seconds "
        "past no longer needs them (scale-up is immediate).",
    )
    migration_batch_threshold: int = option(
        8,
        "Live migration moves a running request off a container whose batch exceeds this "
        "size when another container idles (serverlessllm router only).",
    )
    migration_overhead_s: float = option(
        0.005, "Fixed cost of one migration hand-off (token transfer, control RPCs), s."
    )
    record_steps: bool = option(True, "Keep per-step records of every container.")

    def __post_init__(self) -> None:
        require_positive(self, "num_containers", "keep_alive_s", "target_per_instance")
        if not 0 <= self.initial_warm <= self.num_containers:
            raise ValueError(
                f"PoolConfig.initial_warm must be in [0, num_containers={self.num_containers}], "
                f"got {self.initial_warm}"
            )
        if self.initial_tier not in TIER_ORDER[1:]:
            raise ValueError(
                f"PoolConfig.initial_tier must be one of {', '.join(TIER_ORDER[1:])}, "
                f"got {self.initial_tier!r}"
            )
        for name in (
            "host_cache_bytes", "ssd_cache_bytes", "migration_overhead_s", "scale_down_window_s"
        ):  # fmt: skip
            if getattr(self, name) < 0:
                raise ValueError(f"PoolConfig.{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 <= self.max_instances <= self.num_containers:
            raise ValueError(
                f"PoolConfig.max_instances must be in [0, num_containers={self.num_containers}]"
                f", got {self.max_instances}"
            )
        if not 0 <= self.min_instances <= self.instance_ceiling:
            raise ValueError(
                f"PoolConfig.min_instances must be in [0, {self.instance_ceiling}], "
                f"got {self.min_instances}"
            )
        if self.migration_batch_threshold < 1:
            raise ValueError(
                "PoolConfig.migration_batch_threshold must be >= 1, "
                f"got {self.migration_batch_threshold}"
            )

    @property
    def instance_ceiling(self) -> int:
        """The autoscaler's effective maximum number of instances."""
        return self.max_instances or self.num_containers
