"""Shared utilities: one-line user errors, atomic writers and the one JSONL reader, safe torch loading."""
