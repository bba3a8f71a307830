"""Start-up time and peak memory of a run's data preparation on a large text corpus, before and after.

    python benchmarks/startup.py [--pairs 1000000] [--vocab 32000]

Writes a generated parallel text corpus (`--pairs` training pairs of random words, WMT-like lengths),
trains a SentencePiece model on a sample once, then times `prepare_data` (reading the text, encoding,
length filter, choosing the row width, planning the first epoch) each in a fresh process, reporting
its wall time and peak resident memory (VmHWM):
  tiny corpus          1,000 pairs, same tokenizer: the floor (imports, tokenizer, dev/test);
  whole-corpus lists   encoding as before: every sentence's id list held, then flattened (no cache);
  chunked first run    encoding in chunks of 50,000 pairs, then saving the arrays to the workdir;
  chunked resume       the same workdir again: the saved arrays are read, the text is not encoded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODES = ("tiny corpus", "whole-corpus lists", "chunked first run", "chunked resume")


def write_corpus(directory: str, num_pairs: int, seed: int = 0) -> None:
    """train/dev/test .en/.de files of random pseudo-words, lognormal lengths (mean about 22 words)."""
    rng = np.random.default_rng(seed)
    syllables = np.array(["ka", "te", "ri", "mo", "su", "len", "der", "ung", "sch", "ein", "the", "and", "ion", "er"])
    words = np.array(["".join(rng.choice(syllables, rng.integers(1, 4))) for _ in range(30_000)])
    os.makedirs(directory, exist_ok=True)
    for split, size in (("train", num_pairs), ("dev", 500), ("test", 500)):
        lengths = np.clip(rng.lognormal(np.log(19), 0.55, size), 1, 200).astype(int)
        for language, stretch in (("en", 1.0), ("de", 1.1)):
            ids = rng.integers(0, len(words), int((lengths * stretch).astype(int).sum() + size))
            with open(os.path.join(directory, f"{split}.{language}"), "w", encoding="utf-8") as f:
                start = 0
                for n in (np.maximum(lengths * stretch, 1)).astype(int):
                    f.write(" ".join(words[ids[start:start + n]]) + "\n")
                    start += n


def child(mode: str, data_dir: str, workdir: str, vocab: int) -> None:
    """One measured start-up in this (fresh) process; prints a JSON line."""
    import transformer_jax.data.pipeline as pipeline
    from transformer_jax.data.encoded import EncodedPairs, Ragged
    from transformer_jax.data.tokenizer import EOS_ID
    from transformer_jax.run.config_schema import default_config

    if mode == "whole-corpus lists":  # the encoding this revision replaced, and no saved arrays
        def encode_at_once(pairs, tokenizer, **_):
            sides = []
            for side in (0, 1):
                ids = tokenizer.encode_batch([pair[side] for pair in pairs])
                sides.append(Ragged.from_lists([sequence + [EOS_ID] for sequence in ids]))
            return EncodedPairs(*sides)

        pipeline.encode_pairs = encode_at_once
        pipeline.save_encoded = lambda *args: None
    config = default_config()
    config.data.update(source="text", path=data_dir, vocab_size=vocab, tokens_per_batch=25_000, max_length=256)
    config.model.update(num_layers=6)
    start = time.perf_counter()
    data = pipeline.prepare_data(config, workdir)
    next(data.train)
    seconds = time.perf_counter() - start
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    print(json.dumps({"mode": mode, "seconds": seconds, "peak_rss_bytes": peak, "pairs": len(data.train.corpus),
                      "row_width": data.train.row_width}))


def measure(mode: str, data_dir: str, workdir: str, vocab: int) -> dict:
    output = subprocess.run([sys.executable, __file__, f"--child={mode}", f"--data={data_dir}",
                             f"--workdir={workdir}", f"--vocab={vocab}"], check=True, capture_output=True, text=True)
    return json.loads(output.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated, from: " + ", ".join(MODES))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--data", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.data, args.workdir, args.vocab)
        return
    from transformer_jax.data.sources import read_parallel_text
    from transformer_jax.data.tokenizer import MODEL_FILENAME, sample_sentences, train_tokenizer

    with tempfile.TemporaryDirectory() as root:
        start = time.perf_counter()
        big, tiny = os.path.join(root, "big"), os.path.join(root, "tiny")
        write_corpus(big, args.pairs)
        write_corpus(tiny, 1_000, seed=1)
        sample = sample_sentences(read_parallel_text(os.path.join(tiny, "train.en"), os.path.join(tiny, "train.de")),
                                  1_000)
        tokenizer_path = os.path.join(root, MODEL_FILENAME)
        train_tokenizer(sample, tokenizer_path, args.vocab)
        print(f"wrote {args.pairs:,} pairs and a tokenizer in {time.perf_counter() - start:.0f} s", flush=True)
        results = []
        workdirs = {}
        for mode in [m for m in MODES if m in args.modes.split(",") or m == "tiny corpus"]:
            data_dir = tiny if mode == "tiny corpus" else big
            if mode != "chunked resume":  # the resume reuses the first run's workdir
                workdirs[mode] = os.path.join(root, mode.replace(" ", "_").replace(",", ""))
                os.makedirs(workdirs[mode])
                shutil.copy(tokenizer_path, workdirs[mode])
            workdir = workdirs["chunked first run" if mode == "chunked resume" else mode]
            result = measure(mode, data_dir, workdir, args.vocab)
            results.append(result)
            above = (result["peak_rss_bytes"] - results[0]["peak_rss_bytes"]) / 2**20
            print(f"{mode:<20} {result['pairs']:>9,} pairs  start-up {result['seconds']:6.1f} s  peak RSS "
                  f"{result['peak_rss_bytes'] / 2**20:7,.0f} MiB  ({above:+7,.0f} MiB over the tiny corpus)",
                  flush=True)


if __name__ == "__main__":
    main()
