"""Offline: making knowledge sources (``rag-build-knowledge``, ``rag-import-knowledge``).

* :func:`build_knowledge_source` with :class:`BuildSettings` (what the source holds),
  :class:`BuildOptions` (how the build runs) and :class:`BuildHooks` (what it takes besides text files to
  embed) -- passages -> passage store -> document vectors (resumable shards) -> FAISS index -> manifest
  (:mod:`.builder` and its stages: :mod:`.settings`, :mod:`.output_dir`, :mod:`.stages`, :mod:`.embedding`);
* :func:`~rag_plugin.indexing.import_knowledge.import_knowledge` -- the one import path for vectors
  computed elsewhere (a Hugging Face dataset, DPR's ``psgs_w100.tsv`` with its pickles or
  ``.npy`` + ids): :mod:`.vector_sources` reads them, :mod:`.precomputed` places them on the
  passage store's rows.

The sources are read back by :class:`rag_plugin.retrieval.knowledge.KnowledgeSource`.
"""
from rag_plugin.indexing.builder import BuildHooks, BuildOptions, build_knowledge_source
from rag_plugin.indexing.settings import BuildSettings

__all__ = ["BuildHooks", "BuildOptions", "BuildSettings", "build_knowledge_source"]
