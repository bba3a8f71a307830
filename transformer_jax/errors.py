"""The one root of every error a user can cause, and its kinds.

`train.py` and `eval.py` print a `UserError` as one line naming the problem and the fix, and exit
with status 2; any other exception is a bug and keeps its traceback. Library callers can catch
`UserError` (or the built-in base each kind also has, e.g. `ValueError` for a bad config value).
"""

from __future__ import annotations

__all__ = ["CheckpointError", "ConfigError", "CorruptCheckpointError", "DataError", "DeviceError", "MeshError",
           "ShapeMismatchError", "StorageError", "TrainingError", "UserError",
           "WorkerError"]


class UserError(Exception):
    """Something a user supplied or asked for cannot be used; the message names it and the fix."""


class ConfigError(UserError, ValueError):
    """A configuration value or command-line setting is invalid."""


class DataError(UserError, ValueError):
    """Input data a user supplied is unusable (missing file, bad encoding, misaligned lines, ...)."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint or run directory cannot be used as asked."""


class ShapeMismatchError(CheckpointError):
    """The checkpoint was saved by a model of other shapes than the config builds."""


class CorruptCheckpointError(CheckpointError):
    """A complete checkpoint directory cannot be read back, or its arrays do not match their checksums."""


class MeshError(ConfigError):
    """The device mesh settings do not fit the devices present."""


class StorageError(UserError, OSError):
    """The machine's storage failed a read or write (a full disk, a read-only or vanished directory); the
    message names the path, what was kept and how to go on. Not a bug: nothing in the run was wrong."""


class WorkerError(UserError, RuntimeError):
    """A worker process a command started was stopped from outside (killed, out of memory); nothing it was making
    is taken as done, and the message says how to go on."""


class TrainingError(UserError, RuntimeError):
    """Training cannot go on (e.g. the loss stays non-finite); the message says why and what to do."""


class DeviceError(TrainingError):
    """A compiled program of the run failed on the device (a runtime error, out of memory, a CUDA-graph capture
    that failed); the message names the program, the attention backend and the setting to change. The commands
    exit with status 3 for it, so that a scheduler can tell it from a bad setting (2)."""
