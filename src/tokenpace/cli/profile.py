"""``tokenpace profile``: the offline profiling sweep of a live engine."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from tokenpace.cli.spec import UsageError
from tokenpace.core.cache import default_cache_dir
from tokenpace.core.config import option
from tokenpace.engine.dtype import DTYPE_CHOICES


def profiled_engines() -> tuple[str, ...]:
    """The engines ``run_profile`` can sweep."""
    from tokenpace.profiling.run import ENGINES

    return ENGINES


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """Everything ``tokenpace profile`` takes; each field is one flag."""

    engine: str = option("native", "Engine to profile.", choices=profiled_engines)
    out: Path | None = option(
        None,
        "Profile JSON to write (PNG of the fit beside it); default "
        "CACHE_DIR/profiles/ENGINE.json (CACHE_DIR: $TOKENPACE_CACHE_DIR or ~/.cache/tokenpace).",
    )
    dtype: str = option(
        "auto",
        "Weights and KV precision; auto takes bfloat16 where the device computes it "
        "natively, else float32.",
        choices=DTYPE_CHOICES,
    )
    model: str = option("smollm2", "'smollm2' (embedded) or a local Hugging Face model directory.")
    skip_checkpoints: bool = option(
        False, "Do not time checkpoint loads per tier (saves ~20 s; native)."
    )
    max_sweeps: int = option(
        1,
        "Sweep again, up to this many sweeps in all, while a sweep's repeated points move "
        "more than 10% between passes (a busy machine); the steadiest is fitted.",
    )

    def __post_init__(self) -> None:
        if self.max_sweeps < 1:
            raise ValueError(f"--max-sweeps must be at least 1, got {self.max_sweeps}")


def engine_config(options: ProfileOptions, cache_dir: Path) -> object:
    """The engine's config for the sweep; UsageError when its extra is missing."""
    try:
        if options.engine == "vllm":
            if find_spec("vllm") is None:
                raise UsageError("profiling vLLM needs the vllm extra (scripts/setup.sh vllm)")
            from tokenpace.engine.vllm.probe import profile_engine_config

            return profile_engine_config(options.model, options.dtype, cache_dir)
        from tokenpace.engine.native import NativeEngineConfig

        return NativeEngineConfig(model=options.model, dtype=options.dtype, cache_dir=cache_dir)
    except ImportError as error:
        setup = f"scripts/setup.sh {options.engine}"
        raise UsageError(f"the {options.engine} engine needs `{setup}` ({error})") from None
    except (ValueError, FileNotFoundError) as error:
        raise UsageError(str(error)) from None


def run(options: ProfileOptions) -> None:
    """Sweep decode step time over batch sizes and context lengths, prefill over chunk
    sizes, mixed steps, KV capacity and (native) checkpoint load time per tier; fit l_min,
    B0 and alpha (Eq. 2) and write a profile the simulator reads."""
    cache_dir = default_cache_dir()
    config = engine_config(options, cache_dir)
    out = (
        options.out
        if options.out is not None
        else cache_dir / "profiles" / f"{options.engine}.json"
    )
    try:
        from tokenpace.bench.engine_runner import prepare_process
        from tokenpace.profiling import run_profile

        prepare_process(options.engine)

        out.parent.mkdir(parents=True, exist_ok=True)
        result = run_profile(
            options.engine, out, engine_config=config,
            measure_checkpoints=not options.skip_checkpoints,
            log=lambda message: print(message, file=sys.stderr),
            max_sweeps=options.max_sweeps,
        )  # fmt: skip
    except ImportError as error:
        setup = f"scripts/setup.sh {options.engine}"
        raise UsageError(f"the {options.engine} engine needs `{setup}` ({error})") from None
    except (ValueError, FileNotFoundError) as error:
        raise UsageError(str(error)) from None
    print(
        f"wrote {out}: l_min {result.l_min_ms:.1f} ms, b0 {result.b0}, "
        f"alpha {result.alpha_ms:.2f} ms, r2 {result.r2}"
    )
