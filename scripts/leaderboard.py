#!/usr/bin/env python
"""Rank several systems on one gold file; see `rag-leaderboard --help` (rag_plugin/cli/leaderboard.py)."""
import sys

from rag_plugin.cli.leaderboard import main

if __name__ == "__main__":
    sys.exit(main())
