"""Progress of a generation run, logged as it goes: questions done, seconds per question, time left.

fairseq-generate shows its own progress only every ``--log-interval`` batches (100 by default), so a
RAG-Sequence run at a large K (Thorough rescoring grows with K x the number of distinct hypotheses)
printed nothing for minutes. The task logs one line every ``--progress-interval`` seconds.
"""
import logging
import time
from typing import Optional

logger = logging.getLogger(__name__)


class GenerationProgress:
    def __init__(self, interval: float, expected: Optional[int] = None, clock=time.monotonic):
        self.interval, self.expected, self.clock = interval, expected, clock
        self.start: Optional[float] = None
        self.last = 0.0
        self.done = 0

    def update(self, n: int) -> Optional[str]:
        """``n`` more questions answered; returns (and logs) the progress line when one is due."""
        now = self.clock()
        if self.start is None:
            self.start, self.last = now, now
        self.done += n
        finished = self.expected is not None and self.done >= self.expected
        if self.interval < 0 or (now - self.last < self.interval and not finished):
            return None
        self.last = now
        per = (now - self.start) / max(self.done, 1)
        line = f"generated {self.done}" + (f"/{self.expected}" if self.expected else "") + \
            f" questions ({per:.2f} s/question"
        if self.expected and not finished:
            line += f", about {per * (self.expected - self.done):.0f} s left"
        line += ")"
        logger.info(line)
        return line
