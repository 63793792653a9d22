"""Decoding checks: beam scores equal teacher-forced scores, Thorough >= Fast, K=1 is BART."""
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fairseq.dataclass.configs import GenerationConfig

import rag_plugin

rag_plugin.register()

from fairseq.sequence_generator import SequenceGenerator  # noqa: E402

from rag_plugin.core import input_format  # noqa: E402
from rag_plugin.hub import RAG  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagSequenceModel, RagTokenModel  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402


def _setup(world, cls, n_docs=3, decoding="thorough", seed=3):
    cfg = RetrievalAugmentedConfig(data=str(world["data"]), knowledge=str(world["ks"]), n_docs=n_docs,
                                   rag_decoding=decoding)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("test")
    torch.manual_seed(seed)
    model = cls.build_model(RagConfig(generator_size="tiny", dropout=0.0), task).eval()
    ds = task.datasets["test"]
    sample = ds.collater([ds[i] for i in range(len(ds))])
    return task, model, sample


def _gen(task, model, sample, **kw):
    args = GenerationConfig(max_len_a=0, max_len_b=6, **kw)
    return task.build_generator([model], args).generate([model], sample)


def _teacher_forced(task, model, sample, hypos):
    """Score each sample's best hypothesis with --score-reference machinery."""
    forced = dict(sample)
    targets = [h[0]["tokens"] for h in hypos]
    width = max(len(t) for t in targets)
    target = torch.full((len(targets), width), 1, dtype=torch.long)
    prev = torch.full_like(target, 1)
    for i, t in enumerate(targets):
        target[i, : len(t)] = t
        prev[i, 0] = 2
        prev[i, 1: len(t)] = t[:-1]
    forced["target"] = target
    forced["net_input"] = dict(sample["net_input"], prev_output_tokens=prev)
    return task.build_generator([model], GenerationConfig(score_reference=True)).generate([model], forced)


@pytest.mark.parametrize("cls, decoding", [(RagTokenModel, "thorough"), (RagSequenceModel, "thorough")])
@pytest.mark.parametrize("beam", [1, 4])
def test_beam_score_equals_teacher_forced_score(tiny_world, cls, decoding, beam):
    task, model, sample = _setup(tiny_world, cls, decoding=decoding)
    hypos = _gen(task, model, sample, beam=beam)
    forced = _teacher_forced(task, model, sample, hypos)
    for h, f in zip(hypos, forced):
        assert torch.equal(h[0]["tokens"], f[0]["tokens"])
        assert float(h[0]["score"]) == pytest.approx(float(f[0]["score"]), abs=1e-4)
        torch.testing.assert_close(h[0]["positional_scores"], f[0]["positional_scores"], atol=1e-4, rtol=1e-4)


def test_thorough_never_below_fast(tiny_world):
    for seed in (3, 4, 5):
        task, model, sample = _setup(tiny_world, RagSequenceModel, decoding="thorough", seed=seed)
        thorough = _gen(task, model, sample, beam=3)
        task.cfg.rag_decoding = "fast"
        fast = _gen(task, model, sample, beam=3)
        t_true = _teacher_forced(task, model, sample, thorough)
        f_true = _teacher_forced(task, model, sample, fast)
        for t, f in zip(t_true, f_true):
            assert float(t[0]["score"]) >= float(f[0]["score"]) - 1e-5


