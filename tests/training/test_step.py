"""Loss, schedule, optimizer and the train step."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from runs import FUSION_EMITTERS
from transformer_jax import Transformer, TransformerConfig
from transformer_jax.training.loss import label_smoothed_cross_entropy
from transformer_jax.training.optimizer import paper_learning_rate, paper_optimizer
from transformer_jax.training.state import create_train_state
from transformer_jax.training.step import train_step


def test_label_smoothed_loss_equals_hand_computation():
    logits = jnp.array([[[2.0, 0.5, -1.0, 0.0]]])
    targets = jnp.array([[1]])
    loss, nll = label_smoothed_cross_entropy(logits, targets, smoothing=0.1)
    log_p = np.log(np.exp([2.0, 0.5, -1.0, 0.0]) / np.exp([2.0, 0.5, -1.0, 0.0]).sum())
    q = np.array([0.1 / 3, 0.9, 0.1 / 3, 0.1 / 3])  # 1 - eps on the reference, eps / (V - 1) elsewhere
    np.testing.assert_allclose(loss[0, 0], -(q * log_p).sum(), rtol=1e-6)
    np.testing.assert_allclose(nll[0, 0], -log_p[1], rtol=1e-6)
    plain, _ = label_smoothed_cross_entropy(logits, targets, smoothing=0.0)
    np.testing.assert_allclose(plain[0, 0], -log_p[1], rtol=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_label_smoothed_loss_gradient_equals_autodiff_of_the_definition(smoothing):
    """The hand-written backward pass (softmax - q, recomputed) equals autodiff of -sum q log p."""
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, 3, 7)) * 3, jnp.float32)
    targets = jnp.asarray(rng.integers(0, 7, size=(2, 3)))
    w_loss, w_nll = jnp.asarray(rng.normal(size=(2, 3))), jnp.asarray(rng.normal(size=(2, 3)))

    def reference(x):
        log_p = jax.nn.log_softmax(x, axis=-1)
        q = jax.nn.one_hot(targets, 7) * (1 - smoothing - smoothing / 6) + smoothing / 6
        return (-(q * log_p).sum(-1) * w_loss).sum() + (-(jax.nn.one_hot(targets, 7) * log_p).sum(-1) * w_nll).sum()

    def ours(x):
        loss, nll = label_smoothed_cross_entropy(x, targets, smoothing)
        return (loss * w_loss).sum() + (nll * w_nll).sum()

    np.testing.assert_allclose(ours(logits), reference(logits), rtol=1e-5)
    np.testing.assert_allclose(jax.grad(ours)(logits), jax.grad(reference)(logits), rtol=1e-5, atol=1e-6)


def test_loss_keeps_no_second_float32_vocab_sized_array_for_the_backward_pass():
    """Residuals saved for the backward pass of the loss: one [B, T, V] array and per-token values only."""
    logits = jnp.zeros((4, 16, 1000), jnp.float32)
    targets = jnp.ones((4, 16), jnp.int32)
    fn = lambda x: label_smoothed_cross_entropy(x, targets, 0.1)[0].sum()
    _, backward = jax.vjp(fn, logits)
    residuals = [np.shape(leaf) for leaf in jax.tree.leaves(backward)]
    big = [shape for shape in residuals if np.prod(shape) >= 4 * 16 * 1000]
    assert big == [(4, 16, 1000)], residuals  # exp(logits - max), in place of the logits


@pytest.mark.parametrize("step", [1, 10, 1000, 3999, 4000, 4001, 10000, 100000])
def test_schedule_equals_the_paper_formula(step):
    schedule = paper_learning_rate(d_model=512, warmup_steps=4000)
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    # optax passes the update count, which starts at 0 for step 1.
    np.testing.assert_allclose(schedule(step - 1), expected, rtol=1e-6)


def test_schedule_peaks_at_warmup_and_scales():
    schedule = paper_learning_rate(d_model=512, warmup_steps=4000, scale=2.0)
    rates = np.asarray([schedule(c) for c in (3998, 3999, 4000)])
    assert rates[1] > rates[0] and rates[1] > rates[2]
    np.testing.assert_allclose(rates[1], 2.0 * 512**-0.5 * 4000**-0.5, rtol=1e-6)


def test_optimizer_uses_paper_adam_hyperparameters():
    opt = paper_optimizer(lambda count: 1.0)
    params = {"w": jnp.array([1.0])}
    state = opt.init(params)
    updates, state = opt.update({"w": jnp.array([2.0])}, state, params)
    # First Adam step: m = (1-b1) g, v = (1-b2) g^2, bias-corrected -> g / (|g| + eps) = 1.
    np.testing.assert_allclose(updates["w"], [-1.0], rtol=1e-6)
    np.testing.assert_allclose(state[0].mu["w"], [0.1 * 2.0], rtol=1e-6)
    np.testing.assert_allclose(state[0].nu["w"], [0.02 * 4.0], rtol=1e-6)


# The tiny preset with one layer per stack: these tests are about the step (its loss, skipping, accumulation, donation,
# dtypes), not the depth, and each of their programs compiles in about half the time of the preset's two layers.
SMALL = TransformerConfig.preset("tiny", vocab_size=32, num_layers=1)


def copy_task_batch(rng: np.random.Generator, batch: int = 16, length: int = 7) -> dict:
    tokens = rng.integers(4, 30, size=(batch, length)).astype(np.int32)
    tokens[:, -1] = 3
    targets = tokens.copy()
    target_inputs = np.concatenate([np.full((batch, 1), 2, np.int32), targets[:, :-1]], 1)
    return {"inputs": tokens, "targets": targets, "target_inputs": target_inputs}


@pytest.fixture(scope="module")
def small_model():
    """SMALL's model and the paper's optimizer, one pair for the module: states made from the same objects share a
    tree structure, so the module's compiled steps take any of them."""
    model = Transformer(SMALL)
    return model, paper_optimizer(paper_learning_rate(model.config.d_model, warmup_steps=10))


