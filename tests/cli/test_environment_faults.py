"""Faults of the machine a command runs on, not of its flags: a package missing, a worker process killed.

Each runs the real command in a subprocess whose start-up a `sitecustomize.py` on PYTHONPATH shapes (gcsfs
unimportable, a worker that kills itself), and expects one `error: ...` line, exit 2 and nothing taken as done.
"""

import pathlib
import subprocess
import sys

import pytest

from runs import ROOT, assert_one_line_error, script_env

SMOKE = str(ROOT / "configs" / "smoke.py")

# gcsfs unimportable, whether or not it is installed: a package of that name earlier on the path that fails.
NO_GCSFS = {"gcsfs/__init__.py": "raise ImportError(\"No module named 'gcsfs'\", name='gcsfs')\n"}

# A spawned worker process (multiprocessing's `--multiprocessing-fork` start) kills itself with SIGKILL, as the
# kernel's out-of-memory killer would, the moment it opens a training shard to write it.
KILLED_WORKER = {"sitecustomize.py": (
    "import os, sys\n"
    "if '--multiprocessing-fork' in sys.argv:\n"
    "    def _kill_on_shard(event, args):\n"
    "        if event == 'open' and isinstance(args[0], str) and '.tokens' in args[0] and 'w' in str(args[1]):\n"
    "            os.kill(os.getpid(), 9)\n"
    "    sys.addaudithook(_kill_on_shard)\n")}


def run_shaped(shim: pathlib.Path, files: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`python ARGS` from the repository root with `files` written under `shim`, which leads PYTHONPATH."""
    for name, text in files.items():
        (shim / name).parent.mkdir(parents=True, exist_ok=True)
        (shim / name).write_text(text)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=script_env(PYTHONPATH=str(shim)),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args, path", [
    (["train.py", f"--config={SMOKE}", "--workdir=gs://bucket/run"], "gs://bucket/run"),
    (["eval.py", "--workdir=gs://bucket/run"], "gs://bucket/run"),
    (["-m", "transformer_jax.cli.prepare", f"--config={SMOKE}", "--output=gs://bucket/corpus"], "gs://bucket/corpus"),
], ids=["train", "eval", "prepare"])
def test_a_gs_path_without_gcsfs_names_the_path_the_package_and_the_install(tmp_path, args, path):
    result = run_shaped(tmp_path, NO_GCSFS, *args)
    assert_one_line_error(result, path, "needs the gcsfs package", "pip install 'transformer-jax[gcs]'")
    assert "ImportError" not in result.stderr


@pytest.mark.parametrize("existed", [False, True], ids=["new_output", "existing_output"])
def test_a_killed_prepare_worker_is_one_line_and_leaves_no_manifest(tmp_path, existed):
    output = tmp_path / "corpus"
    if existed:
        output.mkdir()
    result = run_shaped(tmp_path / "shim", KILLED_WORKER, "-m", "transformer_jax.cli.prepare", f"--config={SMOKE}",
                        f"--output={output}", "--workers=2")
    assert_one_line_error(result, "a preparation worker stopped (killed, or out of memory?)",
                          f"{output} is not prepared (it has no manifest.json)",
                          "run the same command again, or with fewer workers (--workers=1)")
    assert "BrokenProcessPool" not in result.stderr
    assert not (output / "manifest.json").exists()
    assert output.exists() == existed  # a directory the attempt made is removed; one that was there is kept
