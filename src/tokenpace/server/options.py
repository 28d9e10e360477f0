"""Settings of ``tokenpace serve``: address, model, scheduler, pool and admission bounds."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenpace.core.config import option, require_positive
from tokenpace.engine.dtype import DTYPE_CHOICES
from tokenpace.policy import POLICIES
from tokenpace.pool.router import ROUTERS
from tokenpace.server.worker.main import BACKEND_MODULES

ENGINES = tuple(BACKEND_MODULES)
# Registered policy variants that reject early end with this (``twp_slo-early_reject``).
EARLY_REJECT_SUFFIX = "-early_reject"
# uvicorn's own names (uvicorn.config.LOG_LEVELS), kept here so that parsing needs no uvicorn.
UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Everything ``tokenpace serve`` takes. Each field is one command-line flag
    (``--kebab-case`` of its name unless ``flag`` says otherwise; ``tokenpace.cli.spec``
    generates them), so adding a field adds the flag and its config-file key."""

    host: str = option("127.0.0.1", "Address to bind.")
    port: int = option(8000, "TCP port to bind (0 picks a free one).")
    engine: str = option(
        "native",
        "Engine: 'native' (PyTorch + transformers) or 'vllm' (vLLM V1, the policy inside).",
        choices=ENGINES,
    )
    model: str = option("smollm2", "'smollm2' (embedded), a local HF directory or a .gguf file.")
    tokenizer: Path | None = option(
        None, "Local directory of the tokenizer (default: the model's own files)."
    )
    served_model_name: str | None = option(
        None, "Model name clients send and /v1/models lists (default: the model's name)."
    )
    scheduler: str = option("twp", "Admission policy run every step.", choices=POLICIES.names)
    router: str = option(
        "least_loaded", "Router choosing a container for each request.", choices=ROUTERS.names
    )
    containers: int = option(1, "Engine containers in the pool (each holds its own model).")
    slo_ttft_ms: float = option(
        2000.0, "TTFT objective (ms) that SLO-targeted schedulers (twp_slo) aim at."
    )
    slo_tpot_ms: float = option(
        100.0, "Time-per-output-token objective (ms) that SLO-targeted schedulers aim at."
    )
    early_reject: bool = option(
        False,
        "Answer 429 to a request the scheduler predicts will miss --slo-ttft-ms (twp_slo, "
        "native engine); decided before any of its tokens is computed, so a stream's "
        "headers wait for its first token.",
    )
    warm_containers: int = option(
        1, "Containers whose engine loads with the server; the others start cold."
    )
    keep_alive_s: float | None = option(
        None,
        "Seconds an idle container stays warm before going cold (default: never).",
        flag="--keep-alive",
    )
    min_containers: int = option(
        0, "Autoscaler floor on warm+loading containers (0 allows scale to zero)."
    )
    max_containers: int = option(0, "Autoscaler ceiling on warm+loading containers; 0: all.")
    target_per_container: float = option(
        8.0, "Autoscaler target of outstanding requests per warm or loading container."
    )
    scale_down_window_s: float = option(
        5.0,
        "The autoscaler drains surplus containers only when the load of this many seconds "
        "past no longer needs them (scale-out is immediate).",
    )
    migration_batch_threshold: int = option(
        8,
        "With --router serverlessllm: a running request migrates live off a container whose "
        "batch exceeds this size when another container idles.",
    )
    ray_address: str | None = option(
        None,
        "Place the engine containers on a Ray cluster: 'local' starts one here, 'auto' or "
        "HOST:PORT joins a running one (default: local processes).",
    )
    ray_cpus_per_engine: float | None = option(
        None, "CPUs each engine actor reserves on its Ray node (default: --num-threads)."
    )
    ray_gpus_per_engine: float = option(0.0, "GPUs each engine actor reserves on its Ray node.")
    cache_dir: Path | None = option(
        None, "Converted checkpoint cache (default ~/.cache/tokenpace)."
    )
    device: str = option("auto", "'auto', 'cpu' or 'cuda[:N]'.")
    dtype: str = option(
        "auto",
        "Weights and KV precision; auto: the native engine loads float32 and bfloat16, times "
        "decode steps at batch --b0 and keeps the faster; vLLM takes bfloat16 where the "
        "device computes it natively, else float32.",
        choices=DTYPE_CHOICES,
    )
    num_threads: int = option(2, "Torch CPU threads per engine (pinned).")
    kv_cache_tokens: int = option(65536, "KV cache budget per container (tokens).")
    max_model_len: int = option(2048, "Longest prompt + output one request may reach (tokens).")
    max_num_seqs: int = option(256, "Most requests holding KV at once per container.")
    block_size: int | None = option(
        None, "KV block size (tokens); default 16 on the native engine, 32 on vLLM (CPU)."
    )
    max_num_batched_tokens: int | None = option(
        None,
        "vLLM's token budget of one step (default max(--max-model-len, 1024)); the native "
        "engine's step is sized by its policy.",
    )
    seed: int | None = option(
        None,
        "Seeds the generator that gives each sampled request without a seed its own, and "
        "vLLM's seed (default: fresh entropy; vLLM 0).",
    )
    b0: int = option(8, "Saturation batch size B0 given to the policy's profile.")
    profile: str | None = option(
        None,
        "An engine profile for the policy instead of the one each engine measures at start: "
        "a shipped profile's name or a JSON file (as 'tokenpace profile' writes). It must "
        "have been measured in the precision the engine runs in; with --dtype auto the "
        "native engine loads the profile's precision.",
    )
    online_calibration: bool = option(
        True,
        "Refit each engine's profile (l_min, alpha, prefill cost) from the steps it serves "
        "and pace with it; --no-online-calibration keeps the profile measured at start.",
    )
    mean_output_tokens: float = option(64.0, "Expected mean output length given to the profile.")
    default_max_tokens: int = option(256, "max_tokens when a request omits it (capped by context).")
    max_queued_requests: int = option(
        256, "Requests waiting for admission (all containers) beyond which the server answers 429."
    )
    max_queued_tokens: int = option(
        262144, "Prompt + max_tokens of waiting requests beyond which the server answers 429."
    )
    retry_after_s: int = option(1, "Retry-After (seconds) sent with a 429.")
    max_request_bytes: int = option(
        4 * 2**20, "Request bodies larger than this (bytes) are refused with a 413."
    )
    enable_tokenizer_info_endpoint: bool = option(
        False,
        "Serve GET /tokenizer_info (the tokenizer's configuration and chat template), as "
        "vLLM's flag of the same name does; evaluation harnesses read it to tokenize "
        "through the server. Off by default: it exposes the chat template.",
    )
    api_key: str | None = option(
        None, "Bearer token every /v1 request must carry (default: none, the API is open)."
    )
    shutdown_timeout_s: float = option(
        10.0, "On shutdown, seconds in-flight requests may finish before they are aborted."
    )
    disconnect_poll_s: float = option(
        0.25, "How often a non-streaming request checks that its client is still there (s)."
    )
    start_timeout_s: float = option(
        600.0, "Seconds the first engine may take to load before the server gives up."
    )
    log_level: str = option(
        "info", "uvicorn's log level.", flag="--uvicorn-log-level", choices=UVICORN_LOG_LEVELS
    )

    def __post_init__(self) -> None:
        require_positive(
            self,
            "containers",
            "num_threads",
            "kv_cache_tokens",
            "max_model_len",
            "max_num_seqs",
            "b0",
            "mean_output_tokens",
            "default_max_tokens",
            "max_queued_requests",
            "max_queued_tokens",
            "retry_after_s",
            "max_request_bytes",
            "shutdown_timeout_s",
            "disconnect_poll_s",
            "start_timeout_s",
            "slo_ttft_ms",
            "slo_tpot_ms",
            "target_per_container",
            "migration_batch_threshold",
        )
        for name in ("block_size", "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"ServeOptions.{name} must be > 0, got {value}")
        if self.scale_down_window_s < 0:
            raise ValueError(f"--scale-down-window-s must be >= 0, got {self.scale_down_window_s}")
        if not 0 <= self.max_containers <= self.containers:
            raise ValueError(
                f"--max-containers must be in [0, --containers={self.containers}], "
                f"got {self.max_containers}"
            )
        if not 0 <= self.min_containers <= (self.max_containers or self.containers):
            raise ValueError(
                f"--min-containers must be in [0, {self.max_containers or self.containers}], "
                f"got {self.min_containers}"
            )
        if not 0 <= self.port < 65536:
            raise ValueError(f"ServeOptions.port must be in [0, 65535], got {self.port}")
        if self.keep_alive_s is not None and not self.keep_alive_s > 0:
            raise ValueError(f"ServeOptions.keep_alive_s must be > 0, got {self.keep_alive_s}")
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(
                f"--dtype {self.dtype!r} is not a precision; valid choices: "
                f"{', '.join(DTYPE_CHOICES)}"
            )
        if self.engine not in ENGINES:
            raise ValueError(
                f"--engine {self.engine!r} is not served; valid choices: {', '.join(ENGINES)}"
            )
        if self.ray_cpus_per_engine is not None and not self.ray_cpus_per_engine > 0:
            raise ValueError(f"--ray-cpus-per-engine must be > 0, got {self.ray_cpus_per_engine}")
        if self.ray_gpus_per_engine < 0:
            raise ValueError(f"--ray-gpus-per-engine must be >= 0, got {self.ray_gpus_per_engine}")
        if self.ray_address is None and (
            self.ray_cpus_per_engine is not None or self.ray_gpus_per_engine
        ):
            raise ValueError("--ray-cpus-per-engine and --ray-gpus-per-engine need --ray-address")
        if self.early_reject and self.engine != "native":
            raise ValueError(
                f"--early-reject needs --engine native (the policy carries out its own "
                f"rejections there), got --engine {self.engine}"
            )
        if not 1 <= self.warm_containers <= self.containers:
            raise ValueError(
                f"--warm-containers must be in [1, --containers={self.containers}], "
                f"got {self.warm_containers}"
            )

    @property
    def policy_name(self) -> str:
        """The registered policy the workers run: ``scheduler``, or its variant that
        rejects early (``<scheduler>-early_reject``) with ``early_reject``."""
        if self.early_reject and not self.scheduler.endswith(EARLY_REJECT_SUFFIX):
            return self.scheduler + EARLY_REJECT_SUFFIX
        return self.scheduler

    @property
    def rejects_early(self) -> bool:
        """Whether the policy may refuse requests before serving them (HTTP 429)."""
        return self.policy_name.endswith(EARLY_REJECT_SUFFIX)

    @property
    def model_name(self) -> str:
        """The name clients must send as ``model``."""
        if self.served_model_name is not None:
            return self.served_model_name
        return Path(self.model).name if self.model != "smollm2" else "smollm2-135m-instruct"
