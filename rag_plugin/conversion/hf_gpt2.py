"""A Hugging Face GPT-2-family checkpoint -> a fairseq ``transformer_lm`` (``rag-convert-hf --gpt2 DIR``).

Input (``DIR``, a ``GPT2LMHeadModel`` / ``GPT2Model.save_pretrained`` folder plus its tokenizer)::

    config.json                     model_type "gpt2"
    model.safetensors               (or sharded, with model.safetensors.index.json); a pickle
                                    (pytorch_model.bin) is refused, never unpickled
    vocab.json, merges.txt          GPT-2's byte-level BPE

Output (``--out``; written into a temporary folder beside it, renamed when complete)::

    checkpoint.pt        cfg (model transformer_lm, task language_modeling with data=OUT) and weights,
                         loadable with weights_only=True under the plugin's allow-list
    dict.txt             fairseq's Dictionary of the GPT-2 ids (below)
    encoder.json, vocab.bpe   vocab.json and merges.txt, as fairseq's ``--bpe gpt2`` reads them
    conversion.json      the source and the id mapping

**Ids.** fairseq's Dictionary always starts with ``<s>=0, <pad>=1, </s>=2, <unk>=3``; ``dict.txt``
names the GPT-2 ids as symbols (as fairseq's own GPT-2 ``dict.txt`` does, so ``--bpe gpt2`` output
maps through it), every id but ``<|endoftext|>`` (the config's ``eos_token_id``, 50256 in GPT-2),
in id order. So GPT-2 id ``g`` is fairseq id ``g + 4`` below the end-of-text id, ``g + 3`` above it
(none in GPT-2, whose end-of-text id is the last), and the end-of-text id itself is fairseq's
``</s>`` (2): fairseq's language model starts and ends sequences with ``</s>``, as GPT-2 does with
``<|endoftext|>`` (see :func:`gpt2_to_fairseq`, :func:`fairseq_to_gpt2`).

**Exact.** The network is the same: pre-LayerNorm blocks (``ln_1`` -> ``self_attn_layer_norm``,
``ln_2`` -> ``final_layer_norm``, ``ln_f`` -> ``decoder.layer_norm``, eps 1e-5), learned positions
(fairseq's start at ``padding_idx + 1 = 2``: ``wpe`` row ``p`` is fairseq row ``p + 2``), unscaled
token embeddings tied to the output layer, attention scaled by ``head_dim ** -0.5``; GPT-2's Conv1D
weights (``[in, out]``) are transposed into ``nn.Linear`` and ``c_attn`` is split into q, k, v.
The logits of every GPT-2 token therefore equal transformers' up to float rounding (the tests: 1e-5).
The four special rows (``<s>``, ``<pad>``, ``</s>``, ``<unk>``) all hold ``<|endoftext|>``'s embedding:
``</s>`` *is* that token, and with tied weights no other choice keeps the three non-GPT-2 entries
below every token GPT-2 ranks above ``<|endoftext|>`` (a zero row would give them logit 0, above
all of a real GPT-2's typically negative logits). Their logits equal ``<|endoftext|>``'s, so a
distribution over fairseq's whole vocabulary equals GPT-2's exactly once ids 0, 1, 3
(:data:`NOT_GPT2_IDS`) are masked; fairseq's generator masks ``<pad>`` itself. What fairseq's
``transformer_lm`` cannot represent is a one-line error naming the config field.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict

import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rag_plugin.conversion.hf_rag import write_fairseq_checkpoint
from rag_plugin.conversion.hf_rag_folder import read_json
from rag_plugin.models.gpt2_ids import GPT2_CONVERSION_FORMAT, NOT_GPT2_IDS
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_directory, atomic_write_json, atomic_write_text

FORMAT = GPT2_CONVERSION_FORMAT  # the decoder-only reader recognises a conversion by it (models/lm_generator.py)
#: fairseq's special ids, fixed by its Dictionary
BOS, PAD, EOS, UNK = 0, 1, 2, 3
#: NOT_GPT2_IDS (models/gpt2_ids.py) are BOS, PAD, UNK: no GPT-2 token; their logits copy <|endoftext|>'s
#: transformers' activation_function -> fairseq's activation_fn (the same function)
ACTIVATIONS = {"gelu_new": "gelu_accurate", "gelu_fast": "gelu_accurate", "gelu_pytorch_tanh": "gelu_accurate",
               "gelu": "gelu", "relu": "relu", "tanh": "tanh"}
#: fairseq's LayerNorm epsilon
LAYER_NORM_EPS = 1e-5


# ---------------------------------------------------------------------------------- ids
def gpt2_to_fairseq(g: int, eos: int) -> int:
    """The fairseq id of GPT-2 id ``g`` (``eos``: the config's end-of-text id)."""
    return EOS if g == eos else g + 4 if g < eos else g + 3


def fairseq_to_gpt2(f: int, eos: int) -> int:
    """The GPT-2 id of fairseq id ``f``; ``</s>`` is ``<|endoftext|>``, the other specials have none."""
    if f == EOS:
        return eos
    if f in NOT_GPT2_IDS:
        raise ValueError(f"fairseq id {f} is no GPT-2 token")
    return f - 4 if f - 4 < eos else f - 3


# ---------------------------------------------------------------------------------- reading the folder
@dataclass
class Gpt2Folder:
    """A checked Hugging Face GPT-2 folder (:func:`read_gpt2_folder`)."""

    path: Path
    dims: dict                      # :func:`gpt2_dims`
    weights: Dict[str, torch.Tensor]  # keyed as GPT2Model has them (no ``transformer.`` prefix)


def _read_json(path: Path, fix: str) -> dict:
    return read_json(path, fix)  # the conversions' one JSON reader


def _checks(cfg: dict) -> dict:
    """Config field -> (what fairseq's transformer_lm has, what the config says)."""
    return {"scale_attn_weights": (True, bool(cfg.get("scale_attn_weights", True))),
            "scale_attn_by_inverse_layer_idx": (False, bool(cfg.get("scale_attn_by_inverse_layer_idx", False))),
            "add_cross_attention": (False, bool(cfg.get("add_cross_attention", False))),
            "tie_word_embeddings": (True, bool(cfg.get("tie_word_embeddings", True))),
            "layer_norm_epsilon": (LAYER_NORM_EPS, float(cfg.get("layer_norm_epsilon", LAYER_NORM_EPS)))}


def gpt2_dims(cfg: dict, where: str) -> dict:
    """Sizes and settings of the fairseq model for a GPT-2 ``config.json``; what fairseq cannot represent is
    an error naming the field. (``reorder_and_upcast_attn`` is accepted: in float32 it is the same product.)"""
    if cfg.get("model_type") != "gpt2":
        raise UserError(f"config model_type {cfg.get('model_type')!r} is not 'gpt2'", path=where,
                        fix="pass the save_pretrained folder of a GPT-2-family model")
    try:
        embed = int(cfg["n_embd"])
        dims = dict(embed_dim=embed, layers=int(cfg["n_layer"]), heads=int(cfg["n_head"]),
                    ffn_dim=int(cfg.get("n_inner") or 4 * embed), vocab_size=int(cfg["vocab_size"]),
                    max_positions=int(cfg["n_positions"]))
    except KeyError as err:
        raise UserError(f"config lacks {err.args[0]!r}", path=where) from None
    act = cfg.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise UserError(f"config has activation_function={act!r}, which fairseq's transformer_lm lacks", path=where,
                        fix=f"convertible: {', '.join(ACTIVATIONS)}")
    for name, (want, got) in _checks(cfg).items():
        if got != want:
            raise UserError(f"config has {name}={got!r}; fairseq's transformer_lm has {want!r}", path=where)
    eos = int(cfg.get("eos_token_id", 50256) if cfg.get("eos_token_id") is not None else 50256)
    bos = cfg.get("bos_token_id")
    if not 0 <= eos < dims["vocab_size"]:
        raise UserError(f"config has eos_token_id={eos} outside the vocabulary of {dims['vocab_size']}", path=where)
    if bos is not None and int(bos) != eos:
        raise UserError(f"config has bos_token_id={bos} but eos_token_id={eos}; fairseq's language model starts "
                        "sequences with its end-of-sequence token", path=where)
    dims.update(activation_fn=ACTIVATIONS[act], eos=eos, dropout=float(cfg.get("resid_pdrop", 0.1)),
                attention_dropout=float(cfg.get("attn_pdrop", 0.1)))
    return dims


def load_safetensors(src: Path) -> Dict[str, torch.Tensor]:
    """``model.safetensors`` or its shards; a pickle (``pytorch_model.bin``) is refused unread."""
    single, index = src / "model.safetensors", src / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        shards = sorted(set(_read_json(index, "check the path").get("weight_map", {}).values()))
        if not shards:
            raise UserError("weight index names no shards", path=str(index))
        files = [src / s for s in shards]
    elif any(src.glob("pytorch_model*.bin")):
        raise UserError("only pytorch_model.bin (a pickle), which is not loaded", path=str(src),
                        fix="convert it to safetensors (save_pretrained(safe_serialization=True))")
    else:
        raise UserError("no model.safetensors", path=str(src), fix="point --gpt2 at a save_pretrained folder")
    state: Dict[str, torch.Tensor] = {}
    for path in files:
        try:
            state.update(load_file(str(path)))
        except Exception as err:  # safetensors raises its own error types (a missing shard among them)
            raise UserError(f"cannot read safetensors file ({str(err)[:120]})", path=str(path)) from None
    return {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in state.items()}


def check_vocab(src: Path, dims: dict) -> None:
    """vocab.json and merges.txt exist, and vocab.json fits the model (its <|endoftext|> is the config's eos)."""
    fix = "the folder needs GPT-2's vocab.json and merges.txt (the tokenizer's save_pretrained)"
    vocab = _read_json(src / "vocab.json", fix)
    if not (src / "merges.txt").is_file():
        raise UserError("file not found", path=str(src / "merges.txt"), fix=fix)
    ids = [v for v in vocab.values() if isinstance(v, int)]
    if len(ids) != len(vocab) or (ids and not 0 <= min(ids) <= max(ids) < dims["vocab_size"]):
        raise UserError(f"vocab.json ids are not integers within the model's {dims['vocab_size']} embeddings",
                        path=str(src / "vocab.json"), fix="use the tokenizer saved with these weights")
    end = vocab.get("<|endoftext|>")
    if end is not None and end != dims["eos"]:
        raise UserError(f"vocab.json has <|endoftext|>={end}, config.json eos_token_id={dims['eos']}",
                        path=str(src / "vocab.json"))


def read_gpt2_folder(hf_dir: str) -> Gpt2Folder:
    """Read and check everything a conversion takes from ``hf_dir`` (no fairseq import)."""
    src = Path(hf_dir)
    if not src.is_dir():
        raise UserError("Hugging Face GPT-2 folder not found", path=str(src), fix="pass --gpt2 DIR (save_pretrained)")
    dims = gpt2_dims(_read_json(src / "config.json", "point --gpt2 at a save_pretrained folder"),
                     str(src / "config.json"))
    check_vocab(src, dims)
    return Gpt2Folder(src, dims, load_safetensors(src))


# ---------------------------------------------------------------------------------- weights
def _take(hf: Dict[str, torch.Tensor], key: str, shape: tuple, where: str) -> torch.Tensor:
    if key not in hf:
        raise UserError(f"not GPT-2 weights: no {key}", path=where)
    if tuple(hf[key].shape) != shape:
        raise UserError(f"weight {key} has shape {tuple(hf[key].shape)}, config.json says {shape}", path=where,
                        fix="check config.json against the weights")
    return hf[key].float()


def token_embeddings(hf: Dict[str, torch.Tensor], dims: dict, where: str) -> torch.Tensor:
    """``wte`` in fairseq's id order (:func:`gpt2_to_fairseq`), the four specials holding ``<|endoftext|>``'s row."""
    wte = _take(hf, "wte.weight", (dims["vocab_size"], dims["embed_dim"]), where)
    head = hf.get("lm_head.weight")
    if head is not None and not torch.equal(head.float(), wte):
        raise UserError("lm_head.weight differs from wte.weight", path=where,
                        fix="fairseq's converted model ties its input and output embeddings")
    eos = dims["eos"]
    return torch.cat([wte[eos].expand(4, -1), wte[:eos], wte[eos + 1:]]).contiguous()


def layer_state(hf: Dict[str, torch.Tensor], i: int, dims: dict, where: str) -> Dict[str, torch.Tensor]:
    """Block ``h.i`` as fairseq's ``decoder.layers.i`` (Conv1D ``[in, out]`` transposed; ``c_attn`` split)."""
    d, f, src, dst = dims["embed_dim"], dims["ffn_dim"], f"h.{i}.", f"decoder.layers.{i}."
    out: Dict[str, torch.Tensor] = {}
    qkv_w = _take(hf, src + "attn.c_attn.weight", (d, 3 * d), where).t()
    qkv_b = _take(hf, src + "attn.c_attn.bias", (3 * d,), where)
    for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
        out[f"{dst}self_attn.{name}.weight"] = qkv_w[j * d:(j + 1) * d]
        out[f"{dst}self_attn.{name}.bias"] = qkv_b[j * d:(j + 1) * d]
    linears = (("attn.c_proj", "self_attn.out_proj", d, d), ("mlp.c_fc", "fc1", d, f), ("mlp.c_proj", "fc2", f, d))
    for hf_name, fs_name, n_in, n_out in linears:
        out[f"{dst}{fs_name}.weight"] = _take(hf, f"{src}{hf_name}.weight", (n_in, n_out), where).t()
        out[f"{dst}{fs_name}.bias"] = _take(hf, f"{src}{hf_name}.bias", (n_out,), where)
    for hf_name, fs_name in (("ln_1", "self_attn_layer_norm"), ("ln_2", "final_layer_norm")):
        for p in ("weight", "bias"):
            out[f"{dst}{fs_name}.{p}"] = _take(hf, f"{src}{hf_name}.{p}", (d,), where)
    return out


def fairseq_state(hf: Dict[str, torch.Tensor], dims: dict, where: str) -> Dict[str, torch.Tensor]:
    """GPT-2 weights (keyed as ``GPT2Model`` has them) -> fairseq ``TransformerLanguageModel`` weights
    (without the ``version`` buffers); positions keep fairseq's two leading rows, zero (never used)."""
    d = dims["embed_dim"]
    wpe = _take(hf, "wpe.weight", (dims["max_positions"], d), where)
    layers = {int(k.split(".")[1]) for k in hf if k.startswith("h.")}
    if layers != set(range(dims["layers"])):
        raise UserError(f"weights hold {len(layers)} blocks, config.json n_layer={dims['layers']}", path=where)
    embed = token_embeddings(hf, dims, where)
    out = {"decoder.embed_tokens.weight": embed, "decoder.output_projection.weight": embed,
           "decoder.embed_positions.weight": torch.cat([wpe.new_zeros(2, d), wpe]),
           "decoder.layer_norm.weight": _take(hf, "ln_f.weight", (d,), where),
           "decoder.layer_norm.bias": _take(hf, "ln_f.bias", (d,), where)}
    for i in range(dims["layers"]):
        out.update(layer_state(hf, i, dims, where))
    return {k: v.contiguous().clone() for k, v in out.items()}


# ---------------------------------------------------------------------------------- the fairseq model and checkpoint
def checkpoint_config(dims: dict, data: str) -> dict:
    """The checkpoint's ``cfg``: fairseq's defaults with ``transformer_lm`` and ``language_modeling``."""
    from fairseq.dataclass.configs import FairseqConfig  # after import_fairseq_quietly
    from fairseq.models.transformer_lm import TransformerLanguageModelConfig
    from fairseq.tasks.language_modeling import LanguageModelingConfig

    n = dims["max_positions"]
    model = TransformerLanguageModelConfig(
        _name="transformer_lm", activation_fn=dims["activation_fn"], dropout=dims["dropout"],
        attention_dropout=dims["attention_dropout"], activation_dropout=0.0, decoder_embed_dim=dims["embed_dim"],
        decoder_output_dim=dims["embed_dim"], decoder_input_dim=dims["embed_dim"],
        decoder_ffn_embed_dim=dims["ffn_dim"], decoder_layers=dims["layers"],
        decoder_attention_heads=dims["heads"], decoder_normalize_before=True, decoder_learned_pos=True,
        share_decoder_input_output_embed=True, no_scale_embedding=True, no_token_positional_embeddings=False)
    cfg = OmegaConf.structured(FairseqConfig())
    cfg.task = OmegaConf.structured(LanguageModelingConfig(_name="language_modeling", data=data,
                                                           tokens_per_sample=n, max_target_positions=n))
    cfg.model = OmegaConf.structured(model)
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def build_model(folder: Path, cfg: dict, state: Dict[str, torch.Tensor], where: str):
    """fairseq's ``transformer_lm`` over ``folder/dict.txt`` holding ``state``, strictly loaded."""
    from fairseq.data import Dictionary  # after import_fairseq_quietly
    from fairseq.tasks.language_modeling import LanguageModelingTask

    dictionary = Dictionary.load(str(folder / "dict.txt"))
    task = LanguageModelingTask(OmegaConf.create(cfg["task"]), dictionary, dictionary)
    model = task.build_model(OmegaConf.create(cfg["model"]))
    mine = model.state_dict()
    full = {k: v for k, v in mine.items() if k.endswith(".version")}
    full.update(state)
    if set(full) != set(mine):
        raise UserError(f"converted weights do not match fairseq's transformer_lm: missing "
                        f"{sorted(set(mine) - set(full))[:3]}, unexpected {sorted(set(full) - set(mine))[:3]}",
                        path=where)
    model.load_state_dict(full, strict=True)
    return model


def save_checkpoint(path: Path, model: torch.nn.Module, cfg: dict) -> None:
    """A fairseq checkpoint of ``model`` (no optimizer state), atomically."""
    write_fairseq_checkpoint(path, model, cfg, "CrossEntropyCriterion")


# ---------------------------------------------------------------------------------- the conversion
def write_vocabulary(folder: Path, source: Gpt2Folder) -> None:
    """``dict.txt`` (the GPT-2 ids but <|endoftext|>, in order), ``encoder.json`` and ``vocab.bpe`` (copies)."""
    eos = source.dims["eos"]
    atomic_write_text(folder / "dict.txt", "".join(f"{g} 1\n" for g in range(source.dims["vocab_size"]) if g != eos))
    shutil.copyfile(source.path / "vocab.json", folder / "encoder.json")
    shutil.copyfile(source.path / "merges.txt", folder / "vocab.bpe")


def conversion_record(source: Gpt2Folder) -> dict:
    dims = source.dims
    return {"format": FORMAT, "source": str(source.path.resolve()), "model_type": "gpt2",
            "architecture": "transformer_lm", "task": "language_modeling", "dims": dims,
            "ids": {"gpt2_eos": dims["eos"], "fairseq_eos": EOS, "below_eos": "gpt2 id + 4",
                    "above_eos": "gpt2 id + 3", "not_gpt2": list(NOT_GPT2_IDS)},
            "files": {"checkpoint": "checkpoint.pt", "dict": "dict.txt", "gpt2_encoder_json": "encoder.json",
                      "gpt2_vocab_bpe": "vocab.bpe"}}


def check_output_dir(out_dir: str, overwrite: bool) -> Path:
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise UserError("output directory exists and is not empty", path=str(out),
                        fix="choose another --out, or add --overwrite")
    return out


def convert_hf_gpt2(hf_dir: str, out_dir: str, overwrite: bool = False,
                    log: Callable[[str], None] = print) -> dict:
    """Convert (see the module docstring); returns the ``conversion.json`` record."""
    from rag_plugin.util.quiet_import import import_fairseq_quietly

    out = check_output_dir(out_dir, overwrite)
    source = read_gpt2_folder(hf_dir)
    where = str(source.path)
    state = fairseq_state(source.weights, source.dims, where)
    with atomic_directory(out) as folder:
        write_vocabulary(folder, source)
        import_fairseq_quietly()
        cfg = checkpoint_config(source.dims, str(out.resolve()))
        model = build_model(folder, cfg, state, where)
        save_checkpoint(folder / "checkpoint.pt", model, cfg)
        record = conversion_record(source)
        atomic_write_json(folder / "conversion.json", record)
    dims = source.dims
    log(f"wrote {out}: transformer_lm, {dims['layers']} layers d={dims['embed_dim']}, GPT-2 vocabulary "
        f"{dims['vocab_size']} (fairseq {dims['vocab_size'] + 3}), {dims['max_positions']} positions")
    return record
