"""rag-probe-reader: the reader's answer likelihood and its weight on the gold passage, read with the gold passage
alone, among random passages, among the retriever's other passages, and without it. Checked against the models'
own forward passes (FiD: its logits and its cross-attention shares; RAG: each pair's likelihood by hand), the
passages of each condition against their definition, and the command line with its one-line errors."""
import json
import math
import random
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import rag_plugin

rag_plugin.register()

from rag_plugin.core.net_output import ATTENTION_KEY  # noqa: E402
from rag_plugin.data.gold_rows import rows_by_passage_id  # noqa: E402
from rag_plugin.data.kilt import read_kilt  # noqa: E402
from rag_plugin.evaluation import reader_probe  # noqa: E402
from rag_plugin.models.fid import FidConfig, FidModel  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagSequenceModel, RagTokenModel  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402
from tests.conftest import assert_one_line_error  # noqa: E402

BIN = Path(sys.executable).parent
ROOT = Path(rag_plugin.__path__[0]).parent


def _rag(world, cls, config, retriever="dense", k=3):
    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(data=str(world["data"]), retriever=retriever,
                                                                      knowledge=str(world["ks"]), n_docs=k))
    torch.manual_seed(0)
    model = cls.build_model(config(generator_size="tiny", dropout=0.0), task).eval().double()
    return types.SimpleNamespace(task=task, model=model)


def _sample(rag, world, split="test"):
    records = read_kilt(str(world["data"] / f"{split}.jsonl"))
    ds = rag.task.build_dataset([r.input for r in records], targets=[r.answers[0] for r in records])
    return ds.collater([ds[i] for i in range(len(ds))])


def _rows(rag, b, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(len(rag.task.knowledge.passages), generator=g)[:k] for _ in range(b)])


