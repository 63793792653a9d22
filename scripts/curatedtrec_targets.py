#!/usr/bin/env python
"""CuratedTrec regexes -> targets; see `rag-curatedtrec-targets --help` (rag_plugin/cli/curatedtrec_targets.py)."""
import sys

from rag_plugin.cli.curatedtrec_targets import main

if __name__ == "__main__":
    sys.exit(main())
