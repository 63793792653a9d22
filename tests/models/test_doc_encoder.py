"""--train-doc-encoder on the tiny world: the recomputed scores against a fresh embedding, the document
encoder's gradient against finite differences, --rerank-top against brute force, the plain weights, the
agreement check of a served model, bad options; and fairseq-train / fairseq-generate end to end."""
import copy
import subprocess
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import rag_plugin
from rag_plugin.util.errors import UserError

rag_plugin.register()

from rag_plugin.core import marginalization as M  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagTokenModel  # noqa: E402
from rag_plugin.optim import lr_scale  # noqa: E402
from rag_plugin.retrieval.encoders import trained_tower  # noqa: E402
from rag_plugin.retrieval.encoders.weights import state_dict_sha256  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402
from tests.generation.test_fid_cli import _assert_one_line_error, _run  # noqa: E402
from tests.tasks.test_training import _args, _env, _load  # noqa: E402


def _task(world, n_docs=3, **kw):
    cfg = RetrievalAugmentedConfig(data=str(world["data"]), knowledge=str(world["ks"]), n_docs=n_docs, **kw)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("train")
    return task


def _model(task, seed=1, from_checkpoint=False, **kw):
    torch.manual_seed(seed)
    cfg = RagConfig(generator_size="tiny", dropout=0.0, train_doc_encoder=True, **kw)
    if from_checkpoint:  # as fairseq-generate builds it
        return task.build_model(_fairseq_cfg(cfg), from_checkpoint=True)
    return RagTokenModel.build_model(cfg, task)


def _fairseq_cfg(cfg):
    """The model options as fairseq hands them to the task: a DictConfig naming the architecture."""
    from omegaconf import OmegaConf

    cfg._name, cfg.lr = "rag_token", [1e-3]
    return OmegaConf.structured(cfg)


def _batch(task, n=4, start=0):
    ds = task.datasets["train"]
    return ds.collater([ds[i] for i in range(start, start + n)])


def _perturb(module, seed=3, std=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)


def _fresh_scores(task, tower, q, rows, scale):
    """scale x q . d with d embedded afresh by the knowledge source's own encoding path, ``tower`` as passage tower."""
    encoder = copy.copy(task.text_encoder)
    encoder.passage_tower = tower
    store = task.knowledge.passages
    flat = rows.reshape(-1).tolist()
    d = encoder.encode_passages([store.title(r) for r in flat], [store.text(r) for r in flat], progress=False)
    d = torch.from_numpy(d).double().view(*rows.shape, -1)
    return torch.einsum("bkd,bd->bk", d, q.double()) * scale


def test_recomputed_scores_equal_stored_then_fresh_embedding(tiny_world):
    task = _task(tiny_world)
    model = _model(task).eval()
    ni = _batch(task)["net_input"]
    with torch.no_grad():
        scores, rows = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)
        q = model.query_encoder(ni["query_tokens"], ni["query_mask"])
    assert scores.dtype == torch.float32 and rows.shape == (4, 3)
    # step 0: the document encoder is the one the knowledge source embedded with: the stored vectors' scores
    stored = torch.from_numpy(np.asarray(task.knowledge.vectors)[rows.numpy()]).double()
    expected = torch.einsum("bkd,bd->bk", stored, q.double()) * model.doc_score_scale
    torch.testing.assert_close(scores.double(), expected, rtol=0, atol=1e-4)
    # a changed document encoder: its own fresh embedding of the same passages, not the stored vectors
    _perturb(model.doc_encoder)
    with torch.no_grad():
        moved, same_rows = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)
    assert torch.equal(same_rows, rows)  # the (stale) index still picks the rows
    torch.testing.assert_close(moved.double(), _fresh_scores(task, model.doc_encoder, q, rows, model.doc_score_scale),
                               rtol=0, atol=1e-4)
    assert (moved - scores).abs().max() > 1e-2


def _no_dropout(model):
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) or hasattr(m, "dropout_p"):
            setattr(m, "p" if isinstance(m, torch.nn.Dropout) else "dropout_p", 0.0)
    return model


