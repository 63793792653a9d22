#!/usr/bin/env python
"""Build a knowledge source; see `rag-build-knowledge --help` (rag_plugin/cli/build_knowledge.py)."""
import sys

from rag_plugin.cli.build_knowledge import main

if __name__ == "__main__":
    sys.exit(main())
