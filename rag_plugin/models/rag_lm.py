"""``rag_lm_token`` and ``rag_lm_seq``: RAG with a decoder-only reader (REPLUG-style), over fairseq's
``transformer_lm``.

Per batch of B questions and K passages::

    q = BERT_q(question)                       [B, D]   as rag_token / rag_seq (retrieval, rerankers, losses)
    rows = MIPS top-K of q over the index       [B, K]
    context = </s> title </s> passage </s> question      one per (question, passage) pair (core/lm_layout.py)
    logits = LM(context + prev_output_tokens)   [B*K, T, V]  read at the answer's positions

The logits have the shape and meaning of the encoder-decoder reader's, so the criterion (``marginal_nll``, the
retriever losses) and :mod:`rag_plugin.core.marginalization` are shared unchanged: RAG-Token mixes the K passages'
next-token distributions by p(z|x) at every step (REPLUG's ensemble), RAG-Sequence marginalises the K sequence
likelihoods. Decoding: rag_plugin/generation/rag_lm.py (the context of each passage computed once). With
``--n-docs 0`` the model is the closed-book LM (``</s> question``). ``--freeze-generator`` keeps the LM fixed (REPLUG's
frozen black box; with ``--retriever-loss pdist`` the retriever learns from the LM's likelihoods: LSR).
"""
import argparse
import json
import logging
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import torch
from fairseq.models import register_model, register_model_architecture

from rag_plugin.core.lm_layout import lm_contexts
from rag_plugin.models import doc_encoder as doc_side
from rag_plugin.models.generator import count_parameters
from rag_plugin.models.gpt2_ids import NOT_GPT2_IDS, is_converted_gpt2
from rag_plugin.models.lm_generator import build_lm, lm_namespace, load_lm_weights, read_lm_checkpoint
from rag_plugin.models.lm_reader import LMReader
from rag_plugin.models.rag import RagModel
from rag_plugin.models.rag_config import RagConfig, as_config
from rag_plugin.reranking.options import reranker_name
from rag_plugin.util.errors import UserError

logger = logging.getLogger(__name__)


@dataclass
class RagLMConfig(RagConfig):
    """The RAG options (the generator's are the LM's: ``--generator-size tiny|base``, ``--generator-checkpoint`` a
    fairseq transformer_lm checkpoint, ``--max-source-positions`` the context, ``--max-target-positions`` the
    answer)."""

    lm_architecture: str = field(default="", metadata={
        "help": "written by the model, not to set: the LM's transformer_lm options and masked ids (JSON), from which "
                "a checkpoint is rebuilt without its --generator-checkpoint"})


class Contexts(NamedTuple):
    """What the decoder-only reader "encodes": the B*K pairs' contexts, nothing computed yet."""

    tokens: torch.Tensor   # Long[B*K, C], right-padded
    lengths: torch.Tensor  # Long[B*K]


