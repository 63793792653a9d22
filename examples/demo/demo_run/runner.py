"""Runs the demo's commands with the plugin's command runner (:mod:`rag_plugin.pipeline.commands`):
each printed as a user would type it, run from the repository root with its output in a log file,
inside a named, timed step; a failed command stops the demo with the log's path, and rerunning the
demo continues from that step."""
from __future__ import annotations

import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, Optional

from rag_plugin.pipeline import commands

_DONE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d):\d\d \| INFO \| fairseq_cli\.train \| done training in ([0-9.]+) "
                   r"seconds", re.M)
ROOT = Path(__file__).resolve().parents[3]  # the repository (examples/demo/demo_run/runner.py)
DATA = ROOT / "data" / "demo"
KS = DATA / "ks"
KS_SWAP = DATA / "ks_geonames"


class Runner:
    """Runs commands from :data:`ROOT` and times the steps they belong to (``timings``: step -> s)."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log
        self.timings: Dict[str, float] = {}

    def run(self, command: commands.Command, log_file: Optional[Path] = None,
            stdout_file: Optional[Path] = None) -> None:
        """Run ``command`` from :data:`ROOT`; stderr (and stdout, unless ``stdout_file``) to ``log_file``,
        or to the terminal."""
        commands.run(command, log_file=log_file, stdout_file=stdout_file, echo=self.log, cwd=ROOT)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """A named step: announced, timed (also when it fails), its time printed when it succeeds."""
        self.log(f"\n== {name}")
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = round(time.perf_counter() - start, 1)
        self.log(f"   ({self.timings[name]:.0f} s)")


def read_text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def training_done(log_file: Path, updates: int) -> bool:
    """Whether the fairseq-train log says it finished ``updates`` updates."""
    text = read_text(log_file)
    return "done training" in text and f"num_updates {updates}" in text


def complete(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def training_time(log_file: Path) -> Optional[Dict]:
    """When the fairseq-train run of ``log_file`` ended (its log's clock) and its seconds (fairseq's ``done training
    in``), whichever invocation of the demo ran it; None if the log does not say."""
    found = _DONE.findall(read_text(log_file))
    if not found:
        return None
    ended, seconds = found[-1]
    return {"ended": ended, "seconds": float(seconds)}
