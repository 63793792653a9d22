"""What a deep copy of a model shares instead of copying: the read-only, file-backed parts of retrieval.

fairseq's ``--store-ema`` keeps its moving average in ``copy.deepcopy(model)``, and so may any program that
copies a model. A RAG model refers to its knowledge source (passage store, vectors and FAISS index, mapped
read-only and shared by the processes of a node), its retriever and retrieval context: copied, the mapped
vectors would become a private in-memory array (64 GB per process for 21M x 768 floats), the FAISS index a
private copy, and the version's shared lock a second owner of one file descriptor, closed twice. None of
them is ever written through a model, so a copy shares them, as two models built by one task do.
"""


class SharedOnCopy:
    """``copy.deepcopy`` returns the object itself (a shallow ``copy.copy`` is unchanged)."""

    def __deepcopy__(self, memo):
        memo[id(self)] = self
        return self
