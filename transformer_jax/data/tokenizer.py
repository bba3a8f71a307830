"""SentencePiece tokenizer: one joint source/target vocabulary, trained once per run and reused.

Special ids are the project's (model/special_tokens.py): pad=0, unk=1, bos=2, eos=3. With byte fallback (the default) any UTF-8 text is
representable: characters outside the vocabulary become byte pieces instead of <unk>.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

from transformer_jax.errors import DataError
from transformer_jax.model.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer_jax.base.files import is_dir, is_file, read_bytes, write_atomically
from transformer_jax.base import workdir as layout

# The SentencePiece model types a tokenizer is trained as (data.tokenizer_type); any other is refused.
TOKENIZER_TYPES = ("unigram", "bpe")


class Tokenizer:
    """A loaded SentencePiece model with the project's special ids."""

    def __init__(self, model_proto: bytes):
        self._processor = spm.SentencePieceProcessor(model_proto=model_proto)
        # Names this model's ids: a corpus encoded with it (the workdir's cache) is valid only for it.
        self.fingerprint = hashlib.sha256(model_proto).hexdigest()[:16]
        ids = (self._processor.pad_id(), self._processor.unk_id(), self._processor.bos_id(),
               self._processor.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(f"tokenizer has special ids pad/unk/bos/eos={ids}, expected "
                            f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; delete it so it is retrained")

    @classmethod
    def load(cls, path: str, copies: Sequence[str] = ()) -> Tokenizer:
        """Load a model file written by `train_tokenizer`.

        A missing, damaged (cut short, overwritten) or directory `path` is a DataError saying how to get it
        back: from an intact one of `copies` or of the copies a run keeps (`_kept_copies`), else a backup.
        """
        if is_dir(path):
            raise DataError(f"tokenizer model {path} is a directory, not a file; remove it, then "
                            f"{_restore(path, copies)}")
        if not is_file(path):
            raise DataError(f"tokenizer model {path} does not exist; {_restore(path, copies)}")
        model_proto = read_bytes(path)
        try:
            return tokenizer_from_bytes(model_proto)
        except (RuntimeError, DataError):  # SentencePiece's parse error: multi-line, naming its own source file
            reader = "Marian vocabulary" if model_proto.startswith(b"PK") else "SentencePiece"
            raise DataError(f"tokenizer model {path} is damaged ({reader} cannot read its "
                            f"{len(model_proto)} bytes); {_restore(path, copies)}") from None

    @property
    def vocab_size(self) -> int:
        """Number of ids, special ones included."""
        return self._processor.get_piece_size()

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def encode(self, text: str) -> list[int]:
        """Ids of one sentence, without BOS or EOS."""
        return self._processor.encode(text)

    def encode_batch(self, texts: Sequence[str], num_threads: int = -1, target: bool = False) -> list[list[int]]:
        """Ids of many sentences (threaded in C++); one joint model encodes both sides (`target` is ignored)."""
        del target
        return self._processor.encode(list(texts), num_threads=num_threads)

    def decode(self, ids: Iterable[int]) -> str:
        """Text of one id sequence; stops at the first EOS and skips PAD and BOS."""
        kept = []
        for token in np.asarray(ids, dtype=np.int64).reshape(-1).tolist():
            if token == EOS_ID:
                break
            if token not in (PAD_ID, BOS_ID):
                kept.append(token)
        return self._processor.decode(kept)

    def decode_batch(self, ids: np.ndarray | Sequence[Sequence[int]]) -> list[str]:
        """Text of each row of a [B, T] id array (or list of id lists)."""
        return [self.decode(row) for row in ids]

    def piece(self, token: int, target: bool = False) -> str:
        """The vocabulary piece of one id (for inspection); one joint model names both sides (`target` is ignored)."""
        del target
        return self._processor.id_to_piece(token)


def tokenizer_from_bytes(model_proto: bytes) -> Tokenizer:
    """A run's tokenizer from its file's bytes: a SentencePiece model, or an imported Marian vocabulary (a zip
    bundle, data/marian_vocabulary.py, which answers the same calls)."""
    from transformer_jax.data.marian_vocabulary import ZIP_MAGIC, MarianVocabulary

    if model_proto.startswith(ZIP_MAGIC):
        return MarianVocabulary.from_bytes(model_proto)  # type: ignore[return-value]
    return Tokenizer(model_proto)


def _kept_copies(path: str) -> list[str]:
    """Where a run keeps other copies of the tokenizer model at `path`: `<workdir>/tokenizer.model` and
    its prepared corpus's `<workdir>/corpus/tokenizer.model` copy each other (data/prepared.py)."""
    directory = os.path.dirname(path)
    if os.path.basename(path) != layout.TOKENIZER:
        return []
    if os.path.basename(os.path.normpath(directory)) == layout.CORPUS:
        return [os.path.join(os.path.dirname(os.path.normpath(directory)), layout.TOKENIZER)]
    return [layout.run_path(directory, layout.CORPUS, layout.TOKENIZER)]


def _restore(path: str, copies: Sequence[str]) -> str:
    """How to get the tokenizer model at `path` back: copy an intact copy over it, else (a run's) a backup."""
    for copy in [*copies, *_kept_copies(path)]:
        if os.path.normpath(copy) == os.path.normpath(path) or not is_file(copy):
            continue
        try:
            tokenizer_from_bytes(read_bytes(copy))
        except (RuntimeError, DataError):
            continue  # damaged as well
        return f"copy {copy} (an intact copy the run keeps) to {path}"
    if os.path.basename(path) != layout.TOKENIZER and not copies:
        return "pass the path of an intact SentencePiece model"
    return "restore it from a backup (a retrained tokenizer would not give the same ids)"


def sample_sentences(pairs: Sequence[tuple[str, str]], sample_size: int, seed: int = 0) -> list[str]:
    """Both sides of up to `sample_size` pairs drawn uniformly across the whole corpus, empties skipped."""
    order = np.random.default_rng(seed).permutation(len(pairs))[:sample_size]
    order.sort()  # keep corpus order inside the sample: the result does not depend on the sort method
    return [text for i in order.tolist() for text in pairs[i] if text]


# SentencePiece's refusal of a vocabulary smaller than the corpus's characters, with both counts ("300 vs 561": the
# size asked, and the characters plus the special and byte pieces, the least size that holds them).
_TOO_FEW_PIECES = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


@contextlib.contextmanager
def _sentencepiece_errors(vocab_size: int) -> Iterator[None]:
    """SentencePiece reports a too-small vocabulary as a multi-line RuntimeError: make it a DataError naming the
    least size that holds the corpus's characters."""
    try:
        yield
    except RuntimeError as error:
        found = _TOO_FEW_PIECES.search(str(error))
        if found:
            raise DataError(
                f"tokenizer vocab_size={vocab_size} cannot hold the corpus's characters (with the special pieces, "
                f"and 256 byte pieces with byte_fallback, they need {found.group(2)}); set "
                f"--config.data.vocab_size={found.group(2)} or more"
            ) from None
        raise


def _trained_model(sentences: Sequence[str], vocab_size: int, model_type: str, byte_fallback: bool,
                   character_coverage: float, threads: int) -> bytes:
    """The serialized SentencePiece model trained on `sentences` (fewer pieces than `vocab_size` when the text
    supports fewer; see supported_vocab_size)."""
    if model_type not in TOKENIZER_TYPES:
        raise DataError(f"tokenizer model_type={model_type!r} is not supported; use "
                        f"{' or '.join(map(repr, TOKENIZER_TYPES))}")
    if not sentences:
        raise DataError("cannot train a tokenizer on an empty corpus; check the training data")
    model = io.BytesIO()
    with open(os.devnull, "w") as quiet, _sentencepiece_errors(vocab_size):
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model, vocab_size=vocab_size,
            model_type=model_type, byte_fallback=byte_fallback, character_coverage=character_coverage,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
            # A size larger than the corpus supports shrinks instead of failing: reported by the callers.
            hard_vocab_limit=False, input_sentence_size=0, num_threads=threads,
            logstream=quiet,
        )
    return model.getvalue()


def supported_vocab_size(sentences: Sequence[str], vocab_size: int, model_type: str = "unigram",
                         byte_fallback: bool = True, character_coverage: float = 0.9995) -> int:
    """The pieces SentencePiece builds from `sentences` when asked for `vocab_size`: `vocab_size`, or fewer when
    the text supports no more (a size train_tokenizer(exact_size=True) accepts for it). Trained on one thread, so
    every host that asks gets the same answer."""
    model = _trained_model(sentences, vocab_size, model_type, byte_fallback, character_coverage, threads=1)
    return Tokenizer(model).vocab_size


def train_tokenizer(sentences: Sequence[str], model_path: str, vocab_size: int = 32_000,
                    model_type: str = "unigram", byte_fallback: bool = True,
                    character_coverage: float = 0.9995, exact_size: bool = False) -> Tokenizer:
    """Train SentencePiece on in-memory sentences and write the model to `model_path` atomically.

    A corpus too small for `vocab_size` pieces gives fewer; with `exact_size` (a run's tokenizer, whose
    size its config states) that is a DataError instead, raised before anything is written.
    """
    model = _trained_model(sentences, vocab_size, model_type, byte_fallback, character_coverage,
                           threads=os.cpu_count() or 1)
    tokenizer = Tokenizer(model)
    if exact_size and tokenizer.vocab_size < vocab_size:  # before writing: a failed start leaves nothing
        raise DataError(
            f"data.vocab_size={vocab_size} is more than this corpus supports: SentencePiece built only "
            f"{tokenizer.vocab_size} pieces; set --config.data.vocab_size={tokenizer.vocab_size} (or less), "
            "or train on more data"
        )
    write_atomically(model_path, model)
    return tokenizer
