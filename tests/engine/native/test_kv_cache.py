"""Slot KV storage: packing on release, growth keeps held KV."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the native engine needs torch (native extra)")

from tokenpace.engine.native.kv_cache import KVShape, SlotKVCache  # noqa: E402

pytestmark = pytest.mark.native


def make_cache(max_slots: int = 16, max_positions: int = 1024) -> SlotKVCache:
    return SlotKVCache(
        KVShape(2, 3, 4), torch.float32, torch.device("cpu"), max_slots, max_positions
    )


def fill(cache: SlotKVCache, request_id: int, length: int) -> None:
    slot = cache.assign(request_id)
    cache.ensure(cache.num_active, length)
    cache.keys[:, slot, :, :length] = float(request_id)
    cache.values[:, slot, :, :length] = -float(request_id)
    cache.set_length(slot, length)


def test_release_moves_last_slot_into_hole() -> None:
    cache = make_cache()
    for request_id, length in ((10, 5), (11, 7), (12, 3)):
        fill(cache, request_id, length)
    cache.release(10)
    assert cache.num_active == 2
    assert cache.slot_of(12) == 0 and cache.slot_of(11) == 1 and cache.slot_of(10) is None
    assert torch.all(cache.keys[:, 0, :, :3] == 12.0)
    assert torch.all(cache.values[:, 0, :, :3] == -12.0)
    cache.release(10)  # no-op
    cache.release(11)
    cache.release(12)
    assert cache.num_active == 0


def test_growth_keeps_held_kv_and_respects_limits() -> None:
    cache = make_cache(max_slots=16, max_positions=1024)
    fill(cache, 1, 200)
    for request_id in range(2, 12):
        fill(cache, request_id, 4)
    fill(cache, 1, 600)
    assert cache.capacity == (16, 1024)
    assert torch.all(cache.keys[:, cache.slot_of(5) or 0, :, :4] == 5.0)
    with pytest.raises(ValueError, match="max_model_len"):
        cache.ensure(1, 1025)


def test_assign_refuses_beyond_max_slots() -> None:
    cache = make_cache(max_slots=2)
    cache.assign(1)
    cache.assign(2)
    assert cache.assign(1) == 0
    with pytest.raises(MemoryError):
        cache.assign(3)
