"""The service's settings: what ``rag-serve`` is given, in one dataclass (each field's help is the option's)."""
from dataclasses import asdict, dataclass, field, fields
from typing import List, Optional


def _opt(default, help: str, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class ServeSettings:
    path: str = _opt(None, "the checkpoint to serve (checkpoint*.pt)", required=True)
    knowledge: Optional[str] = _opt(None, "knowledge source directory (default: the checkpoint's; another one of "
                                          "the same encoder is a hot swap)")
    host: str = _opt("127.0.0.1", "address to bind (default loopback only; 0.0.0.0 listens on every interface)")
    port: int = _opt(8000, "TCP port (0: a free one, printed at start-up)")
    workers: int = _opt(1, "processes serving the port; each loads the model and maps the knowledge source's index "
                           "shared (the pages are the node's, once)")
    device: str = _opt("cpu", "where the model computes: cpu, cuda, cuda:N")
    n_docs: Optional[int] = _opt(None, "default K, passages per question (default: the checkpoint's)")
    max_k: int = _opt(20, "the largest k a request may ask for")
    max_batch: int = _opt(16, "the most questions answered in one forward (dynamic batching; 1: one at a time)")
    max_wait_ms: float = _opt(5.0, "how long the first request of a batch waits for others to join it (ms)")
    timeout: float = _opt(60.0, "seconds a request may wait for its answer; then 503 and its slot is freed")
    max_pending: int = _opt(256, "requests held at once (queued or computing); more get 503 at once")
    max_question_chars: int = _opt(1000, "the longest question accepted (characters)")
    max_queries: int = _opt(64, "the most queries one /v1/search request may hold")
    max_beam: int = _opt(16, "the largest beam a request may ask for")
    max_len: int = _opt(128, "the longest answer a request may ask for (tokens)")
    admin_token: Optional[str] = _opt(None, "enables POST /v1/reload for requests carrying "
                                            "'Authorization: Bearer TOKEN' (off without it)")
    cors_origin: List[str] = _opt(None, "allow cross-origin requests from this origin (repeatable; none by default)",
                                  action="append")
    log_level: str = _opt("info", "uvicorn's log level (critical, error, warning, info, debug)")
    #: set by the server for --workers N (not an option): the file through which a reload reaches every worker
    reload_stamp: Optional[str] = _opt(None, "", internal=True)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ServeSettings":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
