"""The worker process: build the backend, then step it while reading commands.

The loop reads every pending command between steps (so an abort takes effect before the
next step), steps while there is work, and blocks on the pipe when there is none. Reports
go out through a sender thread, so a server busy writing to this worker never deadlocks
against it. An engine failure is sent as a ``Fault`` and ends the process with status 1.
"""

from __future__ import annotations

import importlib
import os
import queue
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path

from tokenpace.server.worker.backend import BACKENDS, Clock, ServingBackend
from tokenpace.server.worker.wire import (
    Abort,
    AbortAll,
    Command,
    Fault,
    Finished,
    Message,
    Ready,
    Report,
    Shutdown,
    Submit,
    WorkerSpec,
)

# Engine modules that register backends; imported in the worker only (they load torch).
BACKEND_MODULES = {
    "native": "tokenpace.server.worker.native_backend",
    "vllm": "tokenpace.server.worker.vllm_backend",
}
_RETRY_WAIT_S = 0.005


def _vllm_process(build_dir: Path | None) -> None:
    from tokenpace.engine.vllm.start import apply_local_environment

    apply_local_environment(build_dir or Path(tempfile.gettempdir()) / "tokenpace-vllm")


# What an engine needs set in its process before it loads, given the build folder: called
# where such a process begins (a worker, a benchmark's entry point).
PROCESS_SETUP: dict[str, Callable[[Path | None], None]] = {"vllm": _vllm_process}


class _Sender:
    """Sends messages on a background thread, in order."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._queue: queue.Queue[Message | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="tokenpace-sender", daemon=True)
        self._thread.start()

    def send(self, message: Message) -> None:
        self._queue.put(message)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (message := self._queue.get()) is not None:
            try:
                self._conn.send(message)
            except (BrokenPipeError, OSError):
                return


def build_backend(spec: WorkerSpec, clock: Clock) -> ServingBackend:
    """Import the engine's backend module and build it from ``spec``."""
    module = BACKEND_MODULES.get(spec.engine)
    if module is not None:
        importlib.import_module(module)
    return BACKENDS.get(spec.engine)(spec, clock)


def run_worker(spec: WorkerSpec, conn: Connection, clock: Clock = time.perf_counter) -> None:
    """The worker's whole life; returns when told to shut down or when the server's end of
    the pipe closes. Raises SystemExit(1) after sending a ``Fault``."""
    sender = _Sender(conn)
    start = clock()
    try:
        setup = PROCESS_SETUP.get(spec.engine)
        if setup is not None:
            setup(spec.build_dir)
        backend = build_backend(spec, clock)
    except Exception as error:
        sender.send(Fault(_describe(error)))
        sender.close()
        raise SystemExit(1) from None
    choice = backend.dtype_choice
    sender.send(
        Ready(
            os.getpid(),
            clock() - start,
            backend.profile,
            backend.kv_capacity_tokens,
            choice.dtype,
            choice.batch,
            choice.step_ms,
        )
    )
    try:
        _serve(backend, conn, sender)
    except Exception as error:
        traceback.print_exc()
        sender.send(Fault(_describe(error)))
        sender.close()
        raise SystemExit(1) from None
    sender.close()


def _serve(backend: ServingBackend, conn: Connection, sender: _Sender) -> None:
    while True:
        finished: list[Finished] = []
        timeout = 0.0 if backend.has_work else None
        try:
            commands = _read_commands(conn, timeout)
        except EOFError:  # the server is gone
            return
        for command in commands:
            if isinstance(command, Shutdown):
                finished.extend(backend.abort_all())
                sender.send(Report((), (), tuple(finished), backend.load_state()))
                return
            finished.extend(_apply(backend, command))
        report = backend.step() if backend.has_work else None
        if report is None:
            if finished or commands:
                sender.send(Report((), (), tuple(finished), backend.load_state()))
            if backend.has_work:  # work that cannot run yet: wait for a command or a moment
                conn.poll(_RETRY_WAIT_S)
            continue
        if finished:
            report = replace(report, finished=(*finished, *report.finished))
        sender.send(report)


def _read_commands(conn: Connection, timeout: float | None) -> list[Command]:
    commands: list[Command] = []
    if not conn.poll(timeout):
        return commands
    commands.append(conn.recv())
    while conn.poll(0):
        commands.append(conn.recv())
    return commands


def _apply(backend: ServingBackend, command: Command) -> list[Finished]:
    if isinstance(command, Submit):
        return backend.add(command.items)
    if isinstance(command, Abort):
        return backend.abort(command.request_ids)
    if isinstance(command, AbortAll):
        return backend.abort_all()
    raise TypeError(f"unknown worker command {command!r}")


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
