"""Joining a multi-process run (`--multihost` and its flags, checked as they are parsed), its waits ended in one
line of ours, and JAX's backends started with a platform that cannot start named."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from typing import Any, Iterator

from absl import flags

from transformer_jax.base import (DEFAULT_PEER_TIMEOUT, ServiceNotStarted, default_cache_dir, jax_heartbeat_seconds,
                                  start_coordination_service, start_peer_watch, use_compilation_cache)
from transformer_jax.cli.flag_parsing import register_key_flags
from transformer_jax.cli.user_errors import USER_ERROR_EXIT, NamedOutput
from transformer_jax.errors import ConfigError


def wait_for_coordinator(coordinator_address: str, timeout: float, poll_seconds: float = 0.5) -> None:
    """Until the coordinator at HOST:PORT accepts a connection: a name that does not resolve, or no answer within
    `timeout` seconds, is one ConfigError line naming it. The wait is Python's own (a connect, then a sleep), so
    SIGTERM and Ctrl-C are acted on at once, which JAX's join, blocked in native code, would not do."""
    import socket

    host, _, port = coordinator_address.rpartition(":")
    host = host.strip("[]")
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ConfigError(f"--coordinator_address={coordinator_address}: the name {host!r} does not resolve "
                          f"({error.strerror}); pass the address of process 0's host") from None
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(poll_seconds * 4, 5.0)):
                return
        except OSError:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"no coordinator answered at --coordinator_address={coordinator_address} within {timeout:g} s "
                    "(--cluster_timeout); start process 0 there, check the address and that its port is open, or "
                    "wait longer with --cluster_timeout") from None
            time.sleep(poll_seconds)


# What the line of a lost peer ends with, unless the command says otherwise.
RESUME_BY_RERUN = "Run the same command again on every process."


def initialize_distributed(coordinator_address: str | None, num_processes: int | None,
                           process_id: int | None, timeout: int = 300,
                           peer_timeout: float = DEFAULT_PEER_TIMEOUT, resume: str = RESUME_BY_RERUN) -> None:
    """Join a multi-process run (jax.distributed.initialize); a wrong setting is one ConfigError line.

    A process other than 0 first waits, at most `timeout` seconds and interruptibly, for the coordinator to
    answer (wait_for_coordinator); every process then waits at most `timeout` seconds for all of them to
    register (join_watchdog), a wait that ends in one line of ours, never in JAX's abort. Once joined, a peer
    silent for `peer_timeout` seconds ends every process with one line ending in `resume` (base/peer_watch.py).
    On CPU the processes exchange data with JAX's default CPU collectives (gloo over TCP).
    """
    import jax

    # JAX's preemption service would install a C++ SIGTERM handler here that replaces Python's for good:
    # a SIGTERM during start-up, compiling or the test translation would then be swallowed. Its sync point
    # is driven by SIGTERM alone (jaxlib's only notifier), which our own handler and the loop's per-step
    # agreement (run/preemption.py) already hear, on every platform and at every point of the run.
    jax.config.update("jax_enable_preemption_service", False)
    coordinator_address, num_processes, process_id = detect_cluster(coordinator_address, num_processes, process_id,
                                                                    timeout)
    if coordinator_address is not None and not coordinator_address.rpartition(":")[2].isdigit():
        raise ConfigError(f"--coordinator_address={coordinator_address} has no port; pass HOST:PORT of process 0 "
                          "(e.g. --coordinator_address=10.0.0.2:8476), the same on every process")
    if coordinator_address is not None and not 0 < int(coordinator_address.rpartition(":")[2]) < 65536:
        raise ConfigError(f"--coordinator_address={coordinator_address}: port {coordinator_address.rpartition(':')[2]} "
                          "is not a TCP port (1 to 65535); pass the port process 0 listens on, the same on every "
                          "process")
    if coordinator_address is not None and process_id not in (None, 0):
        wait_for_coordinator(coordinator_address, timeout)
    service = service_beside_process_0(coordinator_address, num_processes, process_id, peer_timeout)
    try:
        with join_watchdog(timeout, _not_joined(coordinator_address, num_processes, process_id, timeout)):
            jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                       initialization_timeout=timeout + JAX_JOIN_MARGIN_SECONDS,
                                       heartbeat_timeout_seconds=jax_heartbeat_seconds(peer_timeout), **service)
    except (ValueError, RuntimeError) as error:
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(
            f"cannot join the multi-process run ({detail}); on a cluster without auto-detection pass "
            "--coordinator_address=HOST:PORT --num_processes=N --process_id=I"
        ) from None
    native_output_to_stderr()
    start_peer_watch(jax.process_index(), jax.process_count(), peer_timeout, resume)


