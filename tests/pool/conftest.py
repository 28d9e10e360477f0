from __future__ import annotations

from dataclasses import replace

import pytest

from tokenpace.engine.profile import EngineProfile, load_profile


@pytest.fixture
def profile() -> EngineProfile:
    """The shipped profile without step noise, so latencies are exact."""
    return replace(load_profile("v100-llama-3.2-3b"), noise_cv=0.0)
