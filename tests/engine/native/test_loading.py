"""Converting a GGUF source to the cached safetensors tier when several processes (a pool's
workers, parallel test workers) convert at once: the first rename wins, the rest reuse it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tokenpace.engine.native import loading

pytestmark = pytest.mark.native


class _Saved:
    """Stands in for a loaded model or tokenizer: ``save_pretrained`` writes one file, and
    ``meanwhile`` runs first (what another process does while this one saves)."""

    def __init__(self, name: str, meanwhile: Callable[[], None] | None = None) -> None:
        self.name = name
        self.meanwhile = meanwhile

    def save_pretrained(self, directory: Path, **_: object) -> None:
        if self.meanwhile is not None:
            self.meanwhile()
        (Path(directory) / self.name).write_text("{}")


def _other_process_converts(out_dir: Path) -> None:
    out_dir.mkdir()
    (out_dir / "config.json").write_text(json.dumps({"by": "the other process"}))


def test_a_conversion_that_loses_the_race_reuses_the_winner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out_dir = tmp_path / "model"
    model = _Saved("config.json", lambda: _other_process_converts(out_dir))
    monkeypatch.setattr(loading, "load_gguf", lambda path: (model, _Saved("tokenizer.json")))
    assert loading.convert_gguf(tmp_path / "model.gguf", out_dir) == out_dir
    assert json.loads((out_dir / "config.json").read_text()) == {"by": "the other process"}
    assert not (out_dir / "tokenizer.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no staging directory left


def test_a_rename_that_fails_with_nothing_converted_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out_dir = tmp_path / "model"

    def occupy() -> None:  # something that is not a model directory holds the name
        out_dir.mkdir()
        (out_dir / "notes.txt").write_text("not a model")

    model = _Saved("config.json", occupy)
    monkeypatch.setattr(loading, "load_gguf", lambda path: (model, _Saved("tokenizer.json")))
    with pytest.raises(OSError):
        loading.convert_gguf(tmp_path / "model.gguf", out_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_directory_already_converted_is_reused_without_loading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out_dir = tmp_path / "model"
    _other_process_converts(out_dir)

    def never(path: Path) -> None:
        raise AssertionError("the GGUF was loaded again")

    monkeypatch.setattr(loading, "load_gguf", never)
    assert loading.convert_gguf(tmp_path / "model.gguf", out_dir) == out_dir
