#!/usr/bin/env python
"""Convert a paper dataset's official files; see `rag-prepare --help` (rag_plugin/cli/prepare.py)."""
import sys

from rag_plugin.cli.prepare import main

if __name__ == "__main__":
    sys.exit(main())
