"""The task's options of the reranking stage (``--reranker``, ``--rerank-candidates``, ``--cross-encoder``) and their
checks: one-line errors naming the option. Reranking is part of retrieval, as ``--retriever`` is: one option family
for every model (RAG-Token, RAG-Sequence, FiD) and every first stage (dense, BM25, hybrid). A checkpoint records them
(its task options): fairseq-generate/-validate/-interactive with ``--path`` rerank as the model was trained unless
told otherwise."""
from dataclasses import dataclass, field
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from rag_plugin.reranking.base import RERANKERS
from rag_plugin.util.errors import UserError

#: L when --reranker is given without --rerank-candidates
DEFAULT_CANDIDATES = 20
#: rerankers that read the knowledge source's encoder (its tokenizer, its towers): the task loads it for them
READ_KNOWLEDGE_ENCODER = ("maxsim", "cross")


@dataclass
class RerankConfig(FairseqDataclass):
    reranker: Optional[ChoiceEnum(["none", *RERANKERS])] = field(default=None, metadata={
        "help": "rerank the first stage's candidates: maxsim (late interaction), upr (the reader's log p(question | "
                "passage)), cross (a cross-encoder) or none; default the checkpoint's with --path, else none"})
    rerank_candidates: Optional[int] = field(default=None, metadata={
        "help": "L, the first stage's candidates per question the reranker scores, of which it keeps --n-docs; "
                f"default the checkpoint's with --path, else {DEFAULT_CANDIDATES} with --reranker"})
    cross_encoder: str = field(default="knowledge", metadata={
        "help": "--reranker cross: the BERT-family encoder it starts from: knowledge (the knowledge source's) or an "
                "encoder spec (hf-dpr:DIR, dpr:CKPT, minilm[:DIR])"})
    cross_encoder_layers: int = field(default=0, metadata={
        "help": "--reranker cross: keep only the bottom N layers of its BERT (a smaller, faster cross-encoder, as "
                "MiniLM-L2 cross-encoders are); 0 = all"})
    maxsim_cache: bool = field(default=False, metadata={
        "help": "--reranker maxsim: compute every passage's token states once into KS/.lower_states (tokens x hidden "
                "x 4 bytes a passage, checked against free disk) instead of for each step's candidates"})


def reranker_name(cfg) -> str:
    """``--reranker`` resolved: none when not given (a config saved before the option existed lacks it)."""
    return str(getattr(cfg, "reranker", None) or "none")


def rerank_candidates(cfg) -> int:
    """L, the candidates the reranker scores per question (0: no reranking stage)."""
    if reranker_name(cfg) == "none":
        return 0
    given = getattr(cfg, "rerank_candidates", None)
    return int(given) if given is not None else max(DEFAULT_CANDIDATES, int(cfg.n_docs or 0))


def resolve_from_checkpoint(cfg, saved: Optional[dict]) -> None:
    """The reranking options a run (fairseq-generate/-validate/-interactive with ``--path``) did not give: the
    checkpoint's task options (``saved``). ``--reranker`` not given: the checkpoint's, else none. The same reranker
    as the checkpoint's: its L, and the cross-encoder's start and layers (they shape its weights), unless given.
    Another reranker than the checkpoint's trained one is refused; any, over a checkpoint trained without one
    (zero-shot: the reranker's own start), and none (its weights unused) are not."""
    if getattr(cfg, "reranker", "absent") == "absent":
        return  # a config saved before the options existed (the hub's task options from an old checkpoint): none
    saved = saved or {}
    trained = saved.get("reranker") or "none"
    if cfg.reranker is None:
        cfg.reranker = trained
    if trained != "none" and cfg.reranker not in ("none", trained):
        raise UserError(f"--reranker {cfg.reranker}: the checkpoint was trained with --reranker {trained} (its weights "
                        "are that reranker's)", fix=f"use --reranker {trained}, --reranker none (no reranking), or a "
                                                    f"checkpoint trained with --reranker {cfg.reranker}")
    if cfg.reranker == "none" or cfg.reranker != saved.get("reranker"):
        return
    if cfg.rerank_candidates is None:
        cfg.rerank_candidates = saved.get("rerank_candidates")
    if cfg.cross_encoder == "knowledge" and saved.get("cross_encoder"):
        cfg.cross_encoder = saved["cross_encoder"]
    if not cfg.cross_encoder_layers and saved.get("cross_encoder_layers"):
        cfg.cross_encoder_layers = int(saved["cross_encoder_layers"])


def check_options(cfg, n_passages: int) -> None:
    """The options against --n-docs, --retriever and the knowledge source's size: one-line errors."""
    name, given = reranker_name(cfg), getattr(cfg, "rerank_candidates", None)
    if name == "none":
        if given:
            raise UserError(f"--rerank-candidates {given} gives candidates to a reranker, and no --reranker is given",
                            fix=f"add --reranker {{{','.join(RERANKERS)}}}, or leave --rerank-candidates out")
        return
    layers = int(getattr(cfg, "cross_encoder_layers", 0) or 0)
    if layers < 0 or (layers and name != "cross"):
        raise UserError(f"--cross-encoder-layers {layers} " + ("is negative" if layers < 0 else
                        f"sizes the cross-encoder, and --reranker is {name}"),
                        fix="give the cross-encoder's layers kept (0: all) with --reranker cross, or leave it out")
    k = int(cfg.n_docs or 0)
    if k == 0:
        raise UserError(f"--reranker {name} reranks retrieved passages; --n-docs 0 retrieves none",
                        fix="use --n-docs 1 or more, or leave --reranker out")
    wanted = rerank_candidates(cfg)
    if wanted < k:
        raise UserError(f"--rerank-candidates {wanted} is fewer than --n-docs {k}: the reranker keeps the best "
                        "--n-docs of the candidates", fix=f"use --rerank-candidates {k} or more")
    if wanted > n_passages:
        raise UserError(f"--rerank-candidates {wanted} is larger than the knowledge source ({n_passages} passages)",
                        fix=f"use --rerank-candidates {n_passages} or fewer")
