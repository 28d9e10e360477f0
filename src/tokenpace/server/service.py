"""The async front door to the pool: build a request, admit it, and iterate its events.

Handlers call ``prepare`` (validation against the model's context), ``submit`` (bounded
admission, routing) and then read ``handle.queue``. Whatever ends the handler early (a
client gone, a cancelled task) must call ``abort``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tokenpace.core.request import Request
from tokenpace.core.sampling import SamplingParams
from tokenpace.server.admission import AdmissionQueue
from tokenpace.server.errors import ApiError
from tokenpace.server.events import RequestHandle
from tokenpace.server.inflight import InFlight
from tokenpace.server.metrics import ServerMetrics
from tokenpace.server.pool import ServerPool


@dataclass(frozen=True, slots=True)
class ModelLimits:
    """Token limits of the served model: ``max_model_len`` bounds prompt + output of one
    request; ``kv_capacity_tokens`` is one container's whole KV cache;
    ``max_token_chars`` is the most characters one token of the vocabulary decodes to."""

    max_model_len: int
    kv_capacity_tokens: int
    default_max_tokens: int
    max_token_chars: int = 64

    @property
    def context_tokens(self) -> int:
        return min(self.max_model_len, self.kv_capacity_tokens)


class Service:
    """Owns nothing but references: the pool, admission queue, tokenizer and metrics.
    ``rejects_early``: the policy may refuse requests before serving them (early
    rejection), which the handlers answer with 429."""

    def __init__(
        self,
        pool: ServerPool,
        admission: AdmissionQueue,
        tokenizer: Any,
        metrics: ServerMetrics,
        limits: ModelLimits,
        clock: Callable[[], float],
        retry_after_s: int,
        rng: np.random.Generator,
        rejects_early: bool = False,
    ) -> None:
        self.pool = pool
        self.admission = admission
        self.tokenizer = tokenizer
        self.metrics = metrics
        self.limits = limits
        self.clock = clock
        self.retry_after_s = retry_after_s
        self.rng = rng
        # The policy may refuse a request before serving it: a stream then waits for its
        # first event before sending headers, so that a refusal can still be a 429.
        self.rejects_early = rejects_early
        self.accepting = True

    def check_prompt_chars(self, num_chars: int, prompt_field: str) -> None:
        """Refuse, before tokenizing it, a prompt of ``num_chars`` characters that cannot
        fit the context whatever its tokens (tokenizing megabytes would stall the server).
        Raises ApiError(400) naming ``prompt_field``."""
        limit = self.limits.context_tokens
        if num_chars > limit * self.limits.max_token_chars:
            raise ApiError(
                400,
                f"'{prompt_field}' has {num_chars} characters: more tokens than the model's "
                f"context of {limit} tokens",
                param=prompt_field,
                code="context_length_exceeded",
            )

    def check_lengths(
        self, num_prompt_tokens: int, max_tokens: int | None, prompt_field: str
    ) -> int:
        """Validate against the context; return the effective max_tokens (tokens).

        Raises ApiError(400) naming ``prompt_field`` or ``max_tokens``."""
        limit = self.limits.context_tokens
        if num_prompt_tokens == 0:
            raise ApiError(400, f"'{prompt_field}' must not be empty", param=prompt_field)
        if num_prompt_tokens >= limit:
            raise ApiError(
                400,
                f"'{prompt_field}' has {num_prompt_tokens} tokens; the model's context is "
                f"{limit} tokens, prompt and output included",
                param=prompt_field,
                code="context_length_exceeded",
            )
        if max_tokens is None:
            return min(self.limits.default_max_tokens, limit - num_prompt_tokens)
        if num_prompt_tokens + max_tokens > limit:
            raise ApiError(
                400,
                f"'max_tokens' is {max_tokens} but the prompt has {num_prompt_tokens} tokens "
                f"and the model's context is {limit} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return max_tokens

    def submit(
        self, prompt_token_ids: list[int], max_tokens: int, sampling: SamplingParams
    ) -> InFlight:
        """Admit and route a request. A sampled request without a seed gets one drawn from
        ``rng``, so wherever it runs (and after a move) it draws one random stream. Raises
        ApiError 429 (queue full, with Retry-After) or 503 (shutting down)."""
        if not self.accepting:
            self.metrics.reject("shutting_down")
            raise ApiError(503, "the server is shutting down", code="shutting_down")
        request_id = self.pool.next_request_id()
        num_tokens = len(prompt_token_ids) + max_tokens
        if not self.admission.try_reserve(request_id, num_tokens):
            self.metrics.reject("queue_full")
            raise ApiError(
                429,
                "the server is overloaded: its admission queue is full; retry later",
                code="queue_full",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        request = Request(
            request_id=request_id,
            num_prompt_tokens=len(prompt_token_ids),
            max_tokens=max_tokens,
            arrival_s=self.clock(),
            prompt_token_ids=list(prompt_token_ids),
            sampling=self._seeded(sampling),
        )
        inflight = InFlight(request, RequestHandle(request_id, asyncio.get_running_loop()))
        try:
            self.pool.submit(inflight)
        except RuntimeError as error:
            self.admission.release(request_id)
            raise ApiError(503, str(error), code="shutting_down") from None
        return inflight

    def _seeded(self, sampling: SamplingParams) -> SamplingParams:
        if sampling.is_greedy or sampling.seed is not None:
            return sampling
        return replace(sampling, seed=int(self.rng.integers(0, 2**63 - 1)))

    def abort(self, submission: InFlight) -> None:
        self.pool.abort(submission)
