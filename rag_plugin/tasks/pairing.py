"""What the task checks when it has built a model and its criterion: a combination that would train nothing, or
train the wrong thing, is a one-line error naming the options. The task is the one place that sees the retriever
(``--retriever``, ``--n-docs``), the model (its family, a frozen query encoder, cross-attention scores) and the
criterion (``--retriever-loss``) together."""
from dataclasses import dataclass
from typing import Optional

from fairseq.criterions.cross_entropy import CrossEntropyCriterion
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

from rag_plugin.core.net_output import ATTENTION_CAPABILITY
from rag_plugin.criterions.marginal_nll import MarginalNLLCriterion
from rag_plugin.criterions.retriever_loss import AddsRetrieverLoss
from rag_plugin.util.errors import UserError

#: the registered names of the cross-entropy criteria, for the messages
_REGISTERED = {"CrossEntropyCriterion": "cross_entropy",
               "LabelSmoothedCrossEntropyCriterion": "label_smoothed_cross_entropy",
               "ReaderCrossEntropyCriterion": "reader_cross_entropy"}


@dataclass(frozen=True)
class BuiltModel:
    """What the checks need of the model the task built (kept by the task; not the model itself)."""

    #: token, sequence (RAG) or fid
    variant: str
    #: the model has a query encoder that trains (not frozen, not BM25 or closed book)
    trains_query_encoder: bool
    #: the model's forward can return its cross-attention share of each passage (``--retriever-loss adist``)
    cross_attention: bool
    #: the model class's name, for the messages
    name: str
    #: the model's reranker (--reranker) has weights that learn from the retrieval scores: a retriever loss trains it
    trains_reranker: bool = False

    @classmethod
    def of(cls, model) -> "BuiltModel":
        frozen = model.query_encoder is None or bool(model.cfg.freeze_query_encoder)
        reranker = model.reranker
        return cls(variant=model.variant, trains_query_encoder=not frozen,
                   cross_attention=bool(getattr(type(model), ATTENTION_CAPABILITY, False)), name=type(model).__name__,
                   trains_reranker=reranker is not None and bool(reranker.trainable)
                   and all(p.requires_grad for p in reranker.parameters()))


def check_family(model: Optional[BuiltModel], criterion) -> None:
    """A criterion that does not train the model family: RAG's document marginal for FiD, plain cross-entropy for RAG
    (whose output holds one row per (question, document) pair)."""
    if model is None:
        return
    if model.variant == "fid" and isinstance(criterion, MarginalNLLCriterion):
        raise UserError("--criterion marginal_nll marginalises over documents; Fusion-in-Decoder (--arch fid_*) "
                        "reads them all at once and trains with plain cross-entropy",
                        fix="use --criterion reader_cross_entropy (or fairseq's cross_entropy or "
                            "label_smoothed_cross_entropy)")
    plain = isinstance(criterion, (CrossEntropyCriterion, LabelSmoothedCrossEntropyCriterion))
    if model.variant in ("token", "sequence") and plain:
        name = _REGISTERED.get(type(criterion).__name__, type(criterion).__name__)
        raise UserError(f"--criterion {name}: a RAG model (--arch rag_*) is trained with its document marginal",
                        fix="use --criterion marginal_nll (or --arch fid_* for cross-entropy)")


def check_retriever_loss(task_cfg, model: Optional[BuiltModel], criterion) -> None:
    """``--retriever-loss`` against the retriever, K and the model: one-line errors."""
    loss = str(getattr(criterion, "retriever_loss", "none")) if isinstance(criterion, AddsRetrieverLoss) else "none"
    if loss == "none":
        return
    retriever, k = str(task_cfg.retriever), int(task_cfg.n_docs)
    reranked = model is not None and model.trains_reranker
    if retriever == "bm25" and not reranked:
        raise UserError(f"--retriever-loss {loss} trains the query encoder; --retriever bm25 has nothing to train",
                        fix="use --retriever dense or hybrid, or leave --retriever-loss out")
    if retriever == "hybrid" and str(task_cfg.fusion) == "weighted" and float(task_cfg.fusion_weight) == 0.0 \
            and not reranked:
        raise UserError(f"--retriever-loss {loss} trains the query encoder through the dense side, and "
                        f"--fusion-weight 0 gives it no weight", fix="use a --fusion-weight above 0")
    if k < 2:
        raise UserError(f"--retriever-loss {loss} distributes the retriever's probability over documents; "
                        f"--n-docs {k} gives it {'none' if k == 0 else 'one'}",
                        fix="use --n-docs 2 or more, or leave --retriever-loss out")
    if model is None:
        return
    if model.variant == "fid" and loss != "adist":
        raise UserError(f"--retriever-loss {loss} needs the reader's likelihood of the answer under each document "
                        f"alone; Fusion-in-Decoder (--arch fid_*) reads them all at once",
                        fix="use --retriever-loss adist with FiD (its cross-attention over the passages)")
    if not model.trains_query_encoder and not reranked:
        raise UserError(f"--retriever-loss {loss} trains the query encoder, and this model's is frozen",
                        fix="leave --freeze-query-encoder out, or leave --retriever-loss out")
    if loss == "adist" and not model.cross_attention:
        raise UserError(f"--retriever-loss adist distils the reader's cross-attention over documents; "
                        f"{model.name} (--arch) computes none (RAG reads each document separately)",
                        fix="use --retriever-loss pdist, emdr2 or loop with RAG, or a FiD model with adist")
