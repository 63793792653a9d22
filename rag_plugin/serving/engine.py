"""The model side of the service: a batch of questions in, answers with their passages out; retrieval alone
(:mod:`.search`); the knowledge source's reload. Every method runs on the service's one compute thread
(:mod:`.batcher`), so a batch reads one K, one generator and one version of the knowledge source.

A batch is decoded as the hub decodes it (``rag_plugin.hub.RAG.generate``: the task's dataset of the questions,
the task's generator, fairseq's search), with its generators built once per (decoding, beam, max_len) instead of
per call. Answered in a batch or alone, a question gets the same answer and passages; the scores agree to float32
rounding (a padded batch multiplies matrices of another shape)."""
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Dict, List, Tuple, get_args

import torch

from rag_plugin.serving import explain
from rag_plugin.serving.schemas import DECODINGS, AnswerRequest, Reranker, Retriever
from rag_plugin.serving.settings import ServeSettings
from rag_plugin.util.errors import UserError
from rag_plugin.util.safe_load import checkpoint_config_section

#: a request's beam and answer length when it gives none (capped by --max-beam, --max-len): the hub's defaults
DEFAULT_BEAM, DEFAULT_MAX_LEN = 4, 64


@dataclass(frozen=True)
class AnswerKey:
    """What the questions of one batch share: a batch is one generator call."""

    k: int
    decoding: str
    beam: int
    max_len: int
    explain: bool


def load_model(s: ServeSettings):
    """The checkpoint through the hub (the project's safe loader), with its knowledge source or ``--knowledge``."""
    from rag_plugin.hub import RAG

    return RAG.from_pretrained(s.path, knowledge=s.knowledge, n_docs=s.n_docs, device=s.device)


