"""Request and response bodies of the service, validated by pydantic. Types and shapes are checked here (an unknown
field is an error, not ignored); the limits of one running service (``--max-k``, ``--max-question-chars``...) are
checked by :func:`check_answer` and :func:`check_search` against its settings."""
from typing import List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from rag_plugin.serving.settings import ServeSettings

#: every decoding a service knows; a model decodes with its variant's (DECODINGS)
Decoding = Literal["beam", "thorough", "fast", "fid"]
DECODINGS = {"token": ("beam",), "sequence": ("thorough", "fast"), "fid": ("fid",)}
Retriever = Literal["model", "dense", "bm25", "hybrid"]
Reranker = Literal["maxsim"]


class BadRequest(Exception):
    """A request the service refuses: status, one-line message, the field it names."""

    def __init__(self, message: str, field: Optional[str] = None, status: int = 422):
        self.message, self.field, self.status = " ".join(message.split()), field, status
        super().__init__(self.message)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AnswerRequest(_Strict):
    question: str = Field(description="the question")
    k: Optional[int] = Field(None, description="passages read (default: the service's K)")
    decoding: Optional[Decoding] = Field(None, description="beam (RAG-Token), thorough|fast (RAG-Sequence), fid")
    beam: Optional[int] = Field(None, description="beam size (default 4, at most --max-beam)")
    max_len: Optional[int] = Field(None, description="the longest answer in tokens (default 64, at most --max-len)")
    explain: bool = Field(True, description="add each passage's posterior and RAG-Token's per-token posterior")


class SearchRequest(_Strict):
    queries: List[str] = Field(description="the questions to search for")
    k: int = Field(5, description="hits per query")
    retriever: Retriever = Field("model", description="model: the checkpoint's own retrieval (its query encoder and "
                                                      "reranker); dense, bm25, hybrid: the knowledge source's")
    rerank: Optional[Reranker] = Field(None, description="rerank the first stage's candidates (dense, bm25, "
                                                                   "hybrid) with zero-shot MaxSim")
    rerank_candidates: Optional[int] = Field(None, description="L, the first stage's candidates reranked (default 20)")


class Passage(BaseModel):
    rank: int
    id: str
    title: str
    text: str
    retrieval_score: Optional[float]
    prior: float
    posterior: Optional[float]


class TokenPosterior(BaseModel):
    tokens: List[str]
    posterior: List[List[float]]


class AnswerResponse(BaseModel):
    question: str
    answer: str
    score: float
    decoding: str
    k: int
    knowledge_version: int
    passages: List[Passage]
    token_posterior: Optional[TokenPosterior]
    elapsed_ms: float


class Hit(BaseModel):
    rank: int
    id: str
    title: str
    text: str
    score: float


class SearchResponse(BaseModel):
    results: List[List[Hit]]
    retriever: str
    rerank: Optional[str]
    knowledge_version: int


def _range(value: int, low: int, high: int, name: str, option: str) -> None:
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high} ({option}), got {value}", name)


def _question(text: str, name: str, limit: int) -> None:
    if not text.strip():
        raise BadRequest(f"{name} is empty", name)
    if len(text) > limit:
        raise BadRequest(f"{name} has {len(text)} characters, more than --max-question-chars {limit}", name)


def check_answer(req: AnswerRequest, s: ServeSettings, variant: str, max_k: int) -> None:
    """The service's limits on an answer request; a :class:`BadRequest` naming the field."""
    _question(req.question, "question", s.max_question_chars)
    if req.k is not None:
        _range(req.k, 1, max_k, "k", "--max-k")
    if req.decoding is not None and req.decoding not in DECODINGS[variant]:
        raise BadRequest(f"decoding {req.decoding!r} is not one of this model's ({variant}): "
                         f"{', '.join(DECODINGS[variant])}", "decoding")
    if req.beam is not None:
        _range(req.beam, 1, s.max_beam, "beam", "--max-beam")
    if req.max_len is not None:
        _range(req.max_len, 1, s.max_len, "max_len", "--max-len")


def check_search(req: SearchRequest, s: ServeSettings, max_k: int, max_depth: int) -> None:
    if not req.queries:
        raise BadRequest("queries is empty", "queries")
    if len(req.queries) > s.max_queries:
        raise BadRequest(f"queries holds {len(req.queries)}, more than --max-queries {s.max_queries}", "queries",
                         status=413)
    for i, q in enumerate(req.queries):
        _question(q, f"queries[{i}]", s.max_question_chars)
    _range(req.k, 1, max_k, "k", "--max-k")
    if req.rerank is not None and req.retriever == "model":
        raise BadRequest("rerank reranks the knowledge source's first stage (dense, bm25, hybrid); the model's own "
                         "retrieval reranks as it was trained", "rerank")
    if req.rerank_candidates is not None:
        if req.rerank is None:
            raise BadRequest("rerank_candidates gives candidates to a reranker, and rerank is not set",
                             "rerank_candidates")
        _range(req.rerank_candidates, req.k, max_depth, "rerank_candidates", "at least k")
