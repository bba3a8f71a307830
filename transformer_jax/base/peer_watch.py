"""A multi-process run whose peer dies ends on every process with one line of ours and exit status 4.

Left to JAX, a dead process ends the others in a native check failure (SIGABRT, status 134, a C++ stack): its
coordination service finds the missed heartbeats after `heartbeat_timeout_seconds` and aborts every process,
and at exit its shutdown barrier waits for the dead one, then aborts. The callback JAX offers for this
(`missed_heartbeat_callback`) cannot be given from Python in jaxlib 0.10 (its status argument does not convert:
std::bad_cast, then `terminate`).

So every process runs a `PeerWatch`: a daemon thread that writes a beat to JAX's key-value store (held by the
coordination service in process 0) each BEAT_SECONDS. Process 0 reads every process's beat in one call. A peer
whose beat has not changed for `timeout` seconds is lost (it died, or its host did); so is one that announced
its end with a non-zero status (`announce_end`) while this process is still working `timeout` seconds later.
A process that finished keeps beating until it leaves: JAX's shutdown barrier holds every process until all
have reached it, so a finished peer that dies there is lost too (the barrier would wait for it, then abort).
Process 0 then publishes the loss, waits for the other processes to acknowledge it (each prints the line and
exits), prints the same line and exits: process 0 holds the service, so it goes last. JAX's own heartbeat
timeout is raised above ours (`jax_heartbeat_seconds`), so the line comes first.

Process 0's own death: JAX keeps the service inside process 0, and with it gone JAX's client in every other
process aborts as soon as its connection closes (a native thread, before Python can act). So process 0, found
before the join (the three cluster flags, or the cluster JAX detects: cli/cluster.detect_cluster), runs the
service in a process of its own that outlives it (base/coordination_service.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any

# Exit status of a process ended because another process of the run died or ended with an error.
PEER_LOST_EXIT = 4
# How often each process writes its beat (and process 0 reads them all).
BEAT_SECONDS = 1.0
# The default of --peer_timeout: how long a peer may be silent before the run is ended.
DEFAULT_PEER_TIMEOUT = 30
_PREFIX = "transformer_jax/peers"


def jax_heartbeat_seconds(peer_timeout: float) -> int:
    """JAX's heartbeat timeout for a run whose watch waits `peer_timeout`: past ours and our acknowledgements'
    wait (another `peer_timeout`), with a margin, and never below JAX's default (100 s)."""
    return int(max(100, 2 * peer_timeout + 30))


def _client() -> Any:
    """JAX's distributed-runtime client (its key-value store), or None when this JAX keeps it elsewhere."""
    try:
        from jax._src import distributed
    except ImportError:
        return None
    return getattr(getattr(distributed, "global_state", None), "client", None)


