"""Reading a Hugging Face RAG folder (``save_pretrained`` of ``RagTokenForGeneration`` /
``RagSequenceForGeneration`` + ``RagTokenizer``), checked before anything is written or fairseq
is imported, so that bad input costs seconds and gives one line.

* :func:`read_rag_folder` -- everything a conversion needs, as one :class:`RagFolder`: the
  configs, the variant, the generator input settings, the weights split into the question
  encoder's and the generator's, and the generator's byte-level BPE;
* the pieces it is made of: :func:`read_json`, :func:`load_weights`, :func:`split_weights`,
  :func:`generator_bpe`, :func:`question_tokenizer_files`.

``transformers`` is never imported: configs are JSON, weights safetensors or torch files read
under ``weights_only=True`` (:mod:`rag_plugin.util.safe_load`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch
from safetensors.torch import load_file

from rag_plugin.conversion import hf_bart
from rag_plugin.core.input_format import InputFormat
from rag_plugin.util.errors import UserError
from rag_plugin.util.safe_load import safe_torch_load

#: transformers' class name in ``config.json``'s ``architectures`` -> the plugin's variant
VARIANTS = {"RagTokenForGeneration": "token", "RagSequenceForGeneration": "sequence"}
#: the plugin's variant -> its fairseq architecture
ARCHS = {"token": "rag_token", "sequence": "rag_seq"}


@dataclass
class RagFolder:
    """A checked Hugging Face RAG folder (see :func:`read_rag_folder`)."""

    path: Path
    config: dict                 # config.json
    question_config: dict        # its question_encoder part (DPR)
    dims: dict                   # the generator's sizes (:func:`hf_bart.generator_dims`)
    variant: str                 # "token" or "sequence"
    input_format: InputFormat
    max_combined_length: int     # the reference's generator input length
    max_source_positions: int    # the converted model's
    question_weights: Dict[str, torch.Tensor]   # keyed as a DPR encoder has them (bert_model.*, encode_proj.*)
    generator_weights: Dict[str, torch.Tensor]  # keyed as BartForConditionalGeneration has them
    vocab: dict                  # generator BPE: token -> id
    merges: List[str]            # generator BPE merges, "a b" per line

    @property
    def architecture(self) -> str:
        return ARCHS[self.variant]

    @property
    def n_docs(self) -> int:
        return int(self.config.get("n_docs", 5))

    @property
    def config_file(self) -> str:
        return str(self.path / "config.json")


# ---------------------------------------------------------------------------------- files
def read_json(path: Path, fix: str = "point --hf-dir at a save_pretrained RAG folder") -> dict:
    """A JSON object from ``path``; a missing or malformed file is a one-line error (``fix``: what to do when it is
    missing)."""
    if not path.is_file():
        raise UserError("file not found", path=str(path), fix=fix)
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"not valid JSON ({err})", path=str(path)) from None
    if not isinstance(value, dict):
        raise UserError("expected a JSON object", path=str(path))
    return value


def _load_file(path: Path) -> Dict[str, torch.Tensor]:
    if path.name.endswith(".safetensors"):
        try:
            return load_file(str(path))
        except Exception as err:  # safetensors raises its own error types
            raise UserError(f"cannot read safetensors file ({str(err)[:120]})", path=str(path)) from None
    state = safe_torch_load(path)
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise UserError("expected a state dict of tensors", path=str(path))
    return state


def load_weights(directory: Path) -> Dict[str, torch.Tensor]:
    """``model.safetensors`` / ``pytorch_model.bin``, or their sharded form (``*.index.json``)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).is_file():
            return _load_file(directory / name)
        index = directory / f"{name}.index.json"
        if index.is_file():
            shards = sorted(set(read_json(index).get("weight_map", {}).values()))
            if not shards:
                raise UserError("weight index names no shards", path=str(index))
            state: Dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(_load_file(directory / shard))
            return state
    raise UserError("no model.safetensors or pytorch_model.bin (or a sharded index)", path=str(directory),
                    fix="point --hf-dir at the folder written by save_pretrained")


def split_weights(state: Dict[str, torch.Tensor], source: str) -> Tuple[Dict, Dict]:
    """RAG weights -> (question encoder weights keyed ``bert_model.*``/``encode_proj.*`` as a
    DPR encoder has them, generator weights keyed ``model.*``/``lm_head.*``)."""
    question, generator = {}, {}
    for key, value in state.items():
        k = key[len("rag."):] if key.startswith("rag.") else key
        if k.startswith("question_encoder."):
            question[k[len("question_encoder."):]] = value
        elif k.startswith("generator."):
            generator[k[len("generator."):]] = value
        elif k.startswith("ctx_encoder."):
            continue  # only present after end-to-end retriever training; not used for generation
        else:
            raise UserError(f"unexpected weight {key!r} in a RAG checkpoint", path=source)
    if not question or not generator:
        raise UserError("not RAG weights: expected rag.question_encoder.* and rag.generator.* tensors", path=source)
    if not all(k.startswith("question_encoder.") for k in question):
        raise UserError("the question encoder is not a DPRQuestionEncoder", path=source)
    return {k[len("question_encoder."):]: v for k, v in question.items()}, generator


def _bpe_from_tokenizer_json(path: Path) -> Tuple[dict, list, bool]:
    tok = read_json(path)
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        raise UserError(f"generator tokenizer model is {model.get('type')!r}, not byte-level BPE",
                        path=str(path), fix="only BART's GPT-2 BPE tokenizer converts")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    pre = tok.get("pre_tokenizer") or {}
    if pre.get("type") == "Sequence":
        pre = next((p for p in pre.get("pretokenizers", []) if p.get("type") == "ByteLevel"), {})
    if pre.get("type") != "ByteLevel":
        raise UserError("generator tokenizer is not byte-level BPE", path=str(path))
    return dict(model.get("vocab", {})), merges, bool(pre.get("add_prefix_space", False))


