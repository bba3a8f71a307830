"""The suite's start-up hook (sitecustomize.py, imported by every process a test starts): a JAX without a name it
replaces ends the process with one line naming the JAX version and the name, not an AttributeError."""

import subprocess
import sys

from runs import ROOT, script_env

CHECK = """
import types, sitecustomize
print(sitecustomize.missing_names(__import__("jax._src.cache_key", fromlist=["_"])))
sitecustomize._check(types.ModuleType("jax._src.cache_key"))  # a JAX whose cache_key lacks the hashing function
print("not stopped")
"""


def test_a_jax_without_the_replaced_names_is_one_line_naming_them():
    result = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=script_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2 and result.stdout == "None\n", result.stderr[-2000:]  # this JAX has every name
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: tests/startup/sitecustomize.py was written for JAX 0.10.2; JAX ") and \
        "jax._src.cache_key has no _hash_accelerator_config: update the hook" in line, line
