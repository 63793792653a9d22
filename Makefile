# The two commands of the README. Each one sets up .venv first (idempotent, cached).
PY := .venv/bin/python

.PHONY: demo test setup
setup:
	bash scripts/bootstrap.sh

demo: setup
	$(PY) examples/demo/run_demo.py

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q tests