def _marginal_nll(model, sample):
    """RAG-Token's marginal NLL in float64 throughout (the criterion computes in float32)."""
    logits, extra = model(**sample["net_input"])
    doc_lp = M.doc_log_prior(extra["doc_scores"])
    b, k = doc_lp.shape
    lprobs = torch.log_softmax(logits.double(), -1).view(b, k, logits.size(1), logits.size(2))
    target = sample["target"]
    return M.rag_token_nll(M.target_token_log_probs(lprobs, target), doc_lp, target.ne(1)).sum()


def assert_finite_differences(model, sample, tower, picks, eps=1e-6):
    """Each picked (parameter of ``tower``, index): its gradient from the last backward equals the central
    difference of the float64 marginal NLL, and is not zero."""
    params = dict(tower.named_parameters())
    for name, index in picks:
        p = params[name]
        analytic = float(p.grad[index])
        with torch.no_grad():
            old = float(p[index])
            p[index] = old + eps
            up = float(_marginal_nll(model, sample))
            p[index] = old - eps
            down = float(_marginal_nll(model, sample))
            p[index] = old
        numeric = (up - down) / (2 * eps)
        assert abs(numeric) > 1e-6, name  # the parameter matters
        assert analytic == pytest.approx(numeric, rel=1e-4, abs=1e-7), name


@pytest.mark.parametrize("share", [False, True])
def test_doc_encoder_gradient_matches_finite_differences(tiny_world, share):
    """d marginal NLL / d (document tower weights), float64, against central differences (the rows fixed by the
    untouched query encoder)."""
    task = _task(tiny_world)
    model = _no_dropout(_model(task, share_encoder_towers=share)).double().train()
    sample = _batch(task, n=3)
    assert task.dictionary.pad() == 1
    tower = model.doc_encoder
    assert (tower is model.query_encoder) == share
    loss = _marginal_nll(model, sample)
    model.zero_grad()
    loss.backward()
    assert_finite_differences(model, sample, tower, [("bert_model.encoder.layer.0.output.dense.weight", (0, 1)),
                                                     ("bert_model.encoder.layer.0.attention.self.value.bias", (2,)),
                                                     ("bert_model.embeddings.LayerNorm.weight", (5,))])
    if not share:  # both towers learn
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.query_encoder.parameters())


def test_rerank_top_keeps_the_best_k_of_l_by_current_scores(tiny_world):
    task = _task(tiny_world)
    model = _model(task, rerank_top=10).eval()
    _perturb(model.doc_encoder, std=0.2)  # far from the index's encoder: the order changes
    ni = _batch(task, n=8)["net_input"]
    with torch.no_grad():
        scores, rows = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)
        q = model.query_encoder(ni["query_tokens"], ni["query_mask"])
    candidates = torch.from_numpy(task.retriever.search_vectors(q.numpy(), 10).rows)
    brute = _fresh_scores(task, model.doc_encoder, q, candidates, model.doc_score_scale)
    changed = 0
    for b in range(8):
        order = sorted(range(10), key=lambda i: -float(brute[b, i]))[:3]
        assert rows[b].tolist() == [int(candidates[b, i]) for i in order]
        torch.testing.assert_close(scores[b].double(), brute[b, order], rtol=0, atol=1e-4)
        changed += set(rows[b].tolist()) != set(candidates[b, :3].tolist())
    assert changed > 0  # the re-ranking did something


