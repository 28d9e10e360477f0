"""What the server holds for one engine worker, wherever it runs: the connection it talks
over and how the worker ends.

A worker speaks the protocol of ``worker.wire`` over a ``multiprocessing`` connection: a
pipe to a local process, or a TCP connection to a Ray actor on some node. Whatever ends the
worker (a failed step, a crash, ``kill -9``, a lost node) closes its end, and the server
reads EOF. Subclasses say how the worker is started, waited for and killed. A handle is used
by one container thread only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from multiprocessing.connection import Connection, wait

from tokenpace.server.worker.wire import Command, Fault, Message, Ready, Shutdown, WorkerSpec


class WorkerGone(Exception):
    """The worker ended (or its connection broke); the message says how."""


class WorkerHandle(ABC):
    """A started worker: ``conn`` is the server's end of its connection once it has one;
    ``fault`` is the error it reported, if any."""

    def __init__(self) -> None:
        self.conn: Connection | None = None
        self.fault: str | None = None

    @property
    @abstractmethod
    def pid(self) -> int | None:
        """The worker's process id on its machine (None until known)."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the worker runs: ``"local"`` or the node that hosts it."""

    @abstractmethod
    def wait_sources(self) -> list[Connection | int]:
        """What ``multiprocessing.connection.wait`` should watch: ready when a message
        arrives or the worker ends."""

    @abstractmethod
    def _wait_until_connected(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the connection or a sign of the worker's end;
        True when ``wait_sources()`` should be read. Raises WorkerGone if the worker
        ended before it connected."""

    @abstractmethod
    def _join(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the worker to end; True once it has."""

    @abstractmethod
    def kill(self) -> None:
        """End the worker at once (its resources are released)."""

    @abstractmethod
    def _exit_description(self) -> str:
        """One sentence on how the worker ended, when it sent no fault."""

    def wait_ready(self, should_give_up: Callable[[], bool], poll_s: float = 0.2) -> Ready:
        """Block until the worker is loaded. Raises WorkerGone if it fails or dies first,
        or when ``should_give_up()`` turns True (the worker is then killed)."""
        while True:
            if should_give_up():
                self.kill()
                raise WorkerGone("the server stopped while the engine was loading")
            if not self._wait_until_connected(poll_s):
                continue
            if not wait(self.wait_sources(), poll_s):
                continue
            # A worker that died leaves EOF: read_available raises WorkerGone.
            for message in self.read_available():
                if isinstance(message, Ready):
                    return message

    def send(self, command: Command) -> None:
        """Send ``command``; raises WorkerGone if the connection is broken."""
        conn = self._connection()
        try:
            conn.send(command)
        except (BrokenPipeError, ConnectionResetError, OSError) as error:
            raise WorkerGone(self.describe_exit()) from error

    def read_available(self) -> list[Message]:
        """Every message already waiting. Raises WorkerGone once the worker's end is
        closed and nothing is left to read. A ``Fault`` is remembered and returned."""
        conn = self._connection()
        messages: list[Message] = []
        try:
            while conn.poll(0):
                message = conn.recv()
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
        if it has not ended within ``timeout_s``."""
        messages: list[Message] = []
        if self.conn is not None:
            try:
                self.send(Shutdown())
                while wait([self.conn], timeout_s):
                    messages.extend(self.read_available())
            except WorkerGone:
                pass
        if not self._join(timeout_s):
            self.kill()
        self._close()
        return messages

    def reap(self) -> None:
        """Collect a worker that is gone and release what it held."""
        if not self._join(5.0):
            self.kill()
        self._close()

    def describe_exit(self) -> str:
        """One sentence on how the worker ended (its fault when it sent one)."""
        if self.fault is not None:
            return f"engine error: {self.fault}"
        return self._exit_description()

    def _connection(self) -> Connection:
        if self.conn is None:
            raise WorkerGone("the engine worker has not connected")
        return self.conn

    def _close(self) -> None:
        if self.conn is not None:
            self.conn.close()


Launcher = Callable[[WorkerSpec, str], WorkerHandle]
"""Starts a worker for a spec under a name; the worker begins loading at once."""
