"""Decoding a decoder-only RAG model (``rag_lm_token``, ``rag_lm_seq``): the RAG-Token beam search and RAG-Sequence's
per-passage beams with Thorough or Fast rescoring, exactly as for the encoder-decoder reader
(rag_plugin/generation/rag_token.py, rag_sequence.py), over the LM's adapters (rag_plugin/generation/lm_adapters.py:
each passage's context computed once)."""
from rag_plugin.generation.lm_adapters import LMPairSearchModel, LMTokenSearchModel, score_lm_candidates
from rag_plugin.generation.rag_sequence import RagSequenceGenerator
from rag_plugin.generation.rag_token import RagTokenGenerator


class LMRagTokenGenerator(RagTokenGenerator):
    """RAG-Token over an LM: fairseq's search over the passages' mixed next-token distributions (REPLUG)."""

    @staticmethod
    def make_search_model(rag):
        return LMTokenSearchModel(rag)


class LMRagSequenceGenerator(RagSequenceGenerator):
    """RAG-Sequence over an LM: a beam per (question, passage), then Thorough or Fast rescoring."""

    @staticmethod
    def make_search_model(rag):
        return LMPairSearchModel(rag)

    def score_candidates(self, encoded, k: int, owner, tokens, known=None, only=None):
        return score_lm_candidates(self.rag, encoded, k, owner, tokens, known=known, only=only)
