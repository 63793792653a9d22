"""A Hugging Face RAG folder (``facebook/rag-token-nq``, ``facebook/rag-sequence-nq``, or any
``RagTokenForGeneration`` / ``RagSequenceForGeneration.save_pretrained`` output) -> a plugin
checkpoint directory that ``fairseq-generate --path DIR/checkpoint.pt`` loads (``rag-convert-hf``).

Input (``--hf-dir``; read and checked by :mod:`rag_plugin.conversion.hf_rag_folder`)::

    config.json                 model_type "rag"; question_encoder (dpr) and generator (bart) configs
    model.safetensors | pytorch_model.bin (or sharded, with *.index.json)
    question_encoder_tokenizer/ vocab.txt and/or tokenizer.json (BERT WordPiece)
    generator_tokenizer/        vocab.json + merges.txt, or tokenizer.json (byte-level BPE)

Output (``--out``; written into a temporary folder beside it, renamed when complete)::

    checkpoint.pt        rag_token or rag_seq (the config's architecture), loadable with
                         weights_only=True (the plugin's allow-list)
    dict.txt             the generator dictionary: symbol i is the BPE id i, so plugin ids are HF ids
    encoder.json, vocab.bpe   the generator's BPE (HF's vocab.json and merges), the plugin's
                         --gpt2-encoder-json / --gpt2-vocab-bpe
    question_encoder/    the DPR question encoder in the HF layout (encoder spec hf-dpr:DIR)
    input_format.json    the generator input format (hf: the reference's, or plugin)
    conversion.json      what was converted and the settings the knowledge source needs

The stages, in order (:func:`convert_hf_rag`): read the folder; write the generator tokenizer
files; write the question encoder; build the plugin model and save its checkpoint; write
``input_format.json`` and ``conversion.json``. The ``hf`` input format (default) reproduces the
reference implementation's generator input exactly (see :mod:`rag_plugin.core.input_format`); a
knowledge source imported with ``--rag-checkpoint DIR`` (``rag-import-knowledge``) is
pre-tokenized for it. fairseq is imported quietly and only once every input is checked; no
hook of :mod:`rag_plugin.fairseq_hooks` is installed.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Optional

import torch
from omegaconf import OmegaConf
from safetensors.torch import save_file

import rag_plugin
from rag_plugin.conversion import hf_bart
from rag_plugin.conversion.hf_rag_folder import RagFolder, question_tokenizer_files, read_rag_folder
from rag_plugin.indexing.converted_checkpoint import FORMAT, RECORD
from rag_plugin.models.context import RetrievalContext
from rag_plugin.retrieval.encoders import load_encoder
from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_directory, atomic_path, atomic_write_json, atomic_write_text
from rag_plugin.util.quiet_import import import_fairseq_quietly

#: BART's special ids, which the plugin's dictionary fixes
SPECIAL_IDS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
#: the question length DPR encoders get in the plugin by default (DPR's passage length)
PLUGIN_DPR_MAX_LENGTH = 256


# ---------------------------------------------------------------------------------- the output directory
def check_output_dir(out_dir: str, overwrite: bool) -> Path:
    """``out_dir`` as a path, refused if it exists non-empty (without ``overwrite``) or if an encoder
    spec could not carry it."""
    out = Path(out_dir)
    if any(c in str(out.resolve()) for c in ",="):
        raise UserError("the output path holds ',' or '=', which an encoder spec (hf-dpr:DIR,option=value, recorded "
                        "for the question encoder) cannot carry", path=str(out),
                        fix="choose an --out whose path has no ',' or '='")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise UserError("output directory exists and is not empty", path=str(out),
                        fix="choose another --out, or add --overwrite")
    return out


# ---------------------------------------------------------------------------------- tokenizer and question encoder
def write_generator_tokenizer(folder: Path, source: RagFolder) -> None:
    """``encoder.json`` + ``vocab.bpe`` (the generator's BPE) and ``dict.txt`` (symbol i = BPE id i)."""
    where = str(source.path / "generator_tokenizer")
    vocab, vocab_size = source.vocab, source.dims["vocab_size"]
    wrong = [t for t, i in SPECIAL_IDS.items() if t in vocab and vocab[t] != i]
    if wrong:
        raise UserError(f"generator vocabulary has {wrong[0]}={vocab[wrong[0]]}, the plugin needs "
                        f"{SPECIAL_IDS[wrong[0]]}", path=where, fix="BART's ids: <s>=0, <pad>=1, </s>=2, <unk>=3")
    top = max(vocab.values()) if vocab else -1
    if top >= vocab_size:
        raise UserError(f"generator vocabulary has id {top}, the model only {vocab_size} embeddings", path=where,
                        fix="use the tokenizer saved with these weights")
    atomic_write_text(folder / "encoder.json", json.dumps(vocab, ensure_ascii=False))
    atomic_write_text(folder / "vocab.bpe", "#version: 0.2\n" + "".join(m + "\n" for m in source.merges))
    # symbol i of the dictionary is BPE id i: the plugin's ids are the HF ids
    atomic_write_text(folder / "dict.txt", "".join(f"{i} 1\n" for i in range(4, vocab_size)))


def question_encoder_options(source: RagFolder) -> str:
    """The encoder spec's options: transformers' RAG does not cut the question, so up to the encoder's
    positions (DPR: 512), where the plugin's DPR default is 256."""
    max_length = int(source.question_config.get("max_position_embeddings", 512))
    return "" if max_length == PLUGIN_DPR_MAX_LENGTH else f",max_length={max_length}"


def write_question_encoder(folder: Path, source: RagFolder, log: Callable[[str], None]):
    """The DPR question encoder in the Hugging Face layout (config.json, model.safetensors, the
    tokenizer's files), loaded back (which checks the weights against the config)."""
    folder.mkdir(parents=True)
    config = {k: v for k, v in source.question_config.items() if not k.startswith("_")}
    config.update(architectures=["DPRQuestionEncoder"], model_type="dpr")
    atomic_write_json(folder / "config.json", config)
    state = {"question_encoder." + k: v.detach().float().contiguous().clone()
             for k, v in source.question_weights.items() if not k.endswith("position_ids")}
    with atomic_path(folder / "model.safetensors") as path:
        save_file(state, str(path), metadata={"format": "pt"})
    for src in question_tokenizer_files(source.path / "question_encoder_tokenizer"):
        shutil.copyfile(src, folder / src.name)
    query = load_encoder(f"hf-dpr:{folder}{question_encoder_options(source)}")
    if "retrieval_vector_size" in source.config and query.dim != int(source.config["retrieval_vector_size"]):
        log(f"note: retrieval_vector_size {source.config['retrieval_vector_size']} in config.json, the question "
            f"encoder gives {query.dim}")
    return query


# ---------------------------------------------------------------------------------- the model and its checkpoint
def model_config(source: RagFolder):
    """The plugin's :class:`~rag_plugin.models.rag.RagConfig` for the folder's generator (a preset's
    sizes where one matches), and that preset's name (or None)."""
    from rag_plugin.models.generator import GENERATOR_SIZES  # after import_fairseq_quietly
    from rag_plugin.models.rag import RagConfig  # after import_fairseq_quietly

    dims = source.dims
    shape = (dims["embed_dim"], dims["layers"], dims["heads"], dims["ffn_dim"])
    preset = next((name for name, d in GENERATOR_SIZES.items()
                   if (d["encoder_embed_dim"], d["encoder_layers"], d["encoder_attention_heads"],
                       d["encoder_ffn_embed_dim"]) == shape), None)
    sizes = {} if preset else dict(generator_embed_dim=dims["embed_dim"], generator_layers=dims["layers"],
                                   generator_heads=dims["heads"], generator_ffn_dim=dims["ffn_dim"])
    cfg = RagConfig(_name=source.architecture, generator_size=preset or "large", **sizes,
                    max_source_positions=source.max_source_positions, max_target_positions=dims["max_positions"],
                    input_format=source.input_format.name, doc_score_scale=1.0, dropout=dims["dropout"],
                    attention_dropout=dims["attention_dropout"], activation_dropout=dims["activation_dropout"],
                    query_encoder_lr_scale=1.0)  # weights saved as they are (no lr reparametrisation)
    return cfg, preset


def build_plugin_model(folder: Path, source: RagFolder, query_tower: torch.nn.Module, model_cfg):
    """The plugin's RAG model holding the folder's generator and question encoder weights."""
    from fairseq.data import Dictionary  # after import_fairseq_quietly

    from rag_plugin.models.generator import GeneratorShape, build_bart  # after import_fairseq_quietly
    from rag_plugin.models.rag import RagSequenceModel, RagTokenModel  # after import_fairseq_quietly

    dictionary = Dictionary.load(str(folder / "dict.txt"))
    dims, c = source.dims, model_cfg
    generator = build_bart(GeneratorShape.of(c), dictionary)
    state = hf_bart.fairseq_state(source.generator_weights, dims["layers"], c.max_source_positions,
                                  c.max_target_positions, str(source.path))
    hf_bart.load_into(generator, state, str(source.path))
    cls = RagTokenModel if source.variant == "token" else RagSequenceModel
    context = RetrievalContext(n_docs=source.n_docs, input_format=source.input_format)  # no retriever: weights only
    return cls(model_cfg, generator, query_tower, dictionary, context)


def checkpoint_config(model_cfg, n_docs: int, knowledge: str) -> dict:
    """The checkpoint's ``cfg``: fairseq's defaults with the model, the task and the criterion."""
    from fairseq.dataclass.configs import FairseqConfig  # after import_fairseq_quietly

    from rag_plugin.criterions.marginal_nll import MarginalNLLConfig  # after import_fairseq_quietly
    from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig  # after import_fairseq_quietly

    cfg = OmegaConf.structured(FairseqConfig())
    cfg.model = OmegaConf.structured(model_cfg)
    cfg.task = OmegaConf.structured(RetrievalAugmentedConfig(_name="retrieval_augmented", n_docs=n_docs,
                                                             knowledge=knowledge))
    cfg.criterion = OmegaConf.structured(MarginalNLLConfig(_name="marginal_nll"))
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def save_checkpoint(path: Path, model: torch.nn.Module, model_cfg, n_docs: int, knowledge: str) -> None:
    """A fairseq checkpoint of ``model`` (no optimizer state), atomically."""
    write_fairseq_checkpoint(path, model, checkpoint_config(model_cfg, n_docs, knowledge), "MarginalNLLCriterion")


def write_fairseq_checkpoint(path: Path, model: torch.nn.Module, cfg: dict, criterion: str) -> None:
    """``model``'s weights and ``cfg`` as fairseq writes a checkpoint (no optimizer state), atomically: what
    ``checkpoint_utils.load_model_ensemble_and_task`` reads, under ``weights_only=True``."""
    state = {
        "args": None,
        "cfg": cfg,
        "model": {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in model.state_dict().items()},
        "criterion": None,
        "optimizer_history": [{"criterion_name": criterion, "optimizer_name": "none",
                               "lr_scheduler_state": {}, "num_updates": 0}],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}},
        "last_optimizer_state": None,
    }
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


