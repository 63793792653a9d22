"""Interruptions (a real SIGKILL) and determinism.

* A knowledge-source build killed again and again, at different stages, is never loadable
  half-built, and the rerun of the same command finishes with what an uninterrupted build
  makes.
* fairseq-train killed right after a checkpoint resumes from ``checkpoint_last.pt`` at the saved
  update, and ends with exactly the parameters of an uninterrupted run with the same seed (the
  losses of every update are the same too: same seed, same losses).
* fairseq-generate twice gives the same hypotheses, scores and retrieved documents (Z lines),
  and ``--provenance-out`` lands complete (no ``.partial`` left), identical both times.
* The same build settings and seed give the same index, byte for byte, and the same hits.
"""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rag_plugin.indexing import BuildHooks, BuildOptions, BuildSettings, build_knowledge_source
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.retrieval.retriever import DenseRetriever
from rag_plugin.util.errors import UserError
from tests.conftest import HashingEncoder, synthetic_passages, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return env


# ------------------------------------------------------------------------------------ knowledge build
BUILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    from tests.conftest import HashingEncoder
    from rag_plugin.indexing import BuildHooks, BuildOptions, BuildSettings, build_knowledge_source

    class Slow(HashingEncoder):
        def encode_passages(self, titles, texts, **kw):
            time.sleep(0.15)
            return super().encode_passages(titles, texts)

    s = BuildSettings(passages={src!r}, encoder="hashing", index_factory="Flat")
    build_knowledge_source({out!r}, s, BuildOptions(shard_size=50, progress=False, log=print),
                           BuildHooks(encoder=Slow()))
    print("BUILT", flush=True)
