"""Retrieval alone (``POST /v1/search``), as ``rag-search`` retrieves: ``model`` is the checkpoint's own retrieval
(its query encoder, first stage and reranker, exactly what generation reads: ``rag-search --path``); ``dense``,
``bm25`` and ``hybrid`` are the knowledge source's own first stages (``rag-search`` without ``--path``), optionally
reranked by zero-shot MaxSim (``--rerank maxsim``). They are built on first use and kept for the version open, on
the service's search thread (``model`` on the compute thread, which holds the model)."""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

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
    """``model`` searches run on the compute thread (the model's); the others on the search thread, each with the
    knowledge-source version open when it starts (its first stages are built again for a new version, the encoder
    kept), so a search never waits behind a batch of answers and always says which version it read."""

    def __init__(self, engine):
        self.engine = engine
        self._knowledge = None
        self._stages: Dict[str, object] = {}
        self._rerankers: Dict[str, object] = {}
        self._encoder = None

    def key(self, req) -> SearchKey:
        depth = (req.rerank_candidates or max(req.k, RERANK_CANDIDATES)) if req.rerank else req.k
        return SearchKey(retriever=req.retriever, k=req.k, rerank=req.rerank, depth=min(depth, self.max_depth))

    @staticmethod
    def lane(key: SearchKey) -> str:
        """The thread a search runs on (rag_plugin.serving.batcher.LANES)."""
        return "compute" if key.retriever == "model" else "search"

    @property
    def max_depth(self) -> int:
        """The most candidates a reranked search may take (hybrid fuses this many per side)."""
        return min(len(self.engine.rag.task.knowledge),
                   max(HYBRID_CANDIDATES, 2 * self.engine.max_k, RERANK_CANDIDATES))

    def search(self, key: SearchKey, queries: List[str]) -> Tuple[List[List[dict]], int]:
        """The hits of each query, and the version of the knowledge source they come from."""
        if key.retriever == "model":
            with self.engine.reading(key.k):
                found, version = self.engine.rag.search(queries), self.engine.version
        else:
            knowledge = self.engine.rag.task.knowledge  # read once: a reload may replace it meanwhile
            self._follow(knowledge)
            stage = self._reranker(key) if key.rerank else self._stage(key.retriever)
            found = stage.search(queries) if key.rerank else stage.search(queries, key.k)
            version = int(knowledge.version)
        hits = [[{"rank": r, "id": found.store.id(int(row)), "title": found.store.title(int(row)),
                  "text": found.store.text(int(row)), "score": float(score)}
                 for r, (row, score) in enumerate(zip(rows, scores)) if int(row) >= 0]
                for rows, scores in zip(found.rows, found.scores)]
        return hits, version

    def _follow(self, knowledge) -> None:
        """First stages of ``knowledge`` (the version open): those of an older version are dropped."""
        if knowledge is not self._knowledge:
            self._knowledge, self._stages, self._rerankers = knowledge, {}, {}

    def _stage(self, name: str):
        if name not in self._stages:
            from rag_plugin.retrieval.retriever import BM25Retriever, DenseRetriever

            knowledge = self._knowledge
            if name == "dense":
                if self._encoder is None:
                    self._encoder = knowledge.load_encoder()
                self._stages[name] = DenseRetriever(knowledge, encoder=self._encoder)
            elif name == "bm25":  # its own: the task's serves the model on the compute thread
                self._stages[name] = BM25Retriever(knowledge.passages)
            else:
                from rag_plugin.retrieval.hybrid import HybridRetriever

                self._stages[name] = HybridRetriever(self._stage("dense"), self._stage("bm25"),
                                                     candidates=self.max_depth)
        return self._stages[name]

    def _reranker(self, key: SearchKey):
        from rag_plugin.reranking.late_interaction import LateInteraction, knowledge_and_encoder

        if key.retriever not in self._rerankers:
            first = self._stage(key.retriever)
            knowledge, encoder = knowledge_and_encoder(first, self._knowledge)
            self._rerankers[key.retriever] = LateInteraction(first, knowledge, encoder, key.k, key.depth,
                                                             self.engine.settings.device)
        stage = self._rerankers[key.retriever]
        stage.k, stage.depth = key.k, key.depth
        return stage
