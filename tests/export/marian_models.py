"""Tiny random Hugging Face Marian (OPUS-MT style) checkpoints, built offline for the Marian converter's tests.

`tiny_marian(directory)` writes a directory that `transformers.MarianMTModel.from_pretrained` and
`transformers.MarianTokenizer.from_pretrained` load with no network: two SentencePiece models trained here on
generated English-ish and German-ish sentences, OPUS-MT's vocab.json layout ("</s>" 0, "<unk>" 1, ..., "<pad>" last),
a random model with every weight drawn away from zero, and OPUS-MT's generation config. Tests import it as
`from marian_models import tiny_marian` (tests/export is on sys.path while its tests run) or
`from export.marian_models import tiny_marian` (tests/ is on sys.path).

torch and transformers are imported inside the functions, so importing this module needs neither.
"""

from __future__ import annotations

import functools
import io
import json
import os
import random

EN_WORDS = (
    "a the small big red old new good long test sentence house dog cat tree book water light day time world "
    "is was has see we they you it and of to in on with my your this that one two three very here there"
).split()
DE_WORDS = (
    "ein eine der die das klein groß rot alt neu gut lang Test Satz Haus Hund Katze Baum Buch Wasser Licht Tag "
    "Zeit Welt ist war hat sehen wir sie du es und von zu in auf mit mein dein dies das eins zwei drei sehr hier "
    "dort schön über für Straße Mädchen grün weiß"
).split()
SPM_VOCAB_SIZE = 80
WEIGHT_STD = 0.3  # matrices and embeddings; layer-norm scales are 1 + N(0, WEIGHT_STD)
BIAS_STD = 0.1  # biases, layer-norm shifts and final_logits_bias: small, so they do not swamp the tokens
SPM_SENTENCES = 400
SOURCE_LANG, TARGET_LANG = "en", "de"


def _sentences(words: list[str], seed: int) -> list[str]:
    """SPM_SENTENCES deterministic sentences of 2 to 9 words, capitalised and punctuated."""
    rng = random.Random(seed)
    out = []
    for _ in range(SPM_SENTENCES):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(2, 9)))
        out.append(text[0].upper() + text[1:] + rng.choice(".?!,"))
    return out


@functools.lru_cache(maxsize=8)
def _spm_proto(words: tuple[str, ...], seed: int) -> bytes:
    """A serialized unigram SentencePiece model trained as OPUS-MT-train's spm_train call does.

    Defaults as there: unk 0, <s> 1, </s> 2, no pad piece, nmt_nfkc normalisation, character_coverage 1.0.
    Unlike there the vocabulary limit is hard, so every model has exactly SPM_VOCAB_SIZE pieces.
    """
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(_sentences(list(words), seed)),
        model_writer=model,
        model_type="unigram",
        vocab_size=SPM_VOCAB_SIZE,
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def tiny_spm_models(directory: str | os.PathLike[str], seed: int = 0) -> tuple[str, str]:
    """Writes source.spm ("en") and target.spm ("de") into `directory`; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for name, words, offset in (("source.spm", EN_WORDS, 0), ("target.spm", DE_WORDS, 1)):
        path = os.path.join(directory, name)
        with open(path, "wb") as f:
            f.write(_spm_proto(tuple(words), 2 * seed + offset))
        paths.append(path)
    return paths[0], paths[1]


def _pieces(spm_path: str) -> list[str]:
    """The model's normal pieces in id order (no <unk>, <s>, </s>)."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=spm_path)
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]


