"""Which generator decodes a checkpoint (the task's ``build_generator``): FiD -> fairseq's beam search over the
fused encodings (:mod:`rag_plugin.generation.fid`); ``--score-reference`` -> :class:`RagScorer`; RAG-Token ->
its beam search; RAG-Sequence -> per-document beams with Thorough or Fast decoding. Options a generator cannot
honour are one-line errors here, before anything is decoded."""
import logging

from rag_plugin.generation.fid import build_fid_generator
from rag_plugin.generation.options import refuse_unsupported
from rag_plugin.generation.rag_lm import LMRagSequenceGenerator, LMRagTokenGenerator
from rag_plugin.generation.rag_sequence import RagSequenceGenerator
from rag_plugin.generation.rag_token import RagTokenGenerator
from rag_plugin.generation.scorer import RagScorer
from rag_plugin.util.errors import UserError

logger = logging.getLogger(__name__)


def build_generator(task, models, args, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None):
    if len(models) != 1:
        raise UserError("RAG decoding takes one checkpoint, not an ensemble", fix="pass a single --path")
    model = models[0]
    refuse_unsupported(args)
    if getattr(model, "variant", None) == "fid":  # Fusion-in-Decoder: fairseq's beam search (generation/fid.py)
        return build_fid_generator(task, model, args, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)
    score_reference = getattr(args, "score_reference", False)
    _refuse_doc_posterior(task.cfg, model, score_reference)
    if score_reference:
        if prefix_allowed_tokens_fn is not None:
            raise UserError("prefix_allowed_tokens_fn constrains a search; --score-reference does not search",
                            fix="leave prefix_allowed_tokens_fn out when scoring references")
        return RagScorer(model)
    decoder_only = getattr(model, "decoder_only", False)  # rag_lm_*: the same searches over the LM's adapters
    if model.variant == "token":
        if task.cfg.rag_decoding == "fast":
            logger.warning("--rag-decoding fast applies to RAG-Sequence; this rag_token checkpoint decodes with "
                           "RAG-Token's beam search")
        cls = LMRagTokenGenerator if decoder_only else RagTokenGenerator
        return cls(task, model, args, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)
    cls = LMRagSequenceGenerator if decoder_only else RagSequenceGenerator
    return cls(task, model, args, task.cfg.rag_decoding, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)


def _refuse_doc_posterior(cfg, model, score_reference: bool) -> None:
    """--doc-posterior-out is RAG-Token's per-token document posterior of generated answers."""
    if not cfg.doc_posterior_out or not (score_reference or model.variant != "token"):
        return
    if score_reference:
        what, fix = "--score-reference", "leave --doc-posterior-out out when scoring references"
    else:
        what = "a RAG-Sequence checkpoint (rag_seq)"
        fix = "leave --doc-posterior-out out, or use a rag_token checkpoint"
    raise UserError(f"--doc-posterior-out writes RAG-Token's per-token document posterior of generated "
                    f"answers; with {what} there is none to write", fix=fix)
