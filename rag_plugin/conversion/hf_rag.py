"""A Hugging Face RAG folder (``facebook/rag-token-nq``, ``facebook/rag-sequence-nq``, or any
``RagTokenForGeneration`` / ``RagSequenceForGeneration.save_pretrained`` output) -> a plugin
checkpoint directory that ``fairseq-generate --path DIR/checkpoint.pt`` loads.

Input (``--hf-dir``)::

    config.json                 model_type "rag"; question_encoder (dpr) and generator (bart) configs
    model.safetensors | pytorch_model.bin (or sharded, with *.index.json)
    question_encoder_tokenizer/ vocab.txt and/or tokenizer.json (BERT WordPiece)
    generator_tokenizer/        vocab.json + merges.txt, or tokenizer.json (byte-level BPE)

Output (``--out``; written into a temporary folder beside it, renamed when complete)::

    checkpoint.pt        rag_token or rag_seq (the config's architecture), weights loaded with
                         weights_only=True by fairseq through the plugin
    dict.txt             the generator dictionary: symbol i is the BPE id i, so plugin ids are HF ids
    encoder.json, vocab.bpe   the generator's BPE (HF's vocab.json and merges), the plugin's
                         --gpt2-encoder-json / --gpt2-vocab-bpe
    question_encoder/    the DPR question encoder in the HF layout (encoder spec hf-dpr:DIR)
    input_format.json    the generator input format (hf: the reference's, or plugin)
    conversion.json      what was converted and the settings the knowledge source needs

The ``hf`` input format (default) reproduces the reference implementation's generator input
exactly (see :mod:`rag_plugin.core.input_format`); a knowledge source imported with
``--rag-checkpoint DIR`` (``scripts/import_hf_knowledge.py``) is pre-tokenized for it.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from rag_plugin.conversion import hf_bart
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path, atomic_write_json, atomic_write_text

VARIANTS = {"RagTokenForGeneration": "token", "RagSequenceForGeneration": "sequence"}
ARCHS = {"token": "rag_token", "sequence": "rag_seq"}
FORMAT = "rag_plugin.hf_rag_conversion/1"


# ---------------------------------------------------------------------------------- reading
def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise UserError("file not found", path=str(path), fix="point --hf-dir at a save_pretrained RAG folder")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"not valid JSON ({err})", path=str(path)) from None
    if not isinstance(value, dict):
        raise UserError("expected a JSON object", path=str(path))
    return value


def _load_file(path: Path) -> Dict[str, torch.Tensor]:
    if path.name.endswith(".safetensors"):
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except Exception as err:  # safetensors raises its own error types
            raise UserError(f"cannot read safetensors file ({str(err)[:120]})", path=str(path)) from None
    from rag_plugin.util.safe_load import safe_torch_load

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
            shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
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


def generator_bpe(tok_dir: Path) -> Tuple[dict, list, bool]:
    """(vocab token -> id, merges as 'a b' lines, add_prefix_space) of the generator tokenizer."""
    cfg = _read_json(tok_dir / "tokenizer_config.json") if (tok_dir / "tokenizer_config.json").is_file() else {}
    if (tok_dir / "vocab.json").is_file() and (tok_dir / "merges.txt").is_file():
        vocab = _read_json(tok_dir / "vocab.json")
        merges = [line for line in (tok_dir / "merges.txt").read_text(encoding="utf-8").splitlines()
                  if line and not line.startswith("#version")]
        return vocab, merges, bool(cfg.get("add_prefix_space", False))
    if (tok_dir / "tokenizer.json").is_file():
        tok = _read_json(tok_dir / "tokenizer.json")
        model = tok.get("model") or {}
        if model.get("type") != "BPE":
            raise UserError(f"generator tokenizer model is {model.get('type')!r}, not byte-level BPE",
                            path=str(tok_dir / "tokenizer.json"), fix="only BART's GPT-2 BPE tokenizer converts")
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
        pre = tok.get("pre_tokenizer") or {}
        if pre.get("type") == "Sequence":
            pre = next((p for p in pre.get("pretokenizers", []) if p.get("type") == "ByteLevel"), {})
        if pre.get("type") != "ByteLevel":
            raise UserError("generator tokenizer is not byte-level BPE", path=str(tok_dir / "tokenizer.json"))
        return dict(model.get("vocab", {})), merges, bool(pre.get("add_prefix_space", False))
    raise UserError("generator tokenizer not found (vocab.json + merges.txt, or tokenizer.json)", path=str(tok_dir),
                    fix="the RAG folder needs generator_tokenizer/ as RagTokenizer.save_pretrained writes it")


def _question_tokenizer_files(tok_dir: Path) -> list:
    names = ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json")
    files = [tok_dir / n for n in names if (tok_dir / n).is_file()]
    if not any(f.name in ("tokenizer.json", "vocab.txt") for f in files):
        raise UserError("question encoder tokenizer not found (vocab.txt or tokenizer.json)", path=str(tok_dir),
                        fix="the RAG folder needs question_encoder_tokenizer/ as RagTokenizer.save_pretrained "
                            "writes it")
    return files


# ---------------------------------------------------------------------------------- writing
def _write_question_encoder(folder: Path, qcfg: dict, weights: Dict[str, torch.Tensor], tok_dir: Path) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    config = {k: v for k, v in qcfg.items() if not k.startswith("_")}
    config.update(architectures=["DPRQuestionEncoder"], model_type="dpr")
    atomic_write_json(folder / "config.json", config)
    state = {"question_encoder." + k: v.detach().float().contiguous().clone() for k, v in weights.items()
             if not k.endswith("position_ids")}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    for src in _question_tokenizer_files(tok_dir):
        shutil.copyfile(src, folder / src.name)


def _write_bpe(out: Path, vocab: dict, merges: list, vocab_size: int, source: str) -> None:
    specials = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    wrong = [t for t, i in specials.items() if t in vocab and vocab[t] != i]
    if wrong:
        raise UserError(f"generator vocabulary has {wrong[0]}={vocab[wrong[0]]}, the plugin needs "
                        f"{specials[wrong[0]]}", path=source, fix="BART's ids: <s>=0, <pad>=1, </s>=2, <unk>=3")
    top = max(vocab.values()) if vocab else -1
    if top >= vocab_size:
        raise UserError(f"generator vocabulary has id {top}, the model only {vocab_size} embeddings", path=source,
                        fix="use the tokenizer saved with these weights")
    atomic_write_text(out / "encoder.json", json.dumps(vocab, ensure_ascii=False))
    atomic_write_text(out / "vocab.bpe", "#version: 0.2\n" + "".join(m + "\n" for m in merges))
    # symbol i of the dictionary is BPE id i: the plugin's ids are the HF ids
    atomic_write_text(out / "dict.txt", "".join(f"{i} 1\n" for i in range(4, vocab_size)))


def _checkpoint_cfg(arch: str, model_cfg, n_docs: int, knowledge: str) -> dict:
    from fairseq.dataclass.configs import FairseqConfig
    from omegaconf import OmegaConf

    from rag_plugin.criterions.marginal_nll import MarginalNLLConfig
    from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig

    cfg = OmegaConf.structured(FairseqConfig())
    cfg.model = OmegaConf.structured(model_cfg)
    cfg.task = OmegaConf.structured(RetrievalAugmentedConfig(_name="retrieval_augmented", n_docs=n_docs,
                                                             knowledge=knowledge))
    cfg.criterion = OmegaConf.structured(MarginalNLLConfig(_name="marginal_nll"))
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def convert_hf_rag(hf_dir: str, out_dir: str, input_format: str = "hf", variant: Optional[str] = None,
                   max_source_positions: Optional[int] = None, knowledge: str = "", overwrite: bool = False,
                   log=print) -> dict:
    """Convert; returns the ``conversion.json`` record (see the module docstring).

    Every input is checked before fairseq is imported, so bad input costs seconds and gives one line.
    """
    from rag_plugin.core.input_format import InputFormat
    from rag_plugin.retrieval.encoders import load_encoder

    src = Path(hf_dir)
    if not src.is_dir():
        raise UserError("Hugging Face RAG folder not found", path=str(src), fix="pass --hf-dir DIR (save_pretrained)")
    out = Path(out_dir)
    if any(c in str(out.resolve()) for c in ",="):
        raise UserError("the output path holds ',' or '=', which an encoder spec (hf-dpr:DIR,option=value, recorded "
                        "for the question encoder) cannot carry", path=str(out),
                        fix="choose an --out whose path has no ',' or '='")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise UserError("output directory exists and is not empty", path=str(out),
                        fix="choose another --out, or add --overwrite")
    config = _read_json(src / "config.json")
    if config.get("model_type") != "rag":
        raise UserError(f"config model_type {config.get('model_type')!r} is not 'rag'", path=str(src / "config.json"),
                        fix="pass the folder of a RagTokenForGeneration / RagSequenceForGeneration")
    qcfg, gcfg = config.get("question_encoder") or {}, config.get("generator") or {}
    if qcfg.get("model_type") != "dpr":
        raise UserError(f"question encoder model_type {qcfg.get('model_type')!r} is not supported",
                        path=str(src / "config.json"), fix="only DPR question encoders convert")
    dims = hf_bart.generator_dims(gcfg, str(src / "config.json"))
    archs = [VARIANTS[a] for a in config.get("architectures") or [] if a in VARIANTS]
    variant = variant or (archs[0] if archs else None)
    if variant not in ARCHS:
        raise UserError(f"cannot tell RAG-Token from RAG-Sequence (architectures {config.get('architectures')})",
                        path=str(src / "config.json"), fix="pass --variant token or --variant sequence")
    fmt = InputFormat.parse(input_format) if input_format not in ("hf",) else InputFormat.hf(
        config.get("title_sep", " / "), config.get("doc_sep", " // "), gcfg.get("prefix"))  # the reference
    # passes the generator config's prefix to its retriever
    max_combined = int(config.get("max_combined_length", 300))
    msp = int(max_source_positions or min(max_combined, dims["max_positions"]))
    if not 2 < msp <= dims["max_positions"]:
        raise UserError(f"--max-source-positions {msp} must be within 3..{dims['max_positions']}")
    if fmt.name == "hf" and msp < max_combined:
        log(f"warning: generator inputs are cut at {msp} tokens, the reference at {max_combined}")
    weights = load_weights(src)
    q_weights, g_weights = split_weights(weights, str(src))
    vocab, merges, prefix_space = generator_bpe(src / "generator_tokenizer")
    if prefix_space:
        raise UserError("the generator tokenizer adds a prefix space, which the plugin's GPT-2 BPE does not",
                        path=str(src / "generator_tokenizer"))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write_bpe(tmp, vocab, merges, dims["vocab_size"], str(src / "generator_tokenizer"))
        _write_question_encoder(tmp / "question_encoder", qcfg, q_weights, src / "question_encoder_tokenizer")
        # transformers' RAG does not cut the question: up to the encoder's positions (DPR: 512), where the
        # plugin's DPR default is 256 (DPR's passage length)
        max_length = int(qcfg.get("max_position_embeddings", 512))
        options = "" if max_length == 256 else f",max_length={max_length}"
        query = load_encoder(f"hf-dpr:{tmp / 'question_encoder'}{options}")  # checks weights against config
        if query.dim != int(config.get("retrieval_vector_size", query.dim)) and "retrieval_vector_size" in config:
            log(f"note: retrieval_vector_size {config['retrieval_vector_size']} in config.json, the question "
                f"encoder gives {query.dim}")
        import rag_plugin

        rag_plugin.register()
        from fairseq.data import Dictionary

        from rag_plugin.models.generator import GENERATOR_SIZES, build_bart
        from rag_plugin.models.rag import RagConfig, RagSequenceModel, RagTokenModel

        dictionary = Dictionary.load(str(tmp / "dict.txt"))
        preset = next((name for name, d in GENERATOR_SIZES.items()
                       if (d["encoder_embed_dim"], d["encoder_layers"], d["encoder_attention_heads"],
                           d["encoder_ffn_embed_dim"]) == (dims["embed_dim"], dims["layers"], dims["heads"],
                                                           dims["ffn_dim"])), None)
        overrides = {} if preset else dict(generator_embed_dim=dims["embed_dim"], generator_layers=dims["layers"],
                                           generator_heads=dims["heads"], generator_ffn_dim=dims["ffn_dim"])
        arch = ARCHS[variant]
        model_cfg = RagConfig(_name=arch, generator_size=preset or "large", **overrides,
                              max_source_positions=msp, max_target_positions=dims["max_positions"],
                              input_format=fmt.name, doc_score_scale=1.0, dropout=dims["dropout"],
                              attention_dropout=dims["attention_dropout"],
                              activation_dropout=dims["activation_dropout"])
        generator = build_bart(model_cfg.generator_size, dictionary, msp, dims["max_positions"], dims["dropout"],
                               dims["attention_dropout"], dims["activation_dropout"], model_cfg.generator_embed_dim,
                               model_cfg.generator_layers, model_cfg.generator_heads, model_cfg.generator_ffn_dim)
        hf_bart.load_into(generator, hf_bart.fairseq_state(g_weights, dims["layers"], msp, dims["max_positions"],
                                                           str(src)), str(src))
        cls = RagTokenModel if variant == "token" else RagSequenceModel
        model = cls(model_cfg, generator, query.query_tower, dictionary)
        n_docs = int(config.get("n_docs", 5))
        state = {
            "args": None,
            "cfg": _checkpoint_cfg(arch, model_cfg, n_docs, knowledge),
            "model": {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in model.state_dict().items()},
            "criterion": None,
            "optimizer_history": [{"criterion_name": "MarginalNLLCriterion", "optimizer_name": "none",
                                   "lr_scheduler_state": {}, "num_updates": 0}],
            "task_state": {},
            "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}},
            "last_optimizer_state": None,
        }
        with atomic_path(tmp / "checkpoint.pt") as path:
            torch.save(state, path)
        final = out.resolve()
        record = {
            "format": FORMAT,
            "source": str(src.resolve()),
            "architecture": arch,
            "variant": variant,
            "n_docs": n_docs,
            "max_combined_length": max_combined,
            "max_source_positions": msp,
            "input_format": fmt.identity() or {"name": "plugin"},
            "encoder_spec": f"hf-dpr:{final / 'question_encoder'}{options}",
            "generator_tokenizer": {"dict": "dict.txt", "gpt2_encoder_json": "encoder.json",
                                    "gpt2_vocab_bpe": "vocab.bpe"},
            "generator": {"preset": preset, **dims},
        }
        atomic_write_json(tmp / "input_format.json", fmt.identity() or {"name": "plugin"})
        atomic_write_json(tmp / "conversion.json", record)
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"wrote {out}: {arch}, generator {dims['layers']}+{dims['layers']} layers d={dims['embed_dim']}, "
        f"vocabulary {dims['vocab_size']}, question encoder dim {query.dim}, input format {fmt.name}")
    return record


def read_conversion(directory: str) -> dict:
    """The ``conversion.json`` of a converted checkpoint directory, with absolute file paths."""
    d = Path(directory)
    record = _read_json(d / "conversion.json")
    if record.get("format") != FORMAT:
        raise UserError("not a converted RAG checkpoint directory (conversion.json of another format)",
                        path=str(d / "conversion.json"), fix="pass the --out folder of scripts/convert_hf_rag.py")
    files = {k: str(d / v) for k, v in record["generator_tokenizer"].items()}
    return {**record, "files": files, "input_format_file": str(d / "input_format.json"),
            "checkpoint": str(d / "checkpoint.pt")}
