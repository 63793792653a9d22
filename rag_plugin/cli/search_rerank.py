"""rag-search --rerank: the first stage's L candidates of each question reranked, the best K kept.

Two ways to rerank (each hit's score is the reranker's logit of p(z|x)):

* without --path: ``--rerank maxsim`` only, zero-shot late interaction (ColBERT's MaxSim) with the knowledge source's
  own encoder: its query tower's token states of the question against its passage tower's token states of each
  candidate (:mod:`rag_plugin.reranking.maxsim`; from the lower-layer cache ``KS/.lower_states`` where one of this
  tower exists), over the first stage's L candidates (dense, ``--bm25`` or ``--hybrid``), the best K kept by
  :func:`rag_plugin.reranking.stage.rerank`. The reader as reranker (upr) needs a generator and the cross-encoder a
  trained head: both need --path.
* with --path CHECKPOINT: the checkpoint's model, loaded through :class:`rag_plugin.hub.RAG`, retrieves exactly as
  generation reads: the questions go through the task's ``build_dataset`` and the model's ``retrieve`` (its own
  first stage, its own reranker, ``-k`` documents of ``--rerank-candidates`` L). ``--rerank`` may be left out; given,
  it must be the reranker the checkpoint was trained with (``--reranker``: its weights). A checkpoint trained without
  a reranker gives its own retrieval, unreranked, or with ``--rerank X`` reranked zero-shot (the reranker's own
  start: the knowledge source's encoder, the generator's own likelihood, a zero cross-encoder head).

Each searcher maps a batch of questions to a :class:`~rag_plugin.retrieval.retriever.Retrieval` (rows and scores
[B, K], best first; a row of -1 where fewer than K passages could be found). torch, fairseq and the scorers are
imported when a search starts, not by ``--help``.
"""
from __future__ import annotations

from typing import Callable, Optional

from rag_plugin.util.errors import UserError

#: the --rerank choices: rag_plugin.reranking.base.RERANKERS (which imports torch; a test checks they agree)
RERANKERS = ("maxsim", "upr", "cross")
#: L when neither --rerank-candidates nor a checkpoint says: max(this, -k) (rag_plugin.reranking.options's)
DEFAULT_CANDIDATES = 20
#: rerankers that need a checkpoint's model, and why
NEED_PATH = {"upr": "the reader as reranker scores with a generator",
             "cross": "the cross-encoder's head is trained with a model"}
#: first-stage options that --path leaves to the checkpoint (dest -> option)
FIRST_STAGE_OPTIONS = {"bm25": "--bm25", "hybrid": "--hybrid", "fusion": "--fusion", "rrf_k": "--rrf-k",
                       "fusion_weight": "--fusion-weight", "hybrid_candidates": "--hybrid-candidates"}


def add_options(p) -> None:
    """The reranking options of rag-search."""
    p.add_argument("--rerank", choices=RERANKERS, default=None,
                   help="rerank the first stage's candidates: maxsim (late interaction with the knowledge source's "
                        "encoder), upr or cross (with --path) (default: the checkpoint's with --path, else none)")
    p.add_argument("--rerank-candidates", type=int, default=None, metavar="L",
                   help="first-stage candidates per question the reranker scores, of which it keeps -k (default: "
                        f"the checkpoint's with --path, else max({DEFAULT_CANDIDATES}, -k))")
    p.add_argument("--path", default=None, metavar="CHECKPOINT",
                   help="retrieve and rerank with this checkpoint's model, as generation does (its first stage and "
                        "reranker)")
    p.add_argument("--device", default=None, help="where the reranker (or --path's model) runs: cpu, cuda or cuda:N "
                                                    "(default: cuda when a GPU is available, else cpu)")


def reranks(args) -> bool:
    """Whether this run reranks (or reads a checkpoint's retrieval): --rerank or --path."""
    return args.rerank is not None or args.path is not None


def check_arguments(args) -> None:
    """What can be refused before anything is loaded: one-line errors naming the option."""
    if args.path is None:
        if args.rerank in NEED_PATH:
            raise UserError(f"--rerank {args.rerank}: {NEED_PATH[args.rerank]}, which only a checkpoint has",
                            fix=f"pass --path CHECKPOINT (a model trained with --reranker {args.rerank}), or use "
                                "--rerank maxsim")
        if args.rerank is None and args.rerank_candidates is not None:
            raise UserError(f"--rerank-candidates {args.rerank_candidates} gives candidates to a reranker, and no "
                            "--rerank is given", fix=f"add --rerank {{{','.join(RERANKERS)}}}, or leave "
                                                     "--rerank-candidates out")
        return
    given = [flag for dest, flag in FIRST_STAGE_OPTIONS.items() if getattr(args, dest) not in (None, False)]
    if given:
        raise UserError(f"{given[0]} sets a first stage; --path retrieves with the checkpoint's own (its --retriever "
                        "and fusion settings)", fix=f"leave {given[0]} out with --path")


