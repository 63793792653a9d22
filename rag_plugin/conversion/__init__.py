"""Published checkpoints and knowledge sources into the plugin, without re-training or re-embedding.

* :mod:`~rag_plugin.conversion.hf_bart` -- Hugging Face BART weights <-> fairseq BART (names,
  the shared embeddings, position tables); the checks that the layouts agree.
* :mod:`~rag_plugin.conversion.hf_rag_folder` -- reading and checking a Hugging Face RAG folder
  (configs, weights, tokenizers).
* :mod:`~rag_plugin.conversion.hf_rag` -- a Hugging Face ``RagTokenForGeneration`` /
  ``RagSequenceForGeneration`` folder (``rag-token-nq``, ``rag-sequence-nq``) -> a plugin
  checkpoint directory (``rag-convert-hf``, :mod:`rag_plugin.cli.convert_hf`).

Knowledge datasets with their embeddings are imported by :mod:`rag_plugin.indexing.import_knowledge`
(``rag-import-knowledge``). DPR encoders (original checkpoints and the Hugging Face layout) are
read by :mod:`rag_plugin.retrieval.encoders` (``dpr:CKPT``, ``hf-dpr:DIR``) and fairseq's BART
``model.pt`` by :func:`rag_plugin.models.generator.load_generator_weights`
(``--generator-checkpoint``). Nothing here downloads anything; ``transformers`` is never
imported.
"""
