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
    """One request of a workload. Times in seconds from the workload's start."""

    arrival_s: float
    num_prompt_tokens: int
    max_tokens: int
    prompt: str | None = None


def draw_specs(
    rng: np.random.Generator,
    arrivals: npt.NDArray[np.float64],
    prompt_lengths: LengthMixture,
    output_lengths: LengthMixture,
    prompts: Sequence[str] | None,
) -> list[RequestSpec]:
    """One spec per arrival time, token counts drawn from the mixtures; prompt text, when
    given, taken in rotation from a random start."""
    n = len(arrivals)
    prompt_tokens = prompt_lengths.sample(rng, n)
    output_tokens = output_lengths.sample(rng, n)
    offset = int(rng.integers(len(prompts))) if prompts else 0
    return [
        RequestSpec(
            arrival_s=float(arrivals[i]),
            num_prompt_tokens=int(prompt_tokens[i]),
            max_tokens=int(output_tokens[i]),
            prompt=prompts[(offset + i) % len(prompts)] if prompts else None,
        )
        for i in range(n)
    ]


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
