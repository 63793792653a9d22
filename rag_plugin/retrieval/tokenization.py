"""The generator's tokenizer, used once to pre-tokenize passages (and questions/targets).

Token ids are indices into a fairseq ``dict.txt`` dictionary, so the stored ids feed the
generator's embedding table directly. Two subword models are supported:

* SentencePiece (``--bpe-model spm.model``; the dictionary lists its pieces), the choice for
  generators trained here;
* GPT-2 byte-level BPE (``encoder.json`` + ``vocab.bpe``), the one fairseq's BART uses, whose
  ``dict.txt`` lists GPT-2 ids as symbols.

The four files travel together as one :class:`GeneratorTokenizerFiles` (the command-line options of
:func:`add_tokenizer_arguments`, a build's settings, a manifest's ``tokenizer.files``).

The fairseq Dictionary layout is reproduced here (``<s>``=0, ``<pad>``=1, ``</s>``=2,
``<unk>``=3, then one symbol per line of ``dict.txt``) so no fairseq import is needed.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import sha256_file

SPECIAL_SYMBOLS = ("<s>", "<pad>", "</s>", "<unk>")
BOS, PAD, EOS, UNK = 0, 1, 2, 3


def read_dictionary(path: str) -> List[str]:
    """Symbols of a fairseq ``dict.txt`` in index order (specials first)."""
    symbols = list(SPECIAL_SYMBOLS)
    seen = set(symbols)
    p = Path(path)
    if not p.is_file():
        raise UserError("dictionary file not found", path=path,
                        fix="pass the generator's dict.txt")
    with open(p, encoding="utf-8", errors="strict") as fh:
        try:
            lines = fh.read().splitlines()
        except UnicodeDecodeError as err:
            raise UserError(f"dictionary is not UTF-8 ({err.reason})", path=path,
                            fix="use the dict.txt written by fairseq-preprocess") from None
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        overwrite = line.endswith(" #fairseq:overwrite")
        if overwrite:
            line = line[: -len(" #fairseq:overwrite")]
        parts = line.rsplit(" ", 1)
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise UserError("expected '<symbol> <count>'", path=path, line=lineno,
                            fix="use the dict.txt written by fairseq-preprocess")
        symbol = parts[0]
        if symbol in seen and not overwrite:
            raise UserError(f"duplicate symbol {symbol!r}", path=path, line=lineno,
                            fix="remove the duplicate line or mark it '#fairseq:overwrite'")
        seen.add(symbol)
        symbols.append(symbol)
    return symbols


@dataclass(frozen=True)
class GeneratorTokenizerFiles:
    """The generator tokenizer's files: its fairseq dictionary (``dict.txt``) and its subword model,
    SentencePiece (``bpe_model``) or GPT-2 byte-level BPE (``gpt2_encoder_json`` + ``gpt2_vocab_bpe``)."""

    dict: Optional[str] = None
    bpe_model: Optional[str] = None
    gpt2_encoder_json: Optional[str] = None
    gpt2_vocab_bpe: Optional[str] = None

    @classmethod
    def from_args(cls, args) -> GeneratorTokenizerFiles:
        """From the command-line options of :func:`add_tokenizer_arguments`."""
        return cls(args.dict, args.bpe_model, args.gpt2_encoder_json, args.gpt2_vocab_bpe)

    @classmethod
    def in_directory(cls, directory, names: Mapping[str, str]) -> GeneratorTokenizerFiles:
        """``names`` ({field: file name}, as a manifest records them) in ``directory``."""
        return cls(**{key: str(Path(directory) / name) for key, name in names.items()})

    def paths(self) -> Dict[str, str]:
        """``{field: path}`` of the files given, in field order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}

    @property
    def subword_model(self) -> Optional[str]:
        """``"sentencepiece"``, ``"gpt2"``, or None where no subword model is given."""
        if self.bpe_model:
            return "sentencepiece"
        return "gpt2" if self.gpt2_encoder_json or self.gpt2_vocab_bpe else None


#: each subword model's files, as named in a tokenizer's identity (``model_sha256``, ...)
MODEL_FILES = {"sentencepiece": {"bpe_model": "model"},
               "gpt2": {"gpt2_encoder_json": "encoder_json", "gpt2_vocab_bpe": "vocab_bpe"}}


