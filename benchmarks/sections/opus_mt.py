"""OPUS-MT-sized batch translation: ours against transformers' PyTorch generate and CTranslate2, same weights.

The model is an OPUS-MT (Helsinki-NLP/opus-mt-*) Marian model's size with random weights: d_model 512, 6 + 6
layers, 8 heads, d_ff 2048, swish, a 58,101-piece shared vocabulary, its pad row zero (as in real OPUS-MT
checkpoints; CTranslate2 starts decoding from a zero embedding). It is built with transformers and saved; ours
imports that directory (transformer_jax.cli.import_marian's conversion), CTranslate2 converts it with its own
Marian converter. Each translates the same SENTENCES source sentences of SOURCE_LENGTH tokens (EOS included)
into exactly OUTPUT_LENGTH tokens (random weights never choose to stop: ours decodes with no EOS id, transformers
with min_new_tokens = max_new_tokens, CTranslate2 with min = max decoding length), in batches of BATCH.

Each side's best use of the machine's C cores: ours float32 and bfloat16 on one CPU device and with the rows
split over C devices (eval.py's way); transformers with torch.set_num_threads(C); CTranslate2 float32 with
intra_threads=C on each batch, and with inter_threads=C on C batches at once. One timed pass each after a
warm-up batch (compiling ours; the passes take minutes on 2 cores). Runs in its own process.

The preflight's prediction for accelerators compiles our beam search of this model for TPU v5e-8 and one H100
(libtpu and the CUDA plugin on this host) and reads the roofline: XLA counts the decoding loop's body once, so
one step costs at most the compiled program's bytes and FLOPs (they include the encoder), and a batch
OUTPUT_LENGTH steps: the roofline of the compiler's own figures (the slower of FLOPs at peak and bytes at full
bandwidth), for sources of up to 64 tokens, 64 sentences a chip, bfloat16. An estimate, not a measurement.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.workers import REPO, worker_command

SENTENCES, SOURCE_LENGTH, OUTPUT_LENGTH, BATCH = 1_000, 25, 32, 100
VOCAB, PAD = 58_101, 58_100
MODES = {"greedy": 1, "beam 4": 4}


def build_marian(directory: str) -> str:
    """A random OPUS-MT-sized Marian model with a loadable tokenizer (vocab.json of placeholder pieces)."""
    import sentencepiece as spm
    import torch
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(vocab_size=VOCAB, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                          decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
                          activation_function="swish", max_position_embeddings=512, scale_embedding=True,
                          pad_token_id=PAD, decoder_start_token_id=PAD, eos_token_id=0, forced_eos_token_id=0)
    torch.manual_seed(0)
    model = MarianMTModel(config).eval()
    with torch.no_grad():
        model.model.shared.weight[PAD] = 0.0
        model.final_logits_bias.normal_(0.0, 0.1)
    model.save_pretrained(directory)
    proto = io.BytesIO()
    words = [f"word{i}" for i in range(300)]
    rng = np.random.default_rng(0)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(" ".join(rng.choice(words, 12)) for _ in range(2000)),
                                   model_writer=proto, vocab_size=200, minloglevel=2)
    for name in ("source.spm", "target.spm"):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(proto.getvalue())
    pieces = ["</s>", "<unk>"] + [f"t{i}" for i in range(2, PAD)] + ["<pad>"]
    with open(os.path.join(directory, "vocab.json"), "w") as f:
        json.dump({piece: i for i, piece in enumerate(pieces)}, f)
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "MarianTokenizer", "source_lang": "en", "target_lang": "de"}, f)
    return directory


def sources() -> np.ndarray:
    """[SENTENCES, SOURCE_LENGTH] Marian ids: random pieces, then EOS."""
    rng = np.random.default_rng(0)
    src = rng.integers(2, PAD, (SENTENCES, SOURCE_LENGTH))
    src[:, -1] = 0
    return src


def our_translators(hf_dir: str, src: np.ndarray, devices: int) -> dict[str, Callable[[int], int]]:
    """Ours, float32 and bfloat16, on one device and split over `devices`: each translates the first n batches
    and returns the sentences translated."""
    import jax
    import jax.numpy as jnp

    from benchmarks.sections.decode import split_rows
    from transformer_jax.decoding import beam_search, decoding_precision, greedy_decode
    from transformer_jax.export import marian_to_ours, model_config_of, read_marian

    hf_config, tensors, vocabulary = read_marian(hf_dir)
    config = model_config_of(hf_config, tensors).replace(attention_backend="einsum", dropout_rate=0.0)
    params = marian_to_ours(tensors, config, vocabulary.marian_ids)
    ours_of = np.zeros(VOCAB, np.int64)
    ours_of[vocabulary.marian_ids] = np.arange(len(vocabulary.marian_ids))
    batches = [jnp.asarray(ours_of[src[i:i + BATCH]], jnp.int32) for i in range(0, len(src), BATCH)]
    extra = OUTPUT_LENGTH - SOURCE_LENGTH
    translators = {}
    for dtype in ("", "bfloat16"):
        weights, precise = decoding_precision(params, config, dtype, "cpu")
        for mode, beams in MODES.items():
            if beams == 1:
                decode = jax.jit(lambda w, s, c=precise: greedy_decode(w, c, s, max_extra_length=extra, eos_id=-1))
            else:
                decode = jax.jit(lambda w, s, c=precise, b=beams: beam_search(
                    w, c, s, beam_size=b, alpha=0.6, max_extra_length=extra, eos_id=-1)[0])
            name = f"ours{' bfloat16' if dtype else ''}"
            translators[f"{name} {mode}"] = lambda n, d=decode, w=weights: _run_all(lambda s: d(w, s), batches[:n])
            if devices > 1:
                split, placed, _ = split_rows(decode, weights, batches[0])
                translators[f"{name}, {devices} devices {mode}"] = lambda n, d=split, w=placed: _run_all(
                    lambda s: d(w, s), batches[:n])
    return translators


def _run_all(decode: Callable[[Any], Any], batches: list[Any]) -> int:
    import jax

    outputs = [decode(batch) for batch in batches]
    return int(sum(np.asarray(jax.block_until_ready(out)).shape[0] for out in outputs))


def torch_translators(hf_dir: str, src: np.ndarray, threads: int) -> dict[str, Callable[[int], int]]:
    import torch
    from transformers import MarianMTModel

    torch.set_num_threads(threads)
    model = MarianMTModel.from_pretrained(hf_dir).eval()
    batches = [torch.tensor(src[i:i + BATCH]) for i in range(0, len(src), BATCH)]

    def translate(count: int, beams: int) -> int:
        made = 0
        search = {"num_beams": beams, "length_penalty": 0.6} if beams > 1 else {"num_beams": 1}
        with torch.inference_mode():
            for batch in batches[:count]:
                out = model.generate(input_ids=batch, attention_mask=torch.ones_like(batch), do_sample=False,
                                     min_new_tokens=OUTPUT_LENGTH, max_new_tokens=OUTPUT_LENGTH,
                                     forced_eos_token_id=None, **search)
                made += out.shape[0]
        return made

    return {f"transformers (PyTorch {torch.__version__.split('+')[0]}) {mode}": lambda n, b=beams: translate(n, b)
            for mode, beams in MODES.items()}


def ct2_translators(hf_dir: str, src: np.ndarray, threads: int, scratch: str) -> dict[str, Callable[[int], int]]:
    import ctranslate2
    from ctranslate2.converters import TransformersConverter

    directory = TransformersConverter(hf_dir).convert(os.path.join(scratch, "ct2"), quantization="float32")
    pieces = [[f"t{t}" for t in row[:-1]] for row in src.tolist()]  # CTranslate2 appends EOS itself
    translators = {}
    for suffix, intra, inter, batch in (("", threads, 1, BATCH), (f", {threads} batches at once", 1, threads, BATCH)):
        translator = ctranslate2.Translator(directory, device="cpu", compute_type="float32", intra_threads=intra,
                                            inter_threads=inter)
        for mode, beams in MODES.items():
            translators[f"CTranslate2 {ctranslate2.__version__} float32{suffix} {mode}"] = (
                lambda n, t=translator, b=beams, size=batch: len(t.translate_batch(
                    pieces[:n * BATCH], beam_size=b, length_penalty=0.6, min_decoding_length=OUTPUT_LENGTH,
                    max_decoding_length=OUTPUT_LENGTH, max_batch_size=size)))
    return translators


def worker(spec: dict[str, Any]) -> None:
    """Build, warm up, then time each contender once; the figures to spec["json"] (or the predictions)."""
    from transformer_jax.base import set_cpu_devices

    if "predict" in spec:
        predict(spec)
        return

    threads = spec["threads"]
    set_cpu_devices(threads)
    src = sources()[:spec["sentences"]]
    with tempfile.TemporaryDirectory() as scratch:
        hf_dir = build_marian(os.path.join(scratch, "hf"))
        translators = {**our_translators(hf_dir, src, threads), **torch_translators(hf_dir, src, threads),
                       **ct2_translators(hf_dir, src, threads, scratch)}
        speed = {}
        for name, translate in translators.items():
            if spec["modes"] and not any(name.endswith(mode) for mode in spec["modes"]):
                continue
            translate(1)  # warm-up: ours compiles, the others allocate
            start = time.perf_counter()
            made = translate(len(src) // BATCH)
            speed[name] = made / (time.perf_counter() - start)
            print(f"  {name:60s} {speed[name]:8.1f} sentences/s", flush=True)
    with open(spec["json"], "w") as f:
        json.dump({"sentences_per_s": speed, "sentences": len(src), "source_length": SOURCE_LENGTH,
                   "output_length": OUTPUT_LENGTH, "batch": BATCH, "threads": threads}, f, indent=2)


def predicted(topology_name: str) -> dict[str, Any]:
    """Sentences/s the compiled beam search (beam 4, bfloat16) of this model bounds on `topology_name`."""
    from transformer_jax.aot import describe, mesh_for, program_of, run_programs
    from transformer_jax.config import decode_options, default_config
    from transformer_jax.decoding import output_width

    config = default_config()
    config.model.update(num_layers=6, d_model=512, d_ff=2048, num_heads=8, activation="swish", output_bias=True,
                        layer_norm_epsilon=1e-5, dtype="bfloat16", vocab_size=VOCAB + 1)
    config.data.vocab_size = VOCAB + 1
    # Near the measured sentences' shape: sources up to 32 tokens (the widest a 64-position model translates with
    # 32 extra), caches of 64 positions, 64 sentences a chip. (OPUS-MT's 512 positions would size caches for
    # 256-token sources.)
    config.model.max_len, config.data.max_length = 64, SOURCE_LENGTH
    config.eval.max_extra_length = OUTPUT_LENGTH - SOURCE_LENGTH
    config.data.eval_batch_size, config.eval.batch_tokens = 64 * 8, 0
    topology = describe(topology_name)
    mesh = mesh_for(topology, -1, 1)
    programs = run_programs(config, mesh)
    rows, width = programs.shapes.translation
    program = program_of("ours", programs.lower_search(decode_options(config), "bfloat16")[1].compile())
    chip = topology.chip
    step_s = max(program.flops / chip.peak_bf16_flops, program.bytes_accessed / chip.hbm_bytes_per_second)
    cache = output_width(width, config.eval.max_extra_length, config.model.max_len)  # the compiled caches' positions
    return {"topology": topology_name, "sentences_per_batch": rows, "source_width": width, "cache_positions": cache,
            "step_ms": step_s * 1e3, "sentences_per_s": rows / (step_s * OUTPUT_LENGTH)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.sections.decode import split_device_count

    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "opus_mt.json")
        spec = {"threads": split_device_count(), "json": path, "sentences": 200 if args.quick else SENTENCES,
                "modes": ["greedy"] if args.quick else []}
        print(f"{datetime.date.today()}: {spec['sentences']} sentences of {SOURCE_LENGTH} tokens -> {OUTPUT_LENGTH}, "
              f"batches of {BATCH}, {spec['threads']} cores", flush=True)
        subprocess.run(worker_command("opus_mt", spec), cwd=REPO, check=True)
        with open(path) as f:
            result = json.load(f)
        # Compile-only TPU and GPU devices want a process whose JAX has no local accelerator.
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1")
        subprocess.run(worker_command("opus_mt", {"predict": ["v5e-8", "h100"], "json": path}), cwd=REPO, check=True,
                       env=env)
        with open(path) as f:
            result["predicted"] = json.load(f)
    return result


def predict(spec: dict[str, Any]) -> None:
    """The roofline predictions of spec["predict"]'s topologies, printed and written to spec["json"]."""
    results = []
    for topology in spec["predict"]:
        try:
            results.append(predicted(topology))
            row = results[-1]
            print(f"  predicted {topology}: {row['sentences_per_s']:.0f} sentences/s ({row['sentences_per_batch']} "
                  f"sentences of up to {row['source_width']} tokens a batch, caches of {row['cache_positions']} "
                  f"positions, {row['step_ms']:.2f} ms a step, {OUTPUT_LENGTH} steps)", flush=True)
        except Exception as error:  # no libtpu / CUDA plugin here: say so, keep the measured figures
            print(f"  predicted {topology}: not compiled ({type(error).__name__}: {str(error).splitlines()[0]})")
    with open(spec["json"], "w") as f:
        json.dump(results, f, indent=2)
