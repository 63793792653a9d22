"""benchmarks/serve_load.py's plumbing: the real ``rag-serve`` in a subprocess on a free loopback port, keep-alive
HTTP clients in threads (each request timed), and what ``/proc`` says about the server's processes (VmRSS, CPU time,
worker processes, the mappings of the knowledge source's files in ``/proc/PID/smaps``). Standard library only."""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
#: smaps fields summed over a file's mappings (kB in smaps, bytes here)
SMAPS_FIELDS = ("Size", "Rss", "Pss", "Shared_Clean", "Shared_Dirty", "Private_Clean", "Private_Dirty", "Anonymous")
JSON = {"Content-Type": "application/json"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------------ the server process
class Server:
    """``rag-serve --path PATH --port FREE *options`` with ``threads`` torch threads (OMP_NUM_THREADS; None: the
    variable removed, torch's default), its output in ``log_path``."""

    def __init__(self, path, options: Sequence[str], log_path: Path, threads: Optional[int] = None,
                 program: Optional[str] = None):
        self.port = free_port()
        self.log_path = Path(log_path)
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        cmd = [program or str(Path(sys.executable).parent / "rag-serve"), "--path", str(path), "--port", str(self.port),
               "--log-level", "warning", *options]
        self.command = " ".join(["rag-serve", *cmd[1:]])
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.pid = self.proc.pid

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_up(self, timeout: float = 300.0) -> "Server":
        """Until ``/v1/health`` says ok (a SystemExit with the log's tail when the server exits or is late)."""
        deadline = time.monotonic() + timeout
        client = Client(self.port)
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"rag-serve exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, body = client.call("GET", "/v1/health")
                if status == 200 and json.loads(body).get("status") == "ok":
                    client.close()
                    return self
            except (OSError, ValueError, http.client.HTTPException):
                client.reconnect()
            if time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"rag-serve not up within {timeout:.0f} s:\n{self.log_tail()}")
            time.sleep(0.3)

    def get(self, path: str) -> dict:
        client = Client(self.port)
        try:
            status, body = client.call("GET", path)
        finally:
            client.close()
        if status != 200:
            raise SystemExit(f"GET {path}: {status} {body[:300]!r}")
        return json.loads(body)

    def stop(self, timeout: float = 120.0) -> Optional[int]:
        """SIGTERM; the exit status (None: killed after ``timeout``)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


# ------------------------------------------------------------------------------------------ clients
class Connection(http.client.HTTPConnection):
    """``http.client``'s connection with TCP_NODELAY, as urllib3 (requests) sets it: http.client sends a request's
    headers and body in two writes, and without it Nagle's algorithm holds the body until the server's delayed ACK
    of the headers (~40 ms on Linux), a client's delay, not the server's."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Client:
    """One keep-alive connection; reconnects after a connection error."""

    def __init__(self, port: int, timeout: float = 300.0):
        self.port, self.timeout = port, timeout
        self.conn = Connection("127.0.0.1", port, timeout=timeout)

    def call(self, method: str, path: str, body: Optional[bytes] = None, headers: Optional[dict] = None,
             close: bool = False) -> Tuple[int, bytes]:
        """(status, body) of one request; ``close``: ask the server to close the connection after it."""
        h = dict(headers or {})
        if close:
            h["Connection"] = "close"
        self.conn.request(method, path, body=body, headers=h)
        resp = self.conn.getresponse()
        data = resp.read()
        if close:
            self.reconnect()
        return resp.status, data

    def reconnect(self) -> None:
        self.conn.close()
        self.conn = Connection("127.0.0.1", self.port, timeout=self.timeout)

    def close(self) -> None:
        self.conn.close()


@dataclass
class Request:
    """One planned request: what it is (``kind``: answer, search, or the malformed kind), its HTTP parts."""

    kind: str
    path: str
    body: bytes
    headers: dict = field(default_factory=lambda: dict(JSON))
    method: str = "POST"
    question: Optional[str] = None


@dataclass
class Outcome:
    kind: str
    status: int             # 0: the connection failed
    latency_ms: float
    body: bytes = b""
    question: Optional[str] = None
    error: Optional[str] = None