class GeneratorTokenizer:
    """Text -> generator dictionary ids (no BOS/EOS added), from :class:`GeneratorTokenizerFiles`."""

    def __init__(self, files: GeneratorTokenizerFiles):
        self.files = files
        self.kind = files.subword_model
        if self.kind is None:
            raise UserError("no generator subword model given",
                            fix="pass --bpe-model FILE (SentencePiece) or --gpt2-encoder-json/--gpt2-vocab-bpe")
        if not files.dict:
            raise UserError("a subword model was given without the generator dictionary",
                            fix="pass --dict dict.txt as well")
        self.symbols = read_dictionary(files.dict)
        self.index: Dict[str, int] = {s: i for i, s in enumerate(self.symbols)}
        if self.kind == "sentencepiece":
            import sentencepiece as spm  # start-up: only a SentencePiece tokenizer pays for it

            if not Path(files.bpe_model).is_file():
                raise UserError("SentencePiece model not found", path=files.bpe_model,
                                fix="pass --bpe-model FILE.model")
            self._spm = spm.SentencePieceProcessor(model_file=str(files.bpe_model))
        else:
            self._gpt2 = _gpt2_tokenizer(files.gpt2_encoder_json, files.gpt2_vocab_bpe)

    # ------------------------------------------------------------------ encoding
    def pieces(self, text: str) -> List[str]:
        if self.kind == "sentencepiece":
            return self._spm.encode(text, out_type=str)
        return [str(i) for i in self._gpt2.encode(text, add_special_tokens=False).ids]

    def encode(self, text: str) -> List[int]:
        return [self.index.get(p, UNK) for p in self.pieces(text)]

    def encode_batch(self, texts: Sequence[str]) -> List[List[int]]:
        if self.kind == "sentencepiece":
            all_pieces = self._spm.encode(list(texts), out_type=str)
        else:
            all_pieces = [[str(i) for i in e.ids]
                          for e in self._gpt2.encode_batch(list(texts), add_special_tokens=False)]
        get = self.index.get
        return [[get(p, UNK) for p in ps] for ps in all_pieces]

    def decode(self, ids: Sequence[int]) -> str:
        syms = [self.symbols[i] for i in ids if i >= len(SPECIAL_SYMBOLS)]
        if self.kind == "sentencepiece":
            return self._spm.decode_pieces(syms)
        return self._gpt2.decode([int(s) for s in syms if s.isdigit()])

    # ------------------------------------------------------------------ identity
    def dictionary_sha256(self) -> str:
        return hashlib.sha256("\n".join(self.symbols).encode("utf-8")).hexdigest()

    def identity(self) -> dict:
        out = {"kind": self.kind, "vocab_size": len(self.symbols),
               "dictionary_sha256": self.dictionary_sha256()}
        for key, name in MODEL_FILES[self.kind].items():
            out[f"{name}_sha256"] = sha256_file(getattr(self.files, key))
        return out

    def __len__(self) -> int:
        return len(self.symbols)


def _gpt2_tokenizer(encoder_json: Optional[str], vocab_bpe: Optional[str]):
    """GPT-2's byte-level BPE from its two files (``tokenizers``, no fairseq)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # start-up: only GPT-2 BPE pays for it

    for p in (encoder_json, vocab_bpe):
        if not p or not Path(p).is_file():
            raise UserError("GPT-2 BPE file not found", path=p, fix="pass --gpt2-encoder-json and --gpt2-vocab-bpe")
    tok = Tokenizer(models.BPE.from_file(str(encoder_json), str(vocab_bpe)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def add_tokenizer_arguments(parser, input_format_default: Optional[str], input_format_help: str) -> None:
    """The command-line options naming the generator tokenizer and input format that passages are
    pre-tokenized for (shared by the knowledge-source builder and the precomputed-vectors importer)."""
    parser.add_argument("--dict", default=None, help="generator dictionary (fairseq dict.txt) to pre-tokenize "
                                                     "passages with")
    parser.add_argument("--bpe-model", default=None, help="SentencePiece model of the generator")
    parser.add_argument("--gpt2-encoder-json", default=None, help="GPT-2 BPE encoder.json (fairseq BART)")
    parser.add_argument("--gpt2-vocab-bpe", default=None, help="GPT-2 BPE vocab.bpe (fairseq BART)")
    parser.add_argument("--input-format", default=input_format_default, metavar="plugin|hf|FILE",
                        help="generator input format to pre-tokenize passages for: plugin, hf (the reference "
                             "RAG's 'title / text // question', with GPT-2 BPE) or a converted checkpoint's "
                             f"input_format.json ({input_format_help})")
