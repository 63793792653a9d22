"""SIGTERM while rag-serve is still loading its model (one process, and the workers of --workers 2): the signal is not
lost, the service ends with 0 instead of going on to serve. (Found by the full suite: a --workers 2 service asked to
stop while a worker was still loading waited for it for ever, since that worker then served.)"""
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

BIN = Path(sys.executable).parent


def _wait_for(stream, needle: str, limit: float = 120.0) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        line = stream.readline()
        if not line:
            raise AssertionError(f"rag-serve ended before printing {needle!r}")
        if needle in line:
            return
    raise AssertionError(f"rag-serve printed no {needle!r} within {limit:.0f}s")


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_while_loading_ends_the_service(trained, tiny_world, workers):
    proc = subprocess.Popen([str(BIN / "rag-serve"), "--path", str(trained["rag_token_tiny"]), "--knowledge",
                             str(tiny_world["ks"]), "--port", "0", "--workers", str(workers)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        if workers == 1:  # the model is being built (its handler installed before): stop it there
            _wait_for(proc.stderr, "trainable parameters")
        else:  # the parent is up, its workers loading
            _wait_for(proc.stdout, "workers loading")
            time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
