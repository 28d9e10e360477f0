"""Engine workers as Ray actors: a pool's containers placed on the nodes of a Ray cluster.

Ray places, supervises and ends the workers; the data path is the worker protocol of a
local worker (``worker.wire``) over a ``multiprocessing`` TCP connection from the server to
the actor, authenticated with a key made for each start. Each actor reserves
``cpus_per_engine`` CPUs and ``gpus_per_engine`` GPUs and is placed with Ray's ``SPREAD``
strategy, so containers land on different nodes while nodes have room; a worker that
finds no room waits (its container stays loading) until a node with room joins.

The server notices a worker's end through its connection: EOF when the actor's process or
node ends, or, for a node cut off from the network (its sockets stay open), when Ray
declares the actor dead and a watcher thread shuts the connection down.

Workers stamp tokens with their node's monotonic clock shifted onto the server's: at
connect time the server measures the offset from a few round trips and keeps the one with
the shortest round trip, so its error is within half that round trip.

Every node must have tokenpace installed and see the checkpoint at the path the server
prepared (the same cache folder on each node, or a shared file system).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from tokenpace.core.process_env import apply_process_defaults
from tokenpace.server.worker.backend import Clock
from tokenpace.server.worker.main import run_worker
from tokenpace.server.worker.wire import WorkerSpec
from tokenpace.server.worker_handle import WorkerGone, WorkerHandle

CLOCK_PROBES = 5
CONNECT_TIMEOUT_S = 30.0
PLACEMENT_RETRY_S = 60.0
PLACEMENT_RETRY_WAIT_S = 2.0

logger = logging.getLogger("tokenpace.server")


@dataclass(frozen=True, slots=True)
class RayPlacement:
    """Which Ray cluster runs the engines and what each engine actor reserves.
    ``address``: ``"local"`` starts a single-node cluster in this process; anything else
    (``"auto"``, ``"HOST:PORT"``, ``"ray://HOST:PORT"``) joins a running one."""

    address: str
    cpus_per_engine: float
    gpus_per_engine: float = 0.0

    def __post_init__(self) -> None:
        if not self.address:
            raise ValueError("RayPlacement.address must name a cluster or be 'local'")
        if not self.cpus_per_engine > 0:
            raise ValueError(
                f"RayPlacement.cpus_per_engine must be > 0, got {self.cpus_per_engine}"
            )
        if self.gpus_per_engine < 0:
            raise ValueError(
                f"RayPlacement.gpus_per_engine must be >= 0, got {self.gpus_per_engine}"
            )


@dataclass(frozen=True, slots=True)
class WorkerPlace:
    """Where an actor listens for the server: its address, node, IP and process id."""

    address: tuple[str, int]
    node_id: str
    ip: str
    pid: int


@dataclass(frozen=True, slots=True)
class ClockProbe:
    """The server asks for the worker's clock."""


@dataclass(frozen=True, slots=True)
class ClockReading:
    """The worker's ``time.perf_counter()`` when it answered a probe."""

    worker_s: float


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """Worker clock minus server clock (s); the worker subtracts it from its readings."""

    offset_s: float


class EngineHost:
    """The body of an engine actor: ``open`` starts listening on the node, ``serve`` takes
    the server's connection, aligns the clock and runs the worker until it ends."""

    def __init__(self) -> None:
        # The actor is its own process: this is its entry point.
        apply_process_defaults(os.environ)
        self._listener: Listener | None = None

    def open(self, authkey: bytes) -> WorkerPlace:
        import ray

        ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self._listener = Listener((ip, 0), authkey=authkey)
        host, port = self._listener.address
        node_id = ray.get_runtime_context().get_node_id()
        return WorkerPlace((str(host), int(port)), node_id, ip, os.getpid())

    def serve(self, spec: WorkerSpec) -> None:
        if self._listener is None:
            raise RuntimeError("EngineHost.serve called before open")
        with self._listener as listener:
            conn = listener.accept()
        try:
            offset_s = answer_clock_probes(conn)
            run_worker(spec, conn, lambda: time.perf_counter() - offset_s)
        finally:
            conn.close()  # the actor outlives this call: EOF tells the server at once


def answer_clock_probes(conn: Connection) -> float:
    """Answer probes until the server sends the offset; returns it."""
    while True:
        message = conn.recv()
        if isinstance(message, ClockOffset):
            return message.offset_s
        if not isinstance(message, ClockProbe):
            raise TypeError(f"expected a clock probe, got {message!r}")
        conn.send(ClockReading(time.perf_counter()))


def measure_clock_offset(conn: Connection, clock: Clock, probes: int = CLOCK_PROBES) -> float:
    """Probe the worker's clock ``probes`` times; send and return the offset (worker minus
    server) of the probe with the shortest round trip."""
    best_round_trip, best_offset = float("inf"), 0.0
    for _ in range(probes):
        sent = clock()
        conn.send(ClockProbe())
        if not conn.poll(CONNECT_TIMEOUT_S):
            raise WorkerGone("the engine actor did not answer its clock probe")
        reading = conn.recv()
        received = clock()
        if not isinstance(reading, ClockReading):
            raise WorkerGone(f"the engine actor answered a clock probe with {reading!r}")
        if received - sent < best_round_trip:
            best_round_trip = received - sent
            best_offset = reading.worker_s - (sent + received) / 2
    conn.send(ClockOffset(best_offset))
    return best_offset


@dataclass(frozen=True, slots=True)
class ActorStart:
    """A placed engine actor: its handle, the refs of its ``open`` and ``serve`` calls,
    and the key the server's connection must present."""

    actor: Any
    place_ref: Any
    run_ref: Any
    authkey: bytes


