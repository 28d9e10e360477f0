"""The bounded admission queue: how much work may wait before the server answers 429."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueueBounds:
    """At most ``max_requests`` requests holding at most ``max_tokens`` tokens (prompt plus
    max_tokens each) may wait for admission across the whole server."""

    max_requests: int
    max_tokens: int


class AdmissionQueue:
    """Thread-safe reservations for waiting requests.

    ``try_reserve`` is called by the HTTP handler before a request enters any container;
    the container ``release``s it once its policy admits it (or it finishes, aborts or
    fails while still waiting). ``release`` of an unknown id is a no-op, so every exit path
    may call it.
    """

    def __init__(self, bounds: QueueBounds) -> None:
        self.bounds = bounds
        self._lock = threading.Lock()
        self._tokens: dict[int, int] = {}
        self._num_tokens = 0

    @property
    def num_requests(self) -> int:
        with self._lock:
            return len(self._tokens)

    @property
    def num_tokens(self) -> int:
        with self._lock:
            return self._num_tokens

    def try_reserve(self, request_id: int, num_tokens: int) -> bool:
        """Reserve room for a request of ``num_tokens`` tokens; False when either bound
        would be exceeded (the caller answers 429)."""
        with self._lock:
            if len(self._tokens) + 1 > self.bounds.max_requests:
                return False
            if self._num_tokens + num_tokens > self.bounds.max_tokens:
                return False
            self._tokens[request_id] = num_tokens
            self._num_tokens += num_tokens
            return True

    def release(self, request_id: int) -> None:
        with self._lock:
            self._num_tokens -= self._tokens.pop(request_id, 0)