# ---------------------------------------------------------------------------------- records
def write_records(folder: Path, final: Path, source: RagFolder, preset: Optional[str]) -> dict:
    """``input_format.json`` and ``conversion.json`` (returned); paths recorded as they will be at ``final``."""
    fmt = source.input_format.identity() or {"name": "plugin"}
    record = {
        "format": FORMAT,
        "source": str(source.path.resolve()),
        "architecture": source.architecture,
        "variant": source.variant,
        "n_docs": source.n_docs,
        "max_combined_length": source.max_combined_length,
        "max_source_positions": source.max_source_positions,
        "input_format": fmt,
        "encoder_spec": f"hf-dpr:{final / 'question_encoder'}{question_encoder_options(source)}",
        "generator_tokenizer": GeneratorTokenizerFiles(dict="dict.txt", gpt2_encoder_json="encoder.json",
                                                       gpt2_vocab_bpe="vocab.bpe").paths(),
        "generator": {"preset": preset, **source.dims},
    }
    atomic_write_json(folder / "input_format.json", fmt)
    atomic_write_json(folder / RECORD, record)
    return record


# ---------------------------------------------------------------------------------- the conversion
def _import_fairseq_and_register() -> None:
    """fairseq without its import-time logging noise, and the plugin's registrations (no hooks)."""
    import_fairseq_quietly()
    rag_plugin.register()


def convert_hf_rag(hf_dir: str, out_dir: str, input_format: str = "hf", variant: Optional[str] = None,
                   max_source_positions: Optional[int] = None, knowledge: str = "", overwrite: bool = False,
                   log: Callable[[str], None] = print) -> dict:
    """Convert; returns the ``conversion.json`` record (see the module docstring)."""
    out = check_output_dir(out_dir, overwrite)
    source = read_rag_folder(hf_dir, input_format, variant, max_source_positions, log)
    with atomic_directory(out) as folder:
        write_generator_tokenizer(folder, source)
        query = write_question_encoder(folder / "question_encoder", source, log)
        _import_fairseq_and_register()
        model_cfg, preset = model_config(source)
        model = build_plugin_model(folder, source, query.query_tower, model_cfg)
        save_checkpoint(folder / "checkpoint.pt", model, model_cfg, source.n_docs, knowledge)
        record = write_records(folder, out.resolve(), source, preset)
    dims = source.dims
    log(f"wrote {out}: {source.architecture}, generator {dims['layers']}+{dims['layers']} layers "
        f"d={dims['embed_dim']}, vocabulary {dims['vocab_size']}, question encoder dim {query.dim}, "
        f"input format {source.input_format.name}")
    return record