def detect_cluster(coordinator_address: str | None, num_processes: int | None, process_id: int | None,
                   timeout: int) -> tuple[str | None, int | None, int | None]:
    """The three settings of the join, those not given found as JAX's join would find them: JAX_COORDINATOR_ADDRESS,
    then the cluster this process runs on (TPU pods, SLURM, Kubernetes, Open MPI; JAX_COORDINATOR_PORT). Known
    before the join, process 0 can start the coordination service beside itself (service_beside_process_0), as it
    does with the three flags. JAX's detection is private API (jax._src.clusters, jax 0.10): where it is missing
    or changed, what was not given stays unset and JAX's join detects it, with the service inside process 0."""
    coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if None not in (coordinator_address, num_processes, process_id):
        return coordinator_address, num_processes, process_id
    try:
        from jax._src.clusters import ClusterEnv

        found = ClusterEnv.auto_detect_unset_distributed_params(coordinator_address, num_processes, process_id,
                                                                None, None, timeout)
    except (ImportError, AttributeError, TypeError, ValueError):
        return coordinator_address, num_processes, process_id
    return found[0], found[1], found[2]


def service_beside_process_0(coordinator_address: str | None, num_processes: int | None, process_id: int | None,
                             peer_timeout: float) -> dict[str, str]:
    """On process 0 of a run named by the three flags: JAX's coordination service started in a process of its own
    (base/coordination_service.py: it outlives process 0, so the others end in the peer watch's line, not JAX's
    abort) and JAX's in-process one moved to an unused local port. Returns jax.distributed.initialize's keyword
    arguments for that. The settings of clusters JAX detects (TPU pods, SLURM) are found first (detect_cluster)."""
    import socket

    if process_id != 0 or not num_processes or num_processes < 2 or coordinator_address is None:
        return {}
    port = coordinator_address.rpartition(":")[2]
    try:
        start_coordination_service(f"[::]:{port}", num_processes, jax_heartbeat_seconds(peer_timeout),
                                   linger_seconds=2 * peer_timeout + 10)
    except ServiceNotStarted as error:
        raise ConfigError(f"--coordinator_address={coordinator_address}: process 0 cannot serve on port {port} "
                          f"({error}); free the port or pass another, the same on every process") from None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return {"coordinator_bind_address": f"127.0.0.1:{probe.getsockname()[1]}"}


# How much longer than --cluster_timeout JAX's own join may wait: ours (join_watchdog) must end the wait first.
JAX_JOIN_MARGIN_SECONDS = 30


@contextlib.contextmanager
def join_watchdog(timeout: float, message: str) -> Iterator[None]:
    """While the body (JAX's join) runs: after `timeout` seconds, `message` as one error line and exit status 2.

    JAX's join blocks in native code, which Python's signals and exceptions cannot interrupt, and past its own
    deadline it ends the process in a C++ check failure (SIGABRT, exit 134, a native stack trace). It releases
    the GIL while it waits, so a thread of ours can report the wait and end the process (os._exit) first.
    """
    import threading

    finished, deciding = threading.Event(), threading.Lock()

    def expire() -> None:
        if finished.wait(timeout):
            return
        with deciding:  # held to the end: a join that returns now waits here and is ended with the process
            if finished.is_set():
                return
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.write(2, f"error: {message}\n".encode(errors="replace"))
            os._exit(USER_ERROR_EXIT)

    threading.Thread(target=expire, name="cluster-join-watchdog", daemon=True).start()
    try:
        yield
    finally:
        with deciding:
            finished.set()