def generator_bpe(tok_dir: Path) -> Tuple[dict, list, bool]:
    """(vocab token -> id, merges as 'a b' lines, add_prefix_space) of the generator tokenizer."""
    cfg = read_json(tok_dir / "tokenizer_config.json") if (tok_dir / "tokenizer_config.json").is_file() else {}
    if (tok_dir / "vocab.json").is_file() and (tok_dir / "merges.txt").is_file():
        vocab = read_json(tok_dir / "vocab.json")
        merges = [line for line in (tok_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
                  if line and not line.startswith("#version")]
        return vocab, merges, bool(cfg.get("add_prefix_space", False))
    if (tok_dir / "tokenizer.json").is_file():
        return _bpe_from_tokenizer_json(tok_dir / "tokenizer.json")
    raise UserError("generator tokenizer not found (vocab.json + merges.txt, or tokenizer.json)", path=str(tok_dir),
                    fix="the RAG folder needs generator_tokenizer/ as RagTokenizer.save_pretrained writes it")


def question_tokenizer_files(tok_dir: Path) -> List[Path]:
    """The question encoder tokenizer's files (a WordPiece ``vocab.txt`` and/or ``tokenizer.json``)."""
    names = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
    files = [tok_dir / n for n in names if (tok_dir / n).is_file()]
    if not any(f.name in ("tokenizer.json", "vocab.txt") for f in files):
        raise UserError("question encoder tokenizer not found (vocab.txt or tokenizer.json)", path=str(tok_dir),
                        fix="the RAG folder needs question_encoder_tokenizer/ as RagTokenizer.save_pretrained "
                            "writes it")
    return files


# ---------------------------------------------------------------------------------- settings
def read_rag_config(src: Path) -> Tuple[dict, dict, dict]:
    """``config.json`` and its question encoder (DPR) and generator parts, checked."""
    config = read_json(src / "config.json")
    where = str(src / "config.json")
    if config.get("model_type") != "rag":
        raise UserError(f"config model_type {config.get('model_type')!r} is not 'rag'", path=where,
                        fix="pass the folder of a RagTokenForGeneration / RagSequenceForGeneration")
    qcfg, gcfg = config.get("question_encoder") or {}, config.get("generator") or {}
    if qcfg.get("model_type") != "dpr":
        raise UserError(f"question encoder model_type {qcfg.get('model_type')!r} is not supported", path=where,
                        fix="only DPR question encoders convert")
    return config, qcfg, gcfg


def choose_variant(config: dict, variant: Optional[str], where: str) -> str:
    """``variant`` if given, else the one ``config.json``'s architectures name."""
    named = [VARIANTS[a] for a in config.get("architectures") or [] if a in VARIANTS]
    variant = variant or (named[0] if named else None)
    if variant not in ARCHS:
        raise UserError(f"cannot tell RAG-Token from RAG-Sequence (architectures {config.get('architectures')})",
                        path=where, fix="pass --variant token or --variant sequence")
    return variant


def generator_input_settings(config: dict, gcfg: dict, max_positions: int, input_format: str,
                             max_source_positions: Optional[int], log: Callable[[str], None]):
    """(input format, the reference's max_combined_length, the converted model's max_source_positions)."""
    if input_format == "hf":  # the reference passes the generator config's prefix to its retriever
        fmt = InputFormat.hf(config.get("title_sep", " / "), config.get("doc_sep", " // "), gcfg.get("prefix"))
    else:
        fmt = InputFormat.parse(input_format)
    max_combined = int(config.get("max_combined_length", 300))
    msp = int(max_source_positions or min(max_combined, max_positions))
    if not 2 < msp <= max_positions:
        raise UserError(f"--max-source-positions {msp} must be within 3..{max_positions}")
    if fmt.name == "hf" and msp < max_combined:
        log(f"warning: generator inputs are cut at {msp} tokens, the reference at {max_combined}")
    return fmt, max_combined, msp


def read_rag_folder(hf_dir: str, input_format: str = "hf", variant: Optional[str] = None,
                    max_source_positions: Optional[int] = None, log: Callable[[str], None] = print) -> RagFolder:
    """Read and check everything a conversion takes from ``hf_dir`` (no fairseq import)."""
    src = Path(hf_dir)
    if not src.is_dir():
        raise UserError("Hugging Face RAG folder not found", path=str(src), fix="pass --hf-dir DIR (save_pretrained)")
    config, qcfg, gcfg = read_rag_config(src)
    dims = hf_bart.generator_dims(gcfg, str(src / "config.json"))
    variant = choose_variant(config, variant, str(src / "config.json"))
    fmt, max_combined, msp = generator_input_settings(config, gcfg, dims["max_positions"], input_format,
                                                      max_source_positions, log)
    question_weights, generator_weights = split_weights(load_weights(src), str(src))
    vocab, merges, prefix_space = generator_bpe(src / "generator_tokenizer")
    if prefix_space:
        raise UserError("the generator tokenizer adds a prefix space, which the plugin's GPT-2 BPE does not",
                        path=str(src / "generator_tokenizer"))
    question_tokenizer_files(src / "question_encoder_tokenizer")
    return RagFolder(src, config, qcfg, dims, variant, fmt, max_combined, msp, question_weights, generator_weights,
                     vocab, merges)
