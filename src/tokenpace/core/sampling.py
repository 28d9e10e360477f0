"""How a request's tokens are sampled and when generation stops early."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Temperatures below this sample greedily (vLLM's threshold).
GREEDY_TEMPERATURE = 1e-5
# A repetition penalty divides logits: far below this it overflows them to infinity.
MIN_REPETITION_PENALTY = 0.01


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """OpenAI-style sampling settings. A temperature under ``GREEDY_TEMPERATURE`` (0
    included) means greedy (``is_greedy``), as vLLM treats it: dividing logits by less
    overflows them. ``seed`` makes a
    sampled request reproducible on its own. ``stop`` strings end generation (the stop
    string is not part of the output); ``ignore_eos`` forces exactly max_tokens tokens, as
    benchmark workloads do. ``first_output_index``: the position, in the whole generation,
    of the first token this run produces; a request resumed elsewhere with its earlier
    tokens in the prompt continues its seeded random stream where it stopped (engines that
    derive each token's randomness from its position honour it: the native engine).
    ``min_tokens``: output tokens before EOS or a stop string may end generation (EOS is
    not sampled before). ``logprobs``: report each output token's log-probability under the
    model's raw distribution and this many most likely alternatives (None: none);
    ``prompt_logprobs``: the same for every prompt token after the first. ``top_k`` (0: all
    tokens) and ``min_p`` (0: off; tokens less likely than ``min_p`` times the most likely
    one are dropped) cut the tempered distribution before ``top_p``, in vLLM's order
    (temperature, min-p, top-k, top-p). ``logit_bias``: (token id, bias) pairs added to
    the logits before any of that, greedy included, as OpenAI's ``logit_bias`` (-100 bans
    a token in practice, +100 forces it); logprobs stay those of the raw distribution.
    Penalties, as OpenAI and vLLM define them, apply after the bias, greedy included:
    ``repetition_penalty`` divides the positive logits (multiplies the negative ones) of
    every token already in the prompt or the output; ``frequency_penalty`` subtracts itself
    once per earlier occurrence of a token in the output, ``presence_penalty`` once if it
    occurred at all. ``stop_token_ids`` (vLLM's): generating one of them ends the request
    (with it in the output), whether or not ``ignore_eos``; like EOS, none is sampled before
    ``min_tokens``."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    first_output_index: int = 0
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: all tokens), got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for token_id, bias in self.logit_bias:
            if token_id < 0 or not -100 <= bias <= 100:
                raise ValueError(
                    f"logit_bias needs token ids >= 0 and biases in [-100, 100], got "
                    f"{token_id}: {bias}"
                )
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= 2:
            raise ValueError(
                f"repetition_penalty must be in [{MIN_REPETITION_PENALTY}, 2], got "
                f"{self.repetition_penalty}"
            )
        if self.first_output_index < 0:
            raise ValueError(f"first_output_index must be >= 0, got {self.first_output_index}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {value}")

    @property
    def is_greedy(self) -> bool:
        """Whether the next token is the most likely one (after bias and penalties)."""
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def has_penalties(self) -> bool:
        """Whether any penalty changes the logits."""
        return bool(self.presence_penalty or self.frequency_penalty) or (
            self.repetition_penalty != 1.0
        )


def token_seed(seed: int, output_index: int) -> int:
    """The generator seed for output token ``output_index`` of a request seeded ``seed``.

    Deriving it from (seed, index) rather than carrying generator state makes a sampled
    request reproducible on its own, whatever it was batched with and even after a
    preemption that recomputes its KV."""
    state = np.random.SeedSequence([seed & (2**63 - 1), output_index]).generate_state(2)
    return (int(state[0]) << 32 | int(state[1])) & (2**63 - 1)
