"""Zero-shot late interaction over any first stage, without a checkpoint: ``rag-search --rerank maxsim`` and the
service's ``/v1/search`` rerank with it. The knowledge source's own encoder scores each of the first stage's L
candidates by ColBERT's MaxSim (:mod:`rag_plugin.reranking.maxsim`); the best K are kept by
:func:`rag_plugin.reranking.stage.rerank`. Also :func:`found`: a reranked batch back as a
:class:`~rag_plugin.retrieval.retriever.Retrieval`."""
from pathlib import Path
from types import SimpleNamespace
from typing import List


def found(scores, rows, store):
    """A Retrieval of a reranked batch: the logits [B, K] and rows Long[B, K] (tensors); a row the stage held out
    as missing (its logit ``NO_ROW``, its row read as 0) is -1 again."""
    import torch  # loaded by the search already

    from rag_plugin.reranking.stage import NO_ROW
    from rag_plugin.retrieval.retriever import Retrieval

    scores, rows = scores.detach().float().cpu(), rows.cpu()
    rows = torch.where(scores.le(NO_ROW / 2), torch.full_like(rows, -1), rows)
    return Retrieval(rows=rows.numpy().astype("int64"), scores=scores.numpy(), store=store)


# ------------------------------------------------------------------ without --path: zero-shot MaxSim
class LateInteraction:
    """``--rerank maxsim`` over a first stage's candidates with the knowledge source's own encoder (no checkpoint):
    ``search(questions)`` -> the best ``k`` of the first stage's ``depth`` by MaxSim."""

    def __init__(self, first_stage, knowledge, encoder, k: int, depth: int, device):
        from rag_plugin.reranking.maxsim import MaxSimReranker, PassageStates, check_token_states
        from rag_plugin.retrieval.encoders import lower_states
        from rag_plugin.util.devices import resolve_device

        check_token_states(encoder, knowledge)  # the scorer's own one-line errors
        self.first_stage, self.encoder, self.k, self.depth = first_stage, encoder, k, depth
        self.device = resolve_device(device)
        encoder.to(self.device)  # the query tower reads the questions, the passage tower the candidates
        states = PassageStates(encoder, Path(knowledge.root) / lower_states.DIR_NAME)
        # the knowledge source's own query BERT (not a copy: nothing trains it here), in eval mode
        self.reranker = MaxSimReranker(encoder.query_tower.bert_model, states).eval()
        self.model = SimpleNamespace(retriever=SimpleNamespace(store=first_stage.store))  # what the scorer reads

    def search(self, questions: List[str]):
        import torch  # loaded at construction

        from rag_plugin.reranking.base import RerankBatch
        from rag_plugin.reranking.stage import rerank

        first = self.first_stage.search(questions, self.depth)
        ids, mask, _ = self.encoder.collate(self.encoder.tokenize_queries(questions))
        batch = RerankBatch(rows=torch.from_numpy(first.rows), first_stage=torch.from_numpy(first.scores).float(),
                            src_tokens=torch.zeros((len(questions), 0), dtype=torch.long),  # no generator here
                            query_tokens=ids.to(self.device), query_mask=mask.bool().to(self.device))
        with torch.inference_mode():
            scores, rows = rerank(self.reranker, self.model, batch, self.k, grad=False)
        return found(scores, rows, first.store)


def knowledge_and_encoder(first_stage, knowledge):
    """The knowledge source and encoder behind a first stage (the dense side's, loaded once), else ``knowledge``
    and its encoder (BM25)."""
    dense = getattr(first_stage, "dense", first_stage)
    if getattr(dense, "encoder", None) is not None and getattr(dense, "knowledge", None) is not None:
        return dense.knowledge, dense.encoder
    return knowledge, knowledge.load_encoder()
