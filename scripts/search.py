#!/usr/bin/env python
"""Search a knowledge source; see `rag-search --help` (rag_plugin/cli/search.py)."""
import sys

from rag_plugin.cli.search import main

if __name__ == "__main__":
    sys.exit(main())