@pytest.fixture
def small_state(small_model):
    return create_train_state(*small_model, seed=0)


@pytest.fixture(scope="module")
def donated_step(small_model):
    """The train step with the state donated, compiled once for the module (the loss test runs it, the donation test
    reads its HLO): a function of (state, batch) with label smoothing 0.1."""
    state = create_train_state(*small_model, seed=0)
    return jax.jit(train_step, static_argnums=2, donate_argnums=0).lower(
        state, copy_task_batch(np.random.default_rng(0)), 0.1).compile()


@pytest.fixture(scope="module")
def fused_reference_step(small_model):
    """The default train step (no donation) compiled with XLA:CPU's own fused-loop emitters (FUSION_EMITTERS), once
    for the module: the skipping tests' reference for a healthy update, the donation test's program without donation.
    A function of (state, batch) with label smoothing 0.1."""
    state = create_train_state(*small_model, seed=0)
    return jax.jit(train_step, static_argnums=2).lower(state, copy_task_batch(np.random.default_rng(0)), 0.1).compile(
        compiler_options=FUSION_EMITTERS)


def test_loss_falls_over_30_steps(small_state, donated_step):
    batch = copy_task_batch(np.random.default_rng(0))
    state, losses = small_state, []
    for _ in range(30):
        state, metrics = donated_step(state, batch)
        losses.append(float(metrics["loss"]))
    assert int(state.step) == 30 and int(state.skipped_updates) == 0
    assert np.mean(losses[-5:]) < 0.9 * np.mean(losses[:5]), losses


