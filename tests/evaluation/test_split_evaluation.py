"""Dev loss and decoding split over a (data, fsdp) mesh give one device's sums and translations.

The meshes need 8 devices, so the work runs in fresh interpreters (the host-device count is fixed
when JAX starts): one process with 8 CPU devices, and two processes with 4 each (jax.distributed).
"""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from runs import ROOT, finish_all, free_port, script_env
from transformer_jax.data.batching import eval_batches
from transformer_jax.data.encoded import EncodedPairs, Ragged
from transformer_jax.model.masks import PAD_ID

# argv: "single PARAMS", or "process INDEX COUNT PORT PARAMS" for one process of a jax.distributed run. PARAMS: a file
# the single process writes the model's weights to (pickled NumPy arrays) and the processes of the run read them from.
SCRIPT = textwrap.dedent(
    """
    import json, pickle, re, sys
    import flax.linen as nn, jax, numpy as np, optax
    if sys.argv[1] == "process":
        jax.distributed.initialize(f"localhost:{sys.argv[4]}", int(sys.argv[3]), int(sys.argv[2]))
    from transformer_jax import Transformer, TransformerConfig
    from transformer_jax.data.encoded import EncodedPairs, Ragged
    from transformer_jax.decoding.options import DecodeOptions
    from transformer_jax.data.shapes import TranslationBatching
    from transformer_jax.data.translation_batches import translation_batches
    from transformer_jax.decoding.translate import decoding_precision, translate_batch, translate_rows
    from transformer_jax.base.sharding import place_rows, place_whole, state_shardings
    from transformer_jax.training.dev_loss import evaluate_loss
    from transformer_jax.evaluation.text_translation import replicate, translate_encoded
    from transformer_jax.base.sharding import batch_sharding, init_sharded, make_mesh
    from transformer_jax.training.state import create_train_state
    from transformer_jax.training.dev_loss import dev_loss_step

    # One layer a stack: what is split (rows over data, weights over fsdp) is the same for every layer, and each
    # layer more is more of every compile below.
    CONFIG = TransformerConfig.preset("tiny", num_layers=1, vocab_size=50, max_len=32, norm_position="pre",
                                      positional_encoding="learned", tie_output_embedding=False)
    MODEL = Transformer(CONFIG)
    BATCH = 10  # not a multiple of 8: rows are padded to 16, and the last batch holds 1 sentence
    rng = np.random.default_rng(0)
    def sentence(length):
        return rng.integers(4, 50, size=length - 1).tolist() + [3]
    # 21 pairs of 1 to 21 source tokens (the first an empty line: EOS alone), targets the other way.
    CORPUS = EncodedPairs(Ragged.from_lists([sentence(n) for n in range(1, 22)]),
                          Ragged.from_lists([sentence(n) for n in range(22, 1, -1)]))
    OPTIONS = {mode: DecodeOptions(mode=mode, beam_size=3, max_extra_length=4) for mode in ("greedy", "beam", "sample")}
    # Sentences of 10, 13 and 16 source tokens, from both batches of BATCH (both 24 wide), decoded alone: 16 wide.
    ALONE = (9, 12, 15)
    COLLECTIVE = r"\\b(all-gather|all-reduce|reduce-scatter|collective-permute|all-to-all|collective-broadcast)\\b"

    class Ids:
        # Every output id up to the trailing padding, so equal texts mean equal tokens. (Decoding never
        # emits PAD; how much padding follows an output depends on its batch's width, which batching by
        # source length chooses per device count.)
        def decode_batch(self, ids):
            return [" ".join(map(str, np.trim_zeros(np.asarray(row), "b"))) for row in ids]

    def vary(params):
        # Random weights scaled so outputs differ between sentences and end at different lengths.
        params = jax.tree.map(lambda x: 1.5 * x, nn.meta.unbox(params))
        params["decoder"]["positional_encoding"]["position_embedding"] *= 10.0
        bias = params["decoder"]["output_projection"]["bias"]
        params["decoder"]["output_projection"]["bias"] = bias.at[3].set(1.0)
        return params

    def create():
        return create_train_state(MODEL, optax.sgd(0.1), seed=0)

    def setup_one():
        # The weights initialised and varied on one device: every mesh below is given these same values (placed,
        # not initialised again: each mesh's initialisation would be a compile of its own).
        mesh = make_mesh(1, 1, jax.devices()[:1])
        state, shardings = init_sharded(create, mesh)
        params = jax.jit(vary, out_shardings=shardings.params)(state.params)
        return mesh, params, dev_loss_step(CONFIG, 0.1, mesh)

    def setup(data, fsdp, params):
        # `params` (whole on the host) placed on a (data, fsdp) mesh as a run's state is sharded.
        mesh = make_mesh(data, fsdp)
        shardings = state_shardings(mesh, jax.eval_shape(create))
        return mesh, place_whole(params, shardings.params), dev_loss_step(CONFIG, 0.1, mesh)

    def loss_sums(step, params, mesh):
        batch_sums, arguments = [], []
        def recording(p, b):
            arguments.append((p, b))
            batch_sums.append(step(p, b))
            return batch_sums[-1]
        figures = evaluate_loss(recording, params, CORPUS, BATCH, mesh)
        # The flops of the program that computed the first batch's sums, as its arguments were laid out (the step
        # compiled it for them: lowering and compiling again find it in JAX's caches).
        cost = step.lower(*arguments[0]).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        return {"figures": figures, "batches": len(batch_sums), "flops": cost["flops"],
                "sums": {k: sum(float(np.sum(s[k])) for s in jax.device_get(batch_sums)) for k in batch_sums[0]}}

    def translations(params, mesh, modes=("greedy", "beam")):
        return {mode: translate_encoded(params, CONFIG, CORPUS, Ids(), OPTIONS[mode],
                                        batching=TranslationBatching(BATCH), show_progress=False, mesh=mesh)
                for mode in modes}

    def alone(params, modes=("greedy", "beam", "sample")):
        # Each sentence of ALONE as a corpus of its own (one row, one compile per mode for the three), its row id its
        # place in CORPUS.
        return {mode: {str(item): translate_encoded(params, CONFIG, CORPUS.select(np.array([item])), Ids(),
                                                    OPTIONS[mode], batching=TranslationBatching(1),
                                                    show_progress=False, first_row_id=item)[0]
                       for item in ALONE}
                for mode in modes}

    def collectives(jitted, *args):
        return sorted(set(re.findall(COLLECTIVE, jitted.lower(*args).compile().as_text())))

    results = {}
    if sys.argv[1] == "process":
        with open(sys.argv[5], "rb") as f:
            mesh, params, steps = setup(4, 2, pickle.load(f))
        results["data4_fsdp2"] = {"loss": loss_sums(steps, params, mesh),
                                  "translations": translations(params, mesh, ("greedy", "beam", "sample"))}
    else:
        _, params, steps = setup_one()
        weights = jax.device_get(params)
        with open(sys.argv[2], "wb") as f:
            pickle.dump(weights, f)
        results["one"] = {"loss": loss_sums(steps, params, None),
                          "translations": translations(params, None, ("greedy", "beam", "sample")),
                          "alone": alone(params)}
        for name, (data, fsdp) in {"data8": (8, 1), "data4_fsdp2": (4, 2)}.items():
            mesh, params, steps = setup(data, fsdp, weights)
            results[name] = {"loss": loss_sums(steps, params, mesh),
                             "translations": translations(params, mesh, ("greedy", "beam", "sample"))}
        # The beam search's program as the data4_fsdp2 translations above ran it: their first batch (the sentences
        # that are not empty lines), weights, precision and row ids.
        batch = translation_batches(CORPUS, BATCH, items=np.flatnonzero(CORPUS.source.lengths > 1), row_multiple=8)[0]
        src, row_ids = place_rows((batch["inputs"], batch["index"].astype(np.uint32)), mesh)
        searched, searched_config = decoding_precision(replicate(params, mesh), CONFIG, "", "cpu")
        results["collectives"] = {
            "split": collectives(translate_rows, searched, src, jax.random.key(0), searched_config,
                                 OPTIONS["beam"], mesh, row_ids),
            # The same search jitted on the batch split over the mesh, as before: XLA communicates.
            "jit": collectives(jax.jit(lambda p, s: translate_batch(p, CONFIG, s, OPTIONS["beam"]),
                                       in_shardings=(jax.tree.map(lambda x: x.sharding, params),
                                                     batch_sharding(mesh))), params, src),
        }
    print(json.dumps(results))
    """
)