class RagLMModel(RagModel):
    """RAG over a decoder-only LM (the module docstring). ``self.generator`` is fairseq's
    ``TransformerLanguageModel`` (its weights under ``generator.decoder.*``, as a transformer_lm checkpoint's under
    ``decoder.*``); :attr:`reader` runs it (rag_plugin/models/lm_reader.py)."""

    variant = "token"
    config_class = RagLMConfig
    decoder_only = True

    def __init__(self, cfg, generator, query_encoder, dictionary, context, doc_encoder=None, reranker=None,
                 masked_ids=()):
        super().__init__(cfg, generator, query_encoder, dictionary, context, doc_encoder, reranker)
        self.reader = LMReader(generator, dictionary.pad(), masked_ids)
        self.context_budget = self._context_budget()

    def _context_budget(self) -> int:
        """Context tokens a row may hold: --max-source-positions, within the LM's positions less the answer's."""
        lm_positions = self.reader.max_positions()
        answer = int(self.cfg.max_target_positions)
        if answer >= lm_positions:
            raise UserError(f"--max-target-positions {answer} leaves no room for a context in the LM's "
                            f"{lm_positions} positions", fix=f"use --max-target-positions below {lm_positions}")
        return min(int(self.cfg.max_source_positions), lm_positions - answer)

    # ------------------------------------------------------------------ construction
    @classmethod
    def build_model(cls, cfg, task):
        given = cfg
        cfg = as_config(cfg, cls.config_class)
        doc_side.check_options(cfg, task.cfg, cls.variant, getattr(task, "knowledge", None))
        cls.check_task(cfg, task)
        dictionary = task.dictionary
        if getattr(task, "serving", False) and cfg.lm_architecture:  # a checkpoint: the LM it recorded, no file read
            generator, masked = cls.rebuild_generator(cfg, dictionary)
        else:
            generator, args = cls.build_generator(cfg, dictionary)
            masked = NOT_GPT2_IDS if is_converted_gpt2(cfg.generator_checkpoint) else ()
            if masked:
                logger.info("%s is a converted GPT-2: <s>, <pad>, <unk> are no GPT-2 token, masked out of the "
                            "reader's distribution", cfg.generator_checkpoint)
            _record(given, {"transformer_lm": _plain(vars(args)), "masked_ids": list(masked)})
        reranker, query_encoder = cls.retrieval_parts(cfg, task)
        model = cls(cfg, generator, query_encoder, dictionary, task.retrieval_context(cfg),
                    doc_side.build_doc_encoder(cfg, task, query_encoder), reranker, masked)
        logger.info("%s: trainable parameters: LM %s, query encoder %s, total %s; context %d tokens", cls.__name__,
                    f"{count_parameters(generator):,}",
                    f"{count_parameters(query_encoder):,}" if query_encoder is not None else "none",
                    f"{count_parameters(model):,}", model.context_budget)
        return model

    @staticmethod
    def check_task(cfg, task) -> None:
        """What the decoder-only reader cannot read: one-line errors before anything is built."""
        if str(cfg.input_format) != "plugin":
            raise UserError("--input-format hf is the encoder-decoder reader's (transformers' RAG); the decoder-only "
                            "reader reads its own rows (passage, question, answer)", fix="leave --input-format out")
        if str(getattr(task.cfg, "target_format", "plugin")) != "plugin":
            raise UserError("--target-format hf is transformers' encoder-decoder targets; the decoder-only reader "
                            "reads the answer after its context", fix="leave --target-format out")
        if task.cfg.n_docs > 0 and reranker_name(task.cfg) == "upr":
            raise UserError("--reranker upr scores passages with an encoder-decoder reader's log p(question | "
                            "passage); this reader is decoder-only", fix="use --reranker maxsim or cross")

    @staticmethod
    def rebuild_generator(cfg, dictionary):
        """(the LM, its masked ids) as a checkpoint recorded them (``lm_architecture``), the run's dropout."""
        record = json.loads(cfg.lm_architecture)
        args = argparse.Namespace(**record["transformer_lm"])
        args.dropout, args.attention_dropout = float(cfg.dropout), float(cfg.attention_dropout)
        args.activation_dropout = float(cfg.activation_dropout)
        return build_lm(args, dictionary), tuple(record.get("masked_ids") or ())

    @staticmethod
    def build_generator(cfg, dictionary):
        """(the LM, its transformer_lm options): from --generator-checkpoint's own cfg (its network, the run's
        dropout), or the size preset."""
        positions = int(cfg.max_source_positions) + int(cfg.max_target_positions)
        dropouts = (float(cfg.dropout), float(cfg.attention_dropout), float(cfg.activation_dropout))
        if not cfg.generator_checkpoint:
            overrides = None
            if any(int(v) for v in (cfg.generator_embed_dim, cfg.generator_layers, cfg.generator_heads,
                                    cfg.generator_ffn_dim)):
                from rag_plugin.models.lm_generator import _GPT2_STYLE, LM_SIZES
                overrides = {**LM_SIZES.get(str(cfg.generator_size), {}), **_GPT2_STYLE}
                for key, value in (("decoder_embed_dim", cfg.generator_embed_dim),
                                   ("decoder_layers", cfg.generator_layers),
                                   ("decoder_attention_heads", cfg.generator_heads),
                                   ("decoder_ffn_embed_dim", cfg.generator_ffn_dim)):
                    if int(value):
                        overrides[key] = int(value)
            args = lm_namespace(str(cfg.generator_size), positions, *dropouts, overrides)
            return build_lm(args, dictionary), args
        model_cfg, weights = read_lm_checkpoint(cfg.generator_checkpoint, dictionary)
        args = lm_namespace(str(cfg.generator_size), positions, *dropouts, model_cfg)
        lm = build_lm(args, dictionary)
        load_lm_weights(lm, weights, str(cfg.generator_checkpoint))
        return lm, args

    # ------------------------------------------------------------------ inputs
    def generator_inputs(self, src_tokens: torch.Tensor, rows: Optional[torch.Tensor]) -> Contexts:
        """The B*K pairs' contexts (closed book: B), on the questions' device."""
        questions = [q[q.ne(self.pad)].numpy() for q in src_tokens.cpu()]
        docs = None
        if rows is not None:
            store = self.retriever.store
            docs = [[(store.title_tokens(int(r)), store.text_tokens(int(r))) for r in row] for row in rows.tolist()]
        tokens, lengths = lm_contexts(questions, docs, self.eos, self.pad, self.context_budget)
        return Contexts(tokens.to(src_tokens.device), lengths.to(src_tokens.device))

    def encode(self, src_tokens, query_tokens=None, query_mask=None, fixed_doc_rows=None,
               fixed_doc_scores=None, n_docs: Optional[int] = None):
        """Retrieve and lay out the pairs' contexts: (Contexts, doc_scores [B, K], rows [B, K] or None)."""
        k = self.n_docs if n_docs is None else n_docs
        if k > 0:
            doc_scores, rows = self.retrieve(query_tokens, query_mask, k, fixed_doc_rows, fixed_doc_scores, src_tokens)
        else:
            doc_scores, rows = src_tokens.new_zeros((src_tokens.size(0), 1), dtype=torch.float), None
        return self.generator_inputs(src_tokens, rows), doc_scores, rows

    # ------------------------------------------------------------------ forward
    def forward(self, src_tokens, prev_output_tokens, query_tokens=None, query_mask=None,
                fixed_doc_rows=None, fixed_doc_scores=None, n_docs: Optional[int] = None, src_lengths=None):
        """Teacher-forced logits [B*K, T, V] of every pair, with ``extra["doc_scores"]`` and ``extra["doc_rows"]``
        (as :meth:`RagModel.forward`)."""
        contexts, doc_scores, rows = self.encode(src_tokens, query_tokens, query_mask, fixed_doc_rows,
                                                 fixed_doc_scores, n_docs)
        k = doc_scores.size(1)
        prev = prev_output_tokens.repeat_interleave(k, dim=0) if k > 1 else prev_output_tokens
        logits = self.reader.teacher_forced(contexts.tokens, contexts.lengths, prev)
        return logits, {"doc_scores": doc_scores, "doc_rows": rows, "attn": [None]}

    def max_positions(self):
        return (self.context_budget, int(self.cfg.max_target_positions))

    def max_decoder_positions(self):
        return int(self.cfg.max_target_positions)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """A checkpoint of this model family only (an encoder-decoder RAG's has ``generator.encoder.*``)."""
        if any(k.startswith("generator.encoder.") for k in state_dict):
            raise UserError("the checkpoint is an encoder-decoder RAG model, --arch builds a decoder-only one",
                            fix="load it with --arch rag_token_* / rag_seq_* (as it was trained)")
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)