class PeerWatch:
    """The watch of one process (see the module's docstring). `resume` ends its line: what to do next."""

    def __init__(self, client: Any, process_id: int, num_processes: int, timeout: float, resume: str) -> None:
        self.client, self.process_id, self.num_processes = client, process_id, num_processes
        self.timeout, self.resume = timeout, resume
        self._beat, self._ended, self._lock = 0, None, threading.Lock()
        self._lost = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peer-watch", daemon=True)

    def start(self) -> "PeerWatch":
        self._write()
        self._thread.start()
        return self

    def announce_end(self, status: int) -> None:
        """This process is ending with `status` (0: finished; it keeps beating until it leaves JAX's shutdown
        barrier with every other process); a non-zero status tells process 0 that the run cannot go on without it."""
        with self._lock:
            self._ended = status
        with contextlib.suppress(Exception):
            self._write()

    def await_verdict(self, seconds: float) -> None:
        """Wait at most `seconds` for the watch to end the process because of a lost peer (a collective that
        failed because its peer vanished is that, not a fault of this process's devices)."""
        if self._lost.wait(seconds):
            threading.Event().wait()  # the watch is printing its line and ending the process

    # The key-value store's values: "run <beat>", "end <status> <beat>", "lost <beat> <line>" (process 0).
    def _value(self, lost: str | None = None) -> str:
        if lost is not None:
            return f"lost {self._beat} {lost}"
        return f"run {self._beat}" if self._ended is None else f"end {self._ended} {self._beat}"

    def _write(self, lost: str | None = None) -> None:
        with self._lock:
            self._beat += 1
            value = self._value(lost)
        self.client.key_value_set(f"{_PREFIX}/{self.process_id}", value, allow_overwrite=True)

    def _run(self) -> None:
        seen: dict[int, tuple[str, float, float]] = {}  # process -> (value, when it changed, when it ended)
        while True:
            time.sleep(BEAT_SECONDS)
            now = time.monotonic()
            try:
                self._write()
                if self.process_id == 0:
                    values = {int(key.rsplit("/", 1)[1]): value
                              for key, value in self.client.key_value_dir_get(_PREFIX)}
                else:
                    values = {0: self.client.key_value_try_get(f"{_PREFIX}/0")}
            except Exception:  # the store did not answer: a peer unseen that long is lost all the same
                values = {}
            verdict = self._verdict(values, seen, now)
            if verdict is not None:
                self._end(*verdict)

    def _verdict(self, values: dict[int, str], seen: dict[int, tuple[str, float, float]],
                 now: float) -> tuple[str, int] | None:
        """The line that ends the run and the peer it names, when a watched peer is lost; None while every one is
        alive. `seen`: each peer's last value, when it last changed, and when it first said it was ending.

        A peer is lost when its beat stops for `timeout` seconds, finished or not: a finished process waits, beating,
        in JAX's shutdown barrier until every process reaches it, and all leave it together. One that ends with a
        non-zero status is lost `timeout` seconds later unless this process is ending too (each says why)."""
        peers = range(1, self.num_processes) if self.process_id == 0 else (0,)
        for peer in peers:
            value = values.get(peer)
            if value is not None and value.startswith("lost "):  # process 0 found a loss: say it here too
                return value.split(" ", 2)[2], 0
            last, changed, ending = seen.get(peer, ("", now, 0.0))
            if value is not None and value != last:
                last, changed = value, now
                if value.startswith("end ") and not ending:
                    ending = now
            seen[peer] = (last, changed, ending)
            of = f"process {peer} of {self.num_processes}"
            status = last.split()[1] if last.startswith("end ") else "0"
            if status != "0" and now - ending >= self.timeout and self._ended in (None, 0):
                return (f"{of} ended with exit status {status} (its own output says why) and the run cannot go on "
                        f"without it; every process has stopped. {self.resume}"), peer
            if status == "0" and now - changed >= self.timeout:
                return (f"{of} stopped answering {self.timeout:g} s ago (it died, or its host did; --peer_timeout "
                        f"sets the wait); every process has stopped. {self.resume}"), peer
        return None

    def _end(self, line: str, lost: int) -> None:
        """Print `line` and exit with PEER_LOST_EXIT; process 0 first publishes it and waits (at most `timeout`)
        for the others but the `lost` one to acknowledge, since its exit takes the key-value store with it."""
        self._lost.set()
        if self.process_id == 0:
            with contextlib.suppress(Exception):
                self._write(lost=line)
                deadline = time.monotonic() + self.timeout
                while time.monotonic() < deadline and not self._all_acknowledged(lost):
                    time.sleep(BEAT_SECONDS / 4)
        else:
            with contextlib.suppress(Exception):
                self.announce_end(PEER_LOST_EXIT)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.write(2, f"error: {line}\n".encode(errors="replace"))
        os._exit(PEER_LOST_EXIT)

    def _all_acknowledged(self, lost: int) -> bool:
        values = dict(self.client.key_value_dir_get(_PREFIX))
        return all(not values.get(f"{_PREFIX}/{peer}", "end ").startswith("run ")
                   for peer in range(1, self.num_processes) if peer != lost)


_WATCH: list[PeerWatch] = []


def start_peer_watch(process_id: int, num_processes: int, timeout: float, resume: str) -> PeerWatch | None:
    """Start this process's watch (after joining the run); None for one process or a JAX without the client."""
    client = _client()
    if num_processes < 2 or client is None:
        return None
    watch = PeerWatch(client, process_id, num_processes, timeout, resume).start()
    _WATCH[:] = [watch]
    return watch


def announce_end(status: int) -> None:
    """This process is ending with `status` (PeerWatch.announce_end); nothing without a watch."""
    for watch in _WATCH:
        watch.announce_end(status)


def await_verdict_if_lost_peer(error: BaseException) -> None:
    """When `error` is a collective that failed because a peer's connection closed, give the watch its time to
    end the process with the line that names the peer (it does so within `timeout` and a few beats)."""
    if not _WATCH or getattr(error, "_peer_verdict_awaited", False) or not any(
            mark in str(error) for mark in LOST_PEER_MARKS):
        return
    with contextlib.suppress(AttributeError, TypeError):  # once an error: the Trainer's wait, not run_command's too
        error._peer_verdict_awaited = True
    _WATCH[0].await_verdict(_WATCH[0].timeout + 4 * BEAT_SECONDS)


# How a collective reports that a peer's connection closed: gloo (CPU), NCCL (GPU).
LOST_PEER_MARKS = ("Connection closed by peer", "Connection reset by peer", "Gloo AllGather failed",
                   "Gloo AllReduce failed", "remote process exited", "NCCL operation ncclGroupEnd() failed")
