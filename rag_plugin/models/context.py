"""What a RAG model receives from its task at construction: the retrieval context.

The model never reaches into the task or the knowledge source for these; the task builds one
:class:`RetrievalContext` per model (``RetrievalAugmentedTask.retrieval_context``) from its
knowledge source and options.
"""
from dataclasses import dataclass, field
from typing import Optional

from rag_plugin.core.input_format import InputFormat


@dataclass
class RetrievalContext:
    #: documents per question (K); 0 = closed book
    n_docs: int
    #: the generator input format the knowledge source's passages are pre-tokenized for
    input_format: InputFormat
    #: a :class:`rag_plugin.retrieval.retriever.Retriever` (dense: searched with the model's query
    #: encoder; BM25: rows fixed per question by the dataset, the retriever gives the passages), or None
    retriever: Optional[object] = None
    #: p(z|x) = softmax(scale * q.d), the automatic value already resolved
    doc_score_scale: float = 1.0
    #: what the model is trained with, saved in its checkpoints (encoder identity, knowledge source
    #: path, passage-store hash, count, input format, generator tokenizer hashes)
    identity: dict = field(default_factory=dict)
    #: the knowledge source, for the checks a checkpoint's record is held against (or None)
    knowledge: Optional[object] = None

    def check_trained_encoder(self, encoder_identity: dict) -> None:
        """A one-line error if the checkpoint's document encoder is not this knowledge source's."""
        if self.knowledge is not None and self.retriever is not None and encoder_identity:
            self.knowledge.check_encoder(encoder_identity, what="the checkpoint's document encoder")
