"""The text API (`Translator`) given what a new user may give it: every wrong type or value is one of the project's
errors (a UserError) naming the argument and the fix, before any work; a lone surrogate is refused naming its item;
and a run whose training rotates its checkpoints while a Translator opens it gives the newest checkpoint (latest,
best, average) or the command line's one line (a step named by its number), with nothing of Orbax's on stderr.

Rotation is simulated deterministically, with the real Checkpointer and Orbax: the step being read is removed (and
a newer one saved, as the writer does) at the moment Orbax lists or restores it.
"""

import logging
import shutil
import subprocess
import sys

import jax
import orbax.checkpoint as ocp
import pytest
from orbax.checkpoint._src.path import step as orbax_steps

from runs import ROOT, copy_run, script_env
from transformer_jax.decoding import DecodeOptions
from transformer_jax.errors import CheckpointError, ConfigError, CorruptCheckpointError, DataError, UserError
from transformer_jax.evaluation import Translator, translate_lines
from transformer_jax.evaluation.translator import ROTATION_TRIES

# When a restore fails Orbax abandons its other reads; their coroutines complain when collected.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture(scope="module")
def translator(trained_run):
    with Translator(str(trained_run["workdir"])) as loaded:
        yield loaded


def one_line(error: pytest.ExceptionInfo, *fragments: str) -> str:
    message = str(error.value)
    assert isinstance(error.value, UserError) and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


# (what a user passes to the constructor, the error's kind, fragments: the argument, then the fix)
OPENINGS = [
    (lambda run: Translator(None), ConfigError, ["Translator(workdir=None)", "not NoneType",
                                                 "pass the --workdir a training run wrote"]),
    (lambda run: Translator(42), ConfigError, ["Translator(workdir=42)", "not int"]),
    (lambda run: Translator(" "), CheckpointError, ["the workdir is empty", "pass the --workdir"]),
    (lambda run: Translator(run, dtype="float16"), ConfigError, ["Translator(dtype='float16') is not one of "
                                                                "['float32', 'bfloat16']", "leave it out"]),
    (lambda run: Translator(run, devices=[]), ConfigError, ["Translator(devices=[]) names no device",
                                                            "pass some of jax.local_devices()"]),
    (lambda run: Translator(run, devices=jax.local_devices()[0]), ConfigError, ["takes a list of devices",
                                                                               "pass [device] for one"]),
    (lambda run: Translator(run, devices=["cpu:0"]), ConfigError, ["holds 'cpu:0', which is not a device of this "
                                                                   "process"]),
    (lambda run: Translator(run, devices=jax.local_devices() * 2), ConfigError, ["names a device twice"]),
    (lambda run: Translator(run, checkpoint=None), CheckpointError, ["checkpoint=None is not latest, best"]),
]


@pytest.mark.parametrize("opening, kind, fragments", OPENINGS,
                         ids=["workdir None", "workdir int", "workdir blank", "dtype", "no devices", "one device",
                              "not a device", "a device twice", "checkpoint None"])
def test_a_wrong_argument_to_the_translator_is_one_line_naming_it(trained_run, opening, kind, fragments):
    with pytest.raises(kind) as error:
        opening(trained_run["workdir"])
    one_line(error, *fragments)


def test_the_devices_given_are_the_devices_used(trained_run):
    """devices=[one] means that one device, not all of them (as devices=[] once did)."""
    device = jax.local_devices()[-1]
    with Translator(trained_run["workdir"], devices=[device], dtype="") as chosen:  # a pathlib.Path as a workdir
        assert list(chosen.mesh.devices.flat) == [device] and chosen.dtype == ""


# (texts, keywords) a user passes to translate, the error's kind, fragments naming the argument and the fix
CALLS = [
    (None, {}, ConfigError, ["translate() takes a str or a sequence of str, not NoneType", "pass a sentence"]),
    (42, {}, ConfigError, ["not int"]),
    (b"the dog", {}, ConfigError, ["takes text, not bytes", "decode it first"]),
    ({"the dog": 1}, {}, ConfigError, ["not dict (its order is not defined)"]),
    ({"the dog"}, {}, ConfigError, ["not set (its order is not defined)"]),
    (["the dog", None], {}, ConfigError, ["texts[1] is of type NoneType, not str; pass text"]),
    (["the dog", "\ud800 cat"], {}, DataError, ["texts[1] holds U+D800 (character 1), a lone surrogate",
                                                "pass UTF-8 text", "errors='replace'"]),
    ("caf\udce9", {}, DataError, ["texts[0] holds U+DCE9 (character 4)"]),
    (["the dog"], {"batch_size": 0}, ConfigError, ["batch_size=0 must be a positive integer"]),
    ([], {"batch_size": -1}, ConfigError, ["batch_size=-1 must be a positive integer"]),
    ([], {"batch_tokens": -1}, ConfigError, ["batch_tokens=-1 must be 0"]),
    (["the dog"], {"batch_size": True}, ConfigError, ["batch_size=True must be a positive integer"]),
    (["the dog"], {"batch_size": 2.5}, ConfigError, ["batch_size=2.5"]),
    ([], {"top_k": 3}, ConfigError, ["top_k applies to mode='sample'"]),
    ([], {"beam": 3}, ConfigError, ["unknown decoding option(s) ['beam']"]),
]


