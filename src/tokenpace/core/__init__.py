"""Types shared by every policy, engine and driver."""

from tokenpace.core.registry import Registry
from tokenpace.core.request import Request, RequestStatus
from tokenpace.core.step import ScheduledChunk, StepPlan, StepResult, StepState

__all__ = [
    "Registry",
    "Request",
    "RequestStatus",
    "ScheduledChunk",
    "StepPlan",
    "StepResult",
    "StepState",
]
