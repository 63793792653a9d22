#!/usr/bin/env python
"""Plot RAG-Token's document posterior; see `rag-plot-posterior --help` (rag_plugin/cli/plot_doc_posterior.py)."""
import sys

from rag_plugin.cli.plot_doc_posterior import main

if __name__ == "__main__":
    sys.exit(main())