def test_plain_weights_resolve_the_learning_rate_scale(tiny_world):
    task = _task(tiny_world)
    model = _model(task, query_encoder_lr_scale=0.1)
    state = model.state_dict()
    assert any(k.startswith("doc_encoder.") and k.endswith(".original") for k in state)
    plain = model.doc_encoder_state()
    assert set(plain) == set(task.text_encoder.passage_tower.state_dict())
    # the checkpoint's stored weights x scale are the plain weights; a plain tower with them encodes the same
    stored = {k[len("doc_encoder."):]: v for k, v in state.items() if k.startswith("doc_encoder.")}
    resolved = lr_scale.plain_state(stored, 0.1)
    assert set(resolved) == set(plain) and all(torch.equal(resolved[k], plain[k]) for k in plain)
    tower = copy.deepcopy(task.text_encoder.passage_tower).eval()
    tower.load_state_dict(plain)
    ids = task.text_encoder.collate(task.text_encoder.tokenize_passages(["Kalo"], ["Kalo is a country."]))
    with torch.no_grad():
        assert torch.equal(tower(*ids), model.doc_encoder.eval()(*ids))
    # at step 0: the knowledge source's tower, up to the rounding of (w / 0.1) x 0.1
    for k, v in task.text_encoder.passage_tower.state_dict().items():
        torch.testing.assert_close(plain[k], v, rtol=1e-6, atol=1e-7)


def test_checkpoints_with_and_without_doc_encoder_load_across(tiny_world):
    """--finetune-from-model of a plain RAG checkpoint with --train-doc-encoder: the document encoder starts as the
    knowledge source's; a --train-doc-encoder checkpoint loaded without the option: its document tower is left out."""
    task = _task(tiny_world)
    plain = RagTokenModel.build_model(RagConfig(generator_size="tiny"), task)
    _perturb(plain.query_encoder)
    model = _model(task)  # built as fairseq-train builds it: its document encoder is the knowledge source's
    model.load_state_dict(plain.state_dict())
    assert torch.equal(model.query_encoder.bert_model.embeddings.word_embeddings.weight,
                       plain.query_encoder.bert_model.embeddings.word_embeddings.weight)
    for k, v in task.text_encoder.passage_tower.state_dict().items():
        assert torch.equal(model.doc_encoder_state()[k], v), k
    _perturb(model.doc_encoder)
    plain.load_state_dict(model.state_dict())
    assert not any(k.startswith("doc_encoder.") for k in plain.state_dict())


