import subprocess
import sys
from pathlib import Path

import pytest

import rag_plugin


def _train_tiny(world, tmp: Path, arch: str) -> Path:
    save = tmp / arch
    cmd = [str(Path(sys.executable).parent / "fairseq-train"), str(world["data"]), "--user-dir", "rag_plugin",
           "--task", "retrieval_augmented", "--knowledge", str(world["ks"]), "--arch", arch,
           "--criterion", "marginal_nll", "--n-docs", "3", "--optimizer", "adam", "--lr", "1e-3",
           "--batch-size", "8", "--max-update", "2", "--save-dir", str(save), "--cpu", "--num-workers", "0",
           "--no-progress-bar", "--no-epoch-checkpoints", "--disable-validation"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=rag_plugin.__path__[0] + "/..", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return save / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def trained(tiny_world, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gen")
    return {arch: _train_tiny(tiny_world, tmp, arch) for arch in ("rag_token_tiny", "rag_seq_tiny")}


