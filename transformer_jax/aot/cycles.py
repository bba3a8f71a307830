"""The TPU compiler's own time estimate of a compiled program: the cycles it estimates for each instruction.

libtpu writes an `estimated_cycles` figure into the backend config of each instruction it schedules (fusions,
matmuls, copies, scatters), from its cost model of the chip: the figure it schedules by. Summed over the program
(a loop's body times its known trip count, every branch of a conditional), and divided by the TensorCore clock,
it is a step time that counts what XLA's bytes accessed and FLOPs each miss: the tiles a fusion re-reads, the
arithmetic of elementwise work (a random-number hash is arithmetic, not bytes), a small fusion's fixed cost.

What it leaves out: Pallas kernels (custom calls carry no estimate; `Estimate.seconds` adds them by their cost
estimate's roofline, or by the FLOPs a caller supplies for those without one, such as splash attention) and
collectives (which overlap compute on a pod). CUDA plugin programs carry no estimates: GPUs get None.
"""

from __future__ import annotations

import dataclasses
import json
import re

_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_COST = re.compile(r'"cost_estimate":(\{[^}]*\})')
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%\S+ = .*?\s([a-z][a-z\-]*)\(")
_HEADER = re.compile(r"^(ENTRY )?%(\S+) .*\{\s*$")


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A compiled TPU program's estimated cycles, and its Pallas kernel calls."""

    cycles: int  # summed over the instructions that carry an estimate (loop bodies times their trips)
    kernel_calls: int  # Pallas kernel calls (custom calls with no cycle estimate)
    kernel_flops: float  # FLOPs of the kernel calls that carry a cost estimate
    kernel_bytes: float  # bytes accessed of the kernel calls that carry a cost estimate
    unestimated_kernel_calls: int  # kernel calls with no cost estimate either (splash attention)

    def seconds(self, clock_hz: float, peak_flops: float, bandwidth: float, other_kernel_flops: float = 0.0) -> float:
        """The estimated step time: the cycles at `clock_hz`, plus the kernels with a cost estimate at its roofline
        and those without one at `other_kernel_flops` over the chip's peak."""
        kernels = max(self.kernel_flops / peak_flops, self.kernel_bytes / bandwidth)
        return self.cycles / clock_hz + kernels + other_kernel_flops / peak_flops


def _computations(hlo_text: str) -> tuple[dict[str, list[str]], str]:
    """{name: its instruction lines} of optimized HLO text, and the entry computation's name."""
    computations: dict[str, list[str]] = {}
    current: list[str] | None = None
    entry = ""
    for line in hlo_text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = computations.setdefault(header.group(2), [])
            entry = header.group(2) if header.group(1) else entry
        elif line.rstrip() == "}":
            current = None
        elif current is not None and _INSTRUCTION.match(line):
            current.append(line)
    return computations, entry


def estimate_of(hlo_text: str) -> Estimate | None:
    """The program's Estimate, or None when its HLO carries no cycle estimates (not compiled by libtpu)."""
    if '"estimated_cycles"' not in hlo_text:
        return None
    computations, entry = _computations(hlo_text)
    cycles = calls = unestimated = 0
    flops = accessed = 0.0
    pending = [(entry, 1)]
    while pending:
        name, times = pending.pop()
        for line in computations.get(name, []):
            op = _INSTRUCTION.match(line).group(1)
            if op == "while":
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
                body = re.search(r"body=%([\w.\-]+)", line)
                pending.append((body.group(1), times * (int(trips.group(1)) if trips else 1)))
            elif op in ("call", "conditional"):
                called = re.findall(r"(?:to_apply|true_computation|false_computation)=%([\w.\-]+)", line)
                branches = re.search(r"branch_computations=\{([^}]*)\}", line)
                called += [b.strip().lstrip("%") for b in branches.group(1).split(",")] if branches else []
                pending += [(c, times) for c in called]
            elif 'custom_call_target="tpu_custom_call"' in line:
                calls += times
                cost = _COST.search(line)
                if cost is None:
                    unestimated += times
                else:
                    figures = json.loads(cost.group(1))
                    flops += times * float(figures.get("flops", 0))
                    accessed += times * float(figures.get("bytes_accessed", 0))
            estimated = _CYCLES.search(line)
            if estimated:
                cycles += times * int(estimated.group(1))
    return Estimate(cycles, calls, flops, accessed, unestimated)
