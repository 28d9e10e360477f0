"""The native engine: transformers model classes, slot KV storage, mixed prefill/decode steps.

Importing this package needs the ``native`` extra (torch, transformers, gguf, safetensors).
"""

import os

# OpenMP threads that spin at barriers make a two-thread step many times slower as soon as
# another busy process shares the cores; sleeping waits cost little. libgomp reads this once,
# when torch loads, so it only takes effect if torch is not imported yet (setdefault keeps a
# caller's choice).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tokenpace.engine.native.config import EMBEDDED_MODEL, NativeEngineConfig
from tokenpace.engine.native.engine import NativeEngine
from tokenpace.engine.native.loading import LoadedModel, load_model

__all__ = ["EMBEDDED_MODEL", "LoadedModel", "NativeEngine", "NativeEngineConfig", "load_model"]
