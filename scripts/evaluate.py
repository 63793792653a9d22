#!/usr/bin/env python
"""Score predictions against a KILT gold file; see `rag-evaluate --help` (rag_plugin/cli/evaluate.py)."""
import sys

from rag_plugin.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
