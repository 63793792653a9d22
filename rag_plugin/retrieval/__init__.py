"""The non-parametric memory: passages -> document encoder -> FAISS index -> retrievers.

Nothing in this package imports fairseq: it is usable on its own.
"""