def test_fid_scores_are_its_forward_pass(tiny_world):
    """FiD: the NLL is the model's own teacher-forced cross-entropy (summed per answer) and the weights are the
    cross-attention shares its forward pass returns for --retriever-loss adist."""
    rag = _rag(tiny_world, FidModel, FidConfig)
    sample = _sample(rag, tiny_world)
    ni, target = sample["net_input"], sample["target"]
    rows = _rows(rag, target.size(0), 3)
    with torch.no_grad():
        nll, shares = reader_probe.read_scores(rag.model, ni["src_tokens"], ni["prev_output_tokens"], target, rows,
                                               rag.task.dictionary.pad())
        rag.model.returns_attention = True
        logits, extra = rag.model(ni["src_tokens"], ni["prev_output_tokens"], fixed_doc_rows=rows,
                                  fixed_doc_scores=torch.zeros(rows.shape, dtype=torch.float64), n_docs=3)
    lp = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    expected = -(lp * target.ne(rag.task.dictionary.pad())).sum(1)
    assert torch.equal(extra["doc_rows"], rows)
    torch.testing.assert_close(nll.double(), expected, atol=1e-5, rtol=1e-6)  # float32 log-softmax
    torch.testing.assert_close(shares.double(), extra[ATTENTION_KEY].double(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("cls", [RagTokenModel, RagSequenceModel])
def test_rag_scores_are_the_uniform_prior_marginal_and_posterior(tiny_world, cls):
    """RAG: each pair's log p(y|x,z) by its own forward pass; NLL = -log mean_k p(y|x,z_k), weights = the posterior
    under a uniform prior."""
    rag = _rag(tiny_world, cls, RagConfig)
    sample = _sample(rag, tiny_world)
    ni, target = sample["net_input"], sample["target"]
    pad = rag.task.dictionary.pad()
    rows = _rows(rag, target.size(0), 3, seed=1)
    with torch.no_grad():
        nll, post = reader_probe.read_scores(rag.model, ni["src_tokens"], ni["prev_output_tokens"], target, rows, pad)
        for i in range(target.size(0)):
            seq = []
            for row in rows[i]:
                logits, _ = rag.model(ni["src_tokens"][i: i + 1], ni["prev_output_tokens"][i: i + 1],
                                      fixed_doc_rows=row.view(1, 1), fixed_doc_scores=torch.zeros(1, 1).double(),
                                      n_docs=1)
                lp = torch.log_softmax(logits[0], -1)
                seq.append(sum(float(lp[t, y]) for t, y in enumerate(target[i].tolist()) if y != pad))
            p = [math.exp(s) for s in seq]
            assert float(nll[i]) == pytest.approx(-math.log(sum(p) / 3), abs=1e-6)
            for j in range(3):
                assert float(post[i, j]) == pytest.approx(p[j] / sum(p), abs=1e-6)


def test_passage_rows_put_the_gold_passage_once_in_every_slot():
    rng = random.Random(0)
    slots = set()
    for _ in range(60):
        gold = [7, 8]
        others = reader_probe.random_others(gold, 20, 4, rng)
        assert len(set(others)) == 4 and not set(others) & {7, 8}
        rows = reader_probe.passage_rows(gold, others, 5, rng)
        assert len(rows) == 5 and rows.count(7) == 1 and 8 not in rows
        assert [r for r in rows if r != 7] == others
        slots.add(rows.index(7))
    assert slots == set(range(5))
    assert reader_probe.passage_rows([7], [1, 2, 3], 3, rng, with_gold=False) == [1, 2, 3]
    with pytest.raises(UserError, match="too few"):
        reader_probe.random_others([0, 1], 4, 3, rng)


@pytest.mark.parametrize("retriever", ["dense", "bm25"])
def test_probe_reads_each_condition_as_defined_and_averages_it(tiny_world, monkeypatch, retriever):
    """Every read of probe(): the gold condition reads the first gold row alone; the mixed ones hold it once,
    with random non-gold rows or with the retriever's best non-gold rows in its order; the random condition holds
    no gold row. The reported numbers are the means of those reads."""
    rag = _rag(tiny_world, RagTokenModel, RagConfig, retriever=retriever)
    records = read_kilt(str(tiny_world["data"] / "valid.jsonl")) + read_kilt(str(tiny_world["data"] / "test.jsonl"))
    records.append(types.SimpleNamespace(input="Nowhere?", answers=["x"], provenance=["not-a-passage"]))
    data = reader_probe.probe_questions(records, rows_by_passage_id(rag.task.knowledge.passages), limit=8)
    assert len(data) == 8 and data.skipped == 0  # the limit is reached before the record without a gold passage
    everything = reader_probe.probe_questions(records, rows_by_passage_id(rag.task.knowledge.passages))
    assert len(everything) == 10 and everything.skipped == 1
    reads = []
    real = reader_probe.read_scores

    def recording(model, src, prev, target, rows, pad):
        out = real(model, src, prev, target, rows, pad)
        reads.append((rows.clone(), out[0].clone(), out[1].clone()))
        return out

    monkeypatch.setattr(reader_probe, "read_scores", recording)
    result = reader_probe.probe(rag, data, 3, batch_size=5)
    assert len(reads) == 2 * 4
    sample = _sample(rag, tiny_world, "valid")  # the first 5 questions: the first batch's retrieval
    with torch.no_grad():
        _, best = rag.model.retrieve(sample["net_input"].get("query_tokens"), sample["net_input"].get("query_mask"),
                                     3, sample["net_input"].get("fixed_doc_rows"),
                                     sample["net_input"].get("fixed_doc_scores"))
    sums = {c: [0.0, 0.0] for c in reader_probe.CONDITIONS}
    for n, (rows, nll, weights) in enumerate(reads):
        cond = reader_probe.CONDITIONS[n % 4]
        batch = range(0, 5) if n < 4 else range(5, 8)
        for i, q in enumerate(batch):
            gold, r = data.gold[q], rows[i].tolist()
            if cond == "gold":
                assert r == [gold[0]]
            elif cond == "random":
                assert len(set(r)) == 3 and not set(r) & set(gold)
            else:
                assert r.count(gold[0]) == 1 and len(set(r)) == 3 and len(set(r) & set(gold)) == 1
            if cond == "gold+retrieved" and n < 4:
                assert [x for x in r if x != gold[0]] == [x for x in best[i].tolist() if x not in gold][:2]
            if cond in reader_probe.MIXED:
                sums[cond][1] += float(weights[i, r.index(gold[0])])
            sums[cond][0] += float(nll[i])
    for cond in reader_probe.CONDITIONS:
        assert result.answer_nll[cond] == pytest.approx(sums[cond][0] / 8, rel=1e-6)
    assert set(result.gold_share) == set(reader_probe.MIXED)
    for cond in reader_probe.MIXED:
        assert result.gold_share[cond] == pytest.approx(sums[cond][1] / 8, rel=1e-6)


def test_probe_refuses_k_below_two_and_data_without_gold(tiny_world):
    rag = _rag(tiny_world, RagTokenModel, RagConfig)
    data = reader_probe.probe_questions(read_kilt(str(tiny_world["data"] / "test.jsonl")),
                                        rows_by_passage_id(rag.task.knowledge.passages))
    with pytest.raises(UserError, match="K >= 2"):
        reader_probe.probe(rag, data, 1)
    with pytest.raises(UserError, match="names a gold passage"):
        reader_probe.probe(rag, reader_probe.ProbeQuestions([], [], []), 3)


def test_probe_hands_a_model_on_another_device_its_tensors_there(tiny_world, monkeypatch):
    """A model on a GPU (here the meta device: a CPU tensor beside a meta one is an error, as beside a CUDA one):
    every tensor probe() hands the model (retrieval and reads) is on the model's device, and the gold weights are
    summed there (before: the batch stayed on the CPU, and the gold mask too)."""
    rag = _rag(tiny_world, RagTokenModel, RagConfig)
    data = reader_probe.probe_questions(read_kilt(str(tiny_world["data"] / "valid.jsonl")),
                                        rows_by_passage_id(rag.task.knowledge.passages))
    rag.model.to("meta")
    seen = []

    def retrieved(model, net_input, gold, k):
        seen.extend(t.device for t in net_input.values() if torch.is_tensor(t))
        return [[r for r in range(len(rag.task.knowledge.passages)) if r not in g][:k - 1] for g in gold]

    def read(model, src, prev, target, rows, pad):
        seen.extend((src.device, prev.device, target.device))
        b, k = rows.shape
        return torch.zeros(b), torch.full((b, k), 1.0 / k)

    monkeypatch.setattr(reader_probe, "retrieved_rows", retrieved)
    monkeypatch.setattr(reader_probe, "read_scores", read)
    result = reader_probe.probe(rag, data, 3, batch_size=2)
    assert len(seen) > 0 and set(seen) == {torch.device("meta")}
    assert result.gold_share == {"gold+random": pytest.approx(1 / 3), "gold+retrieved": pytest.approx(1 / 3)}
    weights, rows, gold = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8]]), [[4, 7, 9], [1, 2, 3]], [[7], [5]]
    assert float(reader_probe.gold_weight(weights, rows, gold)) == pytest.approx(0.5)  # row 0's gold (7) in slot 1
    assert reader_probe.gold_weight(weights.to("meta"), rows, gold).device == torch.device("meta")


