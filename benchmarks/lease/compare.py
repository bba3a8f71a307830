"""The lease's three-way comparison: ours, transformers' `generate` and CTranslate2 on the same sentences and weights.

    python -m benchmarks.lease.compare --workdir RUN --pairs TEST_JSON --out DIR [--sentences 1000]
        [--modes beam,greedy]

The trained run is exported with `transformer-jax export --format=hf` (a Marian directory: what transformers'
MarianMTModel reads and CTranslate2's converter takes). Each contender translates the test sources repeated to
each count of --sentences, 16-bit on a GPU (ours bfloat16, transformers and CTranslate2 float16; float32 on a
CPU, where neither runs 16-bit matmuls natively), with the same search: beam 4 with length penalty 0.6, or
greedy, outputs of at most source + 50 tokens; batches of BATCH sentences sorted by length (ours: its own
batching, sized for the devices). A pass over the distinct sentences first (at most the largest count of them:
compiles, warm-up), then each count timed; SacreBLEU of that first pass against the references. A contender that cannot run
(CTranslate2's wheel or the CUDA it needs missing) is a row with its one-line reason. Prints the table and writes
DIR/compare.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Callable

import sacrebleu

from benchmarks.workers import REPO

BATCH = 256
EXTRA = 50  # the paper's maximum output length: source + 50
ALPHA = 0.6
BEAMS = {"beam": 4, "greedy": 1}


def export_hf(workdir: str, directory: str) -> str:
    """The run as a Hugging Face Marian directory (the export command, as a user runs it)."""
    subprocess.run([sys.executable, "-m", "transformer_jax", "export", f"--workdir={workdir}", "--format=hf",
                    f"--output={directory}"], cwd=REPO, check=True, capture_output=True, text=True)
    return directory


def by_length(texts: list[str], lengths: list[int]) -> list[list[int]]:
    """Indices of `texts` in batches of BATCH, longest first (as every contender batches alike)."""
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])
    return [order[i:i + BATCH] for i in range(0, len(order), BATCH)]


def ours(workdir: str, gpu: bool) -> Callable[[list[str], str], list[str]]:
    from transformer_jax.evaluation import Translator

    translator = Translator(workdir, dtype="bfloat16" if gpu else "float32")
    return lambda texts, mode: translator.translate(texts, mode=mode, max_extra_length=EXTRA,
                                                    **({"beam_size": 4, "alpha": ALPHA} if mode == "beam" else {}))


def transformers_generate(hf_dir: str, gpu: bool) -> Callable[[list[str], str], list[str]]:
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    device = "cuda" if gpu else "cpu"
    model = MarianMTModel.from_pretrained(hf_dir, torch_dtype=torch.float16 if gpu else torch.float32).to(device)
    model.eval()
    tokenizer = MarianTokenizer.from_pretrained(hf_dir)

    def translate(texts: list[str], mode: str) -> list[str]:
        encoded = [tokenizer(text).input_ids for text in texts]
        outputs = [""] * len(texts)
        with torch.inference_mode():
            for batch in by_length(texts, [len(ids) for ids in encoded]):
                inputs = tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True).to(device)
                search = {"num_beams": 4, "length_penalty": ALPHA, "early_stopping": True} if mode == "beam" else {
                    "num_beams": 1}
                out = model.generate(**inputs, do_sample=False, max_new_tokens=inputs.input_ids.shape[1] + EXTRA,
                                     **search)
                for i, text in zip(batch, tokenizer.batch_decode(out, skip_special_tokens=True)):
                    outputs[i] = text
        return outputs

    return translate


def ctranslate2_translate(hf_dir: str, gpu: bool, scratch: str) -> Callable[[list[str], str], list[str]]:
    import ctranslate2
    from ctranslate2.converters import TransformersConverter
    from transformers import MarianTokenizer

    directory = TransformersConverter(hf_dir).convert(os.path.join(scratch, "ct2"), force=True,
                                                      quantization="float16" if gpu else "float32")
    translator = ctranslate2.Translator(directory, device="cuda" if gpu else "cpu",
                                        compute_type="float16" if gpu else "float32")
    tokenizer = MarianTokenizer.from_pretrained(hf_dir)

    def translate(texts: list[str], mode: str) -> list[str]:
        # CTranslate2 appends the end of sentence itself.
        pieces = [tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids)[:-1] for text in texts]
        outputs = [""] * len(texts)
        for batch in by_length(texts, [len(p) for p in pieces]):
            longest = max(len(pieces[i]) for i in batch)
            results = translator.translate_batch([pieces[i] for i in batch], beam_size=BEAMS[mode],
                                                 length_penalty=ALPHA if mode == "beam" else 1.0,
                                                 max_decoding_length=longest + EXTRA, max_batch_size=BATCH)
            for i, result in zip(batch, results):
                outputs[i] = tokenizer.convert_tokens_to_string(result.hypotheses[0])
        return outputs

    return translate


def contenders(workdir: str, hf_dir: str, gpu: bool, scratch: str) -> dict[str, Callable | str]:
    """Each contender's translate function, or the one line saying why it cannot run here."""
    makers = {"ours (JAX)": lambda: ours(workdir, gpu), "transformers generate": lambda: transformers_generate(
        hf_dir, gpu), "CTranslate2": lambda: ctranslate2_translate(hf_dir, gpu, scratch)}
    made: dict[str, Callable | str] = {}
    for name, make in makers.items():
        try:
            made[name] = make()
        except Exception as error:  # noqa: BLE001 - a contender that cannot load is a finding, in its row
            made[name] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:200] if str(error) else ''}"
    return made