def _plain(values: dict) -> dict:
    """JSON-ready options (fairseq's choice enums as their strings)."""
    return {k: (v if v is None or isinstance(v, (bool, int, float, str, list)) else str(v)) for k, v in values.items()}


def _record(cfg, record: dict) -> None:
    """Write the LM's record into the config fairseq saves in the model's checkpoints (its ``cfg.model``), where the
    caller handed one that takes it."""
    try:
        cfg.lm_architecture = json.dumps(record, sort_keys=True)
    except Exception:  # a frozen or read-only config: the checkpoint is rebuilt from --generator-checkpoint
        logger.debug("the model config takes no lm_architecture", exc_info=True)


@register_model("rag_lm_token", dataclass=RagLMConfig)
class RagLMTokenModel(RagLMModel):
    """RAG-Token over an LM: the passages' next-token distributions mixed by p(z|x) at every step (REPLUG)."""

    variant = "token"


@register_model("rag_lm_seq", dataclass=RagLMConfig)
class RagLMSequenceModel(RagLMModel):
    """RAG-Sequence over an LM: one passage generates the whole answer."""

    variant = "sequence"


def _preset(size: str, context: int, answer: int):
    def arch(cfg):
        cfg.generator_size = size
        if getattr(cfg, "max_source_positions", None) is None:
            cfg.max_source_positions = context
        if getattr(cfg, "max_target_positions", None) is None:
            cfg.max_target_positions = answer
    return arch


for _model in ("rag_lm_token", "rag_lm_seq"):
    for _size, _context, _answer in (("tiny", 128, 64), ("base", 896, 128)):
        register_model_architecture(_model, f"{_model}_{_size}")(_preset(_size, _context, _answer))