def _train(world, save: Path, arch: str, criterion: str, *extra):
    cmd = [str(BIN / "fairseq-train"), str(world["data"]), "--user-dir", "rag_plugin", "--task",
           "retrieval_augmented", "--knowledge", str(world["ks"]), "--arch", arch, "--criterion", criterion,
           "--n-docs", "2", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8", "--max-update", "2",
           "--save-dir", str(save), "--cpu", "--num-workers", "0", "--no-progress-bar", "--no-epoch-checkpoints",
           "--disable-validation", *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return save / "checkpoint_last.pt"


def _probe_cli(*args):
    return subprocess.run([str(BIN / "rag-probe-reader"), *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


def test_command_line_prints_the_table_and_writes_json(tiny_world, tmp_path):
    ckpt = _train(tiny_world, tmp_path / "fid", "fid_tiny", "cross_entropy")
    out = tmp_path / "probe.json"
    r = _probe_cli("--checkpoint", ckpt, "--data", tiny_world["data"] / "valid.jsonl", "--n-docs", 3,
                   "--json-out", out, "--batch-size", 2)
    assert r.returncode == 0, r.stderr[-3000:]
    table = r.stdout.strip().splitlines()
    assert "5 questions, K = 3 (chance share 0.333)" in table[0]
    assert [line.split()[0] for line in table[2:]] == list(reader_probe.CONDITIONS)
    got = json.loads(out.read_text())
    assert got["k"] == 3 and got["questions"] == 5 and got["chance_share"] == pytest.approx(1 / 3)
    assert set(got["answer_nll"]) == set(reader_probe.CONDITIONS) and set(got["gold_share"]) == set(reader_probe.MIXED)
    for cond, line in zip(reader_probe.CONDITIONS, table[2:]):
        assert float(line.split()[1]) == pytest.approx(got["answer_nll"][cond], abs=1e-3)
    assert all(0.0 <= v <= 1.0 for v in got["gold_share"].values())


def test_command_line_bad_input_is_one_line(tiny_world, tmp_path):
    ckpt = _train(tiny_world, tmp_path / "rag", "rag_token_tiny", "marginal_nll")
    data = tiny_world["data"] / "test.jsonl"
    assert_one_line_error(_probe_cli("--checkpoint", ckpt, "--data", data, "--n-docs", 1), "--n-docs 1")
    assert_one_line_error(_probe_cli("--checkpoint", tmp_path / "none.pt", "--data", data), "checkpoint not found")
    assert_one_line_error(_probe_cli("--checkpoint", ckpt, "--data", tmp_path / "none.jsonl"), "data file not found")
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(json.dumps({"id": "a", "input": "Where?", "output": [{"answer": "x", "provenance":
                                                                                [{"id": "other"}]}]}) + "\n")
    assert_one_line_error(_probe_cli("--checkpoint", ckpt, "--data", elsewhere), "gold passage")
    if not torch.cuda.is_available():
        assert_one_line_error(_probe_cli("--checkpoint", ckpt, "--data", data, "--device", "cuda"),
                              "device cuda: CUDA is not available")
    closed = _train(tiny_world, tmp_path / "closed", "rag_token_tiny", "marginal_nll", "--n-docs", "0")
    assert_one_line_error(_probe_cli("--checkpoint", closed, "--data", data), "reads passages")
