"""A request body's sampling fields as the engines' ``SamplingParams``, with the checks that
need the model (the vocabulary) or several fields together."""

from __future__ import annotations

from tokenpace.core.sampling import SamplingParams
from tokenpace.server.errors import ApiError
from tokenpace.server.schemas import _SamplingFields


def sampling_params(body: _SamplingFields, max_tokens: int, vocab: int) -> SamplingParams:
    """``body``'s sampling for a request of ``max_tokens`` on a model of ``vocab`` tokens.
    Raises ApiError(400) naming the field: fields valid alone but not together,
    ``min_tokens`` over ``max_tokens``, a ``logit_bias`` key or a stop token id that is no
    token of the vocabulary. ``top_k`` -1 (vLLM's "all tokens") becomes 0."""
    conflict = body.conflict()
    if conflict is not None:
        raise ApiError(400, conflict[1], param=conflict[0])
    if body.min_tokens > max_tokens:
        raise ApiError(
            400,
            f"'min_tokens' is {body.min_tokens} but 'max_tokens' is {max_tokens}",
            param="min_tokens",
        )
    return SamplingParams(
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=max(0, body.top_k),
        min_p=body.min_p,
        logit_bias=logit_bias(body, vocab),
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty,
        stop_token_ids=stop_token_ids(body, vocab),
        seed=body.seed,
        stop=body.stop_strings(),
        ignore_eos=body.ignore_eos,
        min_tokens=body.min_tokens,
        logprobs=body.num_logprobs,
        prompt_logprobs=body.num_prompt_logprobs,
    )


def logit_bias(body: _SamplingFields, vocab: int) -> tuple[tuple[int, float], ...]:
    """``body.logit_bias`` as (token id, bias) pairs; a key that is not a token id of the
    vocabulary is a 400 naming the field."""
    pairs = []
    for key, bias in (body.logit_bias or {}).items():
        token_id = int(key) if key.strip().isdigit() else -1
        if not 0 <= token_id < vocab:
            raise ApiError(
                400,
                f"'logit_bias' key {key!r} is not a token id in [0, {vocab})",
                param="logit_bias",
            )
        pairs.append((token_id, float(bias)))
    return tuple(pairs)


def stop_token_ids(body: _SamplingFields, vocab: int) -> tuple[int, ...]:
    """``body.stop_token_ids``; one outside the vocabulary is a 400 naming the field."""
    ids = tuple(body.stop_token_ids or ())
    if any(not 0 <= t < vocab for t in ids):
        raise ApiError(400, f"'stop_token_ids' must be in [0, {vocab})", param="stop_token_ids")
    return ids
