"""Checkpoint tiers, load times and per-server checkpoint caches with LRU eviction.

Tiers, fastest first: ``gpu`` (resident in accelerator memory: nothing to load),
``host_memory``, ``local_ssd``, ``remote``. Their read bandwidths and the engine start-up
overhead come from the engine profile.
"""

from __future__ import annotations

from collections import OrderedDict

from tokenpace.engine.profile import EngineProfile

GPU = "gpu"
HOST_MEMORY = "host_memory"
LOCAL_SSD = "local_ssd"
REMOTE = "remote"
TIER_ORDER = (GPU, HOST_MEMORY, LOCAL_SSD, REMOTE)
STORAGE_TIERS = (HOST_MEMORY, LOCAL_SSD, REMOTE)


def load_time_s(profile: EngineProfile, tier: str) -> float:
    """Seconds to start a container whose checkpoint sits in ``tier``: zero for ``gpu``,
    else ``engine_init_s + checkpoint_bytes / bandwidth``. Raises KeyError for a tier the
    profile does not describe and ValueError for a tier without bandwidth."""
    if tier == GPU:
        return 0.0
    bandwidth_gb_s = profile.tier(tier).bandwidth_gb_s
    if not bandwidth_gb_s > 0:
        raise ValueError(f"profile {profile.name}: tier {tier!r} has no positive bandwidth")
    return profile.engine_init_s + profile.checkpoint_bytes / (bandwidth_gb_s * 1e9)


class LruCache:
    """Checkpoints held in one storage tier, bounded by ``capacity_bytes``.

    ``insert`` makes room by evicting the least recently used entries and returns their
    names; a checkpoint larger than the whole capacity is not stored.
    """

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[str, int] = OrderedDict()
        self._used_bytes = 0

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    def names(self) -> list[str]:
        """Cached checkpoint names, least recently used first."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def touch(self, name: str) -> None:
        """Mark ``name`` as just used (no-op when absent)."""
        if name in self._entries:
            self._entries.move_to_end(name)

    def insert(self, name: str, num_bytes: int) -> list[str]:
        """Store (or refresh) ``name``; returns the names evicted to make room."""
        if name in self._entries:
            self.touch(name)
            return []
        if num_bytes > self.capacity_bytes:
            return []
        evicted: list[str] = []
        while self._used_bytes + num_bytes > self.capacity_bytes:
            old, size = self._entries.popitem(last=False)
            self._used_bytes -= size
            evicted.append(old)
        self._entries[name] = num_bytes
        self._used_bytes += num_bytes
        return evicted


class CheckpointStore:
    """One server's checkpoint caches: host memory and local SSD, each an LRU cache.

    ``locate`` names the fastest storage tier holding a checkpoint (``remote`` always holds
    it). ``record_load`` is called when a container loads a checkpoint: like ServerlessLLM's
    loader it passes through and populates both caches. ``record_unload`` is called when a
    container goes cold: the weights leave the GPU but stay in host memory.
    """

    def __init__(self, host_memory_bytes: int, local_ssd_bytes: int) -> None:
        self.host_memory = LruCache(host_memory_bytes)
        self.local_ssd = LruCache(local_ssd_bytes)

    def locate(self, name: str) -> str:
        if name in self.host_memory:
            return HOST_MEMORY
        if name in self.local_ssd:
            return LOCAL_SSD
        return REMOTE

    def place(self, name: str, num_bytes: int, tier: str) -> None:
        """Put a checkpoint in ``tier`` before a run (``remote``/``gpu``: nothing cached)."""
        if tier == HOST_MEMORY:
            self.host_memory.insert(name, num_bytes)
        elif tier == LOCAL_SSD:
            self.local_ssd.insert(name, num_bytes)
        elif tier not in (REMOTE, GPU):
            raise ValueError(f"unknown checkpoint tier {tier!r}; valid: {', '.join(TIER_ORDER)}")

    def record_load(self, name: str, num_bytes: int) -> None:
        self.local_ssd.insert(name, num_bytes)
        self.host_memory.insert(name, num_bytes)

    def record_unload(self, name: str, num_bytes: int) -> None:
        self.host_memory.insert(name, num_bytes)
