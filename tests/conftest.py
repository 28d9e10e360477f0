from __future__ import annotations

import os
from pathlib import Path

import pytest

from tokenpace.engine.profile import EngineProfile, load_profile

# The shared data folder sits beside the checkout; TOKENPACE_SHARED_DATA points elsewhere.
SHARED_DATA = Path(
    os.environ.get("TOKENPACE_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
)


@pytest.fixture(scope="session")
def paper_profile() -> EngineProfile:
    return load_profile("v100-llama-3.2-3b")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} is not present")
    return SHARED_DATA


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the files that hold a ``slow`` test first, each file's tests in their order.
    pytest-xdist (``--dist loadfile``) hands files to its workers in this order, so the long
    files start early and the workers finish together instead of one running a long file
    alone at the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