@pytest.mark.parametrize("texts, keywords, kind, fragments", CALLS,
                         ids=["None", "int", "bytes", "dict", "set", "an item None", "a lone surrogate",
                              "an escaped byte", "batch_size 0", "batch_size -1 of nothing",
                              "batch_tokens -1 of nothing", "batch_size True", "batch_size 2.5", "a setting of nothing", "an unknown setting"])
def test_a_wrong_argument_to_translate_is_one_line_naming_it_even_with_nothing_to_translate(
        translator, texts, keywords, kind, fragments):
    with pytest.raises(kind) as error:
        translator.translate(texts, **keywords)
    one_line(error, *fragments)


def test_every_batch_size_given_is_the_one_used(translator, monkeypatch):
    import transformer_jax.evaluation.translator as module

    used = []
    original = module.translate_encoded
    monkeypatch.setattr(module, "translate_encoded",
                        lambda *args, batching, **kw: used.append(batching) or original(*args, batching=batching, **kw))
    texts = ["the dog sleeps", "a red house", "the cat"]
    by_one = translator.translate(texts, mode="greedy", batch_size=1, batch_tokens=0)
    assert translator.translate(texts, mode="greedy") == by_one
    translator.translate(iter(texts), mode="greedy", batch_tokens=64)  # any iterable, in its order
    assert [(b.batch_size, b.batch_tokens) for b in used] == [(1, 0), (3, used[1].batch_tokens), (3, 64)]


def test_translate_lines_names_the_line_that_is_not_text(trained_run):
    from transformer_jax.checkpoints import checkpoint_params, open_run

    run = open_run(str(trained_run["workdir"]))
    try:
        params = checkpoint_params(run, [run.checkpointer.latest_step()])
        lines = ["the dog\n", "the cat\n", "caf\udce9\n"]
        with pytest.raises(DataError) as error:
            list(translate_lines(run, params, lines, DecodeOptions(mode="greedy")))
        one_line(error, "line 3 holds U+DCE9 (character 4), a lone surrogate")
        with pytest.raises(ConfigError) as error:
            list(translate_lines(run, params, ["the dog", 7], DecodeOptions(mode="greedy")))
        one_line(error, "line 2 is of type int, not str")
    finally:
        run.checkpointer.close()


def save_newer(checkpoints, step: int) -> None:
    """What the training run writing `checkpoints` does between two reads: save a newer step (two past the newest,
    a copy of `step`) and rotate `step` away."""
    newest = max(int(path.name) for path in checkpoints.iterdir() if path.name.isdigit())
    shutil.copytree(checkpoints / str(step), checkpoints / str(newest + 2))
    shutil.rmtree(checkpoints / str(step))


@pytest.fixture
def live_run(trained_run, tmp_path):
    """A copy of the trained run (checkpoints 4 and 6) that a simulated training run rotates."""
    return copy_run(trained_run, tmp_path / "run")


def rotate_at_restore(monkeypatch, checkpoints, times: int) -> list[int]:
    """At each of the next `times` restores of parameters, the writer saves a newer step and rotates the one being
    read away (a restore of the metadata alone, as the choice of the best step reads it, is left alone); returns
    the steps whose parameters were restored, in order."""
    restored, original = [], ocp.CheckpointManager.restore

    def restore(self, step, *args, **kwargs):
        if "state" in kwargs["args"]:
            restored.append(step)
            if len(restored) <= times:
                save_newer(checkpoints, step)
        return original(self, step, *args, **kwargs)

    monkeypatch.setattr(ocp.CheckpointManager, "restore", restore)
    return restored


