"""docs/scaling.md's Kubernetes recipe and the Dockerfile it builds: nothing here runs a cluster or builds the image.

- The JobSets (the page's ```yaml blocks after `<!-- jobset-tpu -->` and `<!-- jobset-gpu -->`) parse, their
  workers run `transformer-jax train` with flags the command defines, with --multihost, and a workdir and
  compilation cache in a bucket; the GPU one names the coordinator by the hostname its JobSet gives worker 0 and
  as many processes as it runs.
- Their failure policies restart on the exit status of a stop with a checkpoint (SIGTERM) and fail on those of a
  mistake and of a program that failed on the device: the Job's failure message is built as Kubernetes' Job
  controller builds it and matched with the JobSet's own patterns.
- The cluster they need: the page installs a JobSet release that has those patterns (v0.10 or later), server-side,
  and waits for its controller; both JobSets run as the Kubernetes service account the page creates, to which it
  grants the bucket's role by Workload Identity, on a cluster and node pool it enables for it.
- Each JobSet passes its grace period (terminationGracePeriodSeconds) to the run as its stop budget.
- The XPK lines run the same training as the JobSets, XPK's restart rule (restart on 42 and 127-255) restarts on
  the SIGTERM status only, and each passes its grace period less the 5 s XPK's wrapper takes to relay SIGTERM.
- The Dockerfile installs Python at pyproject's lowest version, the Makefile's `make demo` extras plus gcs, JAX's
  accelerator extra pinned as the page's GPU recipe pins it, all held to constraints.txt, and runs the installed
  command, unbuffered, as a user it creates that is not root.
- constraints.txt pins, exactly, every requirement of the package and its train and gcs extras, each at a version
  pyproject.toml allows, with jax and jaxlib at one version (the accelerator install pins jaxlib to jax's)."""

from __future__ import annotations

import json
import re
import shlex
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from runs import ROOT
from test_readme import bash_blocks, command_flags, marked_block
from transformer_jax.cli.user_errors import DEVICE_ERROR_EXIT, TERMINATED_EXIT, USER_ERROR_EXIT

SCALING = ROOT / "docs" / "scaling.md"
DOCKERFILE = ROOT / "Dockerfile"
CONSTRAINTS = ROOT / "constraints.txt"
JOBSETS = ("jobset-tpu", "jobset-gpu")
# XPK's restart rule (xpk/commands/workload.py, get_restart_exit_codes): with --max-restarts above 0 a worker's
# exit status 42 or 127-255 restarts the workload; a podFailurePolicy fails it on any other.
XPK_RESTART_CODES = {42, *range(127, 256)}
# XPK's wrapper of --command (xpk/core/docker_container.py, get_main_container) traps SIGTERM and relays it to the
# command from a `while kill -0 $PID; do sleep 5; done` loop; bash runs the trap once the `sleep 5` in the
# foreground ends, so the command gets SIGTERM up to 5 s after the pod.
XPK_RELAY_SECONDS = 5
STOP_BUDGET = "config.training.stop_grace_seconds"


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


def pod_spec(document: dict) -> dict:
    """The pod template's spec of the JobSet's workers."""
    return workers(document)[0]["template"]["spec"]


def page_commands() -> list[list[str]]:
    """The words of the page's ```bash lines (continuations joined, comments dropped), in the page's order."""
    return [shlex.split(line, comments=True) for block in bash_blocks(SCALING.read_text(encoding="utf-8"))
            for line in block.splitlines() if line.strip()]


def namespace_of(words: list[str]) -> str:
    """The namespace a kubectl command names (-n NAME or --namespace=NAME), or kubectl's default."""
    if "-n" in words:
        return words[words.index("-n") + 1]
    return flag_values(words).get("namespace", "default")


JOBSET_MANIFESTS = re.compile(r"https://github\.com/kubernetes-sigs/jobset/releases/download/v(\d+)\.(\d+)\.(\d+)/"
                              r"manifests\.yaml")


