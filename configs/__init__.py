"""The run configs, one experiment a file: installed with the package as transformer_jax.configs, so that
`transformer-jax train --config=demo` (a name) reads the installed file from any directory."""
