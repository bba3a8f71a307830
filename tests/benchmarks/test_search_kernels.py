"""The search programs' kernels per decoding step (benchmarks/sections/search_kernels.py), read from compiled HLO."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks.sections.search_kernels import loop_figures
from transformer_jax import Transformer, TransformerConfig
from transformer_jax.decoding import beam_search

HLO = """HloModule search

%branch_a (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  %fusion.1 = f32[4]{0} fusion(%p), kind=kLoop, calls=%fused_a
  ROOT %fusion.2 = f32[4]{0} fusion(%fusion.1), kind=kLoop, calls=%fused_a
}

%branch_b (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %fusion.3 = f32[4]{0} fusion(%p), kind=kLoop, calls=%fused_a
}

%sorting (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %sort.1 = f32[4]{0} sort(%p), dimensions={0}, to_apply=%less
}

%body (state: (s32[], f32[4])) -> (s32[], f32[4]) {
  %state = (s32[], f32[4]{0}) parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %x = f32[4]{0} get-tuple-element(%state), index=1
  %fusion.4 = f32[4]{0} fusion(%x), kind=kInput, calls=%sorting
  %pred = pred[] fusion(%i), kind=kLoop, calls=%fused_a
  %conditional.1 = f32[4]{0} conditional(%pred, %fusion.4, %fusion.4), true_computation=%branch_a, false_computation=%branch_b
  %copy.1 = f32[4]{0} copy(%conditional.1)
  ROOT %tuple = (s32[], f32[4]{0}) tuple(%i, %copy.1)
}

%cond (state: (s32[], f32[4])) -> pred[] {
  %state = (s32[], f32[4]{0}) parameter(0)
  ROOT %lt = pred[] fusion(%state), kind=kLoop, calls=%fused_a
}

ENTRY %main (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  %fusion.5 = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_a
  %init = (s32[], f32[4]{0}) tuple(%x, %fusion.5)
  %while.1 = (s32[], f32[4]{0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[4]{0} get-tuple-element(%while.1), index=1
}
"""


def test_a_steps_kernels_count_a_conditional_as_its_larger_branch_and_name_sorts():
    figures = loop_figures(HLO)
    # fusion.4 (a sort), pred, copy.1 and the conditional's larger branch (2 fusions): 5 kernels a step.
    assert figures["kernels_per_step"] == 5
    assert figures["conditionals_per_step"] == 1
    assert figures["sorts_per_step"] == 1
    assert figures["outside"] == 1  # fusion.5 (the while itself is not a kernel)
    assert figures["host_transfers_per_step"] == 0
    with_callback = HLO.replace("%copy.1 = f32[4]{0} copy(%conditional.1)",
                                '%copy.1 = f32[4]{0} custom-call(%conditional.1), custom_call_target="xla_ffi_python_cpu_callback"')
    assert loop_figures(with_callback)["host_transfers_per_step"] == 1


@pytest.mark.parametrize("chunked", [True, False])
def test_the_compiled_searchs_conditionals_are_the_chunked_caches(chunked):
    config = TransformerConfig.preset("tiny", max_len=128, chunked_decoding_cache=chunked)
    src = jnp.ones((2, 64), jnp.int32)
    params = jax.eval_shape(lambda: Transformer(config).init(jax.random.key(0), src[:, :8], src[:, :8])["params"])
    hlo = jax.jit(lambda p, s: beam_search(p, config, s, beam_size=2)).lower(params, src).compile().as_text()
    figures = loop_figures(hlo)
    assert figures["kernels_per_step"] > 0 and figures["host_transfers_per_step"] == 0
    # 64 + 50 positions: chunks of 32, 32 and 50, each after the first read under a conditional (its logits and
    # its values) in each of the 2 layers; one chunk has none.
    assert (figures["conditionals_per_step"] > 0) == chunked