def test_the_page_installs_a_jobset_release_with_message_patterns_before_applying_a_jobset():
    commands = page_commands()
    (install_at,) = [i for i, words in enumerate(commands) if any(JOBSET_MANIFESTS.fullmatch(w) for w in words)]
    install = commands[install_at]
    # Server-side: the JobSet CRD is applied as JobSet's installation page applies it.
    assert install[:2] == ["kubectl", "apply"] and "--server-side" in install
    assert JOBSET_MANIFESTS.fullmatch(install[install.index("-f") + 1])
    # The JobSets' failure policies match the Jobs' failure messages, which JobSet reads from v0.10.0 on.
    assert any("onJobFailureMessagePatterns" in rule
               for marker in JOBSETS for rule in jobset(marker)["spec"]["failurePolicy"]["rules"])
    version = tuple(int(number) for number in JOBSET_MANIFESTS.fullmatch(install[install.index("-f") + 1]).groups())
    assert version >= (0, 10, 0), f"JobSet v{'.'.join(map(str, version))} has no onJobFailureMessagePatterns"
    # The page waits for JobSet's controller (its webhook admits JobSets), then applies a JobSet.
    (wait_at,) = [i for i, words in enumerate(commands) if words[:1] == ["kubectl"]
                  and "deployment/jobset-controller-manager" in words and {"rollout", "status"} <= set(words)]
    assert namespace_of(commands[wait_at]) == "jobset-system"
    applies = [i for i, words in enumerate(commands) if words[:3] == ["kubectl", "apply", "-f"]]
    assert applies and install_at < wait_at < min(applies)


def test_both_jobsets_run_as_the_service_account_granted_the_buckets_role():
    commands = page_commands()
    (created,) = [words for words in commands if words[:3] == ["kubectl", "create", "serviceaccount"]]
    account, namespace = created[3], namespace_of(created)
    for marker in JOBSETS:
        document = jobset(marker)
        assert pod_spec(document)["serviceAccountName"] == account, marker
        assert document["metadata"].get("namespace", "default") == namespace, marker
    # The bucket's role goes to that account by its Workload Identity principal.
    (grant,) = [words for words in commands if words[:4] == ["gcloud", "storage", "buckets", "add-iam-policy-binding"]]
    values = flag_values(grant)
    assert values["role"] == "roles/storage.objectUser"
    member = re.fullmatch(r"principal://iam\.googleapis\.com/projects/\w+/locations/global/workloadIdentityPools/"
                          r"([\w.-]+)/subject/ns/([\w-]+)/sa/([\w-]+)", values["member"])
    assert member, values["member"]
    pool, member_namespace, member_account = member.groups()
    assert (member_namespace, member_account) == (namespace, account)
    for marker in JOBSETS:  # the bucket the workers write
        workdir = flag_values(container_argv(workers(jobset(marker))[1]))["workdir"]
        assert workdir.startswith(grant[4].rstrip("/") + "/"), (marker, workdir, grant[4])
    # The cluster has that workload pool (its project's), and the node pool runs GKE's metadata server.
    (cluster,) = [words for words in commands if words[:4] == ["gcloud", "container", "clusters", "update"]]
    assert flag_values(cluster)["workload-pool"] == pool == f"{flag_values(cluster)['project']}.svc.id.goog"
    (node_pool,) = [words for words in commands if words[:4] == ["gcloud", "container", "node-pools", "update"]]
    assert flag_values(node_pool)["workload-metadata"] == "GKE_METADATA"
    assert flag_values(node_pool)["cluster"] == cluster[4]


@pytest.mark.parametrize("marker", JOBSETS)
def test_each_jobset_passes_its_grace_period_to_the_run_as_its_stop_budget(marker: str):
    document = jobset(marker)
    grace = pod_spec(document)["terminationGracePeriodSeconds"]
    values = flag_values(container_argv(workers(document)[1])[2:])
    assert float(values[STOP_BUDGET]) == grace > 0, f"{marker}: grace {grace} s, --{STOP_BUDGET}={values[STOP_BUDGET]}"


def xpk_lines() -> list[list[str]]:
    """The page's `xpk workload create` command lines, as words."""
    lines = [line for block in bash_blocks(SCALING.read_text(encoding="utf-8")) for line in block.splitlines()
             if line.startswith("xpk workload create ")]
    return [shlex.split(line) for line in lines]


def without_stop_budget(argv: list[str]) -> list[str]:
    return [arg for arg in argv if not arg.startswith(f"--{STOP_BUDGET}=")]


