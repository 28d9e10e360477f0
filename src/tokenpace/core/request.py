"""A request and its life cycle, with every timestamp the metrics need.

Token accounting follows vLLM's unified model: a request holds ``num_tokens = prompt +
generated`` tokens, of which ``num_computed_tokens`` already sit in the KV cache. A step
computes some of the rest (a prefill chunk, or the single newest token when decoding); once
every token is computed, the engine samples the next output token. Preemption by recompute
simply resets ``num_computed_tokens`` to zero and keeps the tokens already streamed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tokenpace.core.sampling import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    # Refused by the policy before any of its tokens was computed (early rejection).
    REJECTED = "rejected"


_DONE = frozenset({RequestStatus.FINISHED, RequestStatus.ABORTED, RequestStatus.REJECTED})


class FinishReason(enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    ABORT = "abort"
    REJECT = "reject"


@dataclass(slots=True, eq=False)
class Request:
    """One generation request.

    What a policy may read: ``num_prompt_tokens``, ``max_tokens`` (the output budget a real
    client sends; in the paper's workloads it equals the target output length), arrival and
    progress counters. There is no hidden true output length: the engine stops a request at
    ``max_tokens`` or earlier on EOS/stop strings, which a policy cannot know in advance.
    Times are seconds on the clock of the driver that owns the request.
    """

    request_id: int
    num_prompt_tokens: int
    max_tokens: int
    arrival_s: float
    prompt: str | None = None
    prompt_token_ids: list[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    # Timestamps (seconds). ``token_times_s[i]`` is when output token i reached the client.
    queued_s: float | None = None
    admitted_s: float | None = None
    admitted_step: int | None = None
    token_times_s: list[float] = field(default_factory=list)
    finished_s: float | None = None
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0
    # Tokens that were in the KV cache when a preemption threw them away (computed again).
    num_recomputed_tokens: int = 0
    # Step index at which the request (re)entered the waiting queue; starvation is in steps.
    enqueued_step: int = 0
    container_id: int | None = None
    cold_start_s: float = 0.0
    # False for a request partly served elsewhere (resumed or migrated in ``serve``): a
    # policy may never reject it, whatever its own state says.
    rejectable: bool = True

    def __post_init__(self) -> None:
        if self.num_prompt_tokens <= 0:
            raise ValueError(f"num_prompt_tokens must be positive, got {self.num_prompt_tokens}")
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {self.max_tokens}")

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the KV cache must hold when fully computed."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """True while more than the newest token is missing from the KV cache."""
        return self.num_uncomputed_tokens > 1 or self.num_output_tokens == 0

    @property
    def remaining_output_tokens(self) -> int:
        """Output budget left: the token load K_t counts this for each active request."""
        return self.max_tokens - self.num_output_tokens

    @property
    def can_be_rejected(self) -> bool:
        """Whether a policy may still reject this request: it is waiting, was never admitted
        and none of its tokens was computed (a rejected request was never partly served)."""
        return (
            self.rejectable
            and self.status is RequestStatus.WAITING
            and self.admitted_s is None
            and self.num_computed_tokens == 0
            and not self.token_times_s
        )

    @property
    def is_done(self) -> bool:
        return self.status in _DONE