def check_k(args, n_passages: int) -> None:
    if not 1 <= args.k <= n_passages:
        raise UserError(f"-k {args.k} is outside 1..{n_passages} (the knowledge source's passages)",
                        fix=f"use -k 1 to {n_passages}")


def candidates(args, n_passages: int, default: Optional[int] = None, whose: str = "") -> int:
    """L: --rerank-candidates, else ``default`` (``whose``: where it came from, for the messages), else
    max(20, -k) up to the collection; checked against -k and the collection."""
    check_k(args, n_passages)
    if args.rerank_candidates is not None:
        wanted, whose = args.rerank_candidates, ""
    elif default is not None:
        wanted = int(default)
    else:
        wanted, whose = min(max(DEFAULT_CANDIDATES, args.k), n_passages), ""
    said = f"--rerank-candidates {wanted}{whose}"
    if wanted < args.k:
        raise UserError(f"{said} is fewer than -k {args.k}: the reranker keeps the best -k of the candidates",
                        fix=f"use --rerank-candidates {args.k} or more")
    if wanted > n_passages:
        raise UserError(f"{said} is larger than the knowledge source ({n_passages} passages)",
                        fix=f"use --rerank-candidates {n_passages} or fewer")
    return wanted


def late_interaction(args, open_first_stage: Callable):
    """--rerank maxsim without --path; ``open_first_stage(knowledge, depth)``: the first stage of L = depth."""
    from rag_plugin.retrieval.knowledge import KnowledgeSource  # start-up: numpy, faiss

    knowledge = KnowledgeSource(args.knowledge, index_mode="private" if args.private_index else "shared")
    depth = candidates(args, len(knowledge))
    first_stage = open_first_stage(knowledge, depth)
    from rag_plugin.reranking.late_interaction import LateInteraction, knowledge_and_encoder  # start-up: torch

    knowledge, encoder = knowledge_and_encoder(first_stage, knowledge)
    return LateInteraction(first_stage, knowledge, encoder, args.k, depth, args.device)


# ------------------------------------------------------------------ with --path: the checkpoint's model
def _checkpoint_depth(args, saved: Optional[int], reranker: str, n_passages: int) -> Optional[int]:
    """L for the checkpoint's model (None: it does not rerank): --rerank-candidates, else the checkpoint's
    (``saved``), else max(20, -k)."""
    if reranker != "none":
        return candidates(args, n_passages, saved, " (the checkpoint's)")
    if args.rerank_candidates is not None:
        raise UserError(f"--rerank-candidates {args.rerank_candidates} gives candidates to a reranker, and the "
                        "checkpoint was trained without one", path=args.path,
                        fix="leave --rerank-candidates out (the checkpoint retrieves without reranking), or leave "
                            "--path out and use --rerank maxsim")
    check_k(args, n_passages)
    return None


def _other_reranker(args, trained: str) -> UserError:
    """--rerank names another reranker than the one the checkpoint was trained with (its weights are that one's)."""
    return UserError(f"--rerank {args.rerank} is not the checkpoint's reranker (it was trained with --reranker "
                     f"{trained})", path=args.path, fix=f"leave --rerank out, or use --rerank {trained}")


def checkpoint_retrieval(args):
    """The checkpoint's model with -k documents, the reranker (--rerank, else its own) and L candidates."""
    from rag_plugin.hub import RAG, checkpoint_task_options
    from rag_plugin.retrieval.knowledge import KnowledgeSource  # start-up: numpy, faiss

    saved = checkpoint_task_options(args.path)  # "checkpoint not found" before anything else loads
    reranker = str(saved.get("reranker") or "none")
    if args.rerank is not None and args.rerank != reranker:
        if reranker != "none":
            raise _other_reranker(args, reranker)
        reranker = args.rerank  # a checkpoint trained without one: zero-shot (the reranker's own start)
    n_passages = len(KnowledgeSource(args.knowledge))
    depth = _checkpoint_depth(args, saved.get("rerank_candidates"), reranker, n_passages)
    rag = RAG.from_pretrained(args.path, knowledge=args.knowledge, n_docs=args.k, reranker=reranker,
                              rerank_candidates=depth, nprobe=args.nprobe, ef_search=args.ef_search,
                              private_index=args.private_index, device=args.device)
    return rag  # RAG.search(questions): its own retrieval (and reranker)