""")


def _stage(out: Path) -> str:
    if (out / "manifest.json").exists():
        return "complete"
    if (out / "vectors.npy").exists():
        return "vectors written"
    shards = len(list((out / ".build" / "shards").glob("*.npy"))) if (out / ".build" / "shards").is_dir() else 0
    if shards:
        return f"{shards} shards"
    return "passages" if (out / ".build").exists() else "nothing"


def _check_loadable_only_when_complete(out: Path, n: int) -> None:
    if not (out / "manifest.json").exists():
        if out.exists():
            with pytest.raises(UserError, match="not a complete knowledge source"):
                KnowledgeSource(str(out))
        return
    ks = KnowledgeSource(str(out))  # complete: everything checks out
    assert len(ks) == n and ks.index.ntotal == n


def test_build_killed_at_every_stage_never_loads_half_built_and_resumes(tmp_path):
    n = 400
    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(n))
    out = tmp_path / "ks"
    script = tmp_path / "build.py"
    script.write_text(BUILD.format(root=str(ROOT), src=str(src), out=str(out)))

    def reached(target):
        shards = out / ".build" / "shards"
        count = len(list(shards.glob("*.npy"))) if shards.is_dir() else 0
        return {"started": (out / ".build" / "settings.json").exists(), "1 shard": count >= 1,
                "4 shards": count >= 4, "7 shards": count >= 7}[target]

    stages = []
    for target in ("started", "1 shard", "4 shards", "7 shards"):
        proc = subprocess.Popen([sys.executable, str(script)], env=_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while proc.poll() is None and not reached(target) and time.time() < deadline:
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        stages.append(_stage(out))
        _check_loadable_only_when_complete(out, n)
    assert any(s != "complete" for s in stages), stages   # at least one kill landed mid-build
    r = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=240)
    assert "BUILT" in r.stdout, r.stderr[-3000:]
    ks = KnowledgeSource(str(out))
    assert len(ks) == n and not (out / ".build").exists()
    fresh = build_knowledge_source(str(tmp_path / "fresh"), BuildSettings(passages=str(src), encoder="hashing"),
                                   BuildOptions(shard_size=50, progress=False, log=lambda m: None),
                                   BuildHooks(encoder=HashingEncoder()))
    np.testing.assert_array_equal(np.asarray(ks.vectors), np.asarray(fresh.vectors))
    assert [ks.passages.id(i) for i in range(n)] == [fresh.passages.id(i) for i in range(n)]
    print("stages killed at:", stages)


def test_same_settings_and_seed_give_the_same_index_and_hits(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(600))
    built = []
    for name in ("a", "b"):
        settings = BuildSettings(passages=str(src), encoder="hashing", index_factory="IVF8,Flat", seed=7,
                                 train_size=400)  # a sample of the vectors, drawn with the seed
        built.append(build_knowledge_source(str(tmp_path / name), settings,
                                            BuildOptions(progress=False, log=lambda m: None),
                                            BuildHooks(encoder=HashingEncoder())))
    assert (tmp_path / "a" / "index.faiss").read_bytes() == (tmp_path / "b" / "index.faiss").read_bytes()
    questions = [built[0].passages.text(i) for i in range(0, 600, 37)]
    hits = []
    for ks in built:
        ks.set_search_params(nprobe=2)
        res = DenseRetriever(ks, encoder=HashingEncoder()).search(questions, k=5)
        hits.append((res.ids(), res.scores))
    assert hits[0][0] == hits[1][0]
    np.testing.assert_array_equal(hits[0][1], hits[1][1])


# ------------------------------------------------------------------------------------ training
def _train_cmd(world, save_dir):
    return [str(BIN / "fairseq-train"), str(world["data"]), "--user-dir", str(ROOT / "rag_plugin"),
            "--task", "retrieval_augmented", "--knowledge", str(world["ks"]), "--arch", "rag_token_tiny",
            "--criterion", "marginal_nll", "--n-docs", "3", "--optimizer", "adam", "--lr", "1e-3",
            "--batch-size", "8", "--max-update", "6", "--save-interval-updates", "2", "--keep-interval-updates", "1",
            "--no-epoch-checkpoints", "--disable-validation", "--seed", "1", "--save-dir", str(save_dir), "--cpu",
            "--num-workers", "0", "--no-progress-bar", "--log-interval", "1", "--log-format", "simple"]


def _losses(log):
    """{update: loss} from the train_inner lines."""
    return {int(u): float(v) for v, u in re.findall(r"train_inner \| .*? loss=([0-9.]+),.*?num_updates=(\d+)", log)}


def _weights(path):
    state = torch.load(path, map_location="cpu", weights_only=False)["model"]  # our own files
    return {k: v for k, v in state.items() if torch.is_tensor(v)}


@pytest.fixture(scope="module")
def runs(tiny_world, tmp_path_factory):
    """An uninterrupted run (6 updates, a checkpoint every 2) and the same command killed with
    SIGKILL once update 2 was saved, then rerun."""
    tmp = tmp_path_factory.mktemp("interrupt")
    straight = subprocess.Popen(_train_cmd(tiny_world, tmp / "straight"), cwd=tmp, env=_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = subprocess.Popen(_train_cmd(tiny_world, tmp / "killed"), cwd=tmp, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    before = []
    for line in killed.stdout:
        before.append(line)
        if re.search(r"Saved checkpoint \S+ \(epoch \d+ @ 2 updates", line):
            killed.send_signal(signal.SIGKILL)
            break
    before.append(killed.communicate()[0])
    straight_log = straight.communicate(timeout=300)[0]
    assert straight.returncode == 0, straight_log[-3000:]
    assert killed.returncode == -signal.SIGKILL, "".join(before)[-3000:]
    saved = torch.load(tmp / "killed" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    saved_updates = saved["optimizer_history"][-1]["num_updates"]
    resumed = subprocess.run(_train_cmd(tiny_world, tmp / "killed"), cwd=tmp, env=_env(), capture_output=True,
                             text=True, timeout=300)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    return {"dir": tmp, "straight": straight_log, "before": "".join(before), "saved_updates": saved_updates,
            "resumed": resumed.stdout + resumed.stderr}


def test_killed_training_resumes_from_the_saved_update(runs):
    assert runs["saved_updates"] >= 2
    m = re.search(r"Loaded checkpoint (\S+) \(epoch \d+ @ (\d+) updates\)", runs["resumed"])
    assert m, runs["resumed"][-3000:]
    assert Path(m.group(1)).name == "checkpoint_last.pt" and int(m.group(2)) == runs["saved_updates"]
    resumed = _losses(runs["resumed"])
    assert min(resumed) == runs["saved_updates"] + 1 and max(resumed) == 6


def test_same_seed_same_losses_and_resume_is_exact(runs):
    straight = _losses(runs["straight"])
    assert sorted(straight) == list(range(1, 7))
    before, after = _losses(runs["before"]), _losses(runs["resumed"])
    for update, loss in {**before, **after}.items():  # every logged update, before the kill and after
        assert loss == straight[update], (update, loss, straight[update])
    a = _weights(runs["dir"] / "straight" / "checkpoint_last.pt")
    b = _weights(runs["dir"] / "killed" / "checkpoint_last.pt")
    assert a.keys() == b.keys()
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert not different, different[:5]


def test_generation_is_deterministic_and_provenance_lands_complete(runs, tiny_world):
    outputs = []
    for name in ("straight", "killed"):
        prov = runs["dir"] / f"prov_{name}.jsonl"
        cmd = [str(BIN / "fairseq-generate"), str(tiny_world["data"]), "--user-dir", str(ROOT / "rag_plugin"),
               "--task", "retrieval_augmented", "--knowledge", str(tiny_world["ks"]),
               "--path", str(runs["dir"] / name / "checkpoint_last.pt"), "--gen-subset", "test", "--n-docs", "3",
               "--beam", "2", "--batch-size", "2", "--cpu", "--num-workers", "0", "--provenance-out", str(prov),
               "--seed", "1"]
        r = subprocess.run(cmd, cwd=runs["dir"], env=_env(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        lines = sorted(x for x in r.stdout.splitlines() if re.match(r"[HDPZ]-\d+\t", x))
        assert sum(x.startswith("D-") for x in lines) == 5 and any(x.startswith("Z-") for x in lines)
        assert prov.is_file() and not prov.with_name(prov.name + ".partial").exists()
        records = [json.loads(x) for x in prov.read_text().splitlines()]
        assert sorted(r["sample_id"] for r in records) == list(range(5))
        outputs.append((lines, sorted(prov.read_text().splitlines())))
    assert outputs[0] == outputs[1]


def test_rerun_of_generate_replaces_provenance_not_appends(runs, tiny_world, tmp_path):
    """An old --provenance-out file is replaced when the new run completes (it used to be
    appended to, doubling every record)."""
    from rag_plugin.generation import provenance

    path = tmp_path / "prov.jsonl"
    path.write_text('{"sample_id": 0, "provenance": []}\n')
    out = provenance.JsonlOutput(str(path), expected=2)
    out.write([{"sample_id": 0, "provenance": [{"id": "a"}]}])
    assert json.loads(path.read_text())["provenance"] == []          # old file untouched so far
    assert path.with_name("prov.jsonl.partial").is_file()
    out.write([{"sample_id": 1, "provenance": []}])
    assert not path.with_name("prov.jsonl.partial").exists()
    assert [json.loads(x)["sample_id"] for x in path.read_text().splitlines()] == [0, 1]
    deep = tmp_path / "new" / "folder" / "prov.jsonl"  # a folder that does not exist yet is made
    provenance.JsonlOutput(str(deep), expected=1).write([{"sample_id": 0, "provenance": []}])
    assert json.loads(deep.read_text())["sample_id"] == 0
