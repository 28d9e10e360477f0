"""Models with random weights built from a config file: the shape of a real checkpoint, with
nothing to download. Step time depends on the shapes, not the weight values, so such a model
times the engine exactly as the real checkpoint would (outputs are meaningless).

A source ``random:NAME`` names a config shipped in ``engine/native/configs`` (``NAME.json``)
or a path to a Hugging Face ``config.json``-style file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

RANDOM_PREFIX = "random:"
CONFIGS_DIR = Path(__file__).parent / "configs"


def is_random_source(model: str) -> bool:
    """True when ``model`` asks for random weights (``random:NAME``)."""
    return model.startswith(RANDOM_PREFIX)


def shipped_configs() -> list[str]:
    """Names of the model configs shipped with the package (usable as ``random:NAME``)."""
    return sorted(path.stem for path in CONFIGS_DIR.glob("*.json"))


def config_path(model: str) -> Path:
    """The config file behind ``random:NAME``; FileNotFoundError naming the valid choices."""
    name = model[len(RANDOM_PREFIX) :]
    shipped = CONFIGS_DIR / f"{name}.json"
    if shipped.is_file():
        return shipped
    path = Path(name)
    if path.is_file():
        return path
    raise FileNotFoundError(
        f"model {model!r}: no shipped config {name!r} (valid: {', '.join(shipped_configs())}) "
        "and no such config file"
    )


def build_random_model(
    model: str, device: torch.device, dtype: torch.dtype, seed: int = 0
) -> tuple[Any, Path]:
    """A transformers causal LM for ``random:NAME`` with weights drawn (seeded by ``seed``)
    directly on ``device`` in ``dtype``; also the config file it was built from. The global
    torch RNG is left as it was."""
    from transformers import AutoConfig, AutoModelForCausalLM

    path = config_path(model)
    values = json.loads(path.read_text())
    model_type = values.pop("model_type", None)
    if model_type is None:
        raise ValueError(f"{path}: a model config needs a 'model_type'")
    hf_config = AutoConfig.for_model(model_type, **values)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.device(device):
        torch.manual_seed(seed)
        built = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)  # type: ignore[no-untyped-call]
    return built, path