@pytest.mark.parametrize("checkpoint, read", [("latest", [6, 8]), ("average:2", [4, 6, 8]), ("best", [6, 8])])
def test_a_checkpoint_named_by_its_place_rotated_away_while_read_is_read_at_the_newest(
        live_run, monkeypatch, capfd, checkpoint, read):
    restored = rotate_at_restore(monkeypatch, live_run / "checkpoints", times=1)
    with Translator(live_run, checkpoint=checkpoint) as opened:
        assert opened.translate("the dog", mode="greedy", max_extra_length=2) is not None
        expected = {"latest": [8], "average:2": [6, 8], "best": [8]}[checkpoint]
        assert opened.steps == expected
    assert restored[:len(read)] == read
    assert "Traceback" not in capfd.readouterr().err


def test_a_step_named_by_its_number_rotated_away_while_read_is_the_command_lines_line(live_run, monkeypatch, capfd):
    rotate_at_restore(monkeypatch, live_run / "checkpoints", times=1)
    with pytest.raises(CorruptCheckpointError) as error:
        Translator(live_run, checkpoint=6)
    one_line(error, "checkpoints/6 was removed while it was read", "keeps only its newest checkpoints",
             "run the same command again for the newest, or choose a step it keeps")
    assert "Traceback" not in capfd.readouterr().err


def test_a_run_that_rotates_at_every_read_is_refused_after_a_few(live_run, monkeypatch):
    restored = rotate_at_restore(monkeypatch, live_run / "checkpoints", times=100)
    with pytest.raises(CorruptCheckpointError) as error:
        Translator(live_run)
    one_line(error, "was removed while it was read")
    assert restored == [6, 8, 10][:ROTATION_TRIES]


def test_a_step_rotated_away_while_orbax_lists_the_steps_is_no_step(live_run, monkeypatch, caplog):
    """Orbax lists the step folders, then reads each one's metadata: a step rotated away in between was a raw
    FileNotFoundError (from the Translator's opening and its choice of the latest step); it is left out."""
    listings, original = [], orbax_steps._StandardNameFormat.find_all

    def find_all(self, base_path):
        found = list(original(self, base_path))
        listings.append(sorted(step.step for step in found))
        if len(listings) in (1, 3):  # as the Translator's checkpointer starts, and as the latest step is chosen
            save_newer(live_run / "checkpoints", max(step.step for step in found))
        return iter(found)

    monkeypatch.setattr(orbax_steps._StandardNameFormat, "find_all", find_all)
    with caplog.at_level(logging.WARNING), Translator(live_run) as opened:
        assert opened.steps == [10]
    assert listings[:4] == [[4, 6], [4, 8], [4, 8], [4, 10]]
    assert caplog.records == []  # nor Orbax's "Metadata file does not exist" about a step gone


# Run in a process of its own: the reports go to its standard error, which the test reads whole.
ABANDONED_READS = """
import asyncio, shutil, sys
import orbax.checkpoint as ocp, tensorstore as ts
from transformer_jax.errors import CorruptCheckpointError
from transformer_jax.evaluation import Translator

workdir, pending = sys.argv[1], []
original = ocp.CheckpointManager.restore

def restore(self, step, *args, **kwargs):
    shutil.rmtree(f"{workdir}/checkpoints/{step}")  # rotated away by the run writing it
    # What Orbax's other reads of a failed restore do: TensorStore completes them after their event loop closed,
    # from its own thread, while the failure is still unwinding.
    promise, future = ts.Promise.new()
    loop = asyncio.new_event_loop()
    async def read():
        return await future
    pending.append(loop.create_task(read()))
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    promise.set_result(0)
    return original(self, step, *args, **kwargs)

ocp.CheckpointManager.restore = restore
try:
    Translator(workdir, checkpoint=6)
except CorruptCheckpointError as error:
    print(error)
"""


def test_reads_abandoned_by_a_rotated_checkpoint_print_nothing(live_run):
    """Orbax's "Event loop is closed" tracebacks reached the API user's stderr: a read ended before the handler of
    the failed one ran. Standard error holds nothing; the error is the one line."""
    result = subprocess.run([sys.executable, "-c", ABANDONED_READS, str(live_run)], cwd=ROOT, env=script_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "checkpoints/6 was removed while it was read" in result.stdout
    assert result.stderr == "", result.stderr[-3000:]


def test_the_docs_example_of_the_translators_arguments_runs(trained_run, tmp_path, monkeypatch, capsys):
    from test_readme import run_marked_block

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "demo").symlink_to(trained_run["workdir"])
    monkeypatch.chdir(tmp_path)
    namespace = run_marked_block("translator-arguments-example")
    assert len(namespace["translations"]) == 2 and isinstance(namespace["one"], str)
    assert capsys.readouterr().out.startswith("batch_size=0 must be a positive integer")
