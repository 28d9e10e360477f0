"""Admission policies. Importing this package registers every built-in policy."""

from tokenpace.policy import dynamic_batch, fcfs, priority, sarathi, sla_batch, vllm_default
from tokenpace.policy.base import POLICIES, Policy, build_policy
from tokenpace.policy.twp import policy as _twp
from tokenpace.policy.twp_slo import policy as _twp_slo

__all__ = ["POLICIES", "Policy", "build_policy"]

del dynamic_batch, fcfs, priority, sarathi, sla_batch, vllm_default, _twp, _twp_slo