def run_script(*args: str, devices: int) -> subprocess.Popen:
    """Start SCRIPT with `args` on `devices` CPU devices."""
    return subprocess.Popen([sys.executable, "-c", SCRIPT, *args], cwd=ROOT, env=script_env(devices),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def results_of(processes: list[subprocess.Popen]) -> list[dict]:
    """The JSON each process printed last (after all of them ended)."""
    outputs = finish_all(processes, 600)
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs]


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    """The file the single process writes the model's weights to, for the two-process run to take."""
    return str(tmp_path_factory.mktemp("split_evaluation") / "params.pickle")


@pytest.fixture(scope="module")
def results(weights) -> dict:
    """One device, data=8 and data=4 x fsdp=2 in one process with 8 CPU devices (all with the weights it writes to
    `weights`)."""
    return results_of([run_script("single", weights, devices=8)])[0]


def test_eval_batch_rows_are_padded_to_a_multiple_of_the_mesh_with_pad_rows():
    lines = [[5] * n + [3] for n in range(1, 22)]
    corpus = EncodedPairs(Ragged.from_lists(lines), Ragged.from_lists(lines[::-1]))
    plain, padded = eval_batches(corpus, 10), eval_batches(corpus, 10, row_multiple=8)
    assert [b["inputs"].shape[0] for b in plain] == [10] * 3 and [b["inputs"].shape[0] for b in padded] == [16] * 3
    for before, after in zip(plain, padded):  # the same sentences in the same rows, then padding rows
        for key in ("inputs", "targets", "target_inputs"):
            np.testing.assert_array_equal(after[key][:10], before[key])
            assert (after[key][10:] == PAD_ID).all()
        assert after["index"][:10].tolist() == before["index"].tolist() and (after["index"][10:] == -1).all()
    halves = [eval_batches(corpus, 10, process_index=p, process_count=2, row_multiple=8) for p in range(2)]
    np.testing.assert_array_equal(np.concatenate([halves[0][0]["inputs"], halves[1][0]["inputs"]]),
                                  padded[0]["inputs"])


