"""Real servers for the serve tests: uvicorn in threads over the embedded SmolLM2.

Each container's engine is a worker process loading the embedded model from its cached
checkpoint tier, as in production. Two session servers: ``server`` with default bounds
(``--dtype auto``, the default, measured at start), ``guarded_server`` with an API key, an
admission queue of one request and ``/tokenizer_info``.
"""

from __future__ import annotations

import importlib.util
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

_MISSING = [
    name
    for name in ("torch", "transformers", "fastapi", "uvicorn", "prometheus_client", "httpx")
    if importlib.util.find_spec(name) is None
]
SKIP_REASON = (
    f"the serve tests need the native and serve extras; missing: {', '.join(_MISSING)}"
    if _MISSING
    else ""
)

MODEL = "smollm2-135m-instruct"
API_KEY = "test-key"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serve: starts a real tokenpace server (real model)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.serve)
            if _MISSING:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@dataclass
class RunningServer:
    """A server running in a thread; ``url`` is its base URL."""

    url: str
    server: object
    uvicorn: object
    thread: threading.Thread

    def stop(self) -> None:
        self.uvicorn.should_exit = True  # type: ignore[attr-defined]
        self.thread.join(60)


def start_server(**overrides: object) -> RunningServer:
    """Build a server with ``overrides`` of the test defaults (its engines are real worker
    processes loading the embedded model) and run it on a free port."""
    import uvicorn

    from tokenpace.server.main import build_server
    from tokenpace.server.options import ServeOptions
    from tokenpace.server.uvicorn_server import DrainingServer

    # float32 unless a test asks otherwise: --dtype auto loads the model twice to choose,
    # which the session ``server`` exercises once for the suite.
    settings: dict[str, Any] = {
        "port": 0,
        "log_level": "warning",
        "shutdown_timeout_s": 5.0,
        "dtype": "float32",
    }
    settings.update(overrides)
    try:
        built = build_server(ServeOptions(**settings))
    except FileNotFoundError as error:
        pytest.skip(f"the embedded model is not available: {error}")
    config = uvicorn.Config(built.app, host="127.0.0.1", port=0, log_level="warning")
    server = DrainingServer(config, built.service, built.options.shutdown_timeout_s)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    return RunningServer(f"http://127.0.0.1:{server.bound_port()}", built, server, thread)


def vllm_server_settings(profile: str) -> dict[str, object]:
    """``start_server`` overrides for a small vLLM container that plans from ``profile`` (a
    float32 profile file) instead of calibrating at start, which
    tests/server/worker/test_vllm_backend.py covers: a vLLM start is slow enough already."""
    return {
        "engine": "vllm",
        "dtype": "float32",
        "profile": profile,
        "max_model_len": 512,
        "kv_cache_tokens": 8192,
    }


@pytest.fixture(scope="session")
def native_profile(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The path of a float32 profile of the embedded model on this machine, measured once
    for the suite by the start-up calibration sweep, as a worker builds its backend (in this
    process). Test servers that do
    not test that calibration take it (``--profile``) instead of each engine measuring its
    own: about 9 s of a 2-core machine per engine start."""
    if _MISSING:
        pytest.skip(SKIP_REASON)
    from tokenpace.server.engines import prepare_checkpoint
    from tokenpace.server.main import worker_spec
    from tokenpace.server.options import ServeOptions
    from tokenpace.server.worker.main import build_backend

    # A worker's engine as start_server's float32 servers build it, with a KV cache just
    # large enough for the sweep (the profile's latencies do not depend on it).
    options = ServeOptions(dtype="float32", kv_cache_tokens=4096)
    try:
        backend = build_backend(
            worker_spec(options, prepare_checkpoint(options)), time.perf_counter
        )
    except FileNotFoundError as error:
        pytest.skip(f"the embedded model is not available: {error}")
    profile = backend.profile
    backend.shutdown()
    path = tmp_path_factory.mktemp("profile") / "smollm2-float32.json"
    path.write_text(profile.to_json())
    return str(path)


@pytest.fixture(scope="session")
def server() -> Iterator[RunningServer]:
    if _MISSING:
        pytest.skip(SKIP_REASON)
    running = start_server(dtype="auto")
    yield running
    running.stop()


@pytest.fixture(scope="session")
def guarded_server(native_profile: str) -> Iterator[RunningServer]:
    running = start_server(
        api_key=API_KEY,
        max_queued_requests=1,
        scheduler="fcfs",
        profile=native_profile,
        enable_tokenizer_info_endpoint=True,
    )
    yield running
    running.stop()