def test_bfloat16_parameters_train_and_keep_their_dtype_in_parameters_and_adam_moments():
    """model.param_dtype=bfloat16: the compiled step takes updates (it failed to compile when float32
    token counts promoted the gradients) and leaves parameters and both moments in bfloat16."""
    model = Transformer(SMALL.replace(param_dtype="bfloat16"))
    optimizer = paper_optimizer(paper_learning_rate(model.config.d_model, warmup_steps=10))
    state = create_train_state(model, optimizer, seed=0)
    step = jax.jit(train_step, static_argnums=2, donate_argnums=0)
    batch = copy_task_batch(np.random.default_rng(0))
    before = np.asarray(jax.tree.leaves(state.params)[0], np.float32)
    for _ in range(3):
        state, metrics = step(state, batch, 0.1)
    assert int(state.skipped_updates) == 0 and np.isfinite(float(metrics["loss"]))
    dtypes = {leaf.dtype for leaf in jax.tree.leaves((state.params, state.opt_state[0].mu, state.opt_state[0].nu))}
    assert dtypes == {jnp.dtype(jnp.bfloat16)}
    assert not np.array_equal(np.asarray(jax.tree.leaves(state.params)[0], np.float32), before)


def test_the_gradient_norm_by_shape_groups_equals_the_norm_by_leaves():
    """Both reductions of step.NormBy give the global norm (float32 rounding apart), also of mixed dtypes, and a
    non-finite element makes both non-finite."""
    from transformer_jax.training.step import global_norm, norm_by_for

    rng = np.random.default_rng(0)
    tree = {"a": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
            "c": jnp.asarray(rng.normal(size=(5,)), jnp.bfloat16), "d": jnp.asarray(rng.normal(size=(5,)), jnp.float32)}
    expected = np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in tree.values()))
    float32 = {key: value for key, value in tree.items() if key != "c"}
    expected32 = np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2) for x in float32.values()))
    for norm_by in ("leaves", "shape_groups"):
        norm = jax.jit(global_norm, static_argnums=1)
        np.testing.assert_allclose(float(norm(float32, norm_by)), expected32, rtol=1e-6)
        # optax squares bfloat16 in bfloat16
        np.testing.assert_allclose(float(norm(tree, norm_by)), expected, rtol=1e-3)
        poisoned = {**tree, "b": tree["b"].at[1, 2].set(jnp.inf)}
        assert not np.isfinite(float(global_norm(poisoned, norm_by)))
    assert [norm_by_for(p) for p in ("cpu", "tpu", "gpu")] == ["leaves", "leaves", "shape_groups"]


# CPUs, TPUs, GPUs (SkipBy, NormBy)
@pytest.mark.parametrize("skip_by,norm_by", [("cond", "leaves"), ("select", "leaves"), ("select", "shape_groups")])
def test_non_finite_gradients_skip_the_update(small_state, fused_reference_step, skip_by, norm_by):
    batch = copy_task_batch(np.random.default_rng(0))
    # Compiled with XLA:CPU's own fused-loop emitters (FUSION_EMITTERS), not the suite's older ones; the suite's
    # XLA_FLAGS still skip LLVM's optimisation passes (runs.DEFAULT_EMITTER_FLAGS), so this is not the program a user's
    # run compiles: the healthy update must give the default step's bits, and two programs give the same bits only
    # where they are emitted alike.
    step = jax.jit(functools.partial(train_step, skip_by=skip_by, norm_by=norm_by), static_argnums=2).lower(
        small_state, batch, 0.1).compile(compiler_options=FUSION_EMITTERS)
    poisoned = small_state.replace(
        params=jax.tree.map(lambda p: p.at[(0,) * p.ndim].set(jnp.nan) if p.ndim == 2 else p, small_state.params)
    )
    new_state, metrics = step(poisoned, batch)
    assert int(metrics["update_skipped"]) == 1 and int(new_state.skipped_updates) == 1
    assert int(new_state.step) == 1
    same = jax.tree.map(lambda a, b: bool(np.array_equal(a, b, equal_nan=True)),
                        (new_state.params, new_state.opt_state), (poisoned.params, poisoned.opt_state))
    assert all(jax.tree.leaves(same))
    healthy, metrics = step(small_state, batch)
    assert int(metrics["update_skipped"]) == 0
    assert not np.array_equal(jax.tree.leaves(healthy.params)[0], jax.tree.leaves(small_state.params)[0])
    reference, _ = fused_reference_step(small_state, batch)
    for a, b in zip(jax.tree.leaves((healthy.params, healthy.opt_state)),
                    jax.tree.leaves((reference.params, reference.opt_state)), strict=True):
        np.testing.assert_array_equal(a, b)


