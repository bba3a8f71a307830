"""What train.py and eval.py share: one-line errors for mistakes a user can make, Ctrl-C, workdir checks and ownership."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import shlex
import shutil
import sys
import time
import traceback
import types
from typing import Any, Iterator, TextIO

from absl import flags

from transformer_jax.base import (
    default_cache_dir,
    exists,
    is_dir,
    is_local,
    list_names,
    make_dirs,
    remove,
    storage_errno,
    storage_error,
    storage_remedy,
    unique_name,
    use_compilation_cache,
    write_atomically,
)
from transformer_jax.base import workdir as layout
from transformer_jax.cli.lock import owning
from transformer_jax.errors import ConfigError, DeviceError, UserError

# Exit status of a run stopped by a user error (bad flag, config value, data, checkpoint).
USER_ERROR_EXIT = 2
# Exit status of a run stopped because a program failed on the device (errors.DeviceError).
DEVICE_ERROR_EXIT = 3
# Exit status of a command stopped by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED_EXIT = 130
# Exit status of a command whose standard output was closed by its reader (128 + SIGPIPE, as shells report it).
BROKEN_PIPE_EXIT = 141
# Exit status of a command stopped by SIGTERM, unless a rerun resumes it (train.py: 0).
TERMINATED_EXIT = 143


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn a UserError into one line on stderr and exit status 2 (3 for a DeviceError: a program failed on the
    device); any other exception is a bug and keeps its traceback.

    An OSError of the machine's storage (a full disk, a read-only file system) that reached this far
    unnamed is one line as well: it is no bug, and its traceback would hide the one thing to do.
    A closed standard output is refused before any work: what the command prints would be lost.
    """
    if sys.stdout is None:
        print("error: standard output is closed, so what this command prints (scores, translations) would be "
              "lost; run it with standard output open (redirect it to a file: > out.txt)", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    sys.stdout = NamedOutput(sys.stdout)
    try:
        yield
    except UserError as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        print(f"error: {message}", file=sys.stderr)
        sys.exit(DEVICE_ERROR_EXIT if isinstance(error, DeviceError) else USER_ERROR_EXIT)
    except BrokenPipeError:  # the reader of standard output is gone (`| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes it
        sys.exit(BROKEN_PIPE_EXIT)
    except OSError as error:
        named = storage_error(error, "a write (to a file or a log)")
        if named is None:
            raise
        print(f"error: {named}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    finally:
        if isinstance(sys.stdout, NamedOutput):
            sys.stdout = sys.stdout.stream


class NamedOutput:
    """Standard output whose failing writes say so: a full device behind `> FILE` is one line naming it."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        with self._named():
            return self.stream.write(text)

    def flush(self) -> None:
        with self._named():
            self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        try:
            yield
        except OSError as error:
            named = storage_error(error, "writing to standard output", f"{storage_remedy(error)} where standard "
                                  "output goes (or redirect it elsewhere) and run the same command again")
            if named is None:
                raise  # a reader that went away (BrokenPipeError) is not a fault of the storage
            os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())  # what is left cannot fail again
            raise named from None


def _config_path(argv: list[str]) -> str | None:
    """The file named by the last --config on the command line (before any `:argument`), or None."""
    path = None
    for index, arg in enumerate(argv[1:], start=1):
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1].split(":", 1)[0]
        elif arg == "--config" and index + 1 < len(argv):
            path = argv[index + 1].split(":", 1)[0]
    return path


def _config_file_failure(path: str | None, error: Exception) -> str:
    """One line saying where the config file's own code failed (a syntax error, a NameError, ...)."""
    if isinstance(error, SyntaxError):
        return f"config file {error.filename}:{error.lineno}: {error.msg}"
    frames = traceback.extract_tb(error.__traceback__)
    inside = [frame for frame in frames if path and os.path.abspath(frame.filename) == os.path.abspath(path)]
    where = f"{inside[-1].filename}:{inside[-1].lineno}" if inside else path
    detail = (str(error).splitlines() or [""])[0]
    return f"config file {where}: {type(error).__name__}: {detail}"


# The configs that ship with the package (the checkout's configs/, installed as transformer_jax.configs).
PACKAGED_CONFIGS = "transformer_jax.configs"
# The flags that print a command's help (its docstring and its flags) and exit 0.
HELP = ("--help", "-h", "-?", "--helpshort")


def packaged_config(value: str) -> str:
    """--config's value with a packaged config's name (`demo`, `parallel_text:DIR,SRC,TGT`; also `demo.py` or
    `configs/demo.py` where no such file is here) replaced by the installed file's path; else unchanged."""
    import importlib.resources

    path, colon, argument = value.partition(":")
    if os.path.exists(path) or not path or os.path.dirname(path) not in ("", "configs"):
        return value
    name = os.path.basename(path).removesuffix(".py")
    try:
        installed = importlib.resources.files(PACKAGED_CONFIGS) / f"{name}.py"
    except ModuleNotFoundError:
        return value
    return f"{installed}{colon}{argument}" if installed.is_file() else value


def packaged_config_names() -> list[str]:
    """The names of the packaged configs (`--config=NAME`)."""
    import importlib.resources

    try:
        files = importlib.resources.files(PACKAGED_CONFIGS).iterdir()
    except ModuleNotFoundError:
        return []
    return sorted(item.name.removesuffix(".py") for item in files if item.name.endswith(".py")
                  and not item.name.startswith("_"))


def _with_packaged_configs(argv: list[str]) -> list[str]:
    """argv with each --config value naming a packaged config replaced by its file (`packaged_config`)."""
    resolved = list(argv)
    for index, arg in enumerate(argv[1:], start=1):
        if arg.startswith("--config="):
            resolved[index] = "--config=" + packaged_config(arg.split("=", 1)[1])
        elif arg == "--config" and index + 1 < len(argv):
            resolved[index + 1] = packaged_config(argv[index + 1])
    return resolved


def command_help(module: types.ModuleType) -> str:
    """A command's --help: its module's docstring, then its flags (those it defines, and the shared ones it uses)."""
    listed = [line for line in flags.FLAGS.module_help(module.__name__).splitlines()
              if line.strip() and line.strip() != f"{module.__name__}:"]  # not absl's line naming the module
    if any(line.startswith("  --config:") for line in listed):
        listed.append(f"  {CONFIG_HELP}: list every run config key with its default and meaning")
    return "{}\n\nflags:\n{}\n".format((module.__doc__ or "").strip(), "\n".join(listed))


def refuse_blank(holder: flags.FlagHolder, needed: str) -> None:
    """Refuse a blank value of a name-giving flag (`--workdir=`, `--output=' '`) when the command line is parsed,
    before any work: "--NAME is empty; pass NEEDED", where a message quoting it would show '' (or a path of
    spaces would be made). A flag left out keeps its default or its required-flag line; a multi-string
    flag is blank when every value is."""
    def named(value: Any) -> bool:
        values = value if isinstance(value, list) else [value]
        if value is not None and not "".join(part for v in values for part in str(v).split(",")).strip():
            raise ConfigError(f"--{holder.name} is empty; pass {needed}")
        return True

    flags.register_validator(holder.name, named)


def register_key_flags(holders: list[flags.FlagHolder], depth: int = 2) -> None:
    """Make the flags key flags of the module `depth` frames up (the one that called the function defining them),
    so that the command's --help lists them."""
    module = sys._getframe(depth).f_globals["__name__"]  # noqa: SLF001 - absl's own way to name a calling module
    for holder in holders:
        flags.FLAGS.register_key_flag_for_module(module, flags.FLAGS[holder.name])


def unexpected_argument(word: str, module: types.ModuleType) -> str:
    """The line refusing a word on the command line that is no flag (every command takes flags alone), naming the
    flag of the command's `module` it was probably meant for: one it names (`split=dev`), one whose choices hold
    it (`dev`: --split), --config for a .py file, else the module's `BARE_WORD_FLAG` (translate: --input)."""
    own = {flag.name: flag for flag in flags.FLAGS.get_key_flags_for_module(module.__name__)}
    name, equals, _ = word.lstrip("-").partition("=")
    choices = [flag.name for flag in own.values() if word in (getattr(flag.parser, "enum_values", None) or ())]
    bare = getattr(module, "BARE_WORD_FLAG", None)
    if bare is not None and flags.FLAGS[bare.name].present and not isinstance(flags.FLAGS[bare.name], flags.MultiFlag):
        bare = None  # given already: the word is not its value
    if equals and name in own:
        meant = f"--{word.lstrip('-')}"
    elif choices:
        meant = f"--{choices[0]}={word}"
    elif word.endswith(".py") and "config" in own:
        meant = f"--config={word}"
    elif bare is not None:
        meant = f"--{bare.name}={word}"
    else:
        return f"unexpected argument {word!r}: this command takes flags only (see --help)"
    return f"unexpected argument {word!r}; pass it as {shlex.quote(meant)} (see --help)"


def parse_flags(argv: list[str], module: types.ModuleType | None = None) -> list[str]:
    """absl flag parsing where a bad flag, config file or --config override is one line and exit status 2;
    `--config_help` prints every run config key with its default and meaning (docs/configuration.md's source);
    with the command's `module`, --help prints its docstring and flags. A --config naming a packaged config
    (`--config=demo`) reads the installed file."""
    from absl import flags

    if CONFIG_HELP in argv[1:]:
        from transformer_jax.config import plain_text

        print(plain_text(), end="")
        sys.exit(0)
    if module is not None and any(arg in HELP for arg in argv[1:]):
        print(command_help(module), end="")
        sys.exit(0)
    argv = _with_packaged_configs(argv)

    path = _config_path(argv)
    if path and not path.endswith(".json") and "://" not in path and not os.path.exists(path):
        named = os.path.dirname(path) in ("", "configs")  # a name, as a packaged config's would be
        shipped = (f", and no config of that name ships with the package; pass a config file's path, or one of "
                   f"{', '.join(packaged_config_names())}") if named else "; pass the path of a config file"
        print(f"error: --config={path}: no such file{shipped}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    if path and path.endswith(".json"):
        print(f"error: --config={path} is a JSON file, but a config is a Python file defining get_config() "
              f"(see configs/); to rerun a run's saved settings pass --config=configs/rerun.py:{path}",
              file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    from absl import logging as absl_logging

    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.ERROR)  # ml_collections' own warnings would precede our one line
    try:
        remaining = flags.FLAGS(argv)
        if len(remaining) > 1:  # absl leaves the words that are no flag: no command takes any
            print(f"error: {unexpected_argument(remaining[1], module or sys.modules['__main__'])}", file=sys.stderr)
            sys.exit(USER_ERROR_EXIT)
        if "config" in flags.FLAGS:
            getattr(flags.FLAGS.config, "keys")  # a config file loads lazily: fail here, not mid-run
        return remaining
    except Exception as error:  # noqa: BLE001 - sorted below: the command line, or the config file's own code
        returned_none = re.search(r"--config must have a value other than None|NoneType>?\.\w+ does not exist",
                                  str(error).replace("'", ""))
        if path and returned_none:  # get_config() gave None: absl's and ml_collections' wording name no cause
            print(f"error: --config={path}: get_config() returned None (a missing return statement?); it must "
                  "return the run's settings: start from transformer_jax.config.default_config() (see configs/)",
                  file=sys.stderr)
            sys.exit(USER_ERROR_EXIT)
        # ml_collections re-raises a TypeError/ValueError of the config file as a new one holding the traceback,
        # which absl wraps again: the config file's own error is the innermost of the chain.
        required = re.search(r"Flag (--\w+) must have a value other than None", str(error))
        if required and required.group(1) != "--config":
            print(f"error: {required.group(1)} is required; see --help", file=sys.stderr)
            sys.exit(USER_ERROR_EXIT)
        original = _config_file_error(error, path) if "Error whilst parsing config file" in str(error) else error
        if isinstance(original, TypeError) and "get_config()" in str(original):
            detail = _get_config_arguments(path, original, argv)
        elif isinstance(original, UserError):
            detail = str(original).splitlines()[0]
        elif isinstance(original, SyntaxError) or _raised_in(original, path):
            detail = f"{_config_file_failure(path, original)}; a config is a Python file defining get_config()"
        elif isinstance(error, (flags.Error, AttributeError, KeyError, TypeError, ValueError, OSError)):
            # ml_collections writes "'key'\nDid you mean ..." and multi-line file errors: keep one line.
            lines = [line.strip() for line in str(error).replace("\\n", "\n").splitlines() if line.strip()]
            detail = " ".join(lines[-2:] if isinstance(error, OSError) else lines).replace("'", "").replace("\\", "")
            configs = " and configs/" if "config" in flags.FLAGS else ""
            detail = f"invalid command line: {detail}; see --help{configs}"
        else:
            raise
        print(f"error: {detail}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    finally:  # the level the command line set (--verbosity), else the one before parsing
        given = "verbosity" in flags.FLAGS and flags.FLAGS["verbosity"].present
        absl_logging.set_verbosity(flags.FLAGS["verbosity"].value if given else verbosity)


# The flag that lists the run config's keys (parse_flags); named in --config's help.
CONFIG_HELP = "--config_help"


def _config_file_error(error: BaseException, path: str | None) -> BaseException:
    """The error of the config file's own code in the chain that ended in `error` (following __cause__, then
    __context__): the outermost one raised in `path`, else the innermost."""
    chain, seen = [error], {id(error)}
    while (inner := chain[-1].__cause__ or chain[-1].__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        chain.append(inner)
    return next((e for e in chain if _raised_in(e, path)), chain[-1])


def _get_config_arguments(path: str | None, error: TypeError, argv: list[str]) -> str:
    """The line for a --config=FILE[:ARGUMENT] whose argument get_config() does not take (or lacks)."""
    given = next((arg.split("=", 1)[1] for arg in reversed(argv) if arg.startswith("--config=")), path or "")
    if "missing" in str(error):
        return (f"--config={given}: get_config() of {path} needs an argument after a colon "
                f"(--config={path}:ARGUMENT; for configs/rerun.py the run's config.json: "
                f"--config=configs/rerun.py:RUN/config.json)")
    return f"--config={given}: get_config() of {path} takes no argument; drop the ':{given.partition(':')[2]}'"


def _raised_in(error: BaseException, path: str | None) -> bool:
    """Whether `error` was raised by code in file `path` (the config file), not by the flag parser."""
    return bool(path) and any(os.path.abspath(frame.filename) == os.path.abspath(path)
                              for frame in traceback.extract_tb(error.__traceback__))


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


def initialize_distributed(coordinator_address: str | None, num_processes: int | None,
                           process_id: int | None, timeout: int = 300) -> None:
    """Join a multi-process run (jax.distributed.initialize); a wrong setting is one ConfigError line.

    A process other than 0 first waits, at most `timeout` seconds and interruptibly, for the coordinator to
    answer (wait_for_coordinator); every process then waits at most `timeout` seconds for all of them to
    register (join_watchdog), a wait that ends in one line of ours, never in JAX's abort.
    On CPU the processes exchange data with JAX's default CPU collectives (gloo over TCP).
    """
    import jax

    # JAX's preemption service would install a C++ SIGTERM handler here that replaces Python's for good:
    # a SIGTERM during start-up, compiling or the test translation would then be swallowed. Its sync point
    # is driven by SIGTERM alone (jaxlib's only notifier), which our own handler and the loop's per-step
    # agreement (run/preemption.py) already hear, on every platform and at every point of the run.
    jax.config.update("jax_enable_preemption_service", False)
    if coordinator_address is not None and not coordinator_address.rpartition(":")[2].isdigit():
        raise ConfigError(f"--coordinator_address={coordinator_address} has no port; pass HOST:PORT of process 0 "
                          "(e.g. --coordinator_address=10.0.0.2:8476), the same on every process")
    if coordinator_address is not None and process_id not in (None, 0):
        wait_for_coordinator(coordinator_address, timeout)
    try:
        with join_watchdog(timeout, _not_joined(coordinator_address, num_processes, process_id, timeout)):
            jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                       initialization_timeout=timeout + JAX_JOIN_MARGIN_SECONDS)
    except (ValueError, RuntimeError) as error:
        detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ConfigError(
            f"cannot join the multi-process run ({detail}); on a cluster without auto-detection pass "
            "--coordinator_address=HOST:PORT --num_processes=N --process_id=I"
        ) from None
    native_output_to_stderr()


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

    def use_compilation_cache(self, workdir: str) -> str:
        """Point JAX's compilation cache where --compilation_cache says (base.compile_cache)."""
        return use_compilation_cache(self.compilation_cache.value, workdir, self.multihost.value)

    def join(self) -> None:
        """With --multihost, join the run (jax.distributed); then start JAX's backends (start_backends)."""
        if self.multihost.value:  # the flags were checked as they were parsed (check_cluster_flags)
            initialize_distributed(self.coordinator_address.value, self.num_processes.value, self.process_id.value,
                                   self.cluster_timeout.value)
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
    )
    register_key_flags([getattr(cluster, field.name) for field in dataclasses.fields(ClusterFlags)])
    # As the command line is parsed, before any work; a ConfigError of a validator reaches parse_flags as it is
    # (absl turns only its own ValidationError into a message of its own), so it is the command's one line.
    flags.register_multi_flags_validator([holder.name for holder in (cluster.multihost, *_multihost_only(cluster))],
                                         lambda _: check_cluster_flags(cluster))
    return cluster


def _multihost_only(cluster: ClusterFlags) -> tuple[flags.FlagHolder, ...]:
    """The flags that mean something only with --multihost."""
    return cluster.coordinator_address, cluster.num_processes, cluster.process_id, cluster.cluster_timeout


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
    return True


def saved_steps(workdir: str, names: list[str] | None = None) -> list[int]:
    """The steps of the checkpoints written whole in `workdir` (`names`: its checkpoints folder's, if read)."""
    directory = layout.run_path(workdir, layout.CHECKPOINTS)
    if names is None:
        names = list_names(directory) if is_dir(directory) else []
    return sorted(int(name) for name in names if name.isdigit())


def training_kept(workdir: str) -> str:
    """What a stop before the end of training leaves, read from the workdir: the newest checkpoint, a checkpoint cut
    short, or the logged steps that no checkpoint keeps."""
    from transformer_jax.base import read_records

    directory = layout.run_path(workdir, layout.CHECKPOINTS)
    names = list_names(directory) if is_dir(directory) else []
    steps = saved_steps(workdir, names)
    cut = sorted(int(name.split(".")[0]) for name in names if name.split(".")[0].isdigit() and not name.isdigit())
    cut_short = (f"; the checkpoint of step {cut[-1]} was cut short (the next start removes what it left)"
                 if cut and (not steps or cut[-1] > max(steps)) else "")
    if steps:
        return f"the newest checkpoint is step {max(steps)}{cut_short}"
    metrics = layout.run_path(workdir, layout.METRICS)
    try:
        logged = [r["step"] for r in read_records(metrics) if r.get("split") == "train"] if exists(metrics) else []
    except Exception:  # noqa: BLE001 - a damaged log: say what the checkpoints say
        logged = []
    if logged:
        return (f"no checkpoint was written{cut_short}; the {max(logged)} steps logged are lost and a rerun starts "
                "over")
    return "nothing; training had not started (its own Ctrl-C saves a checkpoint and stops)"


def missing_directories(path: str) -> list[str]:
    """The local directories of `path` that do not exist yet, deepest first (none on an object store)."""
    missing: list[str] = []
    if is_local(path):
        directory = os.path.abspath(path)
        while not os.path.exists(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
    return missing


@contextlib.contextmanager
def removed_on_failure(path: str, complete: str) -> Iterator[None]:
    """Remove the local directories a failing block created for `path`, with what they hold, unless `complete` (a
    file the block writes last in `path`) is there: a failed first attempt leaves nothing behind. A directory that
    existed is never removed; a stop (Ctrl-C, SIGTERM) keeps what was made."""
    created = missing_directories(path)
    try:
        yield
    except Exception:
        if created and not os.path.exists(os.path.join(path, complete)):
            shutil.rmtree(created[-1], ignore_errors=True)  # the outermost one
        raise


def ensure_writable_workdir(workdir: str) -> list[str]:
    """Create `workdir` if needed; fail clearly when it cannot be written.

    Returns the local directories this call created, deepest first (none on an object store).
    """
    if not workdir:
        raise ConfigError("--workdir is empty; pass the directory for the run's checkpoints and logs")
    if is_local(workdir) and os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ConfigError(f"workdir {workdir} is a file, not a directory; choose another --workdir")
    if is_local(workdir) and os.path.islink(workdir) and not os.path.exists(workdir):
        raise ConfigError(f"workdir {workdir} is a symbolic link to {os.path.realpath(workdir)}, which does not exist; "
                          "create that directory or fix the link")
    created = missing_directories(workdir)
    # Unique per process and host: hosts sharing the workdir may run processes with equal pids.
    probe = unique_name(os.path.join(workdir, ".write_test"))
    try:
        make_dirs(workdir)
        if is_local(probe):
            with open(probe, "w") as f:
                f.write("ok")
        else:
            write_atomically(probe, "ok")  # one object upload: no temporary object to leave behind
    except OSError as error:
        remedy = (f"make {workdir} writable or choose another --workdir" if storage_errno(error) == errno.EROFS
                  else storage_remedy(error))
        named = storage_error(error, f"writing to the workdir {workdir}", f"{remedy} and run the same command again")
        raise named or ConfigError(
            f"workdir {workdir} is not writable ({error.strerror or error}); choose another --workdir"
        ) from None
    finally:
        if is_local(probe) and os.path.lexists(probe):
            os.remove(probe)
    if not is_local(probe):
        remove(probe)
    return created


@contextlib.contextmanager
def training_workdir(workdir: str) -> Iterator[None]:
    """Create `workdir` and own it (run.lock, see cli/lock.py) while training writes it.

    A first start that fails before it wrote a checkpoint (a data check, a bad vocabulary size, a model that
    does not fit, updates that all went non-finite) removes the workdir it created with everything in it (a
    prepared corpus, the tokenizer, logs): a failed first attempt leaves nothing behind, and its rerun would
    start from nothing anyway. Ctrl-C and SIGTERM keep what was made (a rerun resumes it, the corpus
    included); an existing workdir is never removed.
    """
    created = ensure_writable_workdir(workdir)
    try:
        with owning(workdir):
            yield
    except Exception:
        if created and not saved_steps(workdir):
            shutil.rmtree(created[-1], ignore_errors=True)  # the outermost directory this start created
        raise
    except BaseException:
        for directory in created:  # deepest first; rmdir fails on a directory holding anything
            try:
                os.rmdir(directory)
            except OSError:
                break
        raise
