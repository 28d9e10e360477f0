"""A pacing policy's window as others may read it: how much more work it would admit now.

The pool's ``headroom`` router and ``token_rate`` autoscaler read this instead of counting
requests, so they see what the policy itself sees (its window, its token load with the
learned output lengths, its KV reservation). Reading it never changes the policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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
    ``prefill_backlog_s``: the prefill compute queued ahead of a new request, i.e. the prompt
    tokens not yet computed (waiting and running) at the policy's per-token prefill cost
    (seconds; 0 from a policy that does not price prefill).
    """

    unit: str
    window: float
    load: float
    queued: float
    drain_per_s: float
    kv_reserved_blocks: float
    prefill_backlog_s: float = 0.0

    @property
    def free(self) -> float:
        """Window room left once the queue is admitted (negative: the queue overflows it)."""
        return self.window - self.load - self.queued


@runtime_checkable
class WindowedPolicy(Protocol):
    """A policy that reports its window and its output-length estimate (read-only)."""

    def window_state(self, running: Sequence[Request], waiting: WaitingQueue) -> WindowState:
        """The window for these running and waiting requests, after the last ``plan``."""
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
) -> WindowState:
    """twp_slo's window in requests: a running request leaves after its expected remaining
    output at one token per step of ``itl_ms``, so the batch frees n / (mean remaining x
    ITL) requests per second; the prefill backlog is priced at ``prefill_ms_per_token``."""
    drain = 0.0
    if running and itl_ms > 0:
        remaining = float(expected.running_remaining(running).sum())
        drain = len(running) ** 2 / max(remaining, len(running)) / (itl_ms / 1000)
    backlog_tokens = float(waiting.num_prompt_tokens.sum()) if len(waiting) else 0.0
    backlog_tokens += sum(r.num_uncomputed_tokens for r in running if r.is_prefilling)
    return WindowState(
        "requests", window_requests, float(len(running)), float(len(waiting)), drain,
        kv_reserved_blocks, backlog_tokens * prefill_ms_per_token / 1000,
    )  # fmt: skip
