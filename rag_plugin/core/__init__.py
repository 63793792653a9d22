"""The math every RAG variant shares: the marginalisation formulas and the generator input format (no fairseq)."""
