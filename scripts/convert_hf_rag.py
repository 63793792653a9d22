#!/usr/bin/env python
"""Hugging Face RAG folder -> plugin checkpoint; see `rag-convert-hf --help` (rag_plugin/cli/convert_hf.py)."""
import sys

from rag_plugin.cli.convert_hf import main

if __name__ == "__main__":
    sys.exit(main())
