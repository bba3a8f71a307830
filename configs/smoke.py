"""Smoke test: the demo run shrunk to seconds (tiny model, 600 built-in pairs, 6 steps), on CPU.

Command:  transformer-jax train --config=smoke --workdir=/tmp/smoke
          (in a checkout, the same: python train.py --config=configs/smoke.py --workdir=/tmp/smoke)
Hardware: any CPU. On 2 cores (Intel Xeon, 2026-12-07): about 25 s of CPU from an empty compile cache,
          most of it compiling, and 8 s with the cache filled; 15-20 s of wall time cold with the cores
          free, 61-99 s cold and 20-28 s warm while other jobs loaded them
          (benchmarks/results/smoke-time-2026-12-07.txt, docs/benchmarks/demo_and_install.md).
Expected: every stage runs (tokenizer, training with dev loss and checkpoints, beam-search test
          translation, SacreBLEU); the BLEU itself is near 0 after 6 steps. The test suite builds
          its runs from this config, with rows of data.max_length: one batch shape, not the two
          widths chosen here from the corpus (tests/runs.py).
"""

from transformer_jax.config import default_config


def get_config():
    """The demo's settings at the smallest sizes that still exercise every part of a run."""
    config = default_config()
    config.data.update(source="builtin", builtin_train_size=600, builtin_dev_size=16, builtin_test_size=16,
                       vocab_size=500, tokenizer_sample_size=1200, tokens_per_batch=512, max_length=64,
                       pack=True, eval_batch_size=16)
    config.model.update(num_layers=1, d_model=32, d_ff=64, num_heads=2, max_len=128)
    config.training.update(num_train_steps=6, warmup_steps=3, log_every=1, eval_every=3,
                           checkpoint_every=2, keep_checkpoints=2, bleu_every=0)
    config.eval.update(beam_size=2, max_extra_length=4, average_last=2)  # keep_checkpoints=2
    return config
