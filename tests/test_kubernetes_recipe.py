"""docs/scaling.md's Kubernetes recipe and the Dockerfile it builds: nothing here runs a cluster or builds the image.

- The JobSets (the page's ```yaml blocks after `<!-- jobset-tpu -->` and `<!-- jobset-gpu -->`) parse, their
  workers run `transformer-jax train` with flags the command defines, with --multihost, and a workdir and
  compilation cache in a bucket; the GPU one names the coordinator by the hostname its JobSet gives worker 0 and
  as many processes as it runs.
- Their failure policies restart on the exit status of a stop with a checkpoint (SIGTERM) and fail on those of a
  mistake and of a program that failed on the device: the Job's failure message is built as Kubernetes' Job
  controller builds it and matched with the JobSet's own patterns.
- The XPK lines run the same training as the JobSets, and XPK's restart rule (restart on 42 and 127-255) restarts
  on the SIGTERM status only.
- The Dockerfile installs Python at pyproject's lowest version, the Makefile's `make demo` extras plus gcs, JAX's
  accelerator extra pinned as the page's GPU recipe pins it, and runs the installed command.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib

import pytest
import yaml

from runs import ROOT
from test_readme import bash_blocks, command_flags, marked_block
from transformer_jax.cli.user_errors import DEVICE_ERROR_EXIT, TERMINATED_EXIT, USER_ERROR_EXIT

SCALING = ROOT / "docs" / "scaling.md"
DOCKERFILE = ROOT / "Dockerfile"
JOBSETS = ("jobset-tpu", "jobset-gpu")
# XPK's restart rule (xpk/commands/workload.py, get_restart_exit_codes): with --max-restarts above 0 a worker's
# exit status 42 or 127-255 restarts the workload; a podFailurePolicy fails it on any other.
XPK_RESTART_CODES = {42, *range(127, 256)}


def jobset(marker: str) -> dict:
    path, text = marked_block(marker, "yaml")
    assert path == SCALING
    document = yaml.safe_load(text)
    assert document["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and document["kind"] == "JobSet"
    return document


def workers(document: dict) -> tuple[dict, dict]:
    """The JobSet's one replicated job's Job spec and its one container."""
    (replicated,) = document["spec"]["replicatedJobs"]
    job = replicated["template"]["spec"]
    (container,) = job["template"]["spec"]["containers"]
    return job, container


def entrypoint() -> list[str]:
    """The Dockerfile's ENTRYPOINT, in its exec (JSON) form."""
    (line,) = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ENTRYPOINT ")]
    return json.loads(line.removeprefix("ENTRYPOINT "))


def container_argv(container: dict) -> list[str]:
    """What the container runs: its command (or the image's entry point) and its args."""
    return [*(container.get("command") or entrypoint()), *container.get("args", [])]


def flag_values(argv: list[str]) -> dict[str, str]:
    """`--name=value` (and `--name` alone, as "") of a command line."""
    return {arg[2:].partition("=")[0]: arg.partition("=")[2] for arg in argv if arg.startswith("--")}


def unknown_train_flags(values: dict[str, str]) -> set[str]:
    """The flags `transformer-jax train` does not define (`--config.KEY=VALUE` is its --config flag's override)."""
    return {name.split(".")[0] for name in values} - command_flags()["train"]


def job_failure_message(container: str, exit_code: int, rule_index: int) -> str:
    """The message Kubernetes' Job controller gives a Job failed by a FailJob rule of its podFailurePolicy on an exit
    code (pkg/controller/job/pod_failure_policy.go)."""
    return (f"Container {container} for pod default/base-workers-0-3-x7k2p failed with exit code {exit_code} "
            f"matching FailJob rule at index {rule_index}")


def jobset_action(document: dict, reason: str, message: str) -> str:
    """The JobSet controller's action for a child Job failed with `reason` and `message`: the first rule whose
    reasons and message patterns both match (an empty list matches anything); RestartJobSet when none does."""
    for rule in document["spec"]["failurePolicy"].get("rules", []):
        reasons, patterns = rule.get("onJobFailureReasons", []), rule.get("onJobFailureMessagePatterns", [])
        if (not reasons or reason in reasons) and (not patterns or any(re.search(p, message) for p in patterns)):
            return rule["action"]
    return "RestartJobSet"


def pod_failure_rule(job: dict, container: str, exit_code: int) -> tuple[int, dict] | None:
    """The index and rule of the Job's podFailurePolicy that a container exiting with `exit_code` matches first."""
    for index, rule in enumerate(job["podFailurePolicy"]["rules"]):
        codes = rule.get("onExitCodes")
        if codes is None or codes.get("containerName", container) != container:
            continue
        if (exit_code in codes["values"]) == (codes["operator"] == "In"):
            return index, rule
    return None


