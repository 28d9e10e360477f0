"""Property-based fuzzing of the server from its own OpenAPI document: never a 5xx.

The fuzzed server has a 16-token context, so every request it accepts finishes quickly.
Cases come from schemathesis strategies, driven by hypothesis directly (bounded examples).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.server.conftest import RunningServer, start_server

pytestmark = pytest.mark.slow

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

MAX_EXAMPLES = 25


@pytest.fixture(scope="module")
def fuzz_server(native_profile: str) -> Iterator[RunningServer]:
    running = start_server(max_model_len=16, default_max_tokens=4, profile=native_profile)
    yield running
    running.stop()


def test_no_server_errors(fuzz_server: RunningServer) -> None:
    from schemathesis.checks import not_a_server_error

    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions"}
    for operation in operations:

        @hypothesis.given(case=operation.as_strategy())  # type: ignore[untyped-decorator]
        @hypothesis.settings(  # type: ignore[untyped-decorator]
            max_examples=MAX_EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        def check(case: Any) -> None:
            case.call_and_validate(checks=[not_a_server_error])

        check()
