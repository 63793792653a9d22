"""The test suite; its folders mirror rag_plugin/ (a package, so that tests/ itself is never on sys.path:
tests/datasets must not stand in for the Hugging Face ``datasets`` package)."""