def action_on_exit(document: dict, exit_code: int) -> str:
    """What becomes of the JobSet when one worker exits with `exit_code`, the others running on."""
    job, container = workers(document)
    assert job["backoffLimit"] == 0  # a worker's first failure fails its Job: no worker restarts alone
    assert job["template"]["spec"]["restartPolicy"] == "Never"
    matched = pod_failure_rule(job, container["name"], exit_code)
    if matched is None:
        return jobset_action(document, "BackoffLimitExceeded", "Job has reached the specified backoff limit")
    index, rule = matched
    assert rule["action"] == "FailJob"
    return jobset_action(document, "PodFailurePolicy", job_failure_message(container["name"], exit_code, index))


@pytest.mark.parametrize("marker", JOBSETS)
def test_the_jobsets_workers_train_with_real_flags_and_a_bucket(marker: str):
    document = jobset(marker)
    job, container = workers(document)
    argv = container_argv(container)
    assert argv[:2] == ["transformer-jax", "train"], argv
    values = flag_values(argv[2:])
    unknown = unknown_train_flags(values)
    assert not unknown, f"{marker}: transformer-jax train has no flags {sorted(unknown)}"
    assert "multihost" in values
    for flag in ("workdir", "compilation_cache", "config.data.prepared"):
        assert values.get(flag, "").startswith("gs://BUCKET/"), f"{marker}: --{flag}={values.get(flag)}"
    assert values["compilation_cache"].startswith(values["workdir"] + "/")
    assert job["parallelism"] == job["completions"]


def test_the_tpu_jobset_fills_a_v5e_256_slice_and_auto_detects_it():
    job, container = workers(jobset("jobset-tpu"))
    selector = job["template"]["spec"]["nodeSelector"]
    assert selector["cloud.google.com/gke-tpu-topology"] == "16x16"
    chips = container["resources"]["limits"]["google.com/tpu"]
    assert job["parallelism"] * chips == 256
    values = flag_values(container_argv(container)[2:])
    assert not {"coordinator_address", "num_processes", "process_id"} & set(values)  # GKE's TPU hostnames do
    assert int(values["config.data.tokens_per_batch"]) >= 256 * 256  # a 256-token row for each chip


def test_the_gpu_jobset_names_worker_0_as_coordinator_and_counts_its_processes():
    document = jobset("jobset-gpu")
    job, container = workers(document)
    values = flag_values(container_argv(container)[2:])
    assert int(values["num_processes"]) == job["parallelism"]
    # JobSet's hostname of worker 0: <jobset>-<replicated job>-<job index>-<pod index>.<subdomain (the jobset)>.
    name, (replicated,) = document["metadata"]["name"], document["spec"]["replicatedJobs"]
    assert document["spec"]["network"]["enableDNSHostnames"] is True
    host, _, port = values["coordinator_address"].rpartition(":")
    assert host == f"{name}-{replicated['name']}-0-0.{name}" and port.isdigit()
    # --process_id is the Job's completion index, through an env var the container defines ($(VAR) expansion).
    variable = re.fullmatch(r"\$\((\w+)\)", values["process_id"]).group(1)
    (env,) = [env for env in container["env"] if env["name"] == variable]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert job["completionMode"] == "Indexed"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8


@pytest.mark.parametrize("marker", JOBSETS)
def test_a_stop_with_a_checkpoint_restarts_and_a_mistake_fails(marker: str):
    document = jobset(marker)
    # Preempted or told to stop: the checkpoint is saved, the restart resumes it, and does not use up maxRestarts.
    assert action_on_exit(document, TERMINATED_EXIT) == "RestartJobSetAndIgnoreMaxRestarts"
    # A user error or a program failed on the device stops the same way at every start: no restart.
    assert action_on_exit(document, USER_ERROR_EXIT) == "FailJobSet"
    assert action_on_exit(document, DEVICE_ERROR_EXIT) == "FailJobSet"
    # Anything else (a traceback, a worker killed): a restart, counted against maxRestarts.
    assert action_on_exit(document, 1) == action_on_exit(document, 137) == "RestartJobSet"
    assert document["spec"]["failurePolicy"]["maxRestarts"] > 0
    assert document["spec"]["failurePolicy"]["restartStrategy"] == "BlockingRecreate"


def test_the_failure_policy_check_tells_the_statuses_apart():
    """The check on JobSets that get it wrong: a pattern that also fails on 143, a Job with no FailJob rule."""
    document = jobset("jobset-tpu")
    document["spec"]["failurePolicy"]["rules"][0]["onJobFailureMessagePatterns"] = [
        "failed with exit code (2|3|143) matching FailJob rule"]
    assert action_on_exit(document, TERMINATED_EXIT) == "FailJobSet"
    document = jobset("jobset-tpu")
    workers(document)[0]["podFailurePolicy"]["rules"] = []
    assert action_on_exit(document, USER_ERROR_EXIT) == "RestartJobSet"  # a mistake would restart, counted


def xpk_lines() -> list[list[str]]:
    """The page's `xpk workload create` command lines, as words."""
    lines = [line for block in bash_blocks(SCALING.read_text(encoding="utf-8")) for line in block.splitlines()
             if line.startswith("xpk workload create ")]
    return [shlex.split(line) for line in lines]


