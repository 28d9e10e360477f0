"""Slot-based KV storage: one contiguous row of positions per request, active rows packed.

Each request holding KV owns a slot ``s`` and its keys for layer ``l`` live at
``keys[l, s, :, :length]`` (shape ``[num_kv_heads, length, head_dim]``). Active requests
always occupy slots ``0 .. num_active - 1``: when one leaves, the request in the last slot
moves into the hole (one copy of that request's KV), so a decode step can attend over
``keys[l, :n, :, :max_len]`` as a strided view, with no gather. Paged storage would need a
gather of every request's blocks per layer per step; on CPU that copy costs more than the
attention it feeds. Capacity (slots and positions) grows by doubling up to its limits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class KVShape:
    """Model dimensions the cache stores."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


class SlotKVCache:
    """KV tensors ``[layers, slots, kv_heads, positions, head_dim]`` with packed slots.

    The caller writes through ``keys``/``values`` at ``slot_of(request_id)``; ``ensure``
    must be called first with the slot count and positions a step will touch.
    """

    _INITIAL_SLOTS = 8
    _INITIAL_POSITIONS = 256

    def __init__(
        self,
        shape: KVShape,
        dtype: torch.dtype,
        device: torch.device,
        max_slots: int,
        max_positions: int,
    ) -> None:
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.max_slots = max_slots
        self.max_positions = max_positions
        self._slots: dict[int, int] = {}
        self._owners: list[int] = []
        self._lengths: list[int] = []
        self.keys = self._empty(0, 0)
        self.values = self._empty(0, 0)

    def _empty(self, slots: int, positions: int) -> torch.Tensor:
        s = self.shape
        size = (s.num_layers, slots, s.num_kv_heads, positions, s.head_dim)
        return torch.zeros(size, dtype=self.dtype, device=self.device)

    @property
    def num_active(self) -> int:
        return len(self._owners)

    @property
    def capacity(self) -> tuple[int, int]:
        """(slots, positions) currently allocated."""
        return int(self.keys.shape[1]), int(self.keys.shape[3])

    @property
    def bytes_per_token(self) -> int:
        """Keys and values of one token across all layers (bytes)."""
        s = self.shape
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * s.num_layers * s.num_kv_heads * s.head_dim * element

    @property
    def num_bytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()

    def slot_of(self, request_id: int) -> int | None:
        return self._slots.get(request_id)

    def assign(self, request_id: int) -> int:
        """The slot of ``request_id``, taking the next free one if it holds none."""
        slot = self._slots.get(request_id)
        if slot is not None:
            return slot
        if len(self._owners) >= self.max_slots:
            raise MemoryError(f"all {self.max_slots} KV slots are in use")
        slot = len(self._owners)
        self._slots[request_id] = slot
        self._owners.append(request_id)
        self._lengths.append(0)
        return slot

    def set_length(self, slot: int, length: int) -> None:
        """Record that positions ``0 .. length - 1`` of ``slot`` hold valid KV."""
        self._lengths[slot] = length

    def ensure(self, num_slots: int, num_positions: int) -> None:
        """Grow storage (doubling, copying what is held) to at least the given size."""
        if num_positions > self.max_positions:
            raise ValueError(
                f"a request needs {num_positions} positions, max_model_len is {self.max_positions}"
            )
        slots, positions = self.capacity
        if num_slots <= slots and num_positions <= positions:
            return
        new_slots = max(slots, min(self.max_slots, _grow(slots, num_slots, self._INITIAL_SLOTS)))
        new_positions = max(
            positions,
            min(self.max_positions, _grow(positions, num_positions, self._INITIAL_POSITIONS)),
        )
        keys, values = self._empty(new_slots, new_positions), self._empty(new_slots, new_positions)
        n = min(self.num_active, slots)
        if n and positions:
            keys[:, :n, :, :positions] = self.keys[:, :n]
            values[:, :n, :, :positions] = self.values[:, :n]
        self.keys, self.values = keys, values

    def release(self, request_id: int) -> None:
        """Free the slot of ``request_id`` (no-op if it holds none), moving the request in
        the last slot into it so active slots stay packed."""
        slot = self._slots.pop(request_id, None)
        if slot is None:
            return
        last = len(self._owners) - 1
        if slot != last:
            moved = self._owners[last]
            length = self._lengths[last]
            if length:
                self.keys[:, slot, :, :length] = self.keys[:, last, :, :length]
                self.values[:, slot, :, :length] = self.values[:, last, :, :length]
            self._owners[slot] = moved
            self._lengths[slot] = length
            self._slots[moved] = slot
        self._owners.pop()
        self._lengths.pop()


def _grow(current: int, needed: int, initial: int) -> int:
    size = max(current, initial)
    while size < needed:
        size *= 2
    return size
