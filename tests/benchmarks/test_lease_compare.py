"""The lease's three-way comparison (benchmarks/lease/compare.py) on a real trained run, exported as a user would."""

import json

from benchmarks.lease.compare import compare_table, main


def test_ours_transformers_and_ctranslate2_translate_the_same_sentences_of_the_exported_run(trained_run, tmp_path):
    pairs = tmp_path / "test.json"
    pairs.write_text(json.dumps([["the small dog sees a cat", "der kleine Hund"], ["a red house", "ein rotes Haus"],
                                 ["", ""], ["the dog", "der Hund"]]))
    out = tmp_path / "compare"
    main([f"--workdir={trained_run['workdir']}", f"--pairs={pairs}", f"--out={out}", "--sentences=5",
          "--modes=greedy"])
    figures = json.loads((out / "compare.json").read_text())
    assert figures["gpu"] is False
    assert (out / "hf" / "config.json").exists() and (out / "ct2" / "model.bin").exists()
    rows = {row["contender"]: row for row in figures["rows"]}
    assert set(rows) == {"ours (JAX)", "transformers generate", "CTranslate2"}
    for row in rows.values():
        assert row["mode"] == "greedy" and row["sentences"] == 5 and row["sentences_per_second"] > 0
        assert 0 <= row["bleu"] <= 100
    table = compare_table([*figures["rows"], {"contender": "CTranslate2", "mode": "beam", "error": "no wheel"}])
    assert "| CTranslate2 | beam | - | not run: no wheel |" in table and "| ours (JAX) | greedy | 5 |" in table
