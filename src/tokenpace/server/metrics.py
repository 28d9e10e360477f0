"""Prometheus metrics of one server, named like vLLM's under ``tokenpace:``.

Every metric lives in the app's own ``CollectorRegistry``, so two servers in one process
never share state. Engine threads update them; prometheus-client is thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tokenpace.core.request import FinishReason
from tokenpace.profiling.online import LiveProfile

CONTENT_TYPE = CONTENT_TYPE_LATEST

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
_E2E_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)

# TWP telemetry key -> gauge suffix; other policies report none of these and leave them unset.
TWP_GAUGES = {
    "token_window": "twp_token_window",
    "smoothed_itl_ms": "twp_smoothed_itl_ms",
    "slowdown": "twp_slowdown",
    "kv_threshold_blocks": "twp_kv_threshold_blocks",
    "token_load": "twp_token_load",
}

# Live profile field -> (gauge suffix, help); set only under online calibration.
PROFILE_GAUGES = {
    "l_min_ms": ("profile_l_min_ms", "Live profile: decode step latency up to B0 (ms)."),
    "alpha_ms": ("profile_alpha_ms", "Live profile: step latency per request beyond B0 (ms)."),
    "b0": ("profile_b0", "Live profile: saturation batch size B0 (requests)."),
    "prefill_ms_per_token": (
        "profile_prefill_ms_per_token",
        "Live profile: prefill cost per prompt token (ms).",
    ),
    "mixed_prefill_overhead_ms": (
        "profile_mixed_prefill_overhead_ms",
        "Live profile: cost of a prefill chunk riding in a decode step (ms).",
    ),
    "num_steps": ("profile_steps", "Steps the live profile was refitted from."),
    "num_shifts": ("profile_speed_changes", "Changes of engine speed the refit detected."),
}


class ServerMetrics:
    """The metrics of one server for model ``model_name``. Times are in seconds."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        r = self.registry
        m = ["model_name"]
        mc = ["model_name", "container"]
        self.ttft = Histogram(
            "tokenpace:time_to_first_token_seconds",
            "Arrival to first token, queueing and cold start included.",
            m,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "tokenpace:inter_token_latency_seconds",
            "Gap between consecutive output tokens of a request.",
            m,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "tokenpace:e2e_request_latency_seconds",
            "Arrival to the last token.",
            m,
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "tokenpace:request_queue_time_seconds",
            "Arrival to admission by the policy.",
            m,
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.running = Gauge(
            "tokenpace:num_requests_running", "Requests admitted and holding KV.", mc, registry=r
        )
        self.waiting = Gauge(
            "tokenpace:num_requests_waiting", "Requests waiting for admission.", mc, registry=r
        )
        self.kv_usage = Gauge(
            "tokenpace:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).", mc, registry=r
        )
        self.kv_used_blocks = Gauge(
            "tokenpace:kv_cache_used_blocks", "KV blocks in use.", mc, registry=r
        )
        self.twp = {
            key: Gauge(f"tokenpace:{name}", f"TWP telemetry {key}.", mc, registry=r)
            for key, name in TWP_GAUGES.items()
        }
        self.profile = {
            key: Gauge(f"tokenpace:{name}", text, mc, registry=r)
            for key, (name, text) in PROFILE_GAUGES.items()
        }
        self.success = Counter(
            "tokenpace:request_success",
            "Requests finished, by finish reason.",
            ["model_name", "finished_reason"],
            registry=r,
        )
        self.aborts = Counter(
            "tokenpace:request_aborts", "Requests aborted (client gone or shutdown).", m, registry=r
        )
        self.failures = Counter(
            "tokenpace:request_failures", "Requests failed by an engine error.", m, registry=r
        )
        self.rejected = Counter(
            "tokenpace:requests_rejected",
            "Requests refused before admission, by reason.",
            ["model_name", "reason"],
            registry=r,
        )
        self.rejected_early = Counter(
            "tokenpace:requests_rejected_early",
            "Requests the scheduler refused (HTTP 429) before serving them, predicting they "
            "would miss the TTFT objective (--early-reject); not errors, not in "
            "requests_rejected.",
            m,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "tokenpace:prompt_tokens", "Prompt tokens of finished requests.", m, registry=r
        )
        self.generation_tokens = Counter(
            "tokenpace:generation_tokens", "Output tokens delivered.", m, registry=r
        )
        self.containers = Gauge(
            "tokenpace:num_containers", "Containers by state.", ["model_name", "state"], registry=r
        )
        self.cold_starts = Counter(
            "tokenpace:cold_starts", "Container cold starts (engine loads).", m, registry=r
        )
        self.cold_start_time = Histogram(
            "tokenpace:cold_start_seconds",
            "Engine load time of a cold start.",
            m,
            buckets=(0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 80.0),
            registry=r,
        )
        self.resumes = Counter(
            "tokenpace:resumes",
            "In-flight requests of an engine that died, resumed on another container after "
            "their delivered tokens.",
            m,
            registry=r,
        )
        self.migrations = Counter(
            "tokenpace:migrations",
            "Running requests moved live to an idle container (--router serverlessllm): the "
            "target re-prefilled the prompt and the tokens delivered so far.",
            m,
            registry=r,
        )
        self.engine_restarts = Counter(
            "tokenpace:engine_restarts",
            "Engine processes that died (failed step, crash or kill) and were restarted.",
            m,
            registry=r,
        )
        self.engine_dtype = Gauge(
            "tokenpace:engine_dtype_info",
            "1 for the precision each container's engine runs in (--dtype auto resolved).",
            ["model_name", "container", "dtype"],
            registry=r,
        )
        self.dtype_step = Gauge(
            "tokenpace:engine_dtype_step_seconds",
            "Decode step time per candidate precision that --dtype auto measured at start, "
            "at the batch in the 'batch' label.",
            ["model_name", "container", "dtype", "batch"],
            registry=r,
        )
        # Touch the unlabelled-by-container series so they read 0 before any traffic.
        for counter in (
            self.aborts,
            self.rejected_early,
            self.failures,
            self.cold_starts,
            self.resumes,
            self.migrations,
            self.engine_restarts,
        ):
            counter.labels(model_name)
        for reason in ("queue_full", "shutting_down"):
            self.rejected.labels(model_name, reason)

    def observe_first_token(self, ttft_s: float) -> None:
        self.ttft.labels(self.model_name).observe(ttft_s)

    def observe_queue_time(self, queue_time_s: float) -> None:
        self.queue_time.labels(self.model_name).observe(queue_time_s)

    def observe_resumes(self, num_requests: int) -> None:
        """Requests of a dead engine resumed on another container."""
        self.resumes.labels(self.model_name).inc(num_requests)

    def observe_migration(self) -> None:
        """One running request moved live to another container."""
        self.migrations.labels(self.model_name).inc()

    def observe_itl(self, gap_s: float) -> None:
        self.itl.labels(self.model_name).observe(gap_s)

    def observe_tokens(self, num_tokens: int) -> None:
        self.generation_tokens.labels(self.model_name).inc(num_tokens)

    def observe_finish(
        self, reason: FinishReason | None, e2e_s: float | None, num_prompt_tokens: int
    ) -> None:
        """A request left its container: finished (``reason`` LENGTH/STOP), aborted,
        rejected early by the scheduler (REJECT), or failed (``reason`` None)."""
        if reason is None:
            self.failures.labels(self.model_name).inc()
            return
        if reason is FinishReason.REJECT:
            self.rejected_early.labels(self.model_name).inc()
            return
        if reason is FinishReason.ABORT:
            self.aborts.labels(self.model_name).inc()
            return
        self.success.labels(self.model_name, reason.value).inc()
        self.prompt_tokens.labels(self.model_name).inc(num_prompt_tokens)
        if e2e_s is not None:
            self.e2e.labels(self.model_name).observe(e2e_s)

    def observe_step(
        self,
        container_id: int,
        num_running: int,
        num_waiting: int,
        num_used_blocks: int,
        num_total_blocks: int,
        telemetry: Mapping[str, float],
    ) -> None:
        c = str(container_id)
        self.running.labels(self.model_name, c).set(num_running)
        self.waiting.labels(self.model_name, c).set(num_waiting)
        self.kv_used_blocks.labels(self.model_name, c).set(num_used_blocks)
        usage = num_used_blocks / num_total_blocks if num_total_blocks else 0.0
        self.kv_usage.labels(self.model_name, c).set(usage)
        for key, gauge in self.twp.items():
            value = telemetry.get(key)
            if value is not None:
                gauge.labels(self.model_name, c).set(value)

    def observe_profile(self, container_id: int, live: LiveProfile) -> None:
        """The live (online-calibrated) profile of container ``container_id``."""
        c = str(container_id)
        for key, gauge in self.profile.items():
            gauge.labels(self.model_name, c).set(float(getattr(live, key)))

    def set_container_states(self, counts: Mapping[str, int]) -> None:
        for state, count in counts.items():
            self.containers.labels(self.model_name, state).set(count)

    def observe_cold_start(self, load_s: float) -> None:
        self.cold_starts.labels(self.model_name).inc()
        self.cold_start_time.labels(self.model_name).observe(load_s)

    def set_engine_dtype(
        self,
        container_id: int,
        dtype: str,
        batch: int,
        step_ms: tuple[tuple[str, float], ...],
    ) -> None:
        """Record the precision container ``container_id`` runs in and, when ``auto``
        measured them, the decode step (milliseconds) of each candidate at ``batch``."""
        c = str(container_id)
        for name in ("float32", "bfloat16", "float16"):
            self.engine_dtype.labels(self.model_name, c, name).set(1.0 if name == dtype else 0.0)
        for name, ms in step_ms:
            self.dtype_step.labels(self.model_name, c, name, str(batch)).set(ms / 1000.0)

    def reject(self, reason: str) -> None:
        self.rejected.labels(self.model_name, reason).inc()

    def render(self) -> bytes:
        """The text exposition format of every metric."""
        return generate_latest(self.registry)
