"""python -m transformer_jax.aot: the preflight, as `transformer-jax preflight` (aot/preflight.py)."""

from transformer_jax.aot import preflight
from transformer_jax.cli import run_command

if __name__ == "__main__":
    run_command(preflight.main, module=preflight)
