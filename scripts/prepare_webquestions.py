#!/usr/bin/env python
"""Prepare WebQuestions for rag_plugin (see docs/datasets.md; `--help` lists the options).

A thin wrapper around rag_plugin.datasets.prepare.qa_main: bad input -> one `error:` line, exit 2.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from rag_plugin.datasets.prepare import qa_main  # noqa: E402
from rag_plugin.util.errors import cli_main  # noqa: E402


@cli_main
def main(argv=None):
    return qa_main("webquestions", argv)


if __name__ == "__main__":
    sys.exit(main())
