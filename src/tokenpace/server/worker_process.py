"""The server's handle on one engine worker process: start it, talk to it, end it.

Workers start with the ``spawn`` method (a fresh interpreter: no inherited threads or
torch state), so a cold start pays the real cost of imports and loading weights from the
checkpoint tier. The handle is used by one container thread only.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnProcess

from tokenpace.server.worker.main import run_worker
from tokenpace.server.worker.wire import Command, Fault, Message, Ready, Shutdown, WorkerSpec

_SPAWN = multiprocessing.get_context("spawn")


class WorkerGone(Exception):
    """The worker process ended (or its pipe broke); the message says how."""


class WorkerProcess:
    """A started worker and the server's end of its pipe."""

    def __init__(self, process: SpawnProcess, conn: Connection) -> None:
        self._process = process
        self.conn = conn
        self.fault: str | None = None

    @classmethod
    def start(cls, spec: WorkerSpec, name: str) -> WorkerProcess:
        """Spawn a worker for ``spec``; it begins loading at once."""
        server_end, worker_end = _SPAWN.Pipe(duplex=True)
        process = _SPAWN.Process(target=run_worker, args=(spec, worker_end), name=name)
        process.start()
        worker_end.close()  # so the server sees EOF when the worker dies
        return cls(process, server_end)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def sentinel(self) -> int:
        return self._process.sentinel

    def wait_ready(self, should_give_up: Callable[[], bool], poll_s: float = 0.2) -> Ready:
        """Block until the worker is loaded. Raises WorkerGone if it fails or dies first,
        or when ``should_give_up()`` turns True (the worker is then killed)."""
        while True:
            if should_give_up():
                self.kill()
                raise WorkerGone("the server stopped while the engine was loading")
            if not wait([self.conn, self.sentinel], poll_s):
                continue
            # A worker that died leaves EOF on the pipe: read_available raises WorkerGone.
            for message in self.read_available():
                if isinstance(message, Ready):
                    return message

    def send(self, command: Command) -> None:
        """Send ``command``; raises WorkerGone if the pipe is broken."""
        try:
            self.conn.send(command)
        except (BrokenPipeError, ConnectionResetError, OSError) as error:
            raise WorkerGone(self.describe_exit()) from error

    def read_available(self) -> list[Message]:
        """Every message already waiting. Raises WorkerGone once the worker's end is
        closed and nothing is left to read. A ``Fault`` is remembered and returned."""
        messages: list[Message] = []
        try:
            while self.conn.poll(0):
                message = self.conn.recv()
                if isinstance(message, Fault):
                    self.fault = message.error
                messages.append(message)
        except (EOFError, ConnectionResetError, OSError):
            if messages:
                return messages
            raise WorkerGone(self.describe_exit()) from None
        return messages

    def stop(self, timeout_s: float) -> list[Message]:
        """Ask the worker to abort everything and exit; return its last messages. Kills it
        if it has not exited within ``timeout_s``."""
        messages: list[Message] = []
        try:
            self.send(Shutdown())
            self._process.join(0)
            while wait([self.conn], timeout_s):
                messages.extend(self.read_available())
        except WorkerGone:
            pass
        self._process.join(timeout_s)
        if self._process.is_alive():
            self.kill()
        self.conn.close()
        return messages

    def kill(self) -> None:
        self._process.kill()
        self._process.join(5.0)

    def reap(self) -> None:
        """Collect the exit status of a worker that is gone."""
        self._process.join(5.0)
        self.conn.close()

    def describe_exit(self) -> str:
        """One sentence on how the worker ended (its fault when it sent one)."""
        if self.fault is not None:
            return f"engine error: {self.fault}"
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
