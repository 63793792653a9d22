"""The task's options of hybrid retrieval (``--retriever hybrid``: ``--fusion`` and its settings) and their checks:
one-line errors naming the option. (``--retriever-loss`` and its settings are the criterion's:
:class:`rag_plugin.criterions.retriever_loss.RetrieverLossConfig`; the task checks the combination in
:mod:`rag_plugin.tasks.pairing`.)"""
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from rag_plugin.reranking.options import rerank_candidates
from rag_plugin.retrieval.hybrid import HybridRetriever
from rag_plugin.util.errors import UserError


@dataclass
class HybridConfig(FairseqDataclass):
    fusion: ChoiceEnum(["rrf", "weighted"]) = field(default="rrf", metadata={
        "help": "--retriever hybrid: reciprocal rank fusion (rrf) or a weighted sum of min-max normalised scores"})
    rrf_k: float = field(default=60.0, metadata={"help": "--fusion rrf: the constant k of 1 / (k + rank)"})
    fusion_weight: float = field(default=0.5, metadata={
        "help": "--fusion weighted: the dense side's weight in [0, 1] (BM25's: 1 - it)"})
    fusion_scale: float = field(default=10.0, metadata={
        "help": "--retriever hybrid: p(z|x) = softmax(this x fused score in [0, 1])"})
    hybrid_candidates: int = field(default=0, metadata={
        "help": "--retriever hybrid: candidates from each of the dense and BM25 lists; 0 = max(20, 2 x --n-docs, "
                "--rerank-candidates)"})


def hybrid_candidates(cfg) -> int:
    """L, the candidates per side of hybrid retrieval, the automatic value resolved."""
    n = int(getattr(cfg, "hybrid_candidates", 0) or 0)
    return n if n > 0 else max(20, 2 * int(cfg.n_docs or 0), rerank_candidates(cfg))


def retriever_name(cfg) -> str:
    """How a run retrieves, as a checkpoint records it: ``dense``, ``bm25`` or ``hybrid`` with its fusion."""
    name = str(getattr(cfg, "retriever", "dense"))
    if name != "hybrid":
        return name
    fusion = str(getattr(cfg, "fusion", "rrf"))
    setting = f"--rrf-k {getattr(cfg, 'rrf_k', 60.0)}" if fusion == "rrf" else \
        f"--fusion-weight {getattr(cfg, 'fusion_weight', 0.5)}"
    return f"hybrid (--fusion {fusion} {setting})"


def hybrid_retriever(cfg, dense, bm25):
    """The task's ``--retriever hybrid``: its dense and BM25 retrievers fused as the options say."""
    return HybridRetriever(dense, bm25, fusion=str(cfg.fusion), rrf_k=cfg.rrf_k, weight=cfg.fusion_weight,
                           scale=cfg.fusion_scale, candidates=hybrid_candidates(cfg))


def check_options(cfg, n_passages: int) -> None:
    """The options alone (the task's setup): one-line errors naming the option."""
    # a config saved before these options existed lacks them: their defaults
    retriever = str(getattr(cfg, "retriever", "dense"))
    weight, rrf_k, scale = (getattr(cfg, "fusion_weight", 0.5), getattr(cfg, "rrf_k", 60.0),
                            getattr(cfg, "fusion_scale", 10.0))
    if not 0.0 <= float(weight) <= 1.0:
        raise UserError(f"--fusion-weight {weight} is outside [0, 1]",
                        fix="give the dense side's weight in [0, 1] (BM25's is 1 minus it)")
    if float(rrf_k) < 0:
        raise UserError(f"--rrf-k {rrf_k} is negative", fix="use k >= 0 (60 is the usual value)")
    if not float(scale) > 0:
        raise UserError(f"--fusion-scale {scale} must be positive", fix="e.g. --fusion-scale 10")
    if retriever == "hybrid" and cfg.n_docs > 0:
        wanted = hybrid_candidates(cfg)
        least = max(int(cfg.n_docs), rerank_candidates(cfg))
        if wanted < least:
            what = f"--n-docs {cfg.n_docs}" if least == int(cfg.n_docs) else f"--rerank-candidates {least}"
            raise UserError(f"--hybrid-candidates {wanted} is fewer than {what}",
                            fix=f"take at least {least} candidates from each side (0: automatic)")
        if wanted > n_passages:
            cfg.hybrid_candidates = n_passages  # a small knowledge source: every passage is a candidate
