import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class HashingEncoder:
    """A deterministic bag-of-words encoder for fast tests (hashing trick, L2-normalised).

    Same interface as rag_plugin.retrieval.encoders.TextEncoder where the knowledge-source
    code uses it: dim, encode_passages, encode_queries, identity.
    """

    def __init__(self, dim: int = 64):
        self.dim = dim

    def _vec(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, dtype=np.float32)
        for w in text.lower().replace(".", " ").replace("?", " ").split():
            h = int(hashlib.md5(w.encode()).hexdigest(), 16)
            v[h % self.dim] += 1.0 if (h >> 64) % 2 else -1.0
        n = np.linalg.norm(v)
        return v / n if n else v

    def encode_queries(self, questions, batch_size=64, progress=False):
        return np.stack([self._vec(q) for q in questions])

    def encode_passages(self, titles, texts, batch_size=64, progress=False):
        return np.stack([self._vec(f"{t} {x}") for t, x in zip(titles, texts)])

    def identity(self):
        return {"name": "hashing", "dim": self.dim, "pooling": "none",
                "passage_weights_sha256": "hashing", "query_weights_sha256": "hashing"}


@pytest.fixture
def hashing_encoder():
    return HashingEncoder()


def write_jsonl(path: Path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega red green blue river mountain city king queen").split()


def synthetic_passages(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        words = rng.choice(WORDS, size=int(rng.integers(8, 20)))
        rows.append({"id": f"p{i}", "title": f"Title {i}", "text": " ".join(words) + f" unique{i}"})
    return rows


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    from tests.tiny_world import make_world

    return make_world(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="session")
def command_line_hooks():
    """The fairseq command-line hooks of rag_plugin.fairseq_hooks, installed in this test process as
    fairseq-train --user-dir rag_plugin installs them (for tests of the hooks themselves)."""
    import rag_plugin
    from rag_plugin import fairseq_hooks

    rag_plugin.register()
    assert fairseq_hooks.install()


def _train_tiny(world, tmp: Path, arch: str) -> Path:
    save = tmp / arch
    cmd = [str(Path(sys.executable).parent / "fairseq-train"), str(world["data"]), "--user-dir", "rag_plugin",
           "--task", "retrieval_augmented", "--knowledge", str(world["ks"]), "--arch", arch,
           "--criterion", "marginal_nll", "--n-docs", "3", "--optimizer", "adam", "--lr", "1e-3",
           "--batch-size", "8", "--max-update", "2", "--save-dir", str(save), "--cpu", "--num-workers", "0",
           "--no-progress-bar", "--no-epoch-checkpoints", "--disable-validation"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return save / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def trained(tiny_world, tmp_path_factory):
    """rag_token_tiny and rag_seq_tiny trained two updates on the tiny world (the hub's and generation's tests)."""
    tmp = tmp_path_factory.mktemp("gen")
    return {arch: _train_tiny(tiny_world, tmp, arch) for arch in ("rag_token_tiny", "rag_seq_tiny")}


def assert_one_line_error(proc, *needles):
    """A command line that failed on bad input: exit 2, one ``error: ...`` line on stderr holding every needle."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def build_hashing_knowledge_source(tmp_path, n=300, factory="Flat", num_shards=1, name="ks", **kw):
    """A knowledge source of ``n`` synthetic passages embedded by :class:`HashingEncoder` (seconds),
    its index in ``num_shards`` shards, in ``tmp_path/name``."""
    from rag_plugin.indexing import BuildHooks, BuildOptions, BuildSettings, build_knowledge_source

    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(n))
    settings = BuildSettings(passages=str(src), encoder="hashing", index_factory=factory, num_shards=num_shards)
    return build_knowledge_source(str(tmp_path / name), settings,
                                  BuildOptions(shard_size=64, progress=False, log=lambda m: None, **kw),
                                  BuildHooks(encoder=HashingEncoder()))
