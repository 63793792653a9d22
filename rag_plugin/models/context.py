"""What a RAG model receives from its task at construction: the retrieval context.

The model never reaches into the task or the knowledge source for these; the task builds one
:class:`RetrievalContext` per model (``RetrievalAugmentedTask.retrieval_context``) from its
knowledge source and options.
"""
import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from rag_plugin.core.input_format import InputFormat
from rag_plugin.retrieval.retriever import Retriever
from rag_plugin.retrieval.shared import SharedOnCopy
from rag_plugin.util.errors import UserError

logger = logging.getLogger(__name__)

#: the encoder identity fields a model that trains its own document encoder (``--train-doc-encoder``) must share
#: with the knowledge source: the tower's shape and how passages become its inputs, not its weights (those are
#: checked, after loading, against the version's document tower hash: rag_plugin/models/doc_encoder.py)
TRAINED_DOCUMENT_SIDE = ("dim", "pooling", "vocab_sha256", "passage_format", "lowercase", "max_length")


class PassageTokenizer(SharedOnCopy):
    """Passages (titles, texts) -> the document tower's inputs (input_ids, attention_mask, token_type_ids),
    tokenized exactly as the knowledge source's encoder embedded them."""

    def __init__(self, text_encoder):
        self.text_encoder = text_encoder

    def __call__(self, titles, texts):
        return self.collate(self.ids(titles, texts))

    def ids(self, titles, texts):
        """Token ids per passage."""
        return self.text_encoder.tokenize_passages(titles, texts)

    def collate(self, ids):
        """Token ids per passage -> (input_ids, attention_mask, token_type_ids), padded."""
        return self.text_encoder.collate(ids)


@dataclass
class RetrievalContext(SharedOnCopy):
    #: documents per question (K); 0 = closed book
    n_docs: int
    #: the generator input format the knowledge source's passages are pre-tokenized for
    input_format: InputFormat
    #: dense (searched with the model's query vectors), BM25 (rows fixed per question by the dataset) or hybrid;
    #: None closed book (and for a converted model's weights alone)
    retriever: Optional[Retriever] = None
    #: p(z|x) = softmax(scale * q.d), the automatic value already resolved
    doc_score_scale: float = 1.0
    #: what the model is trained with, saved in its checkpoints (encoder identity, knowledge source
    #: path, passage-store hash, count, input format, generator tokenizer hashes)
    identity: dict = field(default_factory=dict)
    #: the knowledge source, for the checks a checkpoint's record is held against (or None)
    knowledge: Optional[object] = None
    #: ``--train-doc-encoder``: (titles, texts) -> the document tower's input tensors (a :class:`PassageTokenizer`)
    passage_tokenizer: Optional[Callable] = None
    #: the model is loaded from a checkpoint to generate or evaluate (fairseq-generate/-validate/-interactive, the
    #: hub), not trained: a document encoder it trained must be the one the open version's vectors come from
    serving: bool = False
    #: the checkpoint served (named in the fix of a mismatch), when the task knows it
    checkpoint: Optional[str] = None
    #: --reranker: L, the first stage's candidates per question the reranker scores (0: no reranking stage)
    rerank_candidates: int = 0

    def __post_init__(self):
        if self.retriever is not None and not isinstance(self.retriever, Retriever):
            raise TypeError(f"{type(self.retriever).__name__} is not a Retriever (rag_plugin/retrieval/retriever.py: "
                            f"trainable, store, search, retrieve)")

    def check_trained_encoder(self, encoder_identity: dict, document_tower_trained: bool = False) -> None:
        """A one-line error if the checkpoint's document encoder is not this knowledge source's. A model that
        trained its own document tower is held to the encoder's shape and tokenization only (its weights are
        checked against the version's document tower hash once loaded)."""
        if self.knowledge is None or self.retriever is None or not encoder_identity:
            return
        if not document_tower_trained:
            self.knowledge.check_encoder(encoder_identity, what="the checkpoint's document encoder")
            return
        mine = self.knowledge.encoder_identity
        differ = [k for k in TRAINED_DOCUMENT_SIDE if k in mine and k in encoder_identity
                  and mine[k] != encoder_identity[k]]
        if differ:
            raise UserError(f"the checkpoint's document encoder (trained with --train-doc-encoder) reads passages "
                            f"unlike this knowledge source's encoder ({', '.join(differ)} differ)",
                            path=str(getattr(self.knowledge, "directory", "")) or None,
                            fix="use a knowledge source built with the encoder the model was trained from")

    def note_trained_retriever(self, trained: dict) -> None:
        """A warning when the checkpoint was trained retrieving otherwise than this run does (``--retriever``,
        hybrid fusion): its query encoder and generator learned from other passages than it now reads."""
        then, now = (trained or {}).get("retriever"), self.identity.get("retriever")
        if then and now and then != now and self.n_docs > 0:
            logger.warning("the checkpoint was trained retrieving with %s; this run retrieves with %s (pass "
                           "--retriever %s to retrieve as it was trained)", then, now, then.split(" (")[0])