def test_k1_all_decodings_reduce_to_bart_beam_search(tiny_world):
    results = []
    for cls, decoding in ((RagTokenModel, "thorough"), (RagSequenceModel, "thorough"), (RagSequenceModel, "fast")):
        task, model, sample = _setup(tiny_world, cls, n_docs=1, decoding=decoding, seed=7)
        results.append(_gen(task, model, sample, beam=4))
    # plain BART beam search on the concatenated (question, top document) input
    _, extra = model(**sample["net_input"])
    store = task.knowledge.passages
    questions = [q[q.ne(1)].numpy() for q in sample["net_input"]["src_tokens"]]
    docs = [[(store.title_tokens(int(r)), store.text_tokens(int(r)))] for r in extra["doc_rows"][:, 0]]
    src, lengths = input_format.batch_inputs(questions, docs, 0, 2, 1, 256)
    bart = SequenceGenerator([model.generator], task.dictionary, beam_size=4, max_len_a=0, max_len_b=6)
    plain = bart.generate([model.generator], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    for i in range(len(plain)):
        for res in results:
            assert res[i][0]["tokens"].tolist() == plain[i][0]["tokens"].tolist()
            assert float(res[i][0]["score"]) == pytest.approx(float(plain[i][0]["score"]), abs=1e-4)


@pytest.mark.parametrize("seed, sharpen", [(3, 1.0), (5, 2.0)])
def test_rag_sequence_decodings_against_per_document_bart_beams(tiny_world, seed, sharpen):
    """RAG-Sequence decoding rebuilt from plain parts: fairseq's own SequenceGenerator on the BART
    generator for each (question, document) input gives the candidates; the prior is the softmax of
    the retrieval scores; Thorough teacher-forces every candidate through BART under every document,
    Fast keeps the beam's log-probability where the document's beam found the candidate and 0
    probability elsewhere; the answer maximises log sum_z p(z|x) p(y|x,z) / |y|.

    Seed 3: the documents' beams partly overlap (27 (candidate, document) pairs off their document's
    beam); seed 5 with every weight matrix doubled (``sharpen``): the beams are disjoint (90 pairs)."""
    k, beam = 3, 3
    task, model, sample = _setup(tiny_world, RagSequenceModel, n_docs=k, seed=seed)
    ni = sample["net_input"]
    eos = task.dictionary.eos()
    with torch.no_grad():
        for p in model.generator.parameters():
            if p.dim() == 2:
                p.mul_(sharpen)
        _, extra = model(**ni)
        prior = torch.log_softmax(extra["doc_scores"].double(), -1)
        src, lengths = model.generator_inputs(ni["src_tokens"], extra["doc_rows"])  # row b * k + d
        bart = SequenceGenerator([model.generator], task.dictionary, beam_size=beam, max_len_a=0, max_len_b=6)
        beams = bart.generate([model.generator], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
        model.generator.decoder.set_beam_size(1)  # the search left its beam-grouped cross-attention on
        # ... and BART's encoder reorder a no-op (BARTModel.set_beam_size), which the plugin's
        # Thorough rescoring (score_candidates) relies on
        model.generator.encoder.__dict__.pop("reorder_encoder_out", None)

        def forced(row, y):
            return float(_forced_log_probs(model.generator, src[row:row + 1], lengths[row:row + 1], y, eos).sum())

        expect = {"thorough": [], "fast": []}
        off_beam = 0
        for b in range(ni["src_tokens"].size(0)):
            found = {}  # candidate -> {document: the beam's log p(y|x,z)}
            for d in range(k):
                for h in beams[b * k + d]:
                    found.setdefault(tuple(h["tokens"].tolist()), {})[d] = float(h["positional_scores"].double().sum())
            scored = {"thorough": [], "fast": []}
            for y, by_doc in found.items():
                off_beam += k - len(by_doc)
                lse = lambda terms: math.log(sum(math.exp(t) for t in terms))  # noqa: E731
                scored["fast"].append((lse([float(prior[b, d]) + lp for d, lp in by_doc.items()]) / len(y), y))
                scored["thorough"].append((lse([float(prior[b, d]) + forced(b * k + d, list(y))
                                               for d in range(k)]) / len(y), y))
            for decoding in expect:
                expect[decoding].append(max(scored[decoding]))
    assert off_beam > 0  # some candidates were missing from some beams: Fast and Thorough differ there
    for decoding, best in expect.items():
        task.cfg.rag_decoding = decoding
        got = _gen(task, model, sample, beam=beam)
        for (score, y), hyps in zip(best, got):
            assert hyps[0]["tokens"].tolist() == list(y), decoding
            assert float(hyps[0]["score"]) == pytest.approx(score, abs=1e-4), decoding


def _forced_log_probs(generator, src, lengths, y, eos):
    """log p(y_t | row, y<t) of target ``y`` (ending in </s>) under every input row of ``src``, by hand:
    the decoder reads </s> then y[:-1], as fairseq feeds it. float64 [rows, len(y)]."""
    prev = torch.tensor([[eos] + list(y[:-1])] * src.size(0))
    logits, _ = generator(src, lengths, prev)
    return torch.log_softmax(logits.double(), -1)[:, torch.arange(len(y)), torch.tensor(list(y))]


def _exact_retrieval(rag, questions, k):
    """Per question, the top-k (passage id, p(z|x)) by brute force for a hub ``RAG``: its question
    encoder, the inner product with every stored vector (float64), times the model's score scale, softmax."""
    ds = rag.task.build_dataset(questions)
    sample = ds.collater([ds[i] for i in range(len(ds))])
    with torch.no_grad():
        q = rag.model.query_encoder(sample["net_input"]["query_tokens"], sample["net_input"]["query_mask"])
    vectors = torch.from_numpy(np.asarray(rag.task.knowledge.vectors, dtype=np.float64))
    scores = q.double() @ vectors.T * rag.model.doc_score_scale
    top = scores.topk(k, dim=1)
    store = rag.task.knowledge.passages
    out = [None] * len(questions)
    for sid, values, rows in zip(sample["id"].tolist(), top.values, top.indices):
        out[sid] = [(store.id(int(r)), float(pz)) for r, pz in zip(rows, torch.softmax(values, -1))]
    return out


def _generate_cli(world, ckpt, *extra, data=None, knowledge=None):
    cmd = [str(Path(sys.executable).parent / "fairseq-generate"), str(data or world["data"]),
           "--user-dir", "rag_plugin",
           "--task", "retrieval_augmented", "--knowledge", str(knowledge or world["ks"]), "--path", str(ckpt),
           "--gen-subset", "test", "--batch-size", "2", "--max-len-b", "5", "--cpu", "--num-workers", "0",
           "--n-docs", "3", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=rag_plugin.__path__[0] + "/..", timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("arch, extra", [("rag_token_tiny", ["--beam", "4"]), ("rag_token_tiny", ["--beam", "1"]),
                                         ("rag_seq_tiny", ["--beam", "2", "--rag-decoding", "thorough"]),
                                         ("rag_seq_tiny", ["--beam", "2", "--rag-decoding", "fast"])])
def test_fairseq_generate_answers_every_line_with_provenance(tiny_world, trained, tmp_path, arch, extra):
    data = tmp_path / "data"
    data.mkdir()
    lines = (tiny_world["data"] / "test.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec["id"], rec["input"] = "empty", "   "
    lines.append(json.dumps(rec))  # an empty question still gets an answer line
    (data / "test.jsonl").write_text("\n".join(lines) + "\n")
    r = _generate_cli(tiny_world, trained[arch], *extra, "--provenance-out", str(tmp_path / "prov.jsonl"), data=data)
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout.splitlines()
    n = len(lines)
    assert sorted(int(l.split("\t")[0][2:]) for l in out if l.startswith("H-")) == list(range(n))
    assert sorted(int(l.split("\t")[0][2:]) for l in out if l.startswith("D-")) == list(range(n))
    z = [l.split("\t") for l in out if l.startswith("Z-")]
    assert len(z) == 3 * n
    assert all(abs(sum(float(x[2]) for x in z if x[0] == f"Z-{i}") - 1) < 1e-3 for i in range(n))
    prov = [json.loads(l) for l in (tmp_path / "prov.jsonl").read_text().splitlines()]
    assert sorted(p["sample_id"] for p in prov) == list(range(n))
    # the Z lines against retrieval by brute force: the checkpoint's question encoder, an inner product
    # with every stored passage vector, the top 3 and their softmax (no FAISS, no generator code)
    questions = [json.loads(line)["input"] for line in lines[:-1]]  # the empty question aside
    rag = RAG.from_pretrained(str(trained[arch]), knowledge=str(tiny_world["ks"]), n_docs=3)
    expect = _exact_retrieval(rag, questions, k=3)
    for i, docs in enumerate(expect):
        got = [x for x in z if x[0] == f"Z-{i}"]
        assert [x[3] for x in got] == [d for d, _ in docs]
        assert [float(x[2]) for x in got] == pytest.approx([pz for _, pz in docs], abs=2e-6)


@pytest.mark.slow
def test_fairseq_generate_post_process_and_quiet(tiny_world, trained, tmp_path):
    """--post-process sentencepiece: fairseq makes the lines text itself; they are the same text as
    without it (S, T = the gold question and answer, D), H lines are that text, and BLEU is computed.
    --quiet: no S/T/H/D/P lines and no Z lines either; --provenance-out is still written."""
    ckpt = trained["rag_token_tiny"]
    plain = _generate_cli(tiny_world, ckpt, "--beam", "2")
    post = _generate_cli(tiny_world, ckpt, "--beam", "2", "--post-process", "sentencepiece")
    quiet = _generate_cli(tiny_world, ckpt, "--beam", "2", "--quiet", "--provenance-out", str(tmp_path / "prov.jsonl"))
    for r in (plain, post, quiet):
        assert r.returncode == 0, r.stderr[-3000:]

    def tagged(r, tag):
        return {l.split("\t")[0]: l.split("\t", 1)[1] for l in r.stdout.splitlines() if l.startswith(tag)}

    records = [json.loads(l) for l in (tiny_world["data"] / "test.jsonl").read_text().splitlines()]
    assert sorted(tagged(post, "S-").values()) == sorted(r["input"] for r in records)
    assert sorted(tagged(post, "T-").values()) == sorted(r["output"][0]["answer"] for r in records)
    for tag in ("S-", "T-", "D-", "Z-"):
        assert tagged(post, tag) == tagged(plain, tag) and len(tagged(post, tag)) >= len(records)
    hypotheses = {key[2:]: value for key, value in tagged(post, "H-").items()}
    assert hypotheses == {key[2:]: value for key, value in tagged(post, "D-").items()}
    assert "BLEU" in post.stdout.splitlines()[-1]
    assert not any(l[:2] in ("S-", "T-", "H-", "D-", "P-", "Z-") for l in quiet.stdout.splitlines())
    prov = [json.loads(l) for l in (tmp_path / "prov.jsonl").read_text().splitlines()]
    assert sorted(p["sample_id"] for p in prov) == list(range(len(records)))


@pytest.mark.slow
def test_per_token_posterior_and_hot_swap(tiny_world, trained, tmp_path):
    post = tmp_path / "post.jsonl"
    r = _generate_cli(tiny_world, trained["rag_token_tiny"], "--beam", "2", "--doc-posterior-out", str(post))
    assert r.returncode == 0, r.stderr[-3000:]
    recs = [json.loads(l) for l in post.read_text().splitlines()]
    assert len(recs) == 5
    for rec in recs:
        cols = list(zip(*rec["posterior"]))
        assert len(cols) == len(rec["tokens"]) and all(abs(sum(c) - 1) < 1e-4 for c in cols)
    # each record against the definition, p(z|x, y_t, y<t) = p(z|x) p(y_t|x,z,y<t) / sum over z, with
    # the prior from brute-force retrieval and every token teacher-forced through BART by hand
    rag = RAG.from_pretrained(str(trained["rag_token_tiny"]), knowledge=str(tiny_world["ks"]), n_docs=3)
    questions = [json.loads(line)["input"] for line in (tiny_world["data"] / "test.jsonl").read_text().splitlines()]
    exact = _exact_retrieval(rag, questions, k=3)
    store, dictionary = rag.task.knowledge.passages, rag.task.dictionary
    row_of = {store.id(i): i for i in range(len(store))}
    ds = rag.task.build_dataset(questions)
    for rec in recs:
        sid = rec["sample_id"]
        by_id = dict(exact[sid])
        assert [d["id"] for d in rec["docs"]] and set(d["id"] for d in rec["docs"]) == set(by_id)
        y = [dictionary.index(piece) for piece in rec["tokens"]]
        sample = ds.collater([ds[sid]])
        rows = torch.tensor([[row_of[d["id"]] for d in rec["docs"]]])
        with torch.no_grad():
            src, lengths = rag.model.generator_inputs(sample["net_input"]["src_tokens"], rows)
            token_p = _forced_log_probs(rag.model.generator, src, lengths, y, dictionary.eos()).exp()  # [K, T]
        joint = torch.tensor([by_id[d["id"]] for d in rec["docs"]], dtype=torch.float64)[:, None] * token_p
        np.testing.assert_allclose(rec["posterior"], (joint / joint.sum(0)).numpy(), atol=2e-5)
        np.testing.assert_allclose([d["prior"] for d in rec["docs"]], [by_id[d["id"]] for d in rec["docs"]],
                                   atol=2e-6)
    # another knowledge source with a different document encoder: refused in one line
    from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source
    from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles

    other = tmp_path / "other_ks"
    build_knowledge_source(str(other), BuildSettings(
        passages=str(tiny_world["root"] / "passages.jsonl"),
        encoder="random:dim=32,layers=1,heads=2,intermediate=64,seed=9",
        tokenizer=GeneratorTokenizerFiles(dict=str(tiny_world["root"] / "dict.txt"),
                                          bpe_model=str(tiny_world["root"] / "spm.model"))),
        BuildOptions(progress=False, log=lambda m: None))
    r = _generate_cli(tiny_world, trained["rag_token_tiny"], knowledge=other)
    assert r.returncode == 2
    err = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and "does not match the document encoder" in err[0] and "Traceback" not in r.stderr