def compare(workdir: str, pairs: list[tuple[str, str]], counts: list[int], modes: list[str], out: str,
            gpu: bool) -> list[dict[str, Any]]:
    """Every contender, mode and count: sentences/s after the warm-up pass, and SacreBLEU of the distinct ones."""
    distinct = list(dict.fromkeys((source, target) for source, target in pairs if source.strip()))[:max(counts)]
    sources, references = [s for s, _ in distinct], [t for _, t in distinct]
    hf_dir = export_hf(workdir, os.path.join(out, "hf"))
    rows = []
    for name, translate in contenders(workdir, hf_dir, gpu, out).items():
        for mode in modes:
            if isinstance(translate, str):
                rows.append({"contender": name, "mode": mode, "error": translate})
                continue
            start = time.perf_counter()
            hypotheses = translate(sources, mode)
            first = time.perf_counter() - start
            bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
            for count in counts:
                lines = (sources * -(-count // len(sources)))[:count]
                start = time.perf_counter()
                translate(lines, mode)
                seconds = time.perf_counter() - start
                rows.append({"contender": name, "mode": mode, "sentences": count, "seconds": seconds,
                             "sentences_per_second": count / seconds, "first_pass_s": first, "bleu": bleu})
    return rows


def compare_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    lines = ["| contender | mode | sentences | sentences/s | SacreBLEU (distinct test sentences) | first pass s |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['contender']} | {row['mode']} | - | not run: {row['error']} | - | - |")
        else:
            lines.append(f"| {row['contender']} | {row['mode']} | {row['sentences']} | "
                         f"{row['sentences_per_second']:,.0f} | {row['bleu']:.2f} | {row['first_pass_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True, help="a trained run's directory")
    parser.add_argument("--pairs", required=True, help="the prepared corpus's test.json ([source, reference] pairs)")
    parser.add_argument("--out", required=True, help="where the exported model, compare.json and scratch go")
    parser.add_argument("--sentences", default="1000", help="sentences timed per contender and mode, comma-separated")
    parser.add_argument("--modes", default="beam,greedy")
    args = parser.parse_args(argv)
    import torch

    gpu = torch.cuda.is_available()
    with open(args.pairs) as f:
        pairs = [tuple(pair[:2]) for pair in json.load(f)]
    os.makedirs(args.out, exist_ok=True)
    rows = compare(args.workdir, pairs, [int(n) for n in args.sentences.split(",")], args.modes.split(","),
                   args.out, gpu)
    with open(os.path.join(args.out, "compare.json"), "w") as f:
        json.dump({"gpu": gpu, "rows": rows}, f, indent=1)
    print(compare_table(rows))


if __name__ == "__main__":
    main()
