"""Published checkpoints and knowledge sources into the plugin, without re-training or re-embedding.

* :mod:`~rag_plugin.conversion.hf_bart` -- Hugging Face BART weights <-> fairseq BART (names,
  the shared embeddings, position tables); the checks that the layouts agree.
* :mod:`~rag_plugin.conversion.hf_rag` -- a Hugging Face ``RagTokenForGeneration`` /
  ``RagSequenceForGeneration`` folder (``rag-token-nq``, ``rag-sequence-nq``) -> a plugin
  checkpoint directory (``scripts/convert_hf_rag.py``).
* :mod:`~rag_plugin.build.import_knowledge` -- a Hugging Face knowledge dataset (``title``,
  ``text``, ``embeddings`` [+ its FAISS index]) or DPR's ``psgs_w100.tsv`` with precomputed
  embeddings -> a knowledge source (``scripts/import_hf_knowledge.py``).

DPR encoders (original checkpoints and the Hugging Face layout) are read by
:mod:`rag_plugin.retrieval.encoders` (``dpr:CKPT``, ``hf-dpr:DIR``) and fairseq's BART
``model.pt`` by :func:`rag_plugin.models.generator.load_generator_weights`
(``--generator-checkpoint``). Nothing here downloads anything; ``transformers`` is never
imported.
"""
