"""JAX's coordination service of a multi-process run, in a process of its own beside process 0.

JAX starts the service inside process 0. When process 0 dies the service goes with it, and JAX's client in every
other process aborts as soon as its connection closes (a native thread: SIGABRT, status 134, a C++ stack), before
anything of ours can say what happened. Kept in a child process, the service outlives process 0 by `linger`
seconds, long enough for the other processes' peer watch to find process 0 silent and end them with its line
(base/peer_watch.py). Process 0 joins it as a client like the others.

The child reads its standard input: the line "exit" (process 0 finished, after JAX's shutdown barrier) ends it at
once; end of file (process 0 ended without saying so: killed, or stopped by a signal while the others stop too)
ends it after `linger` seconds. Run as a script (`python coordination_service.py ...`), it imports jaxlib only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import IO

READY = "ready"


class ServiceNotStarted(RuntimeError):
    """The coordination service's process did not start (its port taken, a JAX without the service's binding)."""


_CHILD: list[subprocess.Popen] = []


def start_coordination_service(bind_address: str, num_processes: int, heartbeat_seconds: int,
                               linger_seconds: float, timeout: float = 60) -> subprocess.Popen:
    """Start the service on `bind_address` in a child process; returns once it listens. A port something on this
    host already listens on is refused: gRPC would share it, and process 0 might join an earlier run's service."""
    _check_port_free(int(bind_address.rpartition(":")[2]))
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), bind_address, str(num_processes), str(heartbeat_seconds),
         str(linger_seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)  # Ctrl-C at a terminal reaches the run's processes, not the service
    line = _first_line(child.stdout, timeout)
    if line != READY:
        child.kill()
        detail = (child.stderr.read().strip().splitlines() or [line or "no answer"])[-1]
        raise ServiceNotStarted(detail)
    threading.Thread(target=_copy, args=(child.stderr,), name="coordination-service-log", daemon=True).start()
    _CHILD[:] = [child]
    return child


def stop_coordination_service() -> None:
    """Process 0 finished (JAX's shutdown barrier passed): end the service at once; nothing without one."""
    if not _CHILD or _CHILD[0].poll() is not None:
        return
    child = _CHILD.pop()
    try:
        child.stdin.write("exit\n")
        child.stdin.flush()
    except OSError:
        child.kill()
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()


def _check_port_free(port: int) -> None:
    import errno
    import socket

    try:
        with socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True):
            return
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise ServiceNotStarted(f"port {port} is in use on this host; the service of an earlier process 0 stays "
                                    "up to 2 x --peer_timeout + 10 s after it died") from None
        if error.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):  # no IPv6 here: the service will say
            raise ServiceNotStarted(str(error)) from None


def _first_line(stream: IO[str], timeout: float) -> str:
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(stream.readline().strip()), daemon=True)
    reader.start()
    reader.join(timeout)
    return found[0] if found else ""


def _copy(stream: IO[str]) -> None:
    """The service's own log lines, on this process's standard error."""
    for line in stream:
        sys.stderr.write(line)


def _serve(bind_address: str, num_processes: int, heartbeat_seconds: int, linger_seconds: float) -> None:
    import signal
    import time

    from jaxlib import _jax

    # It ends by its own rule (above): a SIGTERM sent to every process of a job stops the run's processes, which
    # still talk to the service while they save and stop.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    # A service whose heartbeat timeout is past the peer watch's: the watch speaks first (peer_watch.py).
    service = _jax.get_distributed_runtime_service(bind_address, num_processes, heartbeat_timeout=heartbeat_seconds)
    print(READY, flush=True)
    if sys.stdin.readline().strip() != "exit":  # end of file: process 0 is gone; let the others hear of it
        time.sleep(linger_seconds)
    del service
    os._exit(0)


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