def _not_joined(coordinator_address: str | None, num_processes: int | None, process_id: int | None,
                timeout: float) -> str:
    """The line for a join that timed out: how many processes were expected, where, and what to do."""
    expected = f"the {num_processes} processes (--num_processes={num_processes})" if num_processes else \
        "the run's processes"
    where = f" at --coordinator_address={coordinator_address}" if coordinator_address else ""
    others = ("--process_id=1" if num_processes == 2 else f"--process_id=1 to {num_processes - 1}") \
        if num_processes and num_processes > 1 else "the others"
    this = "" if process_id is None else f"process {process_id}: "
    return (f"{this}not all of {expected} joined{where} within {timeout:g} s (--cluster_timeout); start the other "
            f"processes ({others}) with the same command and --coordinator_address, check --num_processes, or "
            "wait longer with --cluster_timeout")


def native_output_to_stderr() -> None:
    """Point file descriptor 1 at standard error, and Python's `sys.stdout` at the real standard output.

    The multi-process runtime's native code writes to descriptor 1: on CPU, gloo prints "[Gloo] Rank i is
    connected to ..." in pieces whenever its collectives connect, in the middle of whatever the command
    prints. A command's standard output is its data (translations, scores), so that text goes to standard
    error instead; what Python prints is unchanged.
    """
    sys.stdout.flush()
    data = os.dup(1)
    os.dup2(2, 1)
    stream = os.fdopen(data, "w", buffering=1 if sys.stdout.line_buffering else -1, encoding=sys.stdout.encoding,
                       errors=sys.stdout.errors)
    sys.stdout = NamedOutput(stream) if isinstance(sys.stdout, NamedOutput) else stream


@dataclasses.dataclass(frozen=True)
class ClusterFlags:
    """The flags by which train.py and eval.py join a multi-process run and keep their compiled programs."""

    multihost: flags.FlagHolder
    coordinator_address: flags.FlagHolder
    num_processes: flags.FlagHolder
    process_id: flags.FlagHolder
    compilation_cache: flags.FlagHolder
    cluster_timeout: flags.FlagHolder
    peer_timeout: flags.FlagHolder

    def use_compilation_cache(self, workdir: str) -> str:
        """Point JAX's compilation cache where --compilation_cache says (base.compile_cache)."""
        return use_compilation_cache(self.compilation_cache.value, workdir, self.multihost.value)

    def join(self, resume: str = RESUME_BY_RERUN) -> None:
        """With --multihost, join the run (jax.distributed); then start JAX's backends (start_backends).
        `resume`: what the line of a lost peer tells the user to do."""
        if self.multihost.value:  # the flags were checked as they were parsed (check_cluster_flags)
            initialize_distributed(self.coordinator_address.value, self.num_processes.value, self.process_id.value,
                                   self.cluster_timeout.value, self.peer_timeout.value, resume)
        start_backends()


def set_gpu_flags(model: Any) -> None:
    """Before JAX starts its backends: XLA_FLAGS for the attention kernel a run's `model` section may run on GPUs
    (cuDNN's out of XLA's command buffers: model.attention_kernels.command_buffer_flags); a flag the user set
    stays as it is. A no-op once the backends run (XLA reads the flags when they start)."""
    from transformer_jax.model import command_buffer_flags

    before = os.environ.get("XLA_FLAGS", "")
    after = command_buffer_flags(before, model.attention_backend, model.attention_dropout_rate, model.dtype)
    if after != before:
        os.environ["XLA_FLAGS"] = after


def start_backends() -> None:
    """Start JAX's backends now: a JAX_PLATFORMS naming a platform this machine cannot start (no plugin, no
    chip) is one ConfigError line, not the AssertionError or RuntimeError of JAX's first device query."""
    import jax

    try:
        jax.devices()
    except (RuntimeError, AssertionError) as error:
        platforms = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms
        if not platforms:
            raise  # JAX chose the platforms itself: not the user's setting
        detail = (str(error).strip().splitlines() or ["its JAX plugin is not installed"])[0].split(" (set JAX_PLATFORMS")[0]
        raise ConfigError(f"JAX_PLATFORMS={platforms} cannot start on this machine ({detail}); install the "
                          "platform's JAX plugin (e.g. pip install 'jax[cuda12]'), or unset JAX_PLATFORMS to use "
                          "the devices this machine has") from None


