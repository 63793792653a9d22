"""RAG-Sequence decoding: a beam per document, then Thorough or Fast rescoring.

For each question, beam search runs under each of its K documents (one batched search over
B*K pair rows). The union of the K beams' hypotheses is the candidate set Y. Each candidate
y is scored by the marginal ``log sum_z p(z|x) p(y|x,z)``:

* Thorough: ``p(y|x,z)`` for every (y, z): from z's beam where y was found there, otherwise by
  teacher forcing (the paper's additional forward passes), batched over all questions, reusing
  the encoder outputs and computing each pair's cross-attention keys and values once for all
  its candidates (no re-encoding, no re-retrieval, no per-question loop);
* Fast: ``p(y|x,z)`` from the beams where y was found, 0 where it was not.

A beam's scores are reused as ``log p(y|x,z)`` only when they are the model's log-probabilities:
the search is fairseq's plain beam search (or its prefix-constrained one, which only masks
tokens out), with no language-model fusion (``--lm-path``), no diversity penalty
(``--diversity-rate``, ``--diverse-beam-groups``), no forced end of sentence
(``--match-source-len``), no temperature, unknown-word penalty or sampling. Otherwise the search
only proposes the candidates: Thorough teacher-forces every (candidate, document) pair, and Fast
teacher-forces the pairs whose beam found the candidate (still 0 elsewhere), so that both rank
the candidates by the model's own marginal.

Scores are normalised by ``len(y) ** lenpen`` like fairseq's (``--unnormalized`` to not).
"""
from typing import Dict, List, Tuple

import torch
from fairseq.search import BeamSearch, PrefixConstrainedBeamSearch

from rag_plugin.core import marginalization as M
from rag_plugin.generation.adapters import PerDocumentSearchModel, RagGeneratorBase, score_candidates

DECODINGS = ("thorough", "fast")


