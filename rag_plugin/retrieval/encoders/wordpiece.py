"""The encoders' tokenizers (``tokenizers`` library): BERT WordPiece, read and written.

A tokenizer comes from a BERT ``vocab.txt`` (:func:`wordpiece_tokenizer`) or from a model
folder's ``tokenizer.json`` / ``vocab.txt`` + ``tokenizer_config.json``
(:func:`tokenizer_from_dir`); :func:`save_tokenizer_files` writes those three files back.
"""
from __future__ import annotations

import os
from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece

from rag_plugin.retrieval.encoders.files import read_json, require_file
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path, atomic_write_json, atomic_write_text

BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def wordpiece_tokenizer(vocab_file: os.PathLike, lowercase: bool = True):
    """A ``tokenizers.Tokenizer`` equivalent to BERT's WordPiece tokenizer for ``vocab_file``."""
    path = require_file(vocab_file, "vocabulary")
    vocab = WordPiece.read_file(str(path))
    missing = [t for t in ("[CLS]", "[SEP]", "[UNK]", "[PAD]") if t not in vocab]
    if missing:
        raise UserError(f"not a BERT WordPiece vocabulary: no {', '.join(missing)}", path=path)
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([t for t in BERT_SPECIAL_TOKENS if t in vocab])
    return tok


def tokenizer_from_dir(directory: Path):
    """``tokenizer.json`` if present, else ``vocab.txt`` (+ ``do_lower_case`` from
    ``tokenizer_config.json``, default True)."""
    if (directory / "tokenizer.json").is_file():
        try:
            return Tokenizer.from_file(str(directory / "tokenizer.json"))
        except Exception as err:  # tokenizers raises a bare Exception on bad JSON
            raise UserError(f"cannot read tokenizer: {err}", path=directory / "tokenizer.json") from None
    if (directory / "vocab.txt").is_file():
        lowercase = read_json(directory / "tokenizer_config.json", {}).get("do_lower_case", True)
        return wordpiece_tokenizer(directory / "vocab.txt", lowercase=bool(lowercase))
    raise UserError("no tokenizer.json or vocab.txt", path=directory,
                    fix="copy the encoder's tokenizer files into this folder")


def tokenizer_lowercases(tokenizer) -> bool:
    """Whether ``tokenizer``'s normaliser lowercases its input."""
    normalizer = tokenizer.normalizer
    return normalizer is not None and normalizer.normalize_str("A") == "a"


def save_tokenizer_files(tokenizer, folder: Path, max_length: int) -> None:
    """Write ``tokenizer.json``, ``vocab.txt`` and ``tokenizer_config.json`` (lowercasing and
    ``model_max_length``) into ``folder``: what :func:`tokenizer_from_dir` and transformers read."""
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.no_truncation()
    tok.no_padding()
    with atomic_path(folder / "tokenizer.json") as tmp:
        tok.save(str(tmp))
    vocab = tok.get_vocab(with_added_tokens=True)
    atomic_write_text(folder / "vocab.txt",
                      "".join(t + "\n" for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])))
    atomic_write_json(folder / "tokenizer_config.json",
                      {"do_lower_case": tokenizer_lowercases(tok), "model_max_length": max_length})