def test_accumulated_micro_batches_equal_one_big_batch():
    """Summed gradients over two halves, normalized once, give the update of the whole batch."""
    from transformer_jax.training.step import (
        add_trees,
        apply_gradients,
        compute_gradients,
    )

    model = Transformer(SMALL.replace(dropout_rate=0.0))
    optimizer = paper_optimizer(paper_learning_rate(model.config.d_model, warmup_steps=10))
    state = create_train_state(model, optimizer, seed=0)
    batch = copy_task_batch(np.random.default_rng(1))
    batch["targets"][:8, 4:] = 0  # uneven padding: halves hold different token counts
    whole, whole_metrics = jax.jit(train_step, static_argnums=2)(state, batch, 0.1)
    # Each piece compiled, as the accumulating train step runs it (op by op, the tiny model takes ~20 s to dispatch).
    compute_gradients, apply_gradients, add_trees = (
        jax.jit(compute_gradients, static_argnums=2), jax.jit(apply_gradients), jax.jit(add_trees))
    halves = [{k: v[:8] for k, v in batch.items()}, {k: v[8:] for k, v in batch.items()}]
    grads, sums = compute_gradients(state, halves[0], 0.1, 0)
    more_grads, more_sums = compute_gradients(state, halves[1], 0.1, 1)
    accumulated, metrics = apply_gradients(state, add_trees(grads, more_grads), add_trees(sums, more_sums))
    np.testing.assert_allclose(metrics["loss"], whole_metrics["loss"], rtol=1e-6)
    whole_grads, whole_sums = compute_gradients(state, batch, 0.1, 0)
    assert float(whole_sums["tokens"]) == float(sums["tokens"] + more_sums["tokens"])
    summed = add_trees(grads, more_grads)
    for a, b in zip(jax.tree.leaves(summed), jax.tree.leaves(whole_grads)):
        # float32 sums over thousands of tokens in another order: compare against the leaf's scale.
        assert np.max(np.abs(np.asarray(a) - np.asarray(b))) <= 1e-5 * np.max(np.abs(np.asarray(b))) + 1e-6
    # Adam's first step moves each parameter by about lr * sign(gradient): where a gradient is at
    # round-off level its sign is arbitrary, so compare only where the gradient is clearly non-zero,
    # and bound the rest by the largest step Adam can take.
    lr = float(paper_learning_rate(model.config.d_model, warmup_steps=10)(0))
    leaves = zip(jax.tree.leaves(accumulated.params), jax.tree.leaves(whole.params),
                 jax.tree.leaves(state.params), jax.tree.leaves(whole_grads))
    for a, b, before, g in leaves:
        clear = np.abs(np.asarray(g)) > 1e-4 * np.max(np.abs(np.asarray(g))) + 1e-7
        np.testing.assert_allclose(np.asarray(a)[clear], np.asarray(b)[clear], atol=1e-6)
        assert np.max(np.abs(np.asarray(a) - np.asarray(before)), initial=0) <= 1.01 * lr


def test_donated_train_step_updates_every_parameter_and_adam_moment_in_place(small_state, donated_step,
                                                                               fused_reference_step):
    """With the state donated, XLA aliases each parameter and optimizer buffer to its updated value."""
    hlo = donated_step.as_text()
    aliased = hlo[hlo.index("input_output_alias={"):].split("}\n")[0].count("may-alias")
    arrays = len(jax.tree.leaves(small_state.params)) * 3  # parameters, Adam's mu and nu
    assert aliased >= arrays, (aliased, arrays)
    # Without donation nothing may be aliased: the check above can fail. (The same step compiled without donation,
    # the one the skipping tests compile; its fused-loop emitters choose how loops are emitted, not what is aliased.)
    assert "may-alias" not in fused_reference_step.as_text()
