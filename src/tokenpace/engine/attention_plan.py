"""How an engine that pads decode attention splits its batch, shared by the engine and the
latency model that predicts it.

A padded decode attends every request over the batch's longest context, so one long request
makes every other one pay for its length. Attending the few longest on their own (one call
each) and the rest padded to the longest of the rest trades a call's fixed cost for the
padding it removes. ``peeled`` picks how many: the count k (at most ``max_peeled``) that
minimises ``width * L[k] + sum(L[i] + call_tokens for i < k)`` over the contexts ``L`` in
decreasing order, ``width`` being the rows of the padded call and ``call_tokens`` a call's
fixed cost in attended tokens; the minimum is the step's attended-token equivalent.
"""

from __future__ import annotations

from collections.abc import Sequence


def peeled(
    contexts_desc: Sequence[int], width: int, max_peeled: int, call_tokens: float
) -> tuple[int, float]:
    """(requests attended on their own, attended-token equivalent of the step) for decoding
    contexts in decreasing order; (0, ``width`` x the longest) when peeling does not pay."""
    if not contexts_desc:
        return 0, 0.0
    best_count, best = 0, float(width * contexts_desc[0])
    own = 0.0
    for count in range(1, min(max_peeled, len(contexts_desc) - 1) + 1):
        own += contexts_desc[count - 1] + call_tokens
        cost = width * contexts_desc[count] + own
        if cost < best:
            best_count, best = count, cost
    return best_count, best