class Engine:
    def __init__(self, rag, settings: ServeSettings):
        self.rag, self.settings = rag, settings
        model = rag.model
        self.variant = str(getattr(model, "variant", "token"))
        if model.n_docs == 0:
            raise UserError("the checkpoint is closed-book (--n-docs 0): it reads no passages", path=settings.path,
                            fix="serve a retrieval-augmented checkpoint (rag_token_*, rag_seq_*, fid_*)")
        self.default_k = int(model.n_docs)
        self.max_k = self._max_k()
        if self.default_k > self.max_k:
            raise UserError(f"the default K {self.default_k} is above --max-k {self.max_k}", path=settings.path,
                            fix=f"pass --max-k {self.default_k} or more, or --n-docs {self.max_k} or fewer")
        self.arch = str(checkpoint_config_section(settings.path, "model").get("_name") or "unknown")  # --arch
        self.default_decoding = {"token": "beam", "fid": "fid"}.get(self.variant, str(rag.task.cfg.rag_decoding))
        self._generators: Dict[Tuple, object] = {}
        from rag_plugin.serving.search import Searcher  # light: retrievers are built on first use

        self.searcher = Searcher(self)

    def _max_k(self) -> int:
        model, task = self.rag.model, self.rag.task
        most = min(int(self.settings.max_k), len(task.knowledge))
        if model.reranker is not None:  # K of the L candidates the reranker scores
            most = min(most, int(model.context.rerank_candidates))
        candidates = getattr(model.retriever, "candidates", None)  # hybrid: the fused candidates
        return min(most, int(candidates)) if candidates else most

    # ------------------------------------------------------------------ what a request leaves to the service
    def key(self, req: AnswerRequest) -> AnswerKey:
        s = self.settings
        return AnswerKey(k=req.k or self.default_k, decoding=req.decoding or self.default_decoding,
                         beam=req.beam if req.beam is not None else min(DEFAULT_BEAM, s.max_beam),
                         max_len=req.max_len if req.max_len is not None else min(DEFAULT_MAX_LEN, s.max_len),
                         explain=req.explain)

    @property
    def version(self) -> int:
        return int(self.rag.version)

    @contextmanager
    def reading(self, k: int):
        """The model and the task read ``k`` passages per question inside (the compute thread's only)."""
        model, cfg = self.rag.model, self.rag.task.cfg
        context, saved = model.context, cfg.n_docs
        if k != context.n_docs:
            model.use_retrieval(replace(context, n_docs=k))
            cfg.n_docs = k
        try:
            yield
        finally:
            model.use_retrieval(context)
            cfg.n_docs = saved

    def _generator(self, key: AnswerKey):
        gen_key = (key.decoding, key.beam, key.max_len)
        if gen_key not in self._generators:
            from fairseq.dataclass.configs import GenerationConfig  # loaded with the model

            task = self.rag.task
            args = GenerationConfig(beam=key.beam, nbest=1, max_len_a=0, max_len_b=key.max_len, lenpen=1.0)
            saved = task.cfg.rag_decoding
            if self.variant == "sequence":
                task.cfg.rag_decoding = key.decoding
            try:
                generator = task.build_generator([self.rag.model], args)
                generator.keep_retrieval = True  # the explanation reads its retrieval and encoded pairs
                self._generators[gen_key] = generator
            finally:
                task.cfg.rag_decoding = saved
        return self._generators[gen_key]

    # ------------------------------------------------------------------ answers
    def answer(self, key: AnswerKey, questions: List[str]) -> List[dict]:
        """One generator call for every question of the batch; one response body each."""
        from rag_plugin.generation.adapters import retrieval_of  # imports fairseq

        started = time.perf_counter()
        with self.reading(key.k):
            sample = self.rag.sample(questions)
            generator = self._generator(key)
            with torch.no_grad():
                hypos = generator.generate([self.rag.model], sample)
            retrieval, generator.last_retrieval = generator.last_retrieval, {}  # not kept past this batch
            rows, doc_lp = retrieval_of(hypos)
            best = [h[0]["tokens"].cpu() for h in hypos]
            scores = post = tok_post = None
            if key.explain and rows is not None and self.variant != "fid":
                post, tok_post = explain.posteriors(self.rag.model, retrieval["encoder_out"], doc_lp, best,
                                                    key.decoding == "beam")
                scores = retrieval["doc_scores"].float().cpu()
        version = self.version
        prior = None if rows is None else doc_lp.float().exp()  # p(z|x) [B, K]
        out = []
        for i, question in enumerate(questions):
            # the passages by p(z|x), best first; the token posterior's rows in the same order
            order = [] if prior is None else torch.argsort(prior[i], descending=True, stable=True).tolist()
            out.append({"question": question, "answer": self.rag.tokenizer.decode(best[i].tolist()),
                        "score": float(hypos[i][0]["score"]), "decoding": key.decoding, "k": key.k,
                        "knowledge_version": version,
                        "passages": self._passages(i, order, rows, prior, scores, post),
                        "token_posterior": self._token_posterior(i, order, best, tok_post),
                        "elapsed_ms": 1000.0 * (time.perf_counter() - started)})
        return out

    def _passages(self, i, order, rows, prior, scores, post) -> List[dict]:
        store = self.rag.task.knowledge.passages
        return [{"rank": r, "id": store.id(int(rows[i, k])), "title": store.title(int(rows[i, k])),
                 "text": store.text(int(rows[i, k])),
                 "retrieval_score": None if scores is None else float(scores[i, k]),
                 "prior": float(prior[i, k]), "posterior": None if post is None else float(post[i, k])}
                for r, k in enumerate(order)]

    def _token_posterior(self, i, order, best, tok_post):
        if tok_post is None:
            return None
        n = len(best[i])
        tokens = explain.token_texts(self.rag.tokenizer, best[i].tolist(), self.rag.model.eos)
        return {"tokens": tokens, "posterior": [[float(v) for v in tok_post[i, k, :n]] for k in order]}

    # ------------------------------------------------------------------ the knowledge source
    def reload(self) -> Tuple[int, int]:
        """Open the knowledge source's current version; batches before it finished on the old one (the compute
        thread runs one thing at a time). Returns (previous, now)."""
        previous = self.version
        now = int(self.rag.reload())  # the searcher follows the new version at its next search
        return previous, now

    def info(self) -> dict:
        task, s = self.rag.task, self.settings
        knowledge = task.knowledge
        return {"model": s.path, "arch": self.arch, "variant": self.variant, "k": self.default_k, "max_k": self.max_k,
                "decodings": list(DECODINGS[self.variant]), "default_decoding": self.default_decoding,
                "max_beam": s.max_beam, "max_len": s.max_len, "max_question_chars": s.max_question_chars,
                "max_batch": s.max_batch, "max_queries": s.max_queries,
                "retrievers": list(get_args(Retriever)), "rerankers": list(get_args(Reranker)),
                "reranker": None if self.rag.model.reranker is None else str(task.cfg.reranker),
                "knowledge": {"path": str(knowledge.root), "version": self.version, "passages": len(knowledge),
                              "encoder": str(knowledge.encoder_spec),
                              "passage_store_sha256": knowledge.passages.sha256},
                "workers": s.workers}
