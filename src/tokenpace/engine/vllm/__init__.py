"""TWP and the baseline policies inside vLLM V1.

``scheduler.TokenpaceScheduler`` (and ``TokenpaceAsyncScheduler``) subclass vLLM's scheduler
and consult a tokenpace policy on every ``schedule()`` call; pass either to vLLM's
``--scheduler-cls`` or to ``vllm.LLM(scheduler_cls=...)``. The policy is chosen with the
environment variables described in ``settings``.

Importing this package does not import vLLM; ``scheduler``, ``runner`` and ``throughput``
need the ``vllm`` extra (a supported version, see ``version``).
"""
