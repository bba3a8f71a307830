"""benchmarks/suite_cpu.py on a log a real process wrote (tests/startup/sitecustomize.py) and two test lines."""

import json
import os
import subprocess
import sys

from benchmarks.suite_cpu import main
from runs import ROOT


def test_the_tables_sum_each_process_by_its_test_module_and_each_test_by_its_cpu(tmp_path, capsys):
    log = tmp_path / "suite.jsonl"
    env = dict(os.environ, JAX_PLATFORMS="cpu", TRANSFORMER_JAX_TEST_PROCESS_LOG=str(log),
               PYTEST_CURRENT_TEST="tests/x/test_a.py::test_one (call)", JAX_COMPILATION_CACHE_DIR=str(tmp_path / "c"))
    subprocess.run([sys.executable, "-c", "import jax, jax.numpy as jnp; jax.jit(lambda x: x * 2 + 1)(jnp.ones(3))"],
                   env=env, cwd=ROOT, check=True)
    process = json.loads(log.read_text())
    assert process["test"].startswith("tests/x/test_a.py") and process["cpu"] > 0
    assert process["jax"]["/jax/core/compile/backend_compile_duration"] > 0  # JAX's own figure, read at exit
    with open(log, "a") as file:
        for nodeid, own, started in (("tests/x/test_a.py::test_one", 1.5, 7.25),
                                     ("tests/y/test_b.py::test_two", 4.0, 0.0)):
            file.write(json.dumps({"nodeid": nodeid, "wall": 9.0, "self_cpu": own, "children_cpu": started}) + "\n")
    main([str(log), "--rows=5"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1 processes logged at exit")
    assert [line.split()[1] for line in out[2:4]] == ["1", "1"] and out[3].endswith("tests/x/test_a.py")
    assert "2 tests: 12.8 s of CPU (the workers' own 5.5 s, the processes they started 7.2 s), 18.0 s of wall" in out
    ranked = [line for line in out if "::" in line]
    assert ranked[0].split() == ["8.8", "1.5", "7.2", "9.0", "tests/x/test_a.py::test_one"]
    assert ranked[1].split()[-1] == "tests/y/test_b.py::test_two"
    modules = out[out.index("The 5 test modules with the most CPU:") + 2:]
    assert [line.split() for line in modules] == [["8.8", "9.0", "1", "tests/x/test_a.py"],
                                                  ["4.0", "9.0", "1", "tests/y/test_b.py"]]
