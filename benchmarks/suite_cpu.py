"""Where the test suite's CPU goes, from the log a run writes with $TRANSFORMER_JAX_TEST_PROCESS_LOG set:

    TRANSFORMER_JAX_TEST_PROCESS_LOG=/tmp/suite.jsonl make test
    .venv/bin/python -m benchmarks.suite_cpu /tmp/suite.jsonl

Two kinds of line (tests/startup/sitecustomize.py, tests/conftest.py): one per Python process at its exit (its CPU
and JAX's compile, trace, lower and cache-read seconds), and one per test (its wall seconds over setup, call and
teardown, the worker's CPU in it, and the CPU of the processes it started and reaped, killed ones included).
Printed: the processes summed by the test module that started them, then the tests and the modules by CPU.
"""

from __future__ import annotations

import argparse
import json

EVENTS = {"compile": "/jax/core/compile/backend_compile_duration", "trace": "/jax/core/compile/jaxpr_trace_duration",
          "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
          "cache read": "/jax/compilation_cache/cache_retrieval_time_sec"}


def module(nodeid: str) -> str:
    return nodeid.split("::")[0] if nodeid else "(no test: a process started outside any test)"


def summed(rows: list[tuple[str, list[float]]]) -> list[tuple[str, list[float]]]:
    """(key, [count, *sums of the values]) for each key of `rows` (key, values), the largest first sum first."""
    sums: dict[str, list[float]] = {}
    for key, values in rows:
        total = sums.setdefault(key, [0.0] * (1 + len(values)))
        for i, value in enumerate([1.0, *values]):
            total[i] += value
    return sorted(sums.items(), key=lambda item: -item[1][1])


def process_table(processes: list[dict], rows: int) -> list[str]:
    keyed = []
    for line in processes:
        test = line["test"].rsplit(" (", 1)[0]  # $PYTEST_CURRENT_TEST ends with its phase: "(setup)", "(call)"
        values = [line["cpu"], *(line["jax"].get(event, 0.0) for event in EVENTS.values())]
        keyed += [("(all)", values), (module(test), values)]
    out = [f"{'CPU s':>7} {'procs':>5} " + " ".join(f"{name:>10}" for name in EVENTS) + "  test module"]
    for key, (count, seconds, *events) in summed(keyed)[:rows + 1]:
        out.append(f"{seconds:7.1f} {int(count):5d} " + " ".join(f"{v:10.1f}" for v in events) + f"  {key}")
    return out


def test_tables(tests: list[dict], rows: int) -> list[str]:
    cpu = lambda line: line["self_cpu"] + line["children_cpu"]  # noqa: E731
    out = [f"{len(tests)} tests: {sum(map(cpu, tests)):.1f} s of CPU (the workers' own "
           f"{sum(t['self_cpu'] for t in tests):.1f} s, the processes they started "
           f"{sum(t['children_cpu'] for t in tests):.1f} s), {sum(t['wall'] for t in tests):.1f} s of wall",
           "", f"The {rows} tests with the most CPU:", f"{'CPU s':>7} {'own':>7} {'started':>7} {'wall s':>7}  test"]
    for line in sorted(tests, key=lambda t: -cpu(t))[:rows]:
        out.append(f"{cpu(line):7.1f} {line['self_cpu']:7.1f} {line['children_cpu']:7.1f} {line['wall']:7.1f}  "
                   f"{line['nodeid']}")
    out += ["", f"The {rows} test modules with the most CPU:", f"{'CPU s':>7} {'wall s':>7} {'tests':>5}  module"]
    for name, (count, seconds, wall) in summed([(module(t["nodeid"]), [cpu(t), t["wall"]]) for t in tests])[:rows]:
        out.append(f"{seconds:7.1f} {wall:7.1f} {int(count):5d}  {name}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="the file $TRANSFORMER_JAX_TEST_PROCESS_LOG named")
    parser.add_argument("--rows", type=int, default=25, help="rows per table")
    args = parser.parse_args(argv)
    with open(args.log) as file:
        lines = [json.loads(line) for line in file if line.strip()]
    processes = [line for line in lines if "argv" in line]
    tests = [line for line in lines if "nodeid" in line]
    print(f"{len(processes)} processes logged at exit (those killed by a signal, or exiting through os._exit, "
          "write no line)")
    print("\n".join(process_table(processes, args.rows)))
    if tests:
        print()
        print("\n".join(test_tables(tests, args.rows)))


if __name__ == "__main__":
    main()
