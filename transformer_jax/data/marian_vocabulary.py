"""A Marian (OPUS-MT) vocabulary behind our tokenizer's interface: two SentencePiece models and a piece table.

A Hugging Face Marian checkpoint segments the source with `source.spm`, the target with `target.spm`, and
numbers pieces by its `vocab.json` (not by either SentencePiece model), with its own special ids (typically
EOS 0, UNK 1, PAD last; decoding starts from PAD). Our model and decoding use the project's ids (pad 0, unk 1,
bos 2, eos 3), so an imported model's rows are reordered (export/marian.py) and this adapter numbers pieces
the same way:

  our id 0 (PAD)  = Marian's pad row          our id 2 (BOS) = Marian's decoder start row
  our id 1 (UNK)  = Marian's unk row          our id 3 (EOS) = Marian's eos row
  our ids 4, 5, ... = Marian's other ids, in their order

The run keeps it as `tokenizer.model`: a zip of the two SentencePiece models, `vocab.json` and the special
ids (`MarianVocabulary.to_bytes`), which `Tokenizer.load` recognises, so eval.py and train.py use it as
they use a joint SentencePiece model.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import sentencepiece as spm

from transformer_jax.errors import DataError
from transformer_jax.model.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

ZIP_MAGIC = b"PK\x03\x04"
SPECIAL_FILE = "special_ids.json"  # {"pad": id, "unk": id, "eos": id, "decoder_start": id} in Marian's numbering


def our_order(vocab_size: int, special: Mapping[str, int]) -> np.ndarray:
    """Marian's id of each of our ids: [pad, unk, decoder start, eos, then the others in Marian's order]."""
    firsts = [special["pad"], special["unk"], special["decoder_start"], special["eos"]]
    others = np.setdiff1d(np.arange(vocab_size), firsts)
    return np.concatenate([np.asarray(firsts), others]).astype(np.int64)


class MarianVocabulary:
    """Source and target SentencePiece models with a Marian piece table, numbered in our ids."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, source_spm: bytes, target_spm: bytes, vocab: Mapping[str, int], special: Mapping[str, int],
                 target_vocab: Mapping[str, int] | None = None):
        """`target_vocab`: the target side's own table (`target_vocab.json`) when the model has separate source and
        target vocabularies (then of `vocab`'s size, with the same special ids), else None: one for both."""
        self.files = {"source.spm": source_spm, "target.spm": target_spm,
                      "vocab.json": json.dumps(dict(vocab), ensure_ascii=False).encode(),
                      SPECIAL_FILE: json.dumps(dict(special)).encode()}
        if target_vocab is not None:
            self.files["target_vocab.json"] = json.dumps(dict(target_vocab), ensure_ascii=False).encode()
        self.special = dict(special)
        self.vocab, self.target_vocab = dict(vocab), dict(target_vocab if target_vocab is not None else vocab)
        self.separate = target_vocab is not None
        size = len(self.vocab)
        for name, table in (("vocab.json", self.vocab), ("target_vocab.json", self.target_vocab)):
            if sorted(table.values()) != list(range(size)):
                raise DataError(f"{name} does not number {size} pieces 0, 1, ... without gaps; it is not a Marian "
                                "vocabulary of the source's size")
        missing = [name for name, value in self.special.items() if not 0 <= value < size]
        if missing:
            raise DataError(f"the special ids {missing} lie outside vocab.json's {size} pieces")
        self.marian_ids = our_order(size, self.special)  # ours -> Marian's
        self._ours = np.empty(size, np.int64)  # Marian's -> ours (pad and decoder start both map to ours below)
        self._ours[self.marian_ids] = np.arange(len(self.marian_ids))
        self._ours[self.special["pad"]] = PAD_ID
        self._pieces = {side: [""] * size for side in ("source", "target")}
        for side, table in (("source", self.vocab), ("target", self.target_vocab)):
            for piece, index in table.items():
                self._pieces[side][index] = piece
        self._source, self._target = (spm.SentencePieceProcessor(model_proto=proto) for proto in (source_spm, target_spm))
        self.fingerprint = hashlib.sha256(self.to_bytes()).hexdigest()[:16]

    @classmethod
    def from_bytes(cls, content: bytes) -> MarianVocabulary:
        """Read what `to_bytes` wrote; a DataError when a member is missing or unreadable."""
        try:
            with zipfile.ZipFile(io.BytesIO(content)) as bundle:
                files = {name: bundle.read(name) for name in ("source.spm", "target.spm", "vocab.json", SPECIAL_FILE)}
                target = json.loads(bundle.read("target_vocab.json")) if "target_vocab.json" in bundle.namelist() else None
            return cls(files["source.spm"], files["target.spm"], json.loads(files["vocab.json"]),
                       json.loads(files[SPECIAL_FILE]), target)
        except (zipfile.BadZipFile, KeyError, ValueError, RuntimeError) as error:
            raise DataError(f"not a readable Marian vocabulary ({error})") from None

    def to_bytes(self) -> bytes:
        """The bundle as one file (a zip whose members are stored in a fixed order, without timestamps)."""
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
            for name in sorted(self.files):
                bundle.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), self.files[name])
        return buffer.getvalue()

    @property
    def vocab_size(self) -> int:
        """Our ids: Marian's pieces plus one (its pad row serves as both our PAD and our BOS)."""
        return len(self.marian_ids)

    def encode(self, text: str, target: bool = False) -> list[int]:
        """Ids of one sentence (the source model's pieces and table, or the target's), without EOS.

        As Hugging Face's MarianTokenizer: a leading >>lang<< code is one piece; a piece the table lacks is UNK.
        """
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[:end + 2]], text[end + 2:]
        table, unk = (self.target_vocab if target else self.vocab), self.special["unk"]
        pieces = code + (self._target if target else self._source).encode(text, out_type=str)
        return [int(self._ours[table.get(piece, unk)]) for piece in pieces]

    def encode_batch(self, texts: Sequence[str], num_threads: int = -1, target: bool = False) -> list[list[int]]:
        """Ids of many sentences."""
        del num_threads
        return [self.encode(text, target) for text in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of one id sequence; stops at the first EOS and skips PAD, BOS and UNK (special tokens to Marian).

        As MarianTokenizer.decode(skip_special_tokens=True): the target table's pieces, joined by the target
        SentencePiece model with separate vocabularies and otherwise by the *source* one (its default,
        `use_source_tokenizer`), then "\u2581" becomes a space.
        """
        pieces = []
        for token in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
            if token == EOS_ID:
                break
            if token not in (PAD_ID, BOS_ID, UNK_ID):
                pieces.append(self.piece(token, target=True))
        joiner = self._target if self.separate else self._source
        return joiner.decode_pieces(pieces).replace("\u2581", " ").strip()

    def decode_batch(self, ids: np.ndarray | Sequence[Sequence[int]]) -> list[str]:
        """Text of each row of a [B, T] id array (or list of id lists)."""
        return [self.decode(row) for row in ids]

    def piece(self, token: int, target: bool = False) -> str:
        """The piece of one of our ids (in the target table: `target`)."""
        return self._pieces["target" if target else "source"][int(self.marian_ids[token])]