def _marian_vocab(*piece_lists: list[str]) -> dict[str, int]:
    """OPUS-MT's vocab.json: "</s>" 0, "<unk>" 1, the pieces (first occurrence wins), "<pad>" last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for pieces in piece_lists:
        for piece in pieces:
            vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def _write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=2)


def tiny_marian(
    directory: str | os.PathLike[str],
    *,
    shared_embeddings: bool = True,
    activation: str = "swish",
    tie_word_embeddings: bool = True,
    separate_vocabs: bool = False,
    seed: int = 0,
    d_model: int = 16,
    layers: int = 2,
    heads: int = 2,
    ffn: int = 32,
    max_positions: int = 64,
    zero_pad_embedding: bool = False,
) -> str:
    """Writes a complete random Marian checkpoint into `directory` and returns it.

    shared_embeddings: one table for encoder and decoder (Marian's tied-embeddings-src); else two tables over the
        same vocabulary (or over the two vocabularies with separate_vocabs).
    tie_word_embeddings: the output projection is the decoder embedding table (Marian's tied-embeddings).
    separate_vocabs: vocab.json from source.spm and target_vocab.json from target.spm, as MarianTokenizer expects;
        needs shared_embeddings=False. Both hold SPM_VOCAB_SIZE entries, so "<pad>" has one id in both (HF's
        converter and MarianConfig assume one pad id); decoder_vocab_size is the target vocabulary's size.
    zero_pad_embedding: zero the "<pad>" embedding rows and its final_logits_bias entry, as HF's converter leaves
        real OPUS-MT checkpoints ("<pad>" is also the decoder start token). By default every weight is random.
    Every weight is redrawn (seeded): matrices and embeddings from N(0, WEIGHT_STD), layer-norm scales from
    N(1, WEIGHT_STD), biases, layer-norm shifts and the final_logits_bias buffer from N(0, BIAS_STD); the sinusoidal
    position tables are left alone (HF computes them and never saves them).
    """
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    if separate_vocabs and shared_embeddings:
        raise ValueError("separate_vocabs needs shared_embeddings=False: one table cannot index two vocabularies")
    directory = os.fspath(directory)
    source_spm, target_spm = tiny_spm_models(directory, seed)
    vocab_path = os.path.join(directory, "vocab.json")
    target_vocab_path = None
    if separate_vocabs:
        vocab, target_vocab = _marian_vocab(_pieces(source_spm)), _marian_vocab(_pieces(target_spm))
        assert len(vocab) == len(target_vocab) and vocab["<pad>"] == target_vocab["<pad>"]
        target_vocab_path = os.path.join(directory, "target_vocab.json")
        _write_json(target_vocab_path, target_vocab)
    else:
        vocab = target_vocab = _marian_vocab(_pieces(source_spm), _pieces(target_spm))
    _write_json(vocab_path, vocab)
    tokenizer = MarianTokenizer(
        source_spm=source_spm,
        target_spm=target_spm,
        vocab=vocab_path,
        target_vocab_file=target_vocab_path,
        source_lang=SOURCE_LANG,
        target_lang=TARGET_LANG,
        separate_vocabs=separate_vocabs,
    )
    tokenizer.save_pretrained(directory)

    pad = vocab["<pad>"]
    config = MarianConfig(
        vocab_size=len(vocab),
        decoder_vocab_size=len(target_vocab),
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        activation_function=activation,
        max_position_embeddings=max_positions,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        bos_token_id=0,
        scale_embedding=True,
        share_encoder_decoder_embeddings=shared_embeddings,
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied tensors are listed once
            if "embed_positions" in name:
                continue
            noise = torch.randn(param.shape, generator=generator) * (BIAS_STD if name.endswith("bias") else WEIGHT_STD)
            param.copy_(noise + 1.0 if "layer_norm.weight" in name else noise)
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=generator) * BIAS_STD)
        if zero_pad_embedding:
            for table in {id(t): t for t in (model.get_input_embeddings(), model.model.decoder.embed_tokens)}.values():
                table.weight[pad] = 0.0
            model.final_logits_bias[:, pad] = 0.0
    model.generation_config = GenerationConfig(  # what Helsinki-NLP/opus-mt-* generation_config.json files hold
        bad_words_ids=[[pad]],
        bos_token_id=0,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        max_length=512,
        num_beams=4,
        pad_token_id=pad,
        renormalize_logits=True,
    )
    model.save_pretrained(directory)
    return directory
