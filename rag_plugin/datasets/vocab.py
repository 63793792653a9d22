"""SentencePiece model -> fairseq dictionary, and a deterministic trainer for small corpora.

fairseq's :class:`~fairseq.data.Dictionary` always starts with its own four symbols
(``<s>``, ``<pad>``, ``</s>``, ``<unk>``, indices 0-3) and then reads ``<symbol> <count>``
lines. :func:`write_fairseq_dict_from_spm` writes one line per SentencePiece piece, in
SentencePiece id order, leaving out SentencePiece's own control/unknown pieces (``<unk>``,
``<s>``, ``</s>``) that fairseq supplies itself. With ``--bpe sentencepiece`` fairseq splits
text into pieces joined by spaces, so every piece must be a single whitespace-free token.

No fairseq import here: this module only needs ``sentencepiece``.
"""
from __future__ import annotations

import io
import os
import re
from pathlib import Path
from typing import Iterable, List, Union

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path

PathLike = Union[str, os.PathLike]

#: Symbols fairseq's Dictionary adds itself (bos, pad, eos, unk).
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")


def make_readable(path: PathLike) -> None:
    """Give a (temporary) file the permissions a plain ``open(..., "w")`` would (0666 & ~umask)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _write_atomic(path: PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
        make_readable(tmp)


def _spm():
    try:  # optional at import: a one-line error where it is missing (and start-up: rag-vocab --help)
        import sentencepiece as spm  # noqa: WPS433
    except ImportError:
        raise UserError("the Python package 'sentencepiece' is not installed",
                        fix="run scripts/bootstrap.sh (or pip install sentencepiece)") from None
    return spm


def load_spm(spm_model_path: PathLike):
    """Load a SentencePiece model, with a one-line error for a missing or broken file."""
    spm = _spm()
    path = Path(spm_model_path)
    if not path.is_file():
        raise UserError("SentencePiece model not found", path=str(path),
                        fix="build it with examples/demo/prepare_demo_data.py or pass the right path")
    sp = spm.SentencePieceProcessor()
    try:
        sp.Load(str(path))
    except (OSError, RuntimeError) as err:
        raise UserError(f"not a SentencePiece model ({err})", path=str(path)) from None
    return sp


def fairseq_dict_symbols(sp) -> List[str]:
    """The pieces of a loaded SentencePiece model that belong in fairseq's dict.txt, in id order."""
    symbols: List[str] = []
    seen = set(FAIRSEQ_SPECIALS)
    for i in range(sp.GetPieceSize()):
        if sp.IsControl(i) or sp.IsUnknown(i):
            continue  # <unk>, <s>, </s> (and a <pad> if defined): fairseq has its own
        piece = sp.IdToPiece(i)
        if not piece or piece != "".join(piece.split()):
            raise UserError(f"SentencePiece piece {i} ({piece!r}) is empty or contains whitespace, "
                            "which fairseq's dictionary format cannot hold")
        if piece in seen:
            raise UserError(f"SentencePiece piece {i} ({piece!r}) duplicates a fairseq special "
                            "symbol or an earlier piece")
        seen.add(piece)
        symbols.append(piece)
    return symbols


def write_fairseq_dict_from_spm(spm_model_path: PathLike, dict_path: PathLike) -> int:
    """Write fairseq's ``dict.txt`` (``<piece> 1`` per line) for a SentencePiece model.

    Returns the number of lines written. The file is written atomically.
    """
    sp = load_spm(spm_model_path)
    symbols = fairseq_dict_symbols(sp)
    _write_atomic(dict_path, "".join(f"{s} 1\n" for s in symbols).encode("utf-8"))
    return len(symbols)


def train_spm(sentences: Iterable[str], model_path: PathLike, vocab_path: PathLike, *,
              vocab_size: int = 8000, model_type: str = "unigram", seed: int = 0,
              character_coverage: float = 0.9995, byte_fallback: bool = True,
              num_threads: int = 2) -> None:
    """Train a SentencePiece model on ``sentences`` (fed in the given order) and write
    ``model_path`` and ``vocab_path`` atomically.

    ``byte_fallback``: a character outside the vocabulary (``character_coverage`` leaves the
    rarest out: "ã" in "São Tomé", Greek letters, "×") is spelled as its UTF-8 bytes, 256
    pieces ``<0x00>``..``<0xFF>`` that count towards ``vocab_size``, instead of becoming
    ``<unk>``, which the generator could neither read nor write back.

    The vocab file has SentencePiece's own layout (``piece<TAB>score``). Deterministic for the
    same sentences, options and sentencepiece version (no input sampling or shuffling).
    """
    spm = _spm()
    lines = [s for s in (t.strip() for t in sentences) if s]
    if not lines:
        raise UserError("no text to train the SentencePiece model on")
    if hasattr(spm, "set_random_generator_seed"):
        spm.set_random_generator_seed(seed)
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.Train(
            sentence_iterator=iter(lines), model_writer=buf,
            vocab_size=vocab_size, model_type=model_type,
            character_coverage=character_coverage, byte_fallback=byte_fallback,
            input_sentence_size=0, shuffle_input_sentence=False,
            max_sentence_length=1 << 16, num_threads=num_threads,
            unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            minloglevel=2,
        )
    except RuntimeError as err:  # SentencePiece's own check failed: its last line says which
        need = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(err))
        if need:
            raise UserError(f"a SentencePiece vocabulary of {vocab_size} pieces is too small for this text: it "
                            f"needs at least {need.group(1)} (its characters and special pieces"
                            + (", and the 256 byte-fallback pieces)" if byte_fallback else ")"),
                            fix=f"use a vocabulary size of at least {need.group(1)}") from None
        raise UserError(f"SentencePiece training failed: {str(err).strip().splitlines()[-1]}") from None
    model = buf.getvalue()
    _write_atomic(model_path, model)
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(model)
    # same layout as spm_train's .vocab: piece, TAB, score (scores printed like C++'s default)
    _write_atomic(vocab_path, "".join(
        f"{sp.IdToPiece(i)}\t{_fmt_score(sp.GetScore(i))}\n" for i in range(sp.GetPieceSize())).encode("utf-8"))


def _fmt_score(score: float) -> str:
    text = f"{score:.6g}"
    return "0" if text in ("0", "-0") else text
