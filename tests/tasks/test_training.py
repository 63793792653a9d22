"""fairseq-train end to end on the tiny world: resume, safe checkpoint loading, closed book,
frozen query encoder, and one-line errors for bad input (subprocesses of the real CLI)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rag_plugin.util.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FAIRSEQ_TRAIN = str(BIN / "fairseq-train")


def _args(world, save_dir, data=None, knowledge=None, n_docs=3, arch="rag_token_tiny", extra=()):
    return [FAIRSEQ_TRAIN, str(data or world["data"]), "--user-dir", str(ROOT / "rag_plugin"),
            "--task", "retrieval_augmented", "--knowledge", str(knowledge or world["ks"]),
            "--arch", arch, "--criterion", "marginal_nll", "--n-docs", str(n_docs),
            "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8", "--seed", "1",
            "--save-dir", str(save_dir), "--cpu", "--num-workers", "0", "--no-progress-bar",
            "--log-interval", "1", "--log-format", "simple", *extra]


def _env(threads=None):
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # safe loading must be on, as by default
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _run(cmd, cwd, timeout=240, threads=None):
    proc = subprocess.run(cmd, cwd=cwd, env=_env(threads), capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def _updates(log):
    return [int(x) for x in re.findall(r"train_inner \|.*?num_updates=(\d+)", log)]


def _load(path):
    """Through fairseq's own loader (plain torch.load, torch's default weights_only=True), with the
    plugin's allow-list in scope (as the hub loads)."""
    from rag_plugin.hub import load_fairseq_checkpoint

    return load_fairseq_checkpoint(str(path))


class _Job:
    """A fairseq-train subprocess started now, waited for when its result is needed."""

    def __init__(self, cmd, cwd, threads=1):
        self.cwd = Path(cwd)
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=_env(threads), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self._result = None

    def result(self, timeout=300):
        if self._result is None:
            out, err = self.proc.communicate(timeout=timeout)
            self._result = (self.proc.returncode, out, err)
        return self._result

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture(scope="module")
def background(tiny_world, tmp_path_factory):
    """Independent training runs, started together so that they share the cores with the
    resume runs: closed book (--n-docs 0) and --freeze-query-encoder (2 updates each, a
    checkpoint after each update)."""
    jobs = {}
    for name, n_docs, extra in (("closed_book", 0, []), ("frozen", 3, ["--freeze-query-encoder"])):
        tmp = tmp_path_factory.mktemp(name)
        jobs[name] = _Job(_args(tiny_world, tmp / "ckpt", n_docs=n_docs,
                                extra=["--max-update", "2", "--save-interval-updates", "1", *extra]), tmp)
    yield jobs
    for job in jobs.values():
        job.kill()


@pytest.fixture(scope="module")
def one_epoch(background, tiny_world, tmp_path_factory):
    """A run of 1 epoch (3 updates of 8 questions), then the same command with --max-epoch 2."""
    tmp = tmp_path_factory.mktemp("resume")
    save = tmp / "ckpt"
    rc1, out1, err1 = _run(_args(tiny_world, save, extra=["--max-epoch", "1"]), tmp, threads=1)
    assert rc1 == 0, (out1 + err1)[-4000:]
    rc2, out2, err2 = _run(_args(tiny_world, save, extra=["--max-epoch", "2"]), tmp, threads=1)
    assert rc2 == 0, (out2 + err2)[-4000:]
    return {"dir": tmp, "save": save, "log1": out1 + err1, "log2": out2 + err2}


# ------------------------------------------------------------------------------------ (a) resume
def test_rerun_resumes_from_checkpoint_last(one_epoch):
    first = _updates(one_epoch["log1"])
    assert first and first[0] == 1
    saved = first[-1]
    log2 = one_epoch["log2"]
    m = re.search(r"Loaded checkpoint (\S+) \(epoch (\d+) @ (\d+) updates\)", log2)
    assert m, log2[-4000:]
    assert Path(m.group(1)).name == "checkpoint_last.pt"
    # saved at the end of epoch 1: fairseq reports the epoch to run next
    assert int(m.group(3)) == saved and int(m.group(2)) == 2
    second = _updates(log2)
    assert second and second[0] == saved + 1, second   # continues, not from 0
    assert "epoch 002" in log2 and "epoch 001:" not in log2


