"""A workload is a list of request specs: arrival time, token counts, optional prompt text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenpace.core.request import Request


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload. Times in seconds from the workload's start."""

    arrival_s: float
    num_prompt_tokens: int
    max_tokens: int
    prompt: str | None = None


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
