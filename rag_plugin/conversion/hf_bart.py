"""Hugging Face BART weights as a fairseq BART generator.

The two implementations are the same network (post-LayerNorm transformer, ``layernorm_embedding``,
learned positions offset by 2, unscaled shared embeddings, exact GELU); the parameter names
differ only by HF's ``model.`` prefix, and HF keeps one ``shared`` embedding where fairseq
has three tied names. What fairseq's BART cannot represent (T5/mBART layouts, a non-zero
``final_logits_bias``, an untied output layer, scaled embeddings, other activations) is an
error naming the field.
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional

import torch

from rag_plugin.util.errors import UserError

#: Special token ids fairseq's Dictionary fixes (and BART's tokenizer uses).
SPECIAL_IDS = {"bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}


def generator_dims(cfg: Mapping, source: Optional[str] = None) -> Dict:
    """Sizes of the fairseq generator for a Hugging Face BART ``config.json`` dict; checks it
    describes a network fairseq's BART is."""
    model_type = cfg.get("model_type")
    if model_type != "bart":
        raise UserError(f"generator model_type {model_type!r} is not supported", path=source,
                        fix="only BART generators convert (the published RAG models use facebook/bart-large)")
    try:
        dims = dict(embed_dim=int(cfg["d_model"]), layers=int(cfg["encoder_layers"]),
                    heads=int(cfg["encoder_attention_heads"]), ffn_dim=int(cfg["encoder_ffn_dim"]),
                    vocab_size=int(cfg["vocab_size"]), max_positions=int(cfg["max_position_embeddings"]))
    except KeyError as err:
        raise UserError(f"generator config lacks {err.args[0]!r}", path=source) from None
    pairs = (("decoder_layers", "encoder_layers"), ("decoder_attention_heads", "encoder_attention_heads"),
             ("decoder_ffn_dim", "encoder_ffn_dim"))
    for dec, enc in pairs:
        if int(cfg.get(dec, cfg[enc])) != int(cfg[enc]):
            raise UserError(f"generator has {dec}={cfg.get(dec)} but {enc}={cfg[enc]}", path=source,
                            fix="the plugin's BART has the same sizes on both sides")
    checks = {"activation_function": ("gelu", cfg.get("activation_function", "gelu")),
              "scale_embedding": (False, bool(cfg.get("scale_embedding", False))),
              "normalize_before": (False, bool(cfg.get("normalize_before", False))),
              "add_final_layer_norm": (False, bool(cfg.get("add_final_layer_norm", False))),
              "normalize_embedding": (True, bool(cfg.get("normalize_embedding", True)))}
    for name, (want, got) in checks.items():
        if got != want:
            raise UserError(f"generator config has {name}={got!r}; fairseq's BART has {want!r}", path=source)
    for name, want in SPECIAL_IDS.items():
        got = cfg.get(name, want)
        if got is not None and int(got) != want:
            raise UserError(f"generator config has {name}={got}; the plugin's dictionary has {want}", path=source,
                            fix="BART's ids: <s>=0, <pad>=1, </s>=2, <unk>=3")
    dims.update(dropout=float(cfg.get("dropout", 0.1)), attention_dropout=float(cfg.get("attention_dropout", 0.0)),
                activation_dropout=float(cfg.get("activation_dropout", 0.0)))
    return dims


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))


def fairseq_state(hf: Mapping[str, torch.Tensor], layers: int, max_source_positions: int,
                  max_target_positions: int, source: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """``BartForConditionalGeneration`` weights (keys ``model.*``, ``lm_head.weight``,
    ``final_logits_bias``) -> fairseq ``BARTModel`` weights (without the ``version`` buffers).

    Position tables keep ``max_*_positions + 2`` rows (fairseq, like HF, starts positions at 2).
    """
    hf = {k: v for k, v in hf.items() if not k.endswith("position_ids")}
    shared = hf.get("model.shared.weight")
    if shared is None:
        shared = hf.get("model.encoder.embed_tokens.weight")
    if shared is None:
        raise UserError("not BART weights: no model.shared.weight", path=source)
    for name in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
        if name in hf and not _close(hf[name], shared):
            raise UserError(f"{name} differs from the shared embeddings", path=source,
                            fix="fairseq's BART ties input and output embeddings")
    bias = hf.get("final_logits_bias")
    if bias is not None and bool(bias.abs().max() > 0):
        raise UserError("final_logits_bias is not zero; fairseq's BART has no output bias", path=source)
    for side in ("encoder", "decoder"):
        if f"model.{side}.layer_norm.weight" in hf:
            raise UserError(f"generator has a final {side} layer norm (an mBART layout)", path=source,
                            fix="only BART generators convert")
    out: Dict[str, torch.Tensor] = {}
    for key, value in hf.items():
        if not key.startswith("model.") or key in ("model.shared.weight",):
            continue
        name = key[len("model."):]
        if name.endswith("embed_tokens.weight"):
            continue
        out[name] = value
    for side, positions in (("encoder", max_source_positions), ("decoder", max_target_positions)):
        key = f"{side}.embed_positions.weight"
        if key not in out:
            raise UserError(f"not BART weights: no model.{key}", path=source)
        rows = positions + 2
        if out[key].shape[0] < rows:
            raise UserError(f"model.{key} has {out[key].shape[0] - 2} positions, {positions} wanted", path=source,
                            fix="ask for fewer positions (--max-source-positions)")
        out[key] = out[key][:rows]
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        out[key] = shared
    found = {int(k.split(".")[2]) for k in out if k.startswith(("encoder.layers.", "decoder.layers."))}
    if found and max(found) + 1 != layers:
        raise UserError(f"weights hold {max(found) + 1} layers, the config says {layers}", path=source)
    return {k: v.float().contiguous() for k, v in out.items()}


def load_into(generator: torch.nn.Module, state: Mapping[str, torch.Tensor], source: Optional[str] = None) -> None:
    """Strictly load converted weights into a fairseq BART built with the same sizes."""
    mine = generator.state_dict()
    full = {k: v for k, v in mine.items() if k.endswith(".version")}
    full.update(state)
    missing = sorted(set(mine) - set(full))
    unexpected = sorted(set(full) - set(mine))
    if missing or unexpected:
        raise UserError(f"converted generator weights do not match the fairseq BART: missing {missing[:3]}, "
                        f"unexpected {unexpected[:3]}", path=source)
    bad = [k for k in mine if tuple(mine[k].shape) != tuple(full[k].shape)]
    if bad:
        raise UserError(f"generator weight {bad[0]} has shape {tuple(full[bad[0]].shape)}, the fairseq BART "
                        f"{tuple(mine[bad[0]].shape)}", path=source, fix="check config.json against the weights")
    torch.nn.Module.load_state_dict(generator, full, strict=True)
