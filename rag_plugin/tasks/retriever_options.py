"""The task's options for training the retriever (``--retriever-loss``) and for hybrid retrieval
(``--retriever hybrid``), and their checks: one-line errors naming the option.

They are task options, not the criterion's: they belong with ``--retriever`` and ``--n-docs``; the task is
the one place that sees the retriever, the model (frozen query encoder? cross-attention scores?) and the
criterion together, so a combination that would train nothing is refused there, and any criterion (RAG's
``marginal_nll``, a FiD criterion) reads the same options from ``task.cfg``. A criterion that does not add
the retriever loss is refused (:func:`check_criterion`), never silently ignored.
"""
from dataclasses import dataclass, field

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from rag_plugin.util.errors import UserError

#: a model exposing the reader's cross-attention score of each document sets this class attribute True and
#: returns the scores [B, K] as ``net_output[1][ATTENTION_KEY]`` (``--retriever-loss adist`` needs them)
ATTENTION_CAPABILITY = "cross_attention_doc_scores"
ATTENTION_KEY = "doc_attention_scores"
#: a criterion that adds ``--retriever-loss`` to its loss sets this class attribute True
CRITERION_CAPABILITY = "adds_retriever_loss"


@dataclass
class RetrieverTrainingConfig(FairseqDataclass):
    retriever_loss: ChoiceEnum(["none", "pdist", "adist", "emdr2", "loop"]) = field(
        default="none", metadata={"help": "a loss training the retriever towards the reader (Atlas, Izacard et al. "
                                          "2022), added to the criterion's: pdist (KL to the posterior over documents "
                                          "given the answer, uniform prior), adist (KL to the reader's cross-attention "
                                          "over documents: models that expose it, e.g. FiD), emdr2 (-log sum_z "
                                          "p(z|x) p(y|x,z), reader fixed), loop (KL to the leave-one-out perplexity "
                                          "distribution); see rag_plugin/core/retriever_losses.py"})
    retriever_loss_weight: float = field(
        default=1.0, metadata={"help": "weight of --retriever-loss: the loss trained is the criterion's (per target "
                                       "token, or per example with --sentence-avg) + this x the retriever loss per "
                                       "question"})
    retriever_loss_start: int = field(
        default=0, metadata={"help": "the retriever loss joins the loss trained from this update on (before it is "
                                     "only logged): a barely trained reader's target can pull the retriever away "
                                     "from the gold passages, so let the reader learn first"})
    retriever_temperature: float = field(
        default=1.0, metadata={"help": "--retriever-loss compares its target with softmax(doc scores / this): the "
                                       "scores learned are the target's logits x this"})
    retriever_target_temperature: float = field(
        default=1.0, metadata={"help": "the distillation target (pdist, adist, loop) is softmax(target logits / this) "
                                       "(Atlas's temperature_gold; its recipes use 0.01 with --retriever-temperature "
                                       "0.01): below 1 it sharpens the target (FiD's attention shares in [0, 1] are "
                                       "an almost uniform target at 1)"})
    fusion: ChoiceEnum(["rrf", "weighted"]) = field(
        default="rrf", metadata={"help": "--retriever hybrid: reciprocal rank fusion (sum over the dense and BM25 "
                                         "lists of 1 / (--rrf-k + rank)) or weighted (--fusion-weight x dense + (1 - "
                                         "it) x BM25, each min-max normalised per question)"})
    rrf_k: float = field(default=60.0, metadata={"help": "--fusion rrf: the constant k of 1 / (k + rank)"})
    fusion_weight: float = field(
        default=0.5, metadata={"help": "--fusion weighted: the dense side's weight, in [0, 1] (BM25's: 1 - it)"})
    fusion_scale: float = field(
        default=10.0, metadata={"help": "--retriever hybrid: p(z|x) = softmax(this x fused score), fused scores in "
                                        "[0, 1] (rrf: divided by its largest possible value, 2 / (k + 1))"})
    hybrid_candidates: int = field(
        default=0, metadata={"help": "--retriever hybrid: candidates taken from each of the dense and BM25 lists "
                                     "before fusing (at least --n-docs); 0 = max(20, 2 x --n-docs)"})


