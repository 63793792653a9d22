#!/usr/bin/env python
"""Import precomputed vectors; see `rag-import-knowledge --help` (rag_plugin/cli/import_knowledge.py)."""
import sys

from rag_plugin.cli.import_knowledge import main

if __name__ == "__main__":
    sys.exit(main())
