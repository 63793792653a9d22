"""The reranking stage: retrieve L candidates, score them with a reranker, keep the best K.

Usable without fairseq: a scorer is a ``torch.nn.Module`` that maps a :class:`~rag_plugin.reranking.base.RerankBatch`
to the logits of p(z|x) over its L candidates (:mod:`rag_plugin.reranking.base`); :mod:`rag_plugin.reranking.stage`
keeps the best K. The scorers: late interaction (:mod:`.maxsim`), the reader as reranker (:mod:`.upr`), a
cross-encoder (:mod:`.cross_encoder`) and the trainable document encoder (:mod:`.doc_encoder`).
"""
