"""Retrieval alone (``POST /v1/search``), as ``rag-search`` retrieves: ``model`` is the checkpoint's own retrieval
(its query encoder, first stage and reranker, exactly what generation reads: ``rag-search --path``); ``dense``,
``bm25`` and ``hybrid`` are the knowledge source's own first stages (``rag-search`` without ``--path``), optionally
reranked by zero-shot MaxSim (``--rerank maxsim``). They are built on first use and kept for the version open."""
from dataclasses import dataclass
from typing import Dict, List, Optional

#: hybrid's candidates per side: at least this many (rag-search's default), else twice the largest k
HYBRID_CANDIDATES = 20
#: L of a reranked search when the request names none (rag-search's default)
RERANK_CANDIDATES = 20


@dataclass(frozen=True)
class SearchKey:
    """What the queries of one batch share."""

    retriever: str
    k: int
    rerank: Optional[str]
    depth: int


class Searcher:
    def __init__(self, engine):
        self.engine = engine
        self._stages: Dict[str, object] = {}
        self._rerankers: Dict[str, object] = {}

    def key(self, req) -> SearchKey:
        depth = (req.rerank_candidates or max(req.k, RERANK_CANDIDATES)) if req.rerank else req.k
        return SearchKey(retriever=req.retriever, k=req.k, rerank=req.rerank, depth=min(depth, self.max_depth))

    @property
    def max_depth(self) -> int:
        """The most candidates a reranked search may take (hybrid fuses this many per side)."""
        return min(len(self.engine.rag.task.knowledge),
                   max(HYBRID_CANDIDATES, 2 * self.engine.max_k, RERANK_CANDIDATES))

    def forget(self) -> None:
        """The knowledge source was reopened: first stages are built again from the new version on first use."""
        self._stages.clear()
        self._rerankers.clear()

    def search(self, key: SearchKey, queries: List[str]) -> List[List[dict]]:
        if key.retriever == "model":
            found = self._model_search(key.k, queries)
        elif key.rerank:
            found = self._reranker(key).search(queries)
        else:
            found = self._stage(key.retriever).search(queries, key.k)
        return [[{"rank": r, "id": found.store.id(int(row)), "title": found.store.title(int(row)),
                  "text": found.store.text(int(row)), "score": float(score)}
                 for r, (row, score) in enumerate(zip(rows, scores)) if int(row) >= 0]
                for rows, scores in zip(found.rows, found.scores)]

    def _model_search(self, k: int, queries: List[str]):
        with self.engine.reading(k):
            return self.engine.rag.search(queries)

    def _stage(self, name: str):
        if name not in self._stages:
            from rag_plugin.retrieval.retriever import DenseRetriever

            task = self.engine.rag.task
            knowledge = task.knowledge
            if name == "dense":
                self._stages[name] = DenseRetriever(knowledge)
            elif name == "bm25":
                self._stages[name] = task.bm25
            else:
                from rag_plugin.retrieval.hybrid import HybridRetriever

                candidates = self.max_depth
                self._stages[name] = HybridRetriever(self._stage("dense"), self._stage("bm25"),
                                                     candidates=candidates)
        return self._stages[name]

    def _reranker(self, key: SearchKey):
        from rag_plugin.reranking.late_interaction import LateInteraction, knowledge_and_encoder

        if key.retriever not in self._rerankers:
            first = self._stage(key.retriever)
            knowledge, encoder = knowledge_and_encoder(first, self.engine.rag.task.knowledge)
            self._rerankers[key.retriever] = LateInteraction(first, knowledge, encoder, key.k, key.depth,
                                                             self.engine.settings.device)
        stage = self._rerankers[key.retriever]
        stage.k, stage.depth = key.k, key.depth
        return stage