def define_cluster_flags() -> ClusterFlags:
    """Define --multihost, --coordinator_address, --num_processes, --process_id and --compilation_cache."""
    cluster = ClusterFlags(
        flags.DEFINE_bool("multihost", False, "Join a multi-process run with jax.distributed.initialize() "
                          "(auto-detected on TPU pods and SLURM; elsewhere give the three flags below). Every "
                          "process runs the same command."),
        flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multihost)."),
        flags.DEFINE_integer("num_processes", None, "Number of processes (multihost)."),
        flags.DEFINE_integer("process_id", None, "This process's index (multihost)."),
        flags.DEFINE_string(
            "compilation_cache", None, "Keep compiled programs here and load them in later runs: a directory "
            "(local or gs://), 'workdir' for <workdir>/compilation_cache, or empty for off. Default: "
            "$JAX_COMPILATION_CACHE_DIR if set, else the workdir's with --multihost (it outlives a preempted "
            f"host), else {default_cache_dir()}."),
        flags.DEFINE_integer("cluster_timeout", 300, "Seconds to wait for the coordinator to answer, and then for "
                             "every process to join (multihost)."),
        flags.DEFINE_integer("peer_timeout", DEFAULT_PEER_TIMEOUT, "Seconds a process of the run may be silent "
                             "(dead, or its host lost) before every process ends with one line and exit status 4 "
                             "(multihost)."),
    )
    register_key_flags([getattr(cluster, field.name) for field in dataclasses.fields(ClusterFlags)])
    # As the command line is parsed, before any work; a ConfigError of a validator reaches parse_flags as it is
    # (absl turns only its own ValidationError into a message of its own), so it is the command's one line.
    flags.register_multi_flags_validator([holder.name for holder in (cluster.multihost, *_multihost_only(cluster))],
                                         lambda _: check_cluster_flags(cluster))
    return cluster


def _multihost_only(cluster: ClusterFlags) -> tuple[flags.FlagHolder, ...]:
    """The flags that mean something only with --multihost."""
    return (cluster.coordinator_address, cluster.num_processes, cluster.process_id, cluster.cluster_timeout,
            cluster.peer_timeout)


def check_cluster_flags(cluster: ClusterFlags) -> bool:
    """Refuse, as one ConfigError line, cluster flags that would be ignored or cannot name a process of the run:
    --coordinator_address, --num_processes, --process_id or --cluster_timeout without --multihost (the process
    would run alone), a --num_processes below 1, a --process_id outside 0..N-1, a --cluster_timeout below 1."""
    if not cluster.multihost.value:
        given = [f"--{holder.name}={holder.value}" for holder in _multihost_only(cluster) if holder.present]
        if given:
            one = len(given) == 1
            raise ConfigError(f"{' '.join(given)} {'is' if one else 'are'} given without --multihost, where "
                              f"{'it means' if one else 'they mean'} nothing: this process would run alone; add "
                              f"--multihost to join a multi-process run, or drop {'it' if one else 'them'}")
        return True
    count, index = cluster.num_processes.value, cluster.process_id.value
    if count is not None and count < 1:
        raise ConfigError(f"--num_processes={count} must be at least 1: the number of processes in the run, the "
                          "same on every process")
    if index is not None and (index < 0 or (count is not None and index >= count)):
        valid = f"0 to {count - 1} for --num_processes={count}" if count is not None else "0 or more"
        raise ConfigError(f"--process_id={index} is out of range: pass {valid}, 0 on the host of "
                          "--coordinator_address and a different one on each process")
    if cluster.cluster_timeout.value <= 0:
        raise ConfigError(f"--cluster_timeout={cluster.cluster_timeout.value} must be a positive number of seconds")
    if cluster.peer_timeout.value < 2:
        raise ConfigError(f"--peer_timeout={cluster.peer_timeout.value} must be at least 2 seconds (each process "
                          "writes a beat every second)")
    return True
