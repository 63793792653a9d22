"""The real ``rag-serve`` in a subprocess on a free loopback port, for the tests of tests/serving: started with any
options, asked over HTTP (urllib: raw bodies, headers, error statuses), stopped with a signal."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, checkpoint, log_path: Path, options: Sequence[str] = (), workers: int = 1):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        cmd = [str(Path(sys.executable).parent / "rag-serve"), "--path", str(checkpoint), "--port", str(self.port),
               "--workers", str(workers), *options]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, "OMP_NUM_THREADS": "1"})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_up(self, timeout: float = 180.0) -> "LiveServer":
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"rag-serve exited {self.proc.returncode}:\n{self.log()[-3000:]}"
            try:
                if self.get("/v1/health")[1].get("status") == "ok":
                    return self
            except (OSError, ValueError):
                pass
            assert time.monotonic() < deadline, f"rag-serve not up in {timeout:.0f}s:\n{self.log()[-3000:]}"
            time.sleep(0.3)

    def request(self, method: str, path: str, body: Optional[bytes] = None, headers: Optional[dict] = None,
                timeout: float = 120.0) -> Tuple[int, dict, dict]:
        """(status, JSON body (or {"raw": text} when not JSON), response headers); error statuses included."""
        req = urllib.request.Request(self.base + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw, got = resp.status, resp.read(), dict(resp.headers)
        except urllib.error.HTTPError as err:
            status, raw, got = err.code, err.read(), dict(err.headers)
        try:
            return status, json.loads(raw), got
        except ValueError:
            return status, {"raw": raw.decode(errors="replace")}, got

    def get(self, path: str, **kw) -> Tuple[int, dict]:
        return self.request("GET", path, **kw)[:2]

    def post(self, path: str, body, headers: Optional[dict] = None, **kw) -> Tuple[int, dict]:
        """POST ``body`` (a dict or list: JSON; bytes: as is) with Content-Type application/json unless given."""
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.request("POST", path, raw, {"Content-Type": "application/json", **(headers or {})}, **kw)[:2]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send ``sig``; the exit status (killed after ``timeout``: the assertion says so)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"rag-serve did not stop within {timeout:.0f}s of signal {sig}") from None
        return self.proc.returncode