def test_the_xpk_lines_run_the_jobsets_training_and_restart_on_sigterm_only():
    lines = xpk_lines()
    assert len(lines) == 2
    commands = {}
    for words in lines:
        values = flag_values(words)
        assert int(values["max-restarts"]) > 0 and "restart-on-exit-codes" not in values
        commands["tpu" if "tpu-type" in values else "gpu"] = (values, shlex.split(values["command"]))
    assert TERMINATED_EXIT in XPK_RESTART_CODES and not {USER_ERROR_EXIT, DEVICE_ERROR_EXIT} & XPK_RESTART_CODES
    # The TPU line trains as the TPU JobSet does (its stop budget aside: below); both give train only its own flags.
    _, container = workers(jobset("jobset-tpu"))
    tpu_values, tpu_argv = commands["tpu"]
    assert without_stop_budget(tpu_argv) == without_stop_budget(container_argv(container))
    assert tpu_values["tpu-type"] == "v5litepod-256" and tpu_values["docker-image"] == container["image"]
    gpu_values, gpu_argv = commands["gpu"]
    assert gpu_argv[:2] == ["transformer-jax", "train"]
    assert not unknown_train_flags(flag_values(gpu_argv[2:]))
    assert flag_values(gpu_argv[2:])["num_processes"] == "$NNODES" and gpu_values["num-nodes"] == "2"
    # XPK's variables reach the worker's shell unexpanded (the page escapes them as \$ in double quotes).
    assert flag_values(gpu_argv[2:])["coordinator_address"] == "$JAX_COORDINATOR_ADDRESS:$JAX_COORDINATOR_PORT"


def test_the_xpk_lines_budget_their_grace_period_less_the_wrappers_relay():
    for words in xpk_lines():
        values = flag_values(words)
        grace = int(values["termination-grace-period-seconds"])
        budget = float(flag_values(shlex.split(values["command"]))[STOP_BUDGET])
        assert budget == grace - XPK_RELAY_SECONDS > 0, f"{values['workload']}: grace {grace} s, budget {budget} s"


def dockerfile_lines() -> list[str]:
    return DOCKERFILE.read_text().splitlines()


def dockerfile_runs() -> list[list[str]]:
    """The words of the Dockerfile's `RUN pip install` lines."""
    return [shlex.split(line.removeprefix("RUN ")) for line in dockerfile_lines()
            if line.startswith("RUN pip install ")]


def pip_install_arguments(words: list[str]) -> tuple[list[str], list[str]]:
    """The constraints files (-c FILE, --constraint FILE or =FILE) and the requirements of `pip install`'s
    arguments; other options (--no-cache-dir) take no value here."""
    constraints, requirements, rest = [], [], iter(words)
    for word in rest:
        if word in ("-c", "--constraint"):
            constraints.append(next(rest))
        elif word.startswith("--constraint="):
            constraints.append(word.partition("=")[2])
        elif not word.startswith("-"):
            requirements.append(word)
    return constraints, requirements


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
    (spec,) = pip_install_arguments(package[2:])[1]
    assert "-e" not in package and spec.startswith(".[")
    assert extras(spec) == extras(demo) | {"gcs"} and extras(spec) <= set(pyproject["project"]["optional-dependencies"])
    # JAX's extra for the accelerator, pinned to the installed jax as the page's GPU recipe pins its CUDA plugin.
    (jax_spec,) = pip_install_arguments(jax_line[2:])[1]
    name, pin = jax_spec.split("==")
    assert name == "jax[${JAX_EXTRA}]"
    gpu_install = re.search(r'^pip install "jax\[cuda\$CUDA\]==(.+)"$', SCALING.read_text(encoding="utf-8"), re.M)
    assert pin == gpu_install.group(1)
    # The ARG's default is the tpu extra's own requirement; the page builds with extras JAX has.
    default = re.search(r"^ARG JAX_EXTRA=(\w+)$", text, re.M).group(1)
    assert f"jax[{default}]" in " ".join(pyproject["project"]["optional-dependencies"][default])
    built = set(re.findall(r"docker build --build-arg JAX_EXTRA=(\w+) ", SCALING.read_text(encoding="utf-8")))
    assert built == {"tpu", "cuda12"}


