"""What a profile of a few updates (run/profile.py) says, per update: read from its Perfetto/Chrome trace JSON.

Per traced update: the wall time; the devices' busy time (the union of their kernels' and copies' intervals);
the kernels, and the ten that take longest; the host's time in the CUDA launch calls (`cuLaunchKernel`,
`cuGraphLaunch`, ...). A device busy for most of each update is the bound (GPU-bound); a device idle while the
host spends the update launching is launch-bound. The standard library reads it: no TensorBoard, no XProf.

Where the trace has no device tracks (a CPU: XLA's CPU backend runs its ops as thunks on host threads) the
summary says so, and counts those host-side XLA ops instead, as what they are: the kernels' part is not
measured, and there are no launch calls to count.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import os
from typing import Any, Iterable

from transformer_jax.base import workdir as layout
from transformer_jax.run.profile import STEP_NAME

# The host's calls that launch work on an NVIDIA GPU, as CUPTI names them in the trace (prefixes: the
# driver's and the runtime's, kernels and CUDA graphs, ...Ex variants included).
LAUNCH_PREFIXES = ("cuLaunch", "cudaLaunch", "cuGraphLaunch", "cudaGraphLaunch")
# Copies and fills on a GPU stream: busy time, not kernels.
COPY_PREFIXES = ("memcpy", "memset")
# Lines of a device's process that the profiler derives from its streams (counting them would count twice).
DERIVED_LINES = ("XLA Modules", "XLA Ops", "XLA TraceMe", "Steps", "Framework Ops", "Framework Name Scope",
                 "Source code", "Launch Stats", "TensorFlow Ops", "TensorFlow Name Scope")
TOP = 10


@dataclasses.dataclass(frozen=True)
class TraceSummary:
    """A trace of `updates` updates, in seconds per update."""

    updates: int
    device: str  # "gpu": kernels on device tracks; "host": no device tracks, XLA's ops on host threads; "": none
    wall: float  # from the first traced update's start to the end of the last one's work
    busy: float  # kernels and copies running (union over streams), or host XLA ops running
    kernels: float  # kernels (host XLA ops without device tracks) per update
    top: list[tuple[str, float, float]]  # (name, seconds, count) per update, longest first
    launch: float | None  # the host's time in launch calls; None without device tracks
    launches: float
    programs: dict[str, float]  # the XLA programs (modules) the ops belong to: seconds per update
    tracks: list[str] = dataclasses.field(default_factory=list)  # the device tracks read (process / thread)

    def lines(self) -> list[str]:
        """The summary as lines of text."""
        if not self.updates:
            return ["profile: no traced update (no step marker in the trace)"]
        ms = lambda seconds: f"{1e3 * seconds:.2f} ms"  # noqa: E731
        head = [f"profile: {self.updates} update(s) traced, {ms(self.wall)} each (wall)"]
        if not self.device:
            return head + ["no device tracks and no XLA ops in the trace"]
        if self.device == "host":
            head += ["no device tracks: XLA's ops ran as thunks on host threads (a CPU's backend; on a GPU, the "
                     "profiler recorded no kernels); kernels, device busy time and launches are not measured. "
                     "The host's XLA ops instead:",
                     f"host XLA ops busy {ms(self.busy)} per update ({self.share(self.busy)} of the wall), "
                     f"{self.kernels:.0f} ops per update"]
        else:
            launches = (f"host launch calls {ms(self.launch or 0.0)} per update ({self.share(self.launch or 0.0)} "
                        f"of the wall), {self.launches:.0f} calls per update" if self.launches else
                        f"host launch calls: none in the trace (named {', '.join(LAUNCH_PREFIXES)}...)")
            head += [f"device busy {ms(self.busy)} per update ({self.share(self.busy)} of the wall), "
                     f"{self.kernels:.0f} kernels per update", launches, self.verdict(),
                     f"device tracks read: {', '.join(self.tracks[:6])}" + (" ..." if len(self.tracks) > 6 else "")]
        if self.programs:
            head.append("programs: " + ", ".join(f"{name} {ms(seconds)}" for name, seconds in
                                                  sorted(self.programs.items(), key=lambda item: -item[1])))
        what = "kernels" if self.device == "gpu" else "host XLA ops"
        head.append(f"top {len(self.top)} {what} by time, per update:")
        head += [f"  {ms(seconds):>11}  {count:6.1f}x  {name[:110]}" for name, seconds, count in self.top]
        return head

    def share(self, seconds: float) -> str:
        return f"{100 * seconds / self.wall:.0f}%" if self.wall else "-"

    def verdict(self) -> str:
        """Launch-bound, GPU-bound or neither, from the device's and the launches' shares of the wall."""
        if not self.wall:
            return "bound: - (no wall time)"
        if self.busy >= 0.8 * self.wall:
            return "bound: the GPU (busy for most of each update; fewer or faster kernels shorten it)"
        if (self.launch or 0.0) >= 0.5 * self.wall:
            return "bound: the host's launches (the GPU idles while kernels are launched one by one)"
        return ("bound: neither alone (the GPU idles and the launches take under half of the wall: "
                "look at the host's other work in the trace)")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def newest_trace(directory: str) -> str | None:
    """The newest trace JSON below `directory` (a run's profile folder): its Perfetto trace, else the trace
    viewer's JSON that JAX writes beside it (the same events); None without one."""
    found = []
    for folder, _, files in os.walk(directory):
        names = [layout.PERFETTO_TRACE] if layout.PERFETTO_TRACE in files else sorted(
            name for name in files if name.endswith(layout.TRACE_VIEWER_SUFFIX))
        found += [os.path.join(folder, names[0])] if names else []
    return max(found, key=os.path.getmtime) if found else None


def read_trace(path: str) -> list[dict[str, Any]]:
    """The trace events of a Chrome/Perfetto trace JSON (gzipped or not)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def summarize_trace(events: Iterable[dict[str, Any]], step_name: str = STEP_NAME) -> TraceSummary:
    """The per-update summary of a trace's events (see the module docstring); the updates are the spans named
    `step_name` (a `StepTraceAnnotation`; another name for other work marked alike, e.g. a search batch)."""
    events = list(events)
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = sorted((e for e in spans if e.get("name") == step_name and "step_num" in (e.get("args") or {})),
                   key=lambda e: e["ts"])
    if not steps:
        return TraceSummary(0, "", 0.0, 0.0, 0.0, [], None, 0.0, {})
    begin = steps[0]["ts"]
    gpu = {pid for pid, name in processes.items() if name.startswith("/device:GPU")}
    on_device = [e for e in spans if e["pid"] in gpu and e["ts"] >= begin]
    streams = {key for key in threads if key[0] in gpu and threads[key].startswith("Stream")}
    if streams:  # the streams' own lines; the derived ones repeat them
        on_device = [e for e in on_device if (e["pid"], e.get("tid")) in streams]
    else:
        on_device = [e for e in on_device if threads.get((e["pid"], e.get("tid")), "") not in DERIVED_LINES]
    if on_device:
        device = "gpu"
        ops = [e for e in on_device if not e["name"].lower().startswith(COPY_PREFIXES)]
        busy_spans = on_device
        launch_calls = [e for e in spans if e["pid"] not in gpu and e["ts"] >= begin
                        and e["name"].startswith(LAUNCH_PREFIXES)]
    else:  # XLA's CPU backend: the thunks it runs carry their HLO op and module
        ops = [e for e in spans if e["ts"] >= begin and "hlo_op" in (e.get("args") or {})]
        device, busy_spans, launch_calls = ("host" if ops else ""), ops, []
    end = max([steps[-1]["ts"] + steps[-1]["dur"], *(e["ts"] + e["dur"] for e in busy_spans)])
    n = len(steps)
    per_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    programs: dict[str, float] = collections.defaultdict(float)
    for e in ops:
        name = (e.get("args") or {}).get("hlo_op") if device == "host" else e["name"]
        per_name[name][0] += e["dur"]
        per_name[name][1] += 1
        module = (e.get("args") or {}).get("hlo_module")
        if module:
            programs[module] += e["dur"] / 1e6 / n
    top = sorted(per_name.items(), key=lambda item: -item[1][0])[:TOP]
    return TraceSummary(
        updates=n, device=device, wall=(end - begin) / 1e6 / n, busy=_union(busy_spans) / 1e6 / n,
        kernels=len(ops) / n, top=[(name, total / 1e6 / n, count / n) for name, (total, count) in top],
        launch=sum(e["dur"] for e in launch_calls) / 1e6 / n if device == "gpu" else None,
        launches=len(launch_calls) / n, programs=dict(programs),
        tracks=sorted({f"{processes[e['pid']]} / {threads.get((e['pid'], e.get('tid')), e.get('tid'))}"
                       for e in on_device}))


def _union(spans: list[dict[str, Any]]) -> float:
    """The microseconds covered by at least one of `spans` (trace events with `ts` and `dur`)."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted((e["ts"], e["ts"] + e["dur"]) for e in spans):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered
