"""Running the plugin's command lines in a subprocess, as a user would (tests/cli)."""
import os
import subprocess
import sys

from tests.conftest import ROOT


def run_module(module: str, *args, timeout: int = 300, cwd=None) -> subprocess.CompletedProcess:
    """``python -m <module> args`` with this checkout on the path and one torch thread."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=str(cwd or ROOT), env=env)


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit status 2, one ``error: ...`` line on stderr naming every fragment, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
