"""A whole run on `--workdir=gs://...` (a local GCS emulator): train.py, a resume past a damaged checkpoint, eval.py."""

import json
import pathlib
import uuid

import fsspec
import numpy as np
import orbax.checkpoint as ocp
import pytest
from gcs_emulator import BUCKET, emulator_in_this_process

from runs import ROOT, flip_a_readable_bit, run_script, script_env, write_config
from transformer_jax.errors import CheckpointError
from transformer_jax.checkpoints.selection import write_params


class Bucket:
    """What train.py and eval.py left in the bucket, read with a client that caches no listing (other
    processes write the bucket between reads)."""

    def __init__(self) -> None:
        self.filesystem = fsspec.filesystem("gs", skip_instance_cache=True, use_listings_cache=False)

    def names(self, directory: str) -> list[str]:
        return sorted(path.rsplit("/", 1)[-1] for path in self.filesystem.ls(directory, detail=False))

    def text(self, path: str) -> str:
        return self.filesystem.cat_file(path).decode()

    def objects_under(self, directory: str) -> dict[str, bytes]:
        """{path relative to `directory`: content} of every object under `directory`."""
        root = directory.removeprefix("gs://")
        return {path[len(root) + 1:]: self.filesystem.cat_file(path) for path in self.filesystem.find(root)}

    def flip_a_readable_bit(self, step_dir: str, scratch: pathlib.Path) -> None:
        """Change one stored value of the checkpoint (only the checksum can tell), found on a local copy."""
        for name, content in self.objects_under(f"{step_dir}/state").items():
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            (scratch / name).write_bytes(content)
        changed = flip_a_readable_bit(scratch)
        self.filesystem.pipe_file(f"{step_dir}/state/{changed.relative_to(scratch)}", changed.read_bytes())


def log_windows(timing: str) -> list[str]:
    """The log windows' lines of timing.jsonl (the others record the start-up, checkpoint stalls, evaluations)."""
    return [line for line in timing.splitlines() if '"tokens_per_second"' in line]


def test_train_resume_and_eval_keep_the_whole_run_in_the_bucket(gcs_emulator, tmp_path):
    workdir = f"gs://{BUCKET}/run-{uuid.uuid4().hex[:8]}"
    env = script_env(**gcs_emulator)
    config = write_config(tmp_path)
    trained = run_script("train.py", f"--config={config}", f"--workdir={workdir}", env=env, timeout=500)
    assert trained.returncode == 0, trained.stderr[-3000:]
    with emulator_in_this_process(gcs_emulator):
        bucket = Bucket()
        assert bucket.names(f"{workdir}/checkpoints") == ["4", "6"]
        first_timing = log_windows(bucket.text(f"{workdir}/timing.jsonl"))
        bucket.flip_a_readable_bit(f"{workdir}/checkpoints/6", tmp_path / "state")
        damaged = bucket.objects_under(f"{workdir}/checkpoints/6")

    resumed = run_script("train.py", f"--config={config}", "--config.training.num_train_steps=8",
                         f"--workdir={workdir}", env=env, timeout=500)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = "\n".join(line for line in (resumed.stdout + resumed.stderr).splitlines() if "train step" not in line)
    assert f"{workdir}/checkpoints/6: array" in resumed.stderr and "does not match its checksum" in resumed.stderr, said
    evaluated = run_script("eval.py", f"--workdir={workdir}", "--checkpoint=average:2", env=env, timeout=500)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "steps [6, 8]" in evaluated.stdout, evaluated.stdout
    assert not (ROOT / "gs:").exists() and not (tmp_path / "gs:").exists(), "a gs:// path was written locally"

    with emulator_in_this_process(gcs_emulator):
        bucket = Bucket()
        names = bucket.names(workdir)
        assert {"config.json", "tokenizer.model", "metrics.jsonl", "timing.jsonl", "checkpoints", "checkpoints.corrupt",
                "tensorboard", "test_final.json", "test_final.hyp", "eval", "plots"} <= set(names), names
        assert not [name for name in names if ".tmp" in name or ".write_test" in name], names
        # The damaged step was set aside intact, and the run went on from step 4, not from scratch: the
        # wall-clock records of steps 1-4 are the first run's (a fresh start rewrites them).
        assert bucket.objects_under(f"{workdir}/checkpoints.corrupt/6") == damaged
        assert bucket.names(f"{workdir}/checkpoints") == ["6", "8"]
        timing = log_windows(bucket.text(f"{workdir}/timing.jsonl"))
        assert timing[:4] == first_timing[:4] and [json.loads(line)["step"] for line in timing] == list(range(1, 9))
        records = [json.loads(line) for line in bucket.text(f"{workdir}/metrics.jsonl").splitlines()]
        assert [r["step"] for r in records if r["split"] == "train"] == list(range(1, 9)), records
        assert json.loads(bucket.text(f"{workdir}/test_final.json"))["step"] == 8
        results = json.loads(bucket.text(f"{workdir}/eval/test.average_2_to_8.json"))
        assert results["steps"] == [6, 8] and results["sentences"] == 16, results
        assert bucket.filesystem.cat_file(f"{workdir}/plots/learning_curves.png").startswith(b"\x89PNG")
        assert any(name.startswith("events.out.tfevents") for name in bucket.names(f"{workdir}/tensorboard"))


def test_averaged_parameters_are_written_to_a_bucket_once(gcs_workdir):
    params = {"dense": {"kernel": np.arange(6, dtype=np.float32).reshape(2, 3)}}
    write_params(params, f"{gcs_workdir}/averaged")
    restored = ocp.StandardCheckpointer().restore(f"{gcs_workdir}/averaged")
    np.testing.assert_array_equal(restored["dense"]["kernel"], params["dense"]["kernel"])
    with pytest.raises(CheckpointError, match="already exists"):
        write_params(params, f"{gcs_workdir}/averaged")