class RayCluster:
    """This process's link to a Ray cluster: ``connect`` joins (or starts) it, ``launch``
    places an engine actor, ``close`` leaves it (shutting down a cluster it started)."""

    def __init__(self, placement: RayPlacement, clock: Clock) -> None:
        self.placement = placement
        self._clock = clock
        self._owns_ray = False
        self._actor_class: Any = None

    def connect(self) -> None:
        import ray

        if not ray.is_initialized():
            address = None if self.placement.address == "local" else self.placement.address
            ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
            self._owns_ray = True
        self._actor_class = ray.remote(EngineHost)

    def launch(self, spec: WorkerSpec, name: str) -> RayWorker:
        """Place an engine actor for ``spec``; it begins loading once Ray has placed it."""
        if self._actor_class is None:
            raise RuntimeError("RayCluster.launch called before connect")
        return RayWorker(name, self._place(spec), lambda: self._place(spec), self._clock)

    def _place(self, spec: WorkerSpec) -> ActorStart:
        actor = self._actor_class.options(
            num_cpus=self.placement.cpus_per_engine,
            num_gpus=self.placement.gpus_per_engine,
            scheduling_strategy="SPREAD",
            max_restarts=0,
        ).remote()
        authkey = os.urandom(32)
        return ActorStart(actor, actor.open.remote(authkey), actor.serve.remote(spec), authkey)

    def close(self) -> None:
        if self._owns_ray:
            import ray

            ray.shutdown()
            self._owns_ray = False


class RayWorker(WorkerHandle):
    """An engine actor and the server's end of its TCP connection. An actor that dies
    before it listens (its node was lost while Ray placed it) is placed again, for up to
    ``PLACEMENT_RETRY_S`` seconds from the first try."""

    def __init__(
        self, name: str, start: ActorStart, place_again: Callable[[], ActorStart], clock: Clock
    ) -> None:
        super().__init__()
        self.name = name
        self._place_again = place_again
        self._clock = clock
        self._first_try_s = clock()
        self._retry_at_s: float | None = None
        self._start = start
        self._place: WorkerPlace | None = None
        self._conn_lock = threading.Lock()

    @property
    def pid(self) -> int | None:
        return self._place.pid if self._place is not None else None

    @property
    def location(self) -> str:
        if self._place is None:
            return "ray (not placed yet)"
        return f"ray node {self._place.node_id[:12]} ({self._place.ip})"

    def wait_sources(self) -> list[Connection | int]:
        return [] if self.conn is None else [self.conn]

    def _wait_until_connected(self, timeout_s: float) -> bool:
        import ray

        if self.conn is not None:
            return True
        if self._retry_at_s is not None:
            wait_s = self._retry_at_s - self._clock()
            if wait_s > 0:
                time.sleep(min(wait_s, timeout_s))
                return False
            self._retry_at_s = None
            self._start = self._place_again()
        placed, _ = ray.wait([self._start.place_ref], timeout=timeout_s)
        if not placed:
            return False
        try:
            self._place = ray.get(self._start.place_ref)
        except Exception as error:  # the actor died before it listened
            if self._clock() - self._first_try_s < PLACEMENT_RETRY_S:
                logger.warning("%s: %s; placing it again", self.name, self._actor_failure(error))
                self.kill()
                self._retry_at_s = self._clock() + PLACEMENT_RETRY_WAIT_S
                return False
            raise WorkerGone(self._actor_failure(error)) from None
        assert self._place is not None
        try:
            conn = Client(self._place.address, authkey=self._start.authkey)
            offset_s = measure_clock_offset(conn, self._clock)
        except (OSError, EOFError) as error:
            raise WorkerGone(f"{self._where()} could not be reached: {error}") from None
        self.conn = conn
        logger.info(
            "%s: %s connected, clock offset %+.3f ms", self.name, self._where(), offset_s * 1e3
        )
        threading.Thread(
            target=self._close_when_actor_ends, name=f"{self.name}-watch", daemon=True
        ).start()
        return True

    def _close_when_actor_ends(self) -> None:
        """A node cut off from the server leaves the TCP connection open; Ray still declares
        its actors dead (missed heartbeats). Shutting the socket down then makes the
        container read EOF, as it would from a worker that exited."""
        import ray

        ray.wait([self._start.run_ref], timeout=None)
        with self._conn_lock:
            if self.conn is None or self.conn.closed:
                return
            with (
                contextlib.suppress(OSError),
                socket.socket(fileno=os.dup(self.conn.fileno())) as sock,
            ):
                sock.shutdown(socket.SHUT_RDWR)

    def _join(self, timeout_s: float) -> bool:
        import ray

        done, _ = ray.wait([self._start.run_ref], timeout=timeout_s)
        return bool(done)

    def kill(self) -> None:
        import ray

        ray.kill(self._start.actor, no_restart=True)

    def _close(self) -> None:
        with self._conn_lock:  # never while the watcher shuts the socket down
            super()._close()
        self.kill()  # an actor whose worker returned still holds its CPUs until it ends

    def _exit_description(self) -> str:
        import ray

        done, _ = ray.wait([self._start.run_ref], timeout=1.0)
        if not done:
            return f"{self._where()} closed its connection (its process or node ended)"
        try:
            ray.get(self._start.run_ref)
        except Exception as error:
            return self._actor_failure(error)
        return f"{self._where()} exited"

    def _where(self) -> str:
        if self._place is None:
            return f"the engine actor of {self.name} (not placed yet)"
        return f"engine actor {self.pid} on {self.location}"

    def _actor_failure(self, error: BaseException) -> str:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"{self._where()} died: {type(error).__name__}: {first}"
