"""A workload is a list of request specs: arrival time, token counts, optional prompt text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tokenpace.core.request import Request
from tokenpace.workload.lengths import LengthMixture


class Workload(Protocol):
    """Anything with a name that draws a request list from a seeded generator."""

    @property
    def name(self) -> str: ...

    def generate(
        self, rng: np.random.Generator, prompts: Sequence[str] | None = None
    ) -> list[RequestSpec]: ...


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload. Times in seconds from the workload's start.

    ``max_tokens`` is the client's output cap, the only length a scheduler sees.
    ``output_tokens`` is how many tokens the model really generates before it stops (EOS);
    None means it runs to ``max_tokens``. Only an engine may read it (the simulator stops the
    request there); it never reaches a policy.
    """

    arrival_s: float
    num_prompt_tokens: int
    max_tokens: int
    prompt: str | None = None
    output_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.output_tokens is not None and not 0 < self.output_tokens <= self.max_tokens:
            raise ValueError(
                f"output_tokens must be in [1, max_tokens={self.max_tokens}], "
                f"got {self.output_tokens}"
            )

    @property
    def true_output_tokens(self) -> int:
        """Tokens the request really generates: ``output_tokens``, else ``max_tokens``."""
        return self.max_tokens if self.output_tokens is None else self.output_tokens


def draw_specs(
    rng: np.random.Generator,
    arrivals: npt.NDArray[np.float64],
    prompt_lengths: LengthMixture,
    output_lengths: LengthMixture,
    prompts: Sequence[str] | None,
    max_tokens: int | None = None,
) -> list[RequestSpec]:
    """One spec per arrival time, token counts drawn from the mixtures; prompt text, when
    given, taken in rotation from a random start. Each request's client cap is ``max_tokens``
    (None: its drawn output length, a client that knows it) and it really generates the
    drawn length, cut to the cap."""
    n = len(arrivals)
    prompt_tokens = prompt_lengths.sample(rng, n)
    output_tokens = output_lengths.sample(rng, n)
    offset = int(rng.integers(len(prompts))) if prompts else 0
    return [
        RequestSpec(
            arrival_s=float(arrivals[i]),
            num_prompt_tokens=int(prompt_tokens[i]),
            max_tokens=max_tokens or int(output_tokens[i]),
            prompt=prompts[(offset + i) % len(prompts)] if prompts else None,
            output_tokens=min(int(output_tokens[i]), max_tokens or int(output_tokens[i])),
        )
        for i in range(n)
    ]


def with_known_lengths(specs: Sequence[RequestSpec]) -> list[RequestSpec]:
    """``specs`` with each client cap set to the true output length: how real-engine runs
    make a model stop where the workload says (``ignore_eos`` up to ``max_tokens``), so
    their policies see the true length."""
    return [
        RequestSpec(s.arrival_s, s.num_prompt_tokens, s.true_output_tokens, s.prompt) for s in specs
    ]


def true_output_lengths(specs: Sequence[RequestSpec], first_id: int = 0) -> dict[int, int]:
    """Request id -> true output length for the requests ``to_requests(specs)`` builds
    (ids from ``first_id`` in spec order): what an engine needs to stop each request where
    the model would, and what no policy is given."""
    return {first_id + i: s.true_output_tokens for i, s in enumerate(specs)}


def to_requests(specs: Sequence[RequestSpec]) -> list[Request]:
    """Fresh Request objects (ids 0..n-1 in arrival order) for one run."""
    return [
        Request(
            request_id=i,
            num_prompt_tokens=s.num_prompt_tokens,
            max_tokens=s.max_tokens,
            arrival_s=s.arrival_s,
            prompt=s.prompt,
        )
        for i, s in enumerate(specs)
    ]


@dataclass(frozen=True, slots=True)
class ReplayWorkload:
    """A fixed request list (a trace) under a name; every seed replays the same arrivals
    (seeds still vary engine noise)."""

    name: str
    specs: tuple[RequestSpec, ...]

    def generate(
        self, rng: object = None, prompts: Sequence[str] | None = None
    ) -> list[RequestSpec]:
        return list(self.specs)
