"""Process-entry environment defaults and the one cache directory setting."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tokenpace.core.cache import age_s, default_cache_dir
from tokenpace.core.process_env import PROCESS_DEFAULTS, apply_process_defaults


def test_defaults_fill_only_what_is_unset() -> None:
    environ = {"HF_HUB_OFFLINE": "0"}
    apply_process_defaults(environ)
    assert environ["HF_HUB_OFFLINE"] == "0"
    assert environ["TRANSFORMERS_VERBOSITY"] == PROCESS_DEFAULTS["TRANSFORMERS_VERBOSITY"]


def test_cache_dir_follows_the_variable_then_xdg(tmp_path: Path) -> None:
    assert default_cache_dir({"TOKENPACE_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert default_cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "tokenpace"


def test_native_engine_checkpoints_share_the_cache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tokenpace.engine.native.config import NativeEngineConfig

    monkeypatch.setenv("TOKENPACE_CACHE_DIR", str(tmp_path))
    assert NativeEngineConfig().resolved_cache_dir() == tmp_path
    assert NativeEngineConfig(cache_dir=tmp_path / "x").resolved_cache_dir() == tmp_path / "x"


def test_age_of_a_cached_file(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    assert age_s(path, 1e9) is None
    path.write_text("{}")
    os.utime(path, (1_000_000.0, 1_000_000.0))
    assert age_s(path, 1_003_600.0) == 3600.0