def assert_sums_equal(split: dict, one: dict) -> None:
    """Token and correct counts exactly (whole numbers below 2^24 add exactly in float32); loss and NLL
    to rtol 1e-5: each device adds its rows, then the devices' sums are added, so float32 rounds in
    another order than one device adding all rows (a few 1e-7 relative here)."""
    assert split["batches"] == one["batches"] == 2  # the 21 pairs packed into rows of 24 tokens, 10 to a batch
    assert split["sums"]["tokens"] == one["sums"]["tokens"] == sum(range(2, 23))
    assert split["sums"]["correct"] == one["sums"]["correct"]
    for key in ("loss", "nll"):
        np.testing.assert_allclose(split["sums"][key], one["sums"][key], rtol=1e-5)
    for key in ("loss", "nll", "perplexity", "accuracy"):
        np.testing.assert_allclose(split["figures"][key], one["figures"][key], rtol=1e-5)


@pytest.mark.parametrize("mesh", ["data8", "data4_fsdp2"])
def test_dev_loss_sums_on_a_mesh_equal_one_device(results, mesh):
    assert_sums_equal(results[mesh]["loss"], results["one"]["loss"])


@pytest.mark.parametrize("mesh", ["data8", "data4_fsdp2"])
def test_each_device_computes_only_its_rows_of_the_dev_loss(results, mesh):
    # 2 of 16 rows per device against 10 rows on one device: about a fifth of the work.
    assert results[mesh]["loss"]["flops"] < 0.4 * results["one"]["loss"]["flops"]


@pytest.mark.parametrize("mesh", ["data8", "data4_fsdp2"])
@pytest.mark.parametrize("mode", ["greedy", "beam", "sample"])
def test_translations_on_a_mesh_equal_one_device_token_for_token(results, mesh, mode):
    one = results["one"]["translations"][mode]
    assert results[mesh]["translations"][mode] == one
    assert len(one) == 21 and one[0] == ""  # the empty line stays empty
    assert len(set(one)) > 10 and len({len(text.split(" 0")[0].split()) for text in one}) > 5


@pytest.mark.parametrize("mode", ["greedy", "beam", "sample"])
def test_a_sentence_decodes_the_same_alone_as_in_a_batch(results, mode):
    # What makes splitting exact: no row of a search depends on the other rows of its batch (a sampled row
    # draws from the seed folded with its sentence's place, not its row's). Three sentences of different lengths,
    # each alone in a batch narrower than the one it shared (ALONE in SCRIPT).
    alone = {int(item): text.split(" 0")[0] for item, text in results["one"]["alone"][mode].items()}
    batched = results["one"]["translations"][mode]
    assert sorted(alone) == [9, 12, 15] and len(set(alone.values())) == 3
    assert alone == {item: batched[item].split(" 0")[0] for item in alone}


def test_sharded_decoding_has_no_collectives(results):
    assert results["collectives"]["split"] == []
    assert results["collectives"]["jit"], "the check finds collectives where the search communicates"


def test_two_processes_split_like_one(results, weights):
    port = free_port()
    processes = [run_script("process", str(index), "2", str(port), weights, devices=4) for index in range(2)]
    for result in results_of(processes):
        assert_sums_equal(result["data4_fsdp2"]["loss"], results["one"]["loss"])
        assert result["data4_fsdp2"]["translations"] == {
            mode: results["one"]["translations"][mode] for mode in ("greedy", "beam", "sample")}
