"""An engine worker in a local process, talking over a pipe.

Workers start with the ``spawn`` method (a fresh interpreter: no inherited threads or
torch state), so a cold start pays the real cost of imports and loading weights from the
checkpoint tier.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from multiprocessing.connection import Connection
from multiprocessing.context import SpawnProcess

from tokenpace.core.process_env import apply_process_defaults
from tokenpace.server.worker.main import run_worker
from tokenpace.server.worker.wire import WorkerSpec
from tokenpace.server.worker_handle import WorkerHandle

_SPAWN = multiprocessing.get_context("spawn")


def worker_entry(spec: WorkerSpec, conn: Connection) -> None:
    """The spawned process's entry point: environment defaults, then ``run_worker``."""
    apply_process_defaults(os.environ)
    run_worker(spec, conn)


class WorkerProcess(WorkerHandle):
    """A spawned worker process and the server's end of its pipe."""

    def __init__(self, process: SpawnProcess, conn: Connection) -> None:
        super().__init__()
        self._process = process
        self.conn = conn

    @classmethod
    def start(cls, spec: WorkerSpec, name: str) -> WorkerProcess:
        """Spawn a worker for ``spec``; it begins loading at once."""
        server_end, worker_end = _SPAWN.Pipe(duplex=True)
        process = _SPAWN.Process(target=worker_entry, args=(spec, worker_end), name=name)
        process.start()
        worker_end.close()  # so the server sees EOF when the worker dies
        return cls(process, server_end)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def location(self) -> str:
        return "local"

    def wait_sources(self) -> list[Connection | int]:
        assert self.conn is not None
        return [self.conn, self._process.sentinel]

    def _wait_until_connected(self, timeout_s: float) -> bool:
        return True

    def _join(self, timeout_s: float) -> bool:
        self._process.join(timeout_s)
        return not self._process.is_alive()

    def kill(self) -> None:
        self._process.kill()
        self._process.join(5.0)

    def _exit_description(self) -> str:
        self._process.join(1.0)
        code = self._process.exitcode
        if code is None:
            return f"engine process {self.pid} closed its pipe"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"engine process {self.pid} was killed by {name}"
        return f"engine process {self.pid} exited with status {code}"
