"""The lowest floor: files (local or gs://), the console, the device mesh and shardings, a run directory's layout,
its lock and its logs.

`files` (atomic writes, listing, moving, on local disks and Cloud Storage) -> `console` (quiet logs,
progress bars) -> `sharding` (the (data, fsdp) mesh, logical-axis rules, shardings, CPU device counts) ->
`workdir` (every file and folder name of a run directory) -> `lock` (one job owns a run directory or a bulk
output: claims, their heartbeat, stale ones taken over) -> `log_records` (a run's JSON-lines logs read
back) -> `tensorboard` (its TensorBoard event files) -> `compile_cache` (JAX's persistent compilation cache) ->
`coordination_service` (JAX's, in a process beside process 0) -> `peer_watch` (a multi-process run whose peer
dies ends in one line on every process).
Beside them, `limits`: how a setting declares its bound or choices, and how a refusal names it.
Nothing here imports another folder of the package but `errors`.
"""

from transformer_jax.base import workdir
from transformer_jax.base.compile_cache import default_cache_dir, use_compilation_cache
from transformer_jax.base.console import quiet_console, say
from transformer_jax.base.files import (
    directory_written_whole,
    exists,
    is_dir,
    is_file,
    is_local,
    list_names,
    make_dirs,
    object_path,
    read_text,
    remove,
    storage_errno,
    storage_error,
    storage_named,
    storage_remedy,
    unique_name,
    write_atomically,
)
from transformer_jax.base.limits import (
    FLAGS,
    FRACTION,
    KEYWORDS,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_INTEGER,
    Bound,
    Spelling,
    as_float32,
    check_declared,
    check_value,
    declared,
    declared_limits,
    is_number,
    run_keys,
)
from transformer_jax.base.lock import Claim, RunLock, WorkdirLockedError, holding, owning
from transformer_jax.base.log_records import check_logs, read_metrics, read_records
from transformer_jax.base.coordination_service import (
    ServiceNotStarted,
    start_coordination_service,
    stop_coordination_service,
)
from transformer_jax.base.peer_watch import (
    DEFAULT_PEER_TIMEOUT,
    PEER_LOST_EXIT,
    announce_end,
    await_verdict_if_lost_peer,
    jax_heartbeat_seconds,
    start_peer_watch,
)
from transformer_jax.base.sharding import (
    BATCH_AXES,
    DATA_AXIS,
    FSDP_AXIS,
    abstract_with_shardings,
    automatic_cpu_devices,
    batch_sharding,
    global_batch,
    init_sharded,
    make_mesh,
    mesh_platform,
    set_cpu_devices,
    state_shardings,
)

__all__ = [
    "Claim",
    "DEFAULT_PEER_TIMEOUT",
    "ServiceNotStarted",
    "start_coordination_service",
    "stop_coordination_service",
    "PEER_LOST_EXIT",
    "announce_end",
    "await_verdict_if_lost_peer",
    "jax_heartbeat_seconds",
    "start_peer_watch",
    "BATCH_AXES",
    "DATA_AXIS",
    "FSDP_AXIS",
    "FLAGS",
    "FRACTION",
    "KEYWORDS",
    "NON_NEGATIVE",
    "POSITIVE",
    "POSITIVE_INTEGER",
    "Bound",
    "Spelling",
    "as_float32",
    "check_declared",
    "check_value",
    "declared",
    "declared_limits",
    "is_number",
    "run_keys",
    "RunLock",
    "WorkdirLockedError",
    "abstract_with_shardings",
    "automatic_cpu_devices",
    "batch_sharding",
    "check_logs",
    "default_cache_dir",
    "directory_written_whole",
    "exists",
    "global_batch",
    "holding",
    "init_sharded",
    "is_dir",
    "is_file",
    "is_local",
    "list_names",
    "make_dirs",
    "object_path",
    "owning",
    "make_mesh",
    "mesh_platform",
    "quiet_console",
    "read_metrics",
    "read_records",
    "read_text",
    "remove",
    "say",
    "set_cpu_devices",
    "state_shardings",
    "storage_errno",
    "storage_error",
    "storage_named",
    "storage_remedy",
    "unique_name",
    "use_compilation_cache",
    "workdir",
    "write_atomically",
]