class RagSequenceGenerator(RagGeneratorBase):
    variant = "sequence"

    def __init__(self, task, rag, args, decoding: str = "thorough", extra_gen_cls_kwargs=None,
                 prefix_allowed_tokens_fn=None):
        if decoding not in DECODINGS:
            raise ValueError(f"unknown RAG-Sequence decoding {decoding!r}")
        super().__init__(rag)
        self.decoding = decoding
        self.search_model = self.make_search_model(rag)
        # the search's rows are (question, document) pairs: the function sees the question's sample id
        self.search = task.build_search([self.search_model], args, extra_gen_cls_kwargs=extra_gen_cls_kwargs,
                                        prefix_allowed_tokens_fn=self._sentence_ids.wrap(prefix_allowed_tokens_fn))
        self.lenpen = float(getattr(args, "lenpen", 1.0))
        self.normalize = not getattr(args, "unnormalized", False)
        self.nbest = int(getattr(args, "nbest", 1))
        # Thorough: scores of (hypothesis, document) pairs that the document's beam found are
        # reused; only the other pairs are teacher-forced (the paper's "additional forward pass
        # for each document z for which y does not appear in the beam"). False re-scores all.
        self.reuse_beam_scores = True

    def _generate(self, models, sample, prefix_tokens=None, **unused):
        ni = sample["net_input"]
        encoder_out, doc_scores, rows = self.rag.encode(ni["src_tokens"], ni.get("query_tokens"), ni.get("query_mask"),
                                                        ni.get("fixed_doc_rows"), ni.get("fixed_doc_scores"))
        doc_lp = M.doc_log_prior(doc_scores.float())                              # [B, K]
        b, k = doc_lp.shape
        self.search_model.encoder.cached = encoder_out
        pair_sample = {"net_input": {"src_tokens": ni["src_tokens"].repeat_interleave(k, dim=0)}}
        if prefix_tokens is not None:
            prefix_tokens = prefix_tokens.repeat_interleave(k, dim=0)
        self._sentence_ids.set(sample, rows_per_sample=k)
        beams = self.search.generate([self.search_model], pair_sample, prefix_tokens=prefix_tokens)
        self.search_model.encoder.cached = None
        owner, cand_tokens, found = self._union(beams, b, k)
        token_lp = self._score(encoder_out, owner, cand_tokens, found, k)          # [C, K, T]
        positional = M.rag_sequence_positional_scores(token_lp, doc_lp.cpu()[owner])  # [C, T], on the host
        return self._rank(owner, cand_tokens, positional, b), {"rows": rows, "doc_lp": doc_lp,
                                                                 "doc_scores": doc_scores, "encoder_out": encoder_out}

    @staticmethod
    def make_search_model(rag):
        """What fairseq's search drives: one beam per (question, document) pair."""
        return PerDocumentSearchModel(rag)

    def score_candidates(self, encoded, k: int, owner, tokens, known=None, only=None) -> torch.Tensor:
        """log p(y_t|x,z,y<t) [C, K, T] of the candidates under their questions' documents (``encoded``: what
        ``rag.encode`` gave, the B*K pairs)."""
        return score_candidates(self.rag, encoded, k, owner, tokens, known=known, only=only)

    @staticmethod
    def _union(beams, b: int, k: int):
        """Deduplicated candidates per question: owner question [C], tokens, and where found."""
        owner: List[int] = []
        tokens: List[torch.Tensor] = []
        found: Dict[Tuple[int, int], torch.Tensor] = {}   # (candidate, doc) -> positional scores
        for q in range(b):
            index: Dict[Tuple[int, ...], int] = {}
            for d in range(k):
                for hypo in beams[q * k + d]:
                    key = tuple(hypo["tokens"].tolist())
                    if key not in index:
                        index[key] = len(owner)
                        owner.append(q)
                        tokens.append(hypo["tokens"].cpu())
                    found[(index[key], d)] = hypo["positional_scores"].float().cpu()
        return torch.tensor(owner, dtype=torch.long), tokens, found

    def _score(self, encoder_out, owner, tokens, found, k: int) -> torch.Tensor:
        c = len(tokens)
        t = max(len(x) for x in tokens)
        if self.decoding == "fast":
            if not self._beam_scores_are_model_scores():  # the search's scores are not log p(y|x,z)
                forced = self.score_candidates(encoder_out, k, owner, tokens, only=set(found))
                found = {(ci, d): forced[ci, d, : len(tokens[ci])] for (ci, d) in found}
            token_lp = torch.full((c, k, t), float("-inf"))
            for (ci, d), scores in found.items():
                token_lp[ci, d] = 0.0
                token_lp[ci, d, : len(scores)] = scores
            return token_lp
        known = found if self.reuse_beam_scores and self._beam_scores_are_model_scores() else None
        return self.score_candidates(encoder_out, k, owner, tokens, known=known)

    def _beam_scores_are_model_scores(self) -> bool:
        """Whether a hypothesis' beam scores equal its teacher-forced log p(y_t|x,z,y<t).

        They do under fairseq's plain beam search, and under its prefix-constrained search
        (``prefix_allowed_tokens_fn``), which only adds 0 or -inf to the model's log-probabilities.
        They do not when the search changes the scores of the tokens it picks: temperature,
        unknown-word penalty, sampling, language-model fusion (``lm_model``), diverse beam search
        (``--diverse-beam-groups``), diverse siblings (``--diversity-rate``), ``--match-source-len``
        (sets the forced end of sentence's log-probability to 0), lexical constraints, or any other
        strategy: for those, False."""
        s = self.search
        return (type(getattr(s, "search", None)) in (BeamSearch, PrefixConstrainedBeamSearch)
                and getattr(s, "lm_model", None) is None and not getattr(s, "match_source_len", False)
                and float(getattr(s, "temperature", 1.0)) == 1.0 and float(getattr(s, "unk_penalty", 0.0)) == 0.0)

    def _rank(self, owner, tokens, positional, b: int):
        results: List[List[dict]] = [[] for _ in range(b)]
        for ci, y in enumerate(tokens):
            pos = positional[ci, : len(y)]
            total = float(pos.sum())
            score = total / (len(y) ** self.lenpen) if self.normalize else total
            results[int(owner[ci])].append({"tokens": y, "score": torch.tensor(score), "positional_scores": pos,
                                            "alignment": torch.empty(0), "attention": None})
        for hyps in results:
            hyps.sort(key=lambda h: -float(h["score"]))
            del hyps[self.nbest:]
        return results