def test_checkpoint_without_doc_encoder_is_a_one_line_error(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save({"cfg": {"model": {"train_doc_encoder": False}}, "model": {"query_encoder.w": torch.zeros(2)}}, path)
    with pytest.raises(UserError, match="no trained document encoder") as err:
        trained_tower.doc_encoder_state_from_checkpoint(str(path))
    assert "\n" not in str(err.value)


def test_served_model_must_agree_with_the_version(tiny_world):
    """A model built from a checkpoint (generation): its document encoder must be the one of the version's vectors;
    in training (not served) a stale index is expected."""
    task = _task(tiny_world)
    served = _model(task, from_checkpoint=True, query_encoder_lr_scale=1.0)
    assert served.context.serving
    own = served.state_dict()
    served.load_state_dict(own)  # the knowledge source's tower: agrees
    trained = _model(_task(tiny_world), query_encoder_lr_scale=1.0)  # a task that serves no checkpoint: training
    assert not trained.context.serving
    _perturb(trained.doc_encoder)
    moved = trained.state_dict()
    trained.load_state_dict(moved)  # training (resume): no check
    with pytest.raises(UserError, match="document encoder differs from the vectors of .* version 1") as err:
        served.load_state_dict(moved)
    assert "--reembed" in str(err.value) and "\n" not in str(err.value)
    # a version re-embedded with that tower records its hash: agreement
    manifest = task.knowledge.manifest
    manifest["document_tower_sha256"] = state_dict_sha256(trained.doc_encoder_state())
    try:
        served.load_state_dict(moved)
    finally:
        del manifest["document_tower_sha256"]


def test_served_plain_model_refuses_a_re_embedded_version(tiny_world):
    """Without --train-doc-encoder the model's document encoder is the one it was trained with: a version re-embedded
    with another tower (document_tower_sha256 in its manifest) is refused when served, the plain version is not."""
    task = _task(tiny_world)
    torch.manual_seed(1)
    served = task.build_model(_fairseq_cfg(RagConfig(generator_size="tiny")), from_checkpoint=True)
    state = served.state_dict()
    served.load_state_dict(state)
    manifest = task.knowledge.manifest
    manifest["document_tower_sha256"] = "f" * 64
    try:
        with pytest.raises(UserError, match="document encoder differs .* embedded with the document encoder"):
            served.load_state_dict(state)
    finally:
        del manifest["document_tower_sha256"]


def test_document_side_identity_check_spares_a_trained_doc_encoder(tiny_world):
    task = _task(tiny_world)
    identity = dict(task.knowledge.encoder_identity, passage_weights_sha256="0" * 64)
    state = {"knowledge": '{"encoder": %s}' % __import__("json").dumps(identity), "variant": "token"}
    plain = RagTokenModel.build_model(RagConfig(generator_size="tiny"), task)
    with pytest.raises(UserError, match="does not match the document encoder"):
        plain.set_extra_state(state)
    _model(task).set_extra_state(state)  # trained its own document tower: weights are checked after loading
    other = dict(identity, vocab_sha256="1" * 64)
    with pytest.raises(UserError, match="vocab_sha256 differ"):
        _model(task).set_extra_state({"knowledge": '{"encoder": %s}' % __import__("json").dumps(other)})


BAD = [
    ({"share_encoder_towers": True, "train_doc_encoder": False}, {}, "--share-encoder-towers"),
    ({"rerank_top": 5, "train_doc_encoder": False}, {}, "add --train-doc-encoder"),
    ({"rerank_top": 2}, {}, "--rerank-top 2 is fewer than --n-docs 3"),
    ({"rerank_top": 41}, {}, "larger than the knowledge source"),
    ({"share_encoder_towers": True, "freeze_query_encoder": True}, {}, "--freeze-query-encoder"),
    ({}, {"retriever": "bm25"}, "--retriever bm25"),
    ({}, {"retriever": "hybrid"}, "--retriever hybrid"),
    ({}, {"n_docs": 0}, "--n-docs 0"),
]


@pytest.mark.parametrize("model_kw,task_kw,needle", BAD)
def test_bad_options_are_one_line_errors(tiny_world, model_kw, task_kw, needle):
    task = _task(tiny_world, **{"n_docs": 3, **task_kw})
    kw = {"train_doc_encoder": True, **model_kw}
    with pytest.raises(UserError) as err:
        task.build_model(_fairseq_cfg(RagConfig(generator_size="tiny", **kw)))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_fid_refuses_train_doc_encoder(tiny_world):
    from rag_plugin.models.fid import FidConfig, FidModel

    with pytest.raises(UserError, match="Fusion-in-Decoder"):
        FidModel.build_model(FidConfig(generator_size="tiny", train_doc_encoder=True), _task(tiny_world))


# ------------------------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def runs(tiny_world, tmp_path_factory):
    """fairseq-train runs side by side: --train-doc-encoder (3 updates, lr scale 0.03 at --lr 1e-3); with
    --share-encoder-towers --rerank-top 6 (2 updates); and two bad option sets (one-line errors)."""
    specs = {"doc": ["--train-doc-encoder", "--max-update", "3"],
             "shared": ["--train-doc-encoder", "--share-encoder-towers", "--rerank-top", "6", "--max-update", "2"],
             "few": ["--train-doc-encoder", "--rerank-top", "2", "--max-update", "1"],
             "fid": ["--train-doc-encoder", "--criterion", "cross_entropy", "--max-update", "1"]}
    jobs = {}
    for name, extra in specs.items():
        tmp = tmp_path_factory.mktemp(name)
        cmd = _args(tiny_world, tmp / "ckpt", arch="fid_tiny" if name == "fid" else "rag_token_tiny",
                    extra=["--no-epoch-checkpoints", "--dropout", "0", *extra])
        jobs[name] = (tmp / "ckpt", subprocess.Popen(cmd, cwd=tmp, env=_env(1), stdout=subprocess.PIPE,
                                                     stderr=subprocess.PIPE, text=True))
    out = {}
    for name, (save, proc) in jobs.items():
        proc.stdout_text, proc.stderr = proc.communicate(timeout=600)
        out[name] = (save, proc)
    return out


def _trained(runs, name) -> Path:
    save, proc = runs[name]
    assert proc.returncode == 0, (proc.stdout_text + proc.stderr)[-4000:]
    return save / "checkpoint_last.pt"


@pytest.mark.slow
def test_fairseq_train_trains_the_doc_encoder(tiny_world, runs):
    from rag_plugin.retrieval.knowledge import KnowledgeSource

    ckpt = _trained(runs, "doc")
    log = runs["doc"][1].stdout_text + runs["doc"][1].stderr
    assert "| valid |" in log and "'train_doc_encoder': True" in log  # validated with the recomputed scores
    state = _load(ckpt)
    initial = KnowledgeSource(str(tiny_world["ks"])).load_encoder().passage_tower.state_dict()
    plain = trained_tower.doc_encoder_state_from_checkpoint(str(ckpt))
    assert set(plain) == set(initial)
    assert any(not torch.allclose(plain[k], v, rtol=0, atol=1e-6) for k, v in initial.items())  # it learned
    # the checkpoint holds the reparametrised weights (x 0.03 = the plain ones) and the hash of the plain tower
    stored = {k[len("doc_encoder."):]: v for k, v in state["model"].items() if k.startswith("doc_encoder.")}
    assert any(k.endswith(".parametrizations.weight.original") for k in stored)
    resolved = lr_scale.plain_state(stored, 0.03)
    assert all(torch.equal(resolved[k], plain[k]) for k in plain)
    assert state["model"]["_extra_state"]["document_tower_sha256"] == state_dict_sha256(plain)
    # the query encoder learned too (its own tower, apart)
    query = lr_scale.plain_state({k[len("query_encoder."):]: v for k, v in state["model"].items()
                                  if k.startswith("query_encoder.")}, 0.03)
    assert any(not torch.allclose(query[k], v, rtol=0, atol=1e-6) for k, v in initial.items())
    assert any(not torch.equal(query[k], plain[k]) for k in plain)


@pytest.mark.slow
def test_shared_towers_with_rerank_train_one_tower(tiny_world, runs):
    ckpt = _trained(runs, "shared")
    model = _load(ckpt)["model"]
    assert not any(k.startswith("doc_encoder.") for k in model)
    plain = trained_tower.doc_encoder_state_from_checkpoint(str(ckpt))
    query = lr_scale.plain_state({k[len("query_encoder."):]: v for k, v in model.items()
                                  if k.startswith("query_encoder.")}, 0.03)
    assert set(plain) == set(query) and all(torch.equal(plain[k], query[k]) for k in plain)


@pytest.mark.slow
@pytest.mark.parametrize("name,needle", [("few", "--rerank-top 2 is fewer than --n-docs 3"),
                                         ("fid", "--train-doc-encoder trains the document encoder through p(z|x)")])
def test_bad_options_on_the_command_line(runs, name, needle):
    _, proc = runs[name]
    _assert_one_line_error(types.SimpleNamespace(returncode=proc.returncode, stderr=proc.stderr,
                                                 stdout=proc.stdout_text), needle)


@pytest.mark.slow
def test_generation_refuses_a_doc_encoder_the_vectors_do_not_come_from(tiny_world, runs):
    ckpt = _trained(runs, "doc")
    proc = _run("fairseq-generate", tiny_world, "--path", ckpt, "--gen-subset", "test", "--beam", "2")
    _assert_one_line_error(proc, "the checkpoint's document encoder differs from the vectors of", "version 1",
                           "rag-update-knowledge --knowledge", f"--reembed {ckpt}")
    from rag_plugin.hub import RAG

    with pytest.raises(UserError, match="document encoder differs from the vectors of"):
        RAG.from_pretrained(str(ckpt), knowledge=str(tiny_world["ks"]))