def test_the_xpk_lines_run_the_jobsets_training_and_restart_on_sigterm_only():
    lines = xpk_lines()
    assert len(lines) == 2
    commands = {}
    for words in lines:
        values = {word[2:].partition("=")[0]: word.partition("=")[2] for word in words if word.startswith("--")}
        assert int(values["max-restarts"]) > 0 and "restart-on-exit-codes" not in values
        commands["tpu" if "tpu-type" in values else "gpu"] = (values, shlex.split(values["command"]))
    assert TERMINATED_EXIT in XPK_RESTART_CODES and not {USER_ERROR_EXIT, DEVICE_ERROR_EXIT} & XPK_RESTART_CODES
    # The TPU line trains as the TPU JobSet does; both lines give train only its own flags.
    _, container = workers(jobset("jobset-tpu"))
    tpu_values, tpu_argv = commands["tpu"]
    assert tpu_argv == container_argv(container)
    assert tpu_values["tpu-type"] == "v5litepod-256" and tpu_values["docker-image"] == container["image"]
    gpu_values, gpu_argv = commands["gpu"]
    assert gpu_argv[:2] == ["transformer-jax", "train"]
    assert not unknown_train_flags(flag_values(gpu_argv[2:]))
    assert flag_values(gpu_argv[2:])["num_processes"] == "$NNODES" and gpu_values["num-nodes"] == "2"
    # XPK's variables reach the worker's shell unexpanded (the page escapes them as \$ in double quotes).
    assert flag_values(gpu_argv[2:])["coordinator_address"] == "$JAX_COORDINATOR_ADDRESS:$JAX_COORDINATOR_PORT"


def dockerfile_runs() -> list[list[str]]:
    """The words of the Dockerfile's `RUN pip install` lines."""
    return [shlex.split(line.removeprefix("RUN ")) for line in DOCKERFILE.read_text().splitlines()
            if line.startswith("RUN pip install ")]


def extras(spec: str) -> set[str]:
    """The extras of a requirement such as `.[train,gcs]`."""
    match = re.fullmatch(r"[\w.\-]*\[([\w,\-]+)\].*", spec)
    return set(match.group(1).split(",")) if match else set()


def test_the_dockerfile_installs_what_the_makefile_and_the_gpu_recipe_install():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    text = DOCKERFILE.read_text()
    # Python at the lowest version the package supports.
    base = re.search(r"^FROM python:(\d+\.\d+)\S*$", text, re.M).group(1)
    assert pyproject["project"]["requires-python"] == f">={base}"
    package, jax_line = dockerfile_runs()
    # The package, not editable, with make demo's extras (the Makefile's install) and gcs for gs:// workdirs.
    makefile = (ROOT / "Makefile").read_text()
    installed = makefile[makefile.index("$(VENV)/.installed:"):].split("\n\n", 1)[0]  # make demo's install
    demo = re.search(r"pip install -q -e '(\.\[[\w,]+\])'", installed).group(1)
    (spec,) = [word for word in package[2:] if not word.startswith("-")]
    assert "-e" not in package and spec.startswith(".[")
    assert extras(spec) == extras(demo) | {"gcs"} and extras(spec) <= set(pyproject["project"]["optional-dependencies"])
    # JAX's extra for the accelerator, pinned to the installed jax as the page's GPU recipe pins its CUDA plugin.
    (jax_spec,) = [word for word in jax_line[2:] if not word.startswith("-")]
    name, pin = jax_spec.split("==")
    assert name == "jax[${JAX_EXTRA}]"
    gpu_install = re.search(r'^pip install "jax\[cuda\$CUDA\]==(.+)"$', SCALING.read_text(encoding="utf-8"), re.M)
    assert pin == gpu_install.group(1)
    # The ARG's default is the tpu extra's own requirement; the page builds with extras JAX has.
    default = re.search(r"^ARG JAX_EXTRA=(\w+)$", text, re.M).group(1)
    assert f"jax[{default}]" in " ".join(pyproject["project"]["optional-dependencies"][default])
    built = set(re.findall(r"docker build --build-arg JAX_EXTRA=(\w+) ", SCALING.read_text(encoding="utf-8")))
    assert built == {"tpu", "cuda12"}


def test_the_image_runs_the_installed_command_built_from_the_packages_sources():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert entrypoint() == ["transformer-jax"]
    assert "transformer-jax" in pyproject["project"]["scripts"]
    # What the image copies holds every package's directory, and what pip reads to build it.
    copied = {source for line in DOCKERFILE.read_text().splitlines() if line.startswith("COPY ")
              for source in line.split()[1:-1]}
    directories = pyproject["tool"]["setuptools"]["package-dir"]
    for package in pyproject["tool"]["setuptools"]["packages"]:
        directory = directories.get(package, package.replace(".", "/"))
        assert directory.split("/")[0] in copied, f"the Dockerfile does not copy {directory} ({package})"
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= copied
