"""Time to BLEU against fairseq: the same model and recipe on the same corpus for the same wall time, one after
the other on this machine, scored by the same SacreBLEU on the same test set.

    python -m benchmarks.run --sections time_to_bleu --fairseq_venv DIR [--bleu_minutes 30] [--bleu_corpus DIR]

The recipe (issue 31's): d_model 256, 3 + 3 layers, 4 heads, d_ff 1024, dropout 0.1, one joint SentencePiece
vocabulary of 8,000 pieces (ours, trained once and given to both), Adam (0.9, 0.98) with the inverse square root
schedule peaking at 1e-3 after 300 updates, label smoothing 0.1, batches of 4,096 tokens (fairseq's `--max-tokens
4096`; ours `data.tokens_per_batch=4096`, or `--our_tokens_per_batch N`: the preflight's `batch content` line gives
the N whose updates hold as many real tokens as fairseq's), beam 4 for the test translation. The corpus is the
built-in one (synthetic: its BLEU shows learning speed, not quality on language) or `--bleu_corpus`, a directory of
train/dev/test.en and .de files. fairseq's binarized data is made before its clock starts; ours prepares its corpus
inside its clock (start-up counted), as train.py does. Each side trains for `--bleu_minutes` of wall time (fairseq:
`--stop-time-hours`; ours: SIGTERM at that time after train.py starts, after which it saves and exits). Both save a
checkpoint every CHECKPOINT_EVERY updates; the test split is translated with beam 4 from the newest checkpoint
saved by each of `--bleu_at` minutes (default 5, 10 and the end), timed by the checkpoint's file time from the
process's launch, so one run gives BLEU against wall time.

fairseq 0.12.2 (its last release) in its own virtualenv, not in CI: `python3 -m venv DIR && DIR/bin/pip install
torch==2.13.0 fairseq==0.12.2`. On Python 3.11 its and hydra-core 1.0's config dataclasses have instances of
other dataclasses as defaults, which 3.11 refuses; this section writes `DIR/.../site-packages/sitecustomize.py`,
which makes those classes hashable (as Python 3.10 accepted them); fairseq-train then runs. fairseq-generate
on torch 2.13 needs two things this section gives it: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 (its checkpoints
pickle an argparse.Namespace), and its encoder's fused "BetterTransformer" inference path turned off (on
torch 2.13 it fails, "Mask Type should be defined"): GENERATE runs fairseq_cli.generate with each encoder
layer's `load_to_BT` left False, so it takes the layer's ordinary forward, the one it trains with.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.workers import REPO
from transformer_jax.base import workdir as layout

VOCAB, WARMUP, PEAK_LR, MAX_TOKENS = 8_000, 300, 1e-3, 4_096
CHECKPOINT_EVERY = 50  # updates between checkpoints, both sides: BLEU is read at --bleu_at minutes from them
SHIM = '''# Written by benchmarks/sections/time_to_bleu.py: fairseq 0.12.2 and hydra-core 1.0.7 on Python 3.11.
import dataclasses

_dataclass = dataclasses.dataclass


def _hashable_dataclass(cls=None, /, **kwargs):
    def wrap(klass):
        if klass.__module__.split(".")[0] in ("fairseq", "hydra") and "__hash__" not in klass.__dict__:
            kwargs.setdefault("unsafe_hash", True)
        return _dataclass(klass, **kwargs)

    return wrap if cls is None else wrap(cls)


dataclasses.dataclass = _hashable_dataclass
'''


def splits(corpus: str | None) -> dict[str, list[tuple[str, str]]]:
    from transformer_jax.data import load_splits

    return load_splits("text", path=corpus) if corpus else load_splits("builtin")


def write_fairseq_data(pairs: dict[str, list[tuple[str, str]]], scratch: str, venv: str) -> tuple[str, Any]:
    """Our joint SentencePiece model on the training pairs, the splits as pieces, fairseq-preprocess'd."""
    from transformer_jax.data import sample_sentences, train_tokenizer

    # 8,000 pieces, or as many as the corpus supports (the built-in corpus: fewer)
    tokenizer = train_tokenizer(sample_sentences(pairs["train"], 1_000_000), os.path.join(scratch, "spm.model"), VOCAB)
    text = os.path.join(scratch, "pieces")
    os.makedirs(text)
    for split, rows in pairs.items():
        for side, lang in enumerate(("en", "de")):
            with open(os.path.join(text, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(" ".join(tokenizer.piece(t) for t in tokenizer.encode(row[side])) + "\n")
    binary = os.path.join(scratch, "bin")
    subprocess.run([os.path.join(venv, "bin", "fairseq-preprocess"), "--source-lang", "en", "--target-lang", "de",
                    "--trainpref", f"{text}/train", "--validpref", f"{text}/dev", "--testpref", f"{text}/test",
                    "--destdir", binary, "--joined-dictionary", "--workers", "2"], check=True, capture_output=True)
    return binary, tokenizer


def fairseq_run(venv: str, binary: str, scratch: str, minutes: float) -> dict[str, Any]:
    """fairseq-train for `minutes` of wall time, a checkpoint every CHECKPOINT_EVERY updates."""
    save = os.path.join(scratch, "fairseq_checkpoints")
    model = ["--arch", "transformer", "--share-all-embeddings", "--encoder-layers", "3", "--decoder-layers", "3",
             "--encoder-embed-dim", "256", "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
             "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
             "--dropout", "0.1"]
    recipe = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", str(PEAK_LR), "--lr-scheduler",
              "inverse_sqrt", "--warmup-updates", str(WARMUP), "--warmup-init-lr", "1e-7", "--criterion",
              "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", str(MAX_TOKENS)]
    launched = time.time()
    result = subprocess.run([os.path.join(venv, "bin", "fairseq-train"), binary, *model, *recipe, "--cpu",
                             "--save-dir", save, "--no-epoch-checkpoints", "--stop-time-hours", str(minutes / 60),
                             "--save-interval-updates", str(CHECKPOINT_EVERY), "--keep-interval-updates", "-1",
                             "--log-format", "json", "--log-interval", "50", "--max-epoch", "1000",
                             "--disable-validation", "--seed", "0"], capture_output=True, text=True)
    train_s = time.time() - launched
    logs = [json.loads(line.split("|", 3)[-1].strip()) for line in result.stderr.splitlines() + result.stdout.splitlines()
            if '"num_updates"' in line and line.rstrip().endswith("}")]
    if not logs:
        raise RuntimeError(f"fairseq-train logged no updates:\n{result.stderr[-3000:]}")
    saved = [(os.path.getmtime(path) - launched, int(path.rsplit("_", 1)[1][:-3]), path)
             for path in glob.glob(os.path.join(save, "checkpoint_*_*.pt"))]
    final = os.path.join(save, "checkpoint_last.pt")  # saved when --stop-time-hours ends training
    updates = int(subprocess.run(  # the log's last line is up to 50 updates old; the checkpoint knows
        [os.path.join(venv, "bin", "python"), "-c", "import sys, torch; print(torch.load(sys.argv[1], "
         "weights_only=False)['optimizer_history'][-1]['num_updates'])", final],
        capture_output=True, text=True, check=True).stdout.split()[-1])
    saved.append((os.path.getmtime(final) - launched, updates, final))
    return {"updates": updates, "train_s": train_s, "log": logs, "saved": sorted(saved)}


# fairseq_cli.generate with the encoder layers' fused inference path off (see the module docstring).
GENERATE = """
import sys
from fairseq.modules import transformer_layer
loaded = transformer_layer.TransformerEncoderLayerBase._load_from_state_dict
def without_fused_path(self, *args, **kwargs):
    loaded(self, *args, **kwargs)
    self.load_to_BT = False
transformer_layer.TransformerEncoderLayerBase._load_from_state_dict = without_fused_path
from fairseq_cli.generate import cli_main
sys.argv[0] = "fairseq-generate"
cli_main()
"""


def fairseq_translate(venv: str, binary: str, checkpoint: str) -> list[str] | str:
    """fairseq-generate's beam-4 test translations (SentencePiece pieces), or its error line."""
    generated = subprocess.run([os.path.join(venv, "bin", "python"), "-c", GENERATE, binary, "--path", checkpoint,
                                "--cpu", "--beam", "4", "--lenpen", "0.6", "--max-len-a", "1", "--max-len-b", "50",
                                "--batch-size", "128", "--gen-subset", "test"], capture_output=True, text=True,
                               env=dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1"))
    if generated.returncode:
        error = [line for line in generated.stderr.splitlines() if "Error" in line]
        return error[-1] if error else generated.stderr[-300:]
    hypotheses = {}
    for line in generated.stdout.splitlines():
        if line.startswith("H-"):
            index, _, text = line[2:].split("\t", 2)
            hypotheses[int(index)] = text
    return [hypotheses[i] for i in sorted(hypotheses)]


def our_run(corpus: str | None, scratch: str, minutes: float, tokenizer_model: str, vocab: int,
            tokens_per_batch: int = MAX_TOKENS) -> dict[str, Any]:
    """train.py for `minutes` of wall time from its start (SIGTERM then: it saves and exits)."""
    config = os.path.join(scratch, "ours_config.py")
    with open(config, "w") as f:
        f.write(f'''from transformer_jax.config.schema import default_config


def get_config():
    c = default_config()
    c.data.source, c.data.path = {"'text'" if corpus else "'builtin'"}, {corpus or ""!r}
    c.data.vocab_size, c.data.tokens_per_batch, c.data.max_length = {vocab}, {tokens_per_batch}, 128
    c.model.update(num_layers=3, d_model=256, d_ff=1024, num_heads=4, dropout_rate=0.1, max_len=256)
    c.training.update(num_train_steps=1_000_000, warmup_steps={WARMUP}, peak_learning_rate={PEAK_LR},
                      log_every=50, eval_every=1_000_000, bleu_every=0, checkpoint_every={CHECKPOINT_EVERY},
                      keep_checkpoints=100_000)
    return c
''')
    workdir = os.path.join(scratch, "ours")
    os.makedirs(workdir)
    os.link(tokenizer_model, layout.run_path(workdir, layout.TOKENIZER))  # the same SentencePiece model as fairseq's
    launched = time.time()
    # Its output goes to a file: a pipe nobody reads fills up (the progress bar) and stalls train.py.
    with open(os.path.join(scratch, "ours.log"), "w") as log:
        process = subprocess.Popen([sys.executable, "train.py", f"--config={config}", f"--workdir={workdir}"],
                                   cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            process.wait(timeout=minutes * 60)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            process.wait()
    train_s = time.time() - launched
    with open(layout.run_path(workdir, layout.METRICS)) as f:
        metrics = [json.loads(line) for line in f if '"train"' in line]
    with open(layout.run_path(workdir, layout.TIMING)) as f:
        # The log windows' records (the others are start-up, evaluation and checkpoint-stall records).
        timing = [record for record in map(json.loads, f) if "tokens_per_second" in record]
    checkpoints = layout.run_path(workdir, layout.CHECKPOINTS)
    saved = sorted((os.path.getmtime(os.path.join(checkpoints, name)) - launched, int(name), name)
                   for name in os.listdir(checkpoints) if name.isdigit())
    return {"updates": metrics[-1]["step"] if metrics else 0, "train_s": train_s, "timing": timing,
            "saved": saved, "workdir": workdir, "launched": launched}


def our_translate(workdir: str, step: int) -> list[str]:
    """eval.py's beam-4 test translations of checkpoint `step`."""
    subprocess.run([sys.executable, "eval.py", f"--workdir={workdir}", f"--checkpoint={step}", "--beam_size=4"],
                   cwd=REPO, capture_output=True, text=True, check=True)
    with open(glob.glob(layout.run_path(workdir, layout.EVAL, f"test.*{step}.hyp"))[0], encoding="utf-8") as f:
        return f.read().splitlines()


def prepare_venv(venv: str) -> None:
    """fairseq 0.12.2 and hydra-core 1.0.7 on Python 3.11: the dataclass shim (SHIM) as the venv's sitecustomize."""
    packages = glob.glob(os.path.join(venv, "lib", "python3.*", "site-packages"))[0]
    with open(os.path.join(packages, "sitecustomize.py"), "w") as f:
        f.write(SHIM)


def at_minutes(saved: list[tuple[float, int, Any]], minutes: list[float]) -> list[tuple[float, float, int, Any]]:
    """For each of `minutes`, the newest checkpoint saved by then: (minute, seconds since launch, update, its id)."""
    chosen = []
    for minute in minutes:
        before = [entry for entry in saved if entry[0] <= minute * 60 + 5] or saved[:1]  # 5 s: the final save
        chosen.append((minute, *before[-1]))
    return chosen


def scored(hypotheses: list[str] | str, references: list[str]) -> dict[str, Any]:
    """SacreBLEU of `hypotheses` (or the error that kept them from being made)."""
    import sacrebleu

    if isinstance(hypotheses, str):
        return {"bleu": None, "error": hypotheses}
    metric = sacrebleu.BLEU()
    return {"bleu": round(metric.corpus_score(hypotheses, [references]).score, 2),
            "signature": str(metric.get_signature())}


def compare(venv: str, corpus: str | None, minutes: float, bleu_at: list[float],
            tokens_per_batch: int = MAX_TOKENS) -> dict[str, Any]:
    prepare_venv(venv)
    pairs = splits(corpus)
    references = [target for _, target in pairs["test"]]
    marks = sorted({m for m in bleu_at if m < minutes} | {minutes})
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as scratch:
        binary, tokenizer = write_fairseq_data(pairs, scratch, venv)
        result["vocab_size"] = tokenizer.vocab_size
        theirs = fairseq_run(venv, binary, scratch, minutes)
        ours = our_run(corpus, scratch, minutes, os.path.join(scratch, "spm.model"), tokenizer.vocab_size,
                       tokens_per_batch)
        for name, run, translate in (
                ("fairseq", theirs, lambda path: fairseq_translate(venv, binary, path)),
                ("ours", ours, lambda step: our_translate(ours["workdir"], step))):
            points = []
            for minute, elapsed, update, ident in at_minutes(run["saved"], marks):
                hypotheses = translate(ident)
                if name == "fairseq" and not isinstance(hypotheses, str):
                    hypotheses = [tokenizer._processor.decode_pieces(line.split()) for line in hypotheses]
                points.append({"minute": minute, "saved_at_s": round(elapsed, 1), "update": update,
                               **scored(hypotheses, references)})
                print(f"  {name:8s} at {minute:4.0f} min: update {update:5d} (saved {elapsed / 60:5.1f} min after "
                      f"launch), test SacreBLEU {points[-1]['bleu']}", flush=True)
            result[name] = {"updates": run["updates"], "train_s": round(run["train_s"], 1), "bleu_at": points}
    wpb = [float(entry["wpb"]) for entry in theirs["log"] if "wpb" in entry]
    result["fairseq"]["target_tokens_per_update"] = sum(wpb) / len(wpb) if wpb else None
    wps = [float(entry["wps"]) for entry in theirs["log"][1:] if "wps" in entry]  # the first window: start-up
    result["fairseq"]["target_tokens_per_s"] = sorted(wps)[len(wps) // 2] if wps else None
    timing = ours["timing"][1:] or [{"tokens_per_second": 0.0, "seconds_per_step": 0.0}]  # the first: compiling
    middle = sorted(timing, key=lambda entry: entry["tokens_per_second"])[len(timing) // 2]
    result["ours"]["target_tokens_per_s"] = middle["tokens_per_second"]
    result["ours"]["target_tokens_per_update"] = middle["tokens_per_second"] * middle["seconds_per_step"]
    return result


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not args.fairseq_venv:
        print("  skipped: pass --fairseq_venv DIR (a virtualenv with fairseq 0.12.2; see the section's docstring)")
        return {}
    minutes = 2.0 if args.quick else args.bleu_minutes
    bleu_at = [float(m) for m in args.bleu_at.split(",") if m]
    result = compare(os.path.abspath(args.fairseq_venv), args.bleu_corpus, minutes, bleu_at,
                     args.our_tokens_per_batch)
    for name in ("fairseq", "ours"):
        row = result[name]
        print(f"  {name:8s} {row['updates']:6d} updates in {row['train_s']:.0f} s, {row['target_tokens_per_s'] or 0:8.0f} "
              f"target tokens/s (median log window), {row['target_tokens_per_update'] or 0:6.0f} target tokens/update",
              flush=True)
    return {"minutes": minutes, "corpus": args.bleu_corpus or "builtin", "fairseq_max_tokens": MAX_TOKENS,
            "our_tokens_per_batch": args.our_tokens_per_batch, **result}