def run_clients(port: int, plans: List[List[Request]], keep_bodies=lambda r: False, close: bool = False,
                done: Optional[list] = None) -> Tuple[List[Outcome], float]:
    """Each plan sent in order by its own thread over its own keep-alive connection (``close``: a new connection
    per request), all threads started together; (every outcome, wall seconds from the start to the last response).
    ``keep_bodies(request)``: keep that response's body; ``done``: a list each response appends 1 to (a counter
    another thread can read)."""
    results: List[List[Outcome]] = [[] for _ in plans]
    ready = threading.Barrier(len(plans) + 1)

    def client(i: int) -> None:
        c = Client(port)
        ready.wait()
        for r in plans[i]:
            start = time.perf_counter()
            try:
                status, body = c.call(r.method, r.path, r.body, r.headers, close=close)
                err = None
            except (OSError, http.client.HTTPException) as e:
                status, body, err = 0, b"", f"{type(e).__name__}: {e}"
                c.reconnect()
            ms = 1000.0 * (time.perf_counter() - start)
            results[i].append(Outcome(r.kind, status, ms, body if keep_bodies(r) or status >= 500 else b"",
                                      r.question, err))
            if done is not None:
                done.append(1)
        c.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(plans))]
    for t in threads:
        t.start()
    ready.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return [o for rs in results for o in rs], time.perf_counter() - start


def deal(requests: List[Request], clients: int) -> List[List[Request]]:
    """``requests`` dealt round-robin to ``clients`` (each client's share, in order)."""
    return [requests[i::clients] for i in range(clients)]


# ------------------------------------------------------------------------------------------ /proc
def status_kib(pid: int, name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise KeyError(name)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> List[int]:
    """The processes whose parent is ``pid`` (``/proc/*/stat``'s ppid)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return sorted(out)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class RssSampler(threading.Thread):
    """VmRSS of ``pid`` every ``interval`` seconds with ``len(done)`` (requests answered so far) beside it."""

    def __init__(self, pid: int, done: list, interval: float):
        super().__init__(daemon=True)
        self.pid, self.done, self.interval = pid, done, interval
        self.samples: List[Tuple[int, int]] = []  # (requests done, VmRSS kB)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.samples.append((len(self.done), status_kib(self.pid, "VmRSS")))
            except (OSError, KeyError):
                return
            self._halt.wait(self.interval)

    def finish(self) -> List[Tuple[int, int]]:
        self._halt.set()
        self.join()
        return self.samples


def file_inodes(directory: Path) -> Dict[Tuple[int, int], str]:
    """(device, inode) -> the file's path relative to ``directory``, for every file under it (mappings are matched
    by inode: a hard-linked file maps under whichever name it was opened by)."""
    out = {}
    for p in sorted(Path(directory).rglob("*")):
        if p.is_file():
            st = p.stat()
            out[(st.st_dev, st.st_ino)] = str(p.relative_to(directory))
    return out


def mapped_files(pid: int, inodes: Dict[Tuple[int, int], str]) -> Dict[str, Dict[str, int]]:
    """For each file of ``inodes`` that ``pid`` maps: SMAPS_FIELDS summed over its mappings, in bytes."""
    out: Dict[str, Dict[str, int]] = {}
    current = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and not parts[0].endswith(":"):  # a mapping's header line
            current = None
            if len(parts) >= 6:
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                name = inodes.get((os.makedev(major, minor), int(parts[4])))
                if name is not None:
                    current = out.setdefault(name, dict.fromkeys(SMAPS_FIELDS, 0))
        elif current is not None and parts and parts[0].rstrip(":") in SMAPS_FIELDS:
            current[parts[0].rstrip(":")] += int(parts[1]) * 1024
    return out


def rollup(pid: int) -> Dict[str, int]:
    """The process's whole memory (``/proc/PID/smaps_rollup``), bytes, with Private = Private_Clean + _Dirty."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        if name in ("Rss", "Pss", "Pss_Anon", "Pss_File", "Shared_Clean", "Private_Clean", "Private_Dirty",
                    "Anonymous"):
            out[name] = int(value.split()[0]) * 1024
    out["Private"] = out.get("Private_Clean", 0) + out.get("Private_Dirty", 0)
    return out
