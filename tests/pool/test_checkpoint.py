from __future__ import annotations

import pytest

from tokenpace.engine.profile import EngineProfile
from tokenpace.pool.checkpoint import CheckpointStore, LruCache, load_time_s


def test_load_time_is_init_plus_bytes_over_bandwidth(profile: EngineProfile) -> None:
    assert load_time_s(profile, "gpu") == 0.0
    assert load_time_s(profile, "local_ssd") == pytest.approx(2.0 + 6.425 / 3.0)
    assert load_time_s(profile, "host_memory") == pytest.approx(2.0 + 6.425 / 12.0)
    assert load_time_s(profile, "remote") == pytest.approx(2.0 + 6.425)
    with pytest.raises(KeyError, match="nvram"):
        load_time_s(profile, "nvram")


def test_lru_evicts_least_recently_used() -> None:
    cache = LruCache(capacity_bytes=30)
    assert cache.insert("a", 10) == []
    assert cache.insert("b", 10) == []
    assert cache.insert("c", 10) == []
    cache.touch("a")
    assert cache.insert("d", 15) == ["b", "c"]
    assert cache.names() == ["a", "d"]
    assert cache.used_bytes == 25
    assert cache.insert("huge", 31) == []
    assert "huge" not in cache


def test_store_locates_fastest_tier_and_keeps_unloaded_weights_in_host_memory() -> None:
    store = CheckpointStore(host_memory_bytes=100, local_ssd_bytes=200)
    assert store.locate("m") == "remote"
    store.place("m", 60, "local_ssd")
    assert store.locate("m") == "local_ssd"
    store.record_unload("m", 60)
    assert store.locate("m") == "host_memory"
    store.record_load("other", 60)  # evicts m from host memory, not from SSD
    assert store.locate("m") == "local_ssd"
    assert store.locate("other") == "host_memory"
