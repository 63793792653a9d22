#!/usr/bin/env python
"""Pretraining records from passages; see `rag-pretraining-data --help` (rag_plugin/cli/pretraining_data.py)."""
import sys

from rag_plugin.cli.pretraining_data import main

if __name__ == "__main__":
    sys.exit(main())
