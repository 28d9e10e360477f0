"""The policy interface and its registry."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from tokenpace.core.registry import Registry
from tokenpace.core.step import StepPlan, StepState
from tokenpace.engine.profile import EngineProfile
from tokenpace.metrics.slo import Slo


class Policy(Protocol):
    """Pure decision: no I/O, no clock of its own.

    ``plan`` is called once per step with a fresh snapshot and returns which waiting requests
    to admit and how many tokens every request computes. Contract: each admitted id is waiting;
    every admitted request is scheduled; a decoding request is scheduled for exactly 1 token.
    A policy must admit something when nothing runs and requests wait, unless memory forbids
    it, so an idle server never stalls. It may refuse waiting requests it does not admit
    and that were never served (``StepPlan.rejections``, ``Request.can_be_rejected``); the
    loop ends them as REJECTED. ``telemetry`` returns the policy's internal state
    (numbers only) after the last ``plan``; loops read it every step, so it must be cheap: a
    value that only some steps compute (TWP's KV forecast) is reported on those steps only.
    """

    name: str

    def plan(self, state: StepState) -> StepPlan: ...

    def telemetry(self) -> Mapping[str, float]: ...


@runtime_checkable
class ProfileAware(Protocol):
    """A policy that can plan from a refitted profile while it runs (online calibration).

    Policies that size their decisions from the engine profile (TWP: l_min; twp_slo: l_min,
    alpha and the prefill costs) implement it; the baselines keep the profile they were
    built with, as their published counterparts do."""

    def use_profile(self, profile: EngineProfile) -> None:
        """Plan from ``profile``'s latency terms from the next ``plan`` on. B0 and the KV
        facts are those the policy was built with; its state (smoothed ITL, window, learned
        output lengths) carries over."""
        ...


PolicyFactory = Callable[[EngineProfile, Slo], Policy]

POLICIES: Registry[PolicyFactory] = Registry("scheduler")


def build_policy(name: str, profile: EngineProfile, slo: Slo | None = None) -> Policy:
    """Instantiate the registered policy ``name`` with its defaults for ``profile``.

    ``slo`` (default: ``Slo()``) matters only to SLO-targeted policies."""
    return POLICIES.get(name)(profile, slo if slo is not None else Slo())