def test_every_pip_install_of_the_image_holds_to_the_constraints_it_copies_first():
    lines = dockerfile_lines()
    installs = [i for i, line in enumerate(lines) if line.startswith("RUN pip install ")]
    assert len(installs) == 2
    for words in dockerfile_runs():
        assert pip_install_arguments(words[2:])[0] == [CONSTRAINTS.name], words
    # Copied, from the checkout's top level, into the working directory the installs run in, before them.
    copies = [i for i, line in enumerate(lines) if line.startswith("COPY ") and CONSTRAINTS.name in line.split()[1:-1]]
    assert copies and copies[0] < installs[0], "the Dockerfile does not copy constraints.txt before its installs"
    assert lines[copies[0]].split()[-1] in (".", "./")
    assert max(i for i, line in enumerate(lines) if line.startswith("WORKDIR ")) < copies[0]
    assert CONSTRAINTS.is_file()


def test_the_image_runs_unbuffered_as_a_user_it_creates_that_is_not_root():
    lines = dockerfile_lines()
    env = dict(word.partition("=")[::2] for line in lines if line.startswith("ENV ")
               for word in shlex.split(line.removeprefix("ENV ")))
    assert env.get("PYTHONUNBUFFERED") == "1"  # each log line reaches `kubectl logs` as it is printed
    (user_at,) = [i for i, line in enumerate(lines) if line.startswith("USER ")]
    user = lines[user_at].split()[1].partition(":")[0]
    assert user not in ("root", "0")
    # A RUN before USER creates it (by name or uid), and gives it the working directory, for a relative --workdir.
    shell = [word for line in lines[:user_at] if line.startswith("RUN ") for word in shlex.split(line[4:]) + ["&&"]]
    commands, command = [], []
    for word in shell:
        if word in ("&&", ";"):
            commands, command = commands + [command], []
        else:
            command.append(word)
    (useradd,) = [command for command in commands if command[:1] == ["useradd"]]
    name = [word for word in useradd[1:] if not word.startswith("-")][-1]
    uids = [useradd[i + 1] for i, word in enumerate(useradd) if word in ("-u", "--uid")]
    assert user in (name, *uids), f"USER {user}: the Dockerfile creates {name} (uid {uids})"
    assert "0" not in uids
    workdir = [line.split()[1] for line in lines[:user_at] if line.startswith("WORKDIR ")][-1]
    assert any(command[:1] == ["chown"] and command[1].partition(":")[0] in (name, *uids) and workdir in command[2:]
               for command in commands), f"the user does not own {workdir}"
    # The installs write the system's Python, which only root can: they come before USER.
    assert max(i for i, line in enumerate(lines) if line.startswith("RUN pip install ")) < user_at


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


def constraint_pins() -> dict[str, Version]:
    """constraints.txt's pins by canonical name; each line (comments and blank lines aside) is one `name==version`."""
    pins: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pin = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\d[\w.+!-]*)", line)
        assert pin, f"constraints.txt: {line!r} is not an exact name==version pin"
        name = canonicalize_name(pin.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = Version(pin.group(2))
    return pins


def test_the_constraints_pin_the_package_and_its_train_and_gcs_extras_at_versions_pyproject_allows():
    pins = constraint_pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional = project["optional-dependencies"]
    needed = [Requirement(spec) for spec in project["dependencies"] + optional["train"] + optional["gcs"]]
    missing = sorted(str(requirement) for requirement in needed if canonicalize_name(requirement.name) not in pins)
    assert not missing, f"constraints.txt pins no version of {missing}"
    # Every pin that pyproject names anywhere (base, any extra) is at a version it allows: its lower bound or above.
    declared = [Requirement(spec) for specs in [project["dependencies"], *optional.values()] for spec in specs]
    for requirement in declared:
        pinned = pins.get(canonicalize_name(requirement.name))
        if pinned is not None:
            assert requirement.specifier.contains(pinned, prereleases=True), f"{requirement}: constraints.txt {pinned}"
    # Only the image's install: none of what only the other extras bring (the tests', libtpu, torch), and jaxlib at
    # jax's version, which the accelerator install (jax[EXTRA]==jax's version) requires.
    image = {canonicalize_name(requirement.name) for requirement in needed}
    others = {canonicalize_name(requirement.name) for requirement in declared} - image - {"transformer-jax"}
    assert others and not (others | {"libtpu", "jax-cuda12-plugin", "jax-cuda13-plugin"}) & set(pins)
    assert pins["jaxlib"] == pins["jax"]
