"""Offline dataset preparation (no fairseq import): the paper's datasets from their official files,
CuratedTrec's concrete targets, pretraining records, vocabularies.

* :mod:`.open_qa` -- NQ, TriviaQA, WebQuestions, CuratedTrec (layouts: :mod:`.qa_layouts`,
  :mod:`.dpr_qa`, :mod:`.kilt_records`, :mod:`.triviaqa`);
* :mod:`.msmarco`, :mod:`.jeopardy`, :mod:`.fever` -- one converter per source;
* :mod:`.writer` -- the all-or-nothing output directory and the split plan; :mod:`.inputs` --
  layout sniffing; :mod:`.json_stream` -- the streaming JSON parser;
* :mod:`.curatedtrec` -- concrete targets for regex answers; :mod:`.denoising` -- pretraining
  records from passages; :mod:`.vocab` -- SentencePiece -> fairseq dictionary.

The command lines are ``rag-prepare``, ``rag-curatedtrec-targets`` and ``rag-pretraining-data``
(:mod:`rag_plugin.cli`).
"""
