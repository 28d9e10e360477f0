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
