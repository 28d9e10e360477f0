"""The native engine: transformers model classes, slot KV storage, mixed prefill/decode steps.

Importing this package needs the ``native`` extra (torch, transformers, gguf, safetensors).
"""

from tokenpace.engine.native.config import EMBEDDED_MODEL, NativeEngineConfig
from tokenpace.engine.native.engine import NativeEngine
from tokenpace.engine.native.loading import LoadedModel, load_model

__all__ = ["EMBEDDED_MODEL", "LoadedModel", "NativeEngine", "NativeEngineConfig", "load_model"]