# ------------------------------------------------------------------------------------ (b) safe loading
def test_checkpoints_load_with_weights_only(one_epoch):
    state = _load(one_epoch["save"] / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == _updates(one_epoch["log2"])[-1]
    assert state["cfg"]["model"]["_name"] == "rag_token_tiny"
    assert any(k.startswith("query_encoder.") for k in state["model"])
    assert any(k.startswith("generator.") for k in state["model"])


class _Payload:
    """Runs a shell command when unpickled (what a malicious checkpoint does)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_checkpoint_is_refused(tiny_world, one_epoch, tmp_path):
    marker = tmp_path / "PWNED"
    save = tmp_path / "ckpt"
    save.mkdir()
    good = torch.load(one_epoch["save"] / "checkpoint_last.pt", weights_only=False)  # our own file
    good["extra_state"]["payload"] = _Payload(marker)
    torch.save(good, save / "checkpoint_last.pt")
    assert not marker.exists()

    with pytest.raises(UserError, match=r"refers to (os|posix)\.system\); refused to load, nothing in it was run"):
        _load(save / "checkpoint_last.pt")
    assert not marker.exists()

    rc, out, err = _run(_args(tiny_world, save, extra=["--max-epoch", "2"]), tmp_path)
    assert rc != 0, (out + err)[-4000:]
    assert not marker.exists(), "the checkpoint's payload ran"
    assert "num_updates=" not in out + err
    assert re.search(r"weights_only|Unsupported global|system", out + err), (out + err)[-4000:]


# ------------------------------------------------------------------------------------ (c) closed book
def test_n_docs_0_trains_closed_book_baseline(background):
    job = background["closed_book"]
    rc, out, err = job.result()
    assert rc == 0, (out + err)[-4000:]
    assert _updates(out + err) == [1, 2]
    assert "query encoder none" in out + err
    state = _load(job.cwd / "ckpt" / "checkpoint_last.pt")
    assert not any(k.startswith("query_encoder.") for k in state["model"])


# ------------------------------------------------------------------------------------ (d) frozen q
def _prefixed(state, prefix):
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def _effective(state, scale):
    """A query encoder's weights as used: ``X.parametrizations.W.original`` (the lr reparametrisation) x scale."""
    out = {}
    for key, value in state.items():
        if ".parametrizations." in key and key.endswith(".original"):
            head, rest = key.split(".parametrizations.", 1)
            out[f"{head}.{rest[: -len('.original')]}"] = value * scale
        else:
            out[key] = value
    return out


def test_freeze_query_encoder(tiny_world, background, one_epoch):
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    job = background["frozen"]
    rc, out, err = job.result()
    assert rc == 0, (out + err)[-4000:]
    save = job.cwd / "ckpt"
    initial = KnowledgeSource(str(tiny_world["ks"])).load_encoder().query_tower.state_dict()
    ep1 = _load(save / "checkpoint_1_1.pt")["model"]   # after update 1
    ep2 = _load(save / "checkpoint_1_2.pt")["model"]   # after update 2
    q1, q2 = _prefixed(ep1, "query_encoder."), _prefixed(ep2, "query_encoder.")
    assert q2 and set(q2) == set(initial)
    for k, v in initial.items():
        assert torch.equal(q1[k], v) and torch.equal(q2[k], v), k
    g1, g2 = _prefixed(ep1, "generator."), _prefixed(ep2, "generator.")
    assert any(not torch.equal(g1[k], g2[k]) for k in g1 if g1[k].is_floating_point())
    # contrast: without the flag, the gradient through p(z|x) does move the query encoder (trained at the
    # default scale, min(1, 3e-5 / --lr) = 0.03 at --lr 1e-3: stored as weight / 0.03 under parametrizations)
    trained = _effective(_prefixed(_load(one_epoch["save"] / "checkpoint_last.pt")["model"], "query_encoder."), 0.03)
    assert set(trained) == set(initial)
    assert any(not torch.equal(trained[k], v) for k, v in initial.items() if v.is_floating_point())


# ------------------------------------------------------------------------------------ (e) bad input
def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


GOOD = {"id": "g", "input": "What is the capital of X?", "output": [{"answer": "Y"}]}


def _bad_cases(world, tmp):
    """name -> (command, text the message must contain)."""
    valid = (world["data"] / "valid.jsonl").read_text()

    def data_with(name, train_rows):
        d = tmp / name
        _jsonl(d / "train.jsonl", train_rows)
        (d / "valid.jsonl").write_text(valid)
        return d

    no_valid = tmp / "no_valid"
    _jsonl(no_valid / "train.jsonl", [GOOD])
    no_manifest = tmp / "ks_no_manifest"
    no_manifest.mkdir()
    fake_bart = tmp / "fake_bart.pt"
    torch.save({"model": {"encoder.embed_tokens.weight": torch.zeros(10, 256),
                          "decoder.embed_tokens.weight": torch.zeros(10, 256)}}, fake_bart)
    save = tmp / "never"
    return {
        "missing valid split": (_args(world, save, data=no_valid), "valid"),
        "line without input": (_args(world, save,
                                     data=data_with("no_input", [GOOD, {"id": "x", "output": [{"answer": "a"}]}])),
                               "input"),
        "line without output": (_args(world, save, data=data_with("no_output", [GOOD, {"id": "x", "input": "q?"}])),
                                "output"),
        "empty answer": (_args(world, save, data=data_with("empty_answer", [GOOD, {"id": "x", "input": "q?",
                                                                                   "output": [{"answer": " "}]}])),
                         "answer"),
        "knowledge dir missing": (_args(world, save, knowledge=tmp / "no_such_ks"), "not found"),
        "knowledge without manifest": (_args(world, save, knowledge=no_manifest), "manifest"),
        "n-docs above collection": (_args(world, save, n_docs=len(world["countries"]) + 1), "n-docs"),
        "generator embeddings mismatch": (_args(world, save, extra=["--generator-checkpoint", str(fake_bart)]),
                                          "embeddings"),
    }


def test_bad_inputs_fail_with_one_line_error(tiny_world, tmp_path):
    cases = _bad_cases(tiny_world, tmp_path)
    names = list(cases)
    results, running = {}, {}
    while names or running:   # at most 4 at a time
        while names and len(running) < 4:
            name = names.pop(0)
            running[name] = _Job(cases[name][0] + ["--max-update", "1"], tmp_path)
        name = next(iter(running))
        results[name] = running.pop(name).result()
    failures = []
    for name, (returncode, out, err) in results.items():
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        problems = []
        if returncode != 2:
            problems.append(f"exit {returncode}")
        if len(errors) != 1:
            problems.append(f"{len(errors)} error lines")
        elif cases[name][1].lower() not in errors[0].lower():
            problems.append(f"message lacks {cases[name][1]!r}: {errors[0]}")
        if "Traceback" in err or "Traceback" in out:
            problems.append("traceback")
        if "num_updates" in out or "begin training epoch" in out:
            problems.append("training started")
        if problems:
            failures.append(f"{name}: {', '.join(problems)}\n{err[-1500:]}")
    assert not failures, "\n\n".join(failures)
    assert not (tmp_path / "never").exists() or not any((tmp_path / "never").iterdir())


def test_unknown_arch_is_a_clear_error(tiny_world, tmp_path):
    rc, out, err = _run(_args(tiny_world, tmp_path / "never", arch="rag_tokn_tiny"), tmp_path, threads=1)
    assert rc != 0
    assert "rag_tokn_tiny" in err and "invalid choice" in err
    assert "Traceback" not in err
