"""Reading a profile: device busy time, kernels, the top kernels and the host's launch calls, per update."""

import gzip
import json

import pytest

from transformer_jax.run.trace_summary import newest_trace, read_trace, summarize_trace


def gpu_trace():
    """Two updates on one GPU stream: 3 kernels and a copy each, launched from the host's main thread."""
    meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "Stream #7(Compute)"}},
            {"ph": "M", "pid": 1, "tid": 9, "name": "thread_name", "args": {"name": "XLA Ops"}},
            {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}}]
    events = []
    for update, start in enumerate((1000, 2000)):  # microseconds; each update 1 ms of wall
        events.append({"ph": "X", "pid": 2, "tid": 5, "name": "train", "ts": start, "dur": 300,
                       "args": {"step_num": str(update + 1)}})
        for i, (name, at, dur) in enumerate((("gemm_fusion", 100, 400), ("loop_add_fusion", 200, 100),
                                             ("MemcpyH2D", 600, 50), ("gemm_fusion", 700, 200))):
            events.append({"ph": "X", "pid": 1, "tid": 7, "name": name, "ts": start + at, "dur": dur,
                           "args": {"hlo_module": "jit_train_step"}})
            events.append({"ph": "X", "pid": 1, "tid": 9, "name": name, "ts": start + at, "dur": dur})  # derived
            events.append({"ph": "X", "pid": 2, "tid": 5, "name": "cuLaunchKernelEx", "ts": start + 10 * i, "dur": 5})
    before = {"ph": "X", "pid": 1, "tid": 7, "name": "gemm_fusion", "ts": 10, "dur": 500}  # before the first update
    return meta + events + [before, {"ph": "X", "pid": 2, "tid": 5, "name": "PjitFunction", "ts": 1000, "dur": 50}]


def test_a_gpu_trace_gives_busy_time_kernels_and_launches_per_update():
    summary = summarize_trace(gpu_trace())
    assert summary.updates == 2 and summary.device == "gpu"
    assert summary.wall == pytest.approx(0.95e-3)  # 1000 to 2900 us over two updates
    # Busy: 100-500 (the add inside it), 600-650, 700-900 = 650 us; kernels leave the copy out, derived lines too.
    assert summary.busy == pytest.approx(650e-6) and summary.kernels == 3
    assert summary.top[0] == ("gemm_fusion", pytest.approx(600e-6), 2.0) and len(summary.top) == 2
    assert summary.launch == pytest.approx(20e-6) and summary.launches == 4
    assert summary.programs == {"jit_train_step": pytest.approx(700e-6)}
    text = "\n".join(summary.lines())
    assert "device busy 0.65 ms per update (68% of the wall), 3 kernels per update" in text
    assert "host launch calls 0.02 ms per update (2% of the wall), 4 calls per update" in text
    assert "bound: neither alone" in text and "no device tracks" not in text
    assert "device tracks read: /device:GPU:0 / Stream #7(Compute)" in text  # the derived "XLA Ops" left out
    unlaunched = summarize_trace([e for e in gpu_trace() if e.get("name") != "cuLaunchKernelEx"])
    assert unlaunched.launches == 0 and "host launch calls: none in the trace" in "\n".join(unlaunched.lines())


def test_the_verdict_tells_a_busy_gpu_from_a_host_that_launches():
    busy = summarize_trace([e if e.get("name") != "gemm_fusion" else {**e, "dur": 800} for e in gpu_trace()])
    assert busy.verdict().startswith("bound: the GPU")
    launching = summarize_trace([e if e.get("name") != "cuLaunchKernelEx" else {**e, "dur": 200} for e in gpu_trace()])
    assert launching.verdict().startswith("bound: the host's launches")


def test_no_step_marker_is_said_not_zeros(tmp_path):
    summary = summarize_trace([e for e in gpu_trace() if e.get("name") != "train"])
    assert summary.updates == 0 and summary.lines() == ["profile: no traced update (no step marker in the trace)"]
    folder = tmp_path / "plugins" / "x" / "2026_11_28"
    folder.mkdir(parents=True)
    with gzip.open(folder / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": gpu_trace()}, f)
    assert newest_trace(str(tmp_path)) == str(folder / "perfetto_trace.json.gz")
    assert len(read_trace(newest_trace(str(tmp_path)))) == len(gpu_trace())
    assert newest_trace(str(tmp_path / "none")) is None
    viewer = tmp_path / "viewer"  # a JAX that wrote no Perfetto trace: its trace viewer JSON holds the same events
    viewer.mkdir()
    with gzip.open(viewer / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": gpu_trace()}, f)
    assert newest_trace(str(viewer)) == str(viewer / "host.trace.json.gz")
