"""The lease's decode figures (benchmarks/lease/decode.py) on a real trained run, and their table."""

import json

from benchmarks.lease.decode import main
from benchmarks.lease.records import decode_table


def test_each_mode_is_timed_at_each_count_after_compiling_and_one_batch_is_profiled(trained_run, tmp_path):
    sources = tmp_path / "sources.txt"
    sources.write_text("the small dog sees a cat\na red house\n\nthe dog\n")
    out = tmp_path / "decode"
    main([f"--workdir={trained_run['workdir']}", f"--sources={sources}", f"--out={out}", "--sentences=3,12",
          "--modes=greedy,beam", "--batch_size=4"])
    figures = json.loads((out / "decode.json").read_text())
    assert figures["batching"] == {"batch_size": 4}
    rows = [(row["mode"], row["sentences"]) for row in figures["modes"]]
    assert rows == [("greedy", 3), ("greedy", 12), ("beam", 3), ("beam", 12)]
    for row in figures["modes"]:
        assert row["compile_s"] > 0 and row["sentences_per_second"] > 0
        assert row["seconds"] > 0 and 0 <= row["empty_outputs"] <= row["sentences"]
    # The blank source line is not translated: three distinct sentences, the first pass compiles their widths.
    profile = figures["search_profile"]
    assert profile["updates"] == 1 and profile["sentences"] == 4
    assert profile["device"] == "host"  # a CPU: no device tracks, the host's XLA ops counted instead
    assert any("search batch" in line for line in profile["lines"])
    text = decode_table({**figures, "exit": 0})
    assert "| greedy | 12 |" in text and "| beam | 3 |" in text and "batch_size 4" in text