def hybrid_candidates(cfg) -> int:
    """L, the candidates per side of hybrid retrieval, the automatic value resolved."""
    n = int(getattr(cfg, "hybrid_candidates", 0) or 0)
    return n if n > 0 else max(20, 2 * int(cfg.n_docs or 0))


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
    from rag_plugin.retrieval.hybrid import HybridRetriever

    return HybridRetriever(dense, bm25, fusion=str(cfg.fusion), rrf_k=cfg.rrf_k, weight=cfg.fusion_weight,
                           scale=cfg.fusion_scale, candidates=hybrid_candidates(cfg))


def check_options(cfg, n_passages: int) -> None:
    """The options alone (the task's setup): one-line errors naming the option."""
    # a config saved before these options existed lacks them: their defaults
    loss = str(getattr(cfg, "retriever_loss", "none"))
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
        if wanted < cfg.n_docs:
            raise UserError(f"--hybrid-candidates {wanted} is fewer than --n-docs {cfg.n_docs}",
                            fix=f"take at least {cfg.n_docs} candidates from each side (0: automatic)")
        if wanted > n_passages:
            cfg.hybrid_candidates = n_passages  # a small knowledge source: every passage is a candidate
    if loss == "none":
        return
    if not float(cfg.retriever_loss_weight) >= 0:
        raise UserError(f"--retriever-loss-weight {cfg.retriever_loss_weight} is negative", fix="use a weight >= 0")
    if int(getattr(cfg, "retriever_loss_start", 0)) < 0:
        raise UserError(f"--retriever-loss-start {cfg.retriever_loss_start} is negative",
                        fix="give the update the retriever loss starts at (0: from the first)")
    if not float(cfg.retriever_temperature) > 0:
        raise UserError(f"--retriever-temperature {cfg.retriever_temperature} must be positive", fix="e.g. 1")
    target_t = getattr(cfg, "retriever_target_temperature", 1.0)
    if not float(target_t) > 0:
        raise UserError(f"--retriever-target-temperature {target_t} must be positive", fix="e.g. 1 or 0.1")
    if retriever == "bm25":
        raise UserError(f"--retriever-loss {loss} trains the query encoder; --retriever bm25 has nothing to train",
                        fix="use --retriever dense or hybrid, or leave --retriever-loss out")
    if retriever == "hybrid" and str(getattr(cfg, "fusion", "rrf")) == "weighted" and float(weight) == 0.0:
        raise UserError(f"--retriever-loss {loss} trains the query encoder through the dense side, and "
                        f"--fusion-weight 0 gives it no weight", fix="use a --fusion-weight above 0")
    if cfg.n_docs < 2:
        raise UserError(f"--retriever-loss {loss} distributes the retriever's probability over documents; "
                        f"--n-docs {cfg.n_docs} gives it {'none' if cfg.n_docs == 0 else 'one'}",
                        fix="use --n-docs 2 or more, or leave --retriever-loss out")


def check_model(cfg, model) -> None:
    """The options against the model built (the task's build_model)."""
    loss = str(getattr(cfg, "retriever_loss", "none"))
    if loss == "none":
        return
    if getattr(model, "variant", None) == "fid" and loss != "adist":
        raise UserError(f"--retriever-loss {loss} needs the reader's likelihood of the answer under each document "
                        f"alone; Fusion-in-Decoder (--arch fid_*) reads them all at once",
                        fix="use --retriever-loss adist with FiD (its cross-attention over the passages)")
    frozen = getattr(model, "query_encoder", None) is None or bool(getattr(model.cfg, "freeze_query_encoder", False))
    if frozen:
        raise UserError(f"--retriever-loss {loss} trains the query encoder, and this model's is frozen",
                        fix="leave --freeze-query-encoder out, or leave --retriever-loss out")
    if loss == "adist" and not getattr(model, ATTENTION_CAPABILITY, False):
        raise UserError(f"--retriever-loss adist distils the reader's cross-attention over documents; "
                        f"{type(model).__name__} (--arch) computes none (RAG reads each document separately)",
                        fix="use --retriever-loss pdist, emdr2 or loop with RAG, or a FiD model with adist")


def check_criterion(cfg, criterion) -> None:
    """The options against the criterion built (the task's build_criterion)."""
    loss = str(getattr(cfg, "retriever_loss", "none"))
    if loss != "none" and not getattr(criterion, CRITERION_CAPABILITY, False):
        raise UserError(f"--retriever-loss {loss}: the criterion {type(criterion).__name__} does not add a "
                        f"retriever loss",
                        fix="use --criterion marginal_nll (RAG) or reader_cross_entropy (FiD), or leave "
                            "--retriever-loss out")
