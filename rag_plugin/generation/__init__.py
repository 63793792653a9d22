"""Decoding for RAG models, driven by fairseq's own SequenceGenerator.

* RAG-Token (``rag_token.py``): standard beam search over the document-marginalised
  transition, through an adapter that makes a RAG model look like a fairseq
  encoder-decoder (``adapters.py``).
* RAG-Sequence (``rag_sequence.py``): a beam per document, then Thorough or Fast
  rescoring of the union of hypotheses.
* ``scorer.py``: teacher-forced scores (``--score-reference``) for both variants.
"""
