"""The demo's modules live beside its scripts in examples/demo (not in the installable package):
the scripts find them as their own directory is first on sys.path; the tests put it there."""
import sys
from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parents[2] / "examples" / "demo"
if str(DEMO_DIR) not in sys.path:
    sys.path.insert(0, str(DEMO_DIR))
