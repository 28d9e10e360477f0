"""A pacing policy's window as others may read it: how much more work it would admit now.

The pool's ``headroom`` router and ``token_rate`` autoscaler read this instead of counting
requests, so they see what the policy itself sees (its window, its token load with the
learned output lengths, its KV reservation). Reading it never changes the policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from tokenpace.core.queue import WaitingQueue
from tokenpace.core.request import Request
from tokenpace.policy.twp.expected import ExpectedOutput


@dataclass(frozen=True, slots=True)
class WindowState:
    """One policy's window at one instant, every figure in the window's own ``unit``.

    ``unit``: "tokens" (TWP: the window H_t bounds the expected remaining output K_t) or
    "requests" (twp_slo: the window W_t bounds the running batch). ``window``: H_t or W_t.
    ``load``: what the running requests occupy (K_t, or their count). ``queued``: what the
    waiting requests would occupy once admitted (their expected output tokens, or their
    count). ``drain_per_s``: units the running batch frees per second at the smoothed ITL
    (0 when nothing runs). ``kv_reserved_blocks``: the running batch's predicted KV
    footprint plus its safety margin at the last plan (blocks; 0 without a reservation).
    ``prefill_backlog_s``: the prefill compute queued, i.e. the prompt tokens not yet
    computed (waiting and running) at the policy's per-token prefill cost (seconds; 0 from a
    policy that does not price prefill). ``queued_ahead`` and ``prefill_ahead_s``: the part of
    ``queued`` and of ``prefill_backlog_s`` that a request arriving now would wait behind,
    where the policy serves some waiting requests after a fresh one (twp_slo's ranking puts
    those that can no longer meet the TTFT objective last); None: all of it.
    """

    unit: str
    window: float
    load: float
    queued: float
    drain_per_s: float
    kv_reserved_blocks: float
    prefill_backlog_s: float = 0.0
    queued_ahead: float | None = None
    prefill_ahead_s: float | None = None

    @property
    def free(self) -> float:
        """Window room left once the queue is admitted (negative: the queue overflows it)."""
        return self.window - self.load - self.queued

    @property
    def free_ahead(self) -> float:
        """Window room a request arriving now finds once what goes before it is admitted
        (negative: it waits for that many units to drain)."""
        queued = self.queued if self.queued_ahead is None else self.queued_ahead
        return self.window - self.load - queued

    @property
    def num_behind(self) -> float:
        """Waiting requests (in ``unit``) the policy serves after a request arriving now."""
        return 0.0 if self.queued_ahead is None else self.queued - self.queued_ahead

    @property
    def backlog_ahead_s(self) -> float:
        """Prefill compute (seconds) a request arriving now waits behind."""
        return self.prefill_backlog_s if self.prefill_ahead_s is None else self.prefill_ahead_s


@runtime_checkable
class WindowedPolicy(Protocol):
    """A policy that reports its window and its output-length estimate (read-only)."""

    def window_state(
        self, running: Sequence[Request], waiting: WaitingQueue, now_s: float | None = None
    ) -> WindowState:
        """The window for these running and waiting requests, after the last ``plan``; with
        ``now_s``, also what a request arriving then would wait behind (``queued_ahead``)."""
        ...

    def expected_output(self, request: Request) -> float | None:
        """Output tokens expected of ``request`` (None before any request finished)."""
        ...


def token_window_state(
    window_tokens: float,
    itl_ms: float,
    expected: ExpectedOutput,
    running: Sequence[Request],
    waiting: WaitingQueue,
    kv_reserved_blocks: float,
) -> WindowState:
    """TWP's window in tokens: K_t and the queue's expected output from ``expected``; the
    batch drains one token per running request per step of ``itl_ms``."""
    load = float(expected.running_remaining(running).sum()) if running else 0.0
    queued = 0.0
    if len(waiting):
        totals = expected.queue_totals(waiting)
        remaining = waiting.remaining_output_tokens
        if totals is None:  # planning with budgets: the rest of max_tokens
            queued = float(remaining.sum())
        else:  # expected totals minus what was already streamed (resumed requests)
            queued = float((totals - (waiting.max_tokens - remaining)).sum())
    drain = len(running) / (itl_ms / 1000) if itl_ms > 0 else 0.0
    return WindowState("tokens", window_tokens, load, queued, drain, kv_reserved_blocks)


def request_window_state(
    window_requests: float,
    itl_ms: float,
    expected: ExpectedOutput,
    running: Sequence[Request],
    waiting: WaitingQueue,
    kv_reserved_blocks: float,
    prefill_ms_per_token: float = 0.0,
    ahead: npt.NDArray[np.bool_] | None = None,
) -> WindowState:
    """twp_slo's window in requests: a running request leaves after its expected remaining
    output at one token per step of ``itl_ms``, so the batch frees n / (mean remaining x
    ITL) requests per second; the prefill backlog is priced at ``prefill_ms_per_token``.
    ``ahead`` (one flag per waiting request, in queue order): the waiting requests served
    before a fresh arrival, which ``queued_ahead`` and ``prefill_ahead_s`` count (with every
    running request's prefill); None: all of them."""
    drain = 0.0
    if running and itl_ms > 0:
        remaining = float(expected.running_remaining(running).sum())
        drain = len(running) ** 2 / max(remaining, len(running)) / (itl_ms / 1000)
    prompts = waiting.num_prompt_tokens if len(waiting) else np.zeros(0, dtype=np.int64)
    running_tokens = float(sum(r.num_uncomputed_tokens for r in running if r.is_prefilling))
    backlog_tokens = float(prompts.sum()) + running_tokens
    queued_ahead = prefill_ahead_s = None
    if ahead is not None:
        queued_ahead = float(np.count_nonzero(ahead))
        ahead_tokens = float(prompts[ahead].sum()) + running_tokens
        prefill_ahead_s = ahead_tokens * prefill_ms_per_token / 1000
    return WindowState(
        "requests", window_requests, float(len(running)), float(len(waiting)), drain,
        kv_reserved_blocks, backlog_tokens * prefill_ms_per_token / 1000,
        queued_ahead, prefill_ahead_s,
    )  # fmt: skip
