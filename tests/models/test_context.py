"""The model's retrieval binding (rag_plugin/models/context.py, RagModel.use_retrieval) and the Retriever protocol's
one call a model makes (``retrieve``), against brute force over the stored vectors."""
import ast
from pathlib import Path

import numpy as np
import pytest
import torch

import rag_plugin

rag_plugin.register()

from rag_plugin.models.context import RetrievalContext  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagTokenModel  # noqa: E402
from rag_plugin.retrieval.retriever import Retriever  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402

PACKAGE = Path(rag_plugin.__file__).parent


def _task(world, retriever="dense", n_docs=3):
    cfg = RetrievalAugmentedConfig(data=str(world["data"]), knowledge=str(world["ks"]), n_docs=n_docs,
                                   retriever=retriever)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("valid")
    return task


def _batch(task, n=4):
    ds = task.datasets["valid"]
    return ds.collater([ds[i] for i in range(n)])


def test_every_retriever_the_task_makes_is_a_retriever_and_a_context_refuses_anything_else(tiny_world):
    for name in ("dense", "bm25", "hybrid"):
        assert isinstance(_task(tiny_world, name).retriever, Retriever), name
    with pytest.raises(TypeError, match="is not a Retriever"):
        RetrievalContext(n_docs=3, input_format=_task(tiny_world).input_format, retriever=object())


def test_dense_retrieve_is_the_top_k_of_scaled_inner_products_over_every_stored_vector(tiny_world):
    task = _task(tiny_world)
    knowledge = task.knowledge
    q = torch.randn(5, knowledge.dim, generator=torch.Generator().manual_seed(0), requires_grad=True)
    logits, rows = task.retriever.retrieve(q, 3, 20.0)
    every = 20.0 * (q.detach().double() @ torch.from_numpy(np.array(knowledge.vectors[:])).double().T)  # [5, N]
    best = every.topk(3, dim=1)
    assert torch.equal(rows, best.indices) and logits.dtype == torch.float32
    assert torch.allclose(logits.double(), best.values, atol=1e-4)
    logits.sum().backward()  # the gradient reaches the query vectors
    assert q.grad is not None and q.grad.abs().sum() > 0


def test_candidates_of_the_dataset_are_what_bm25_returns_and_what_dense_is_forced_to(tiny_world):
    task = _task(tiny_world, "bm25", n_docs=2)
    ni = _batch(task)["net_input"]
    rows, scores = ni["fixed_doc_rows"], ni["fixed_doc_scores"]
    logits, got = task.retriever.retrieve(None, 2, 1.0, (rows, scores))
    assert torch.equal(got, rows[:, :2]) and torch.equal(logits, scores[:, :2].float())
    with pytest.raises(UserError, match="BM25 retrieval reads each question's passages from its dataset"):
        task.retriever.retrieve(None, 2, 1.0)
    dense = _task(tiny_world).retriever
    logits, got = dense.retrieve(None, 1, 20.0, (rows[:, 1:2], torch.zeros(rows.size(0), 1)))
    assert torch.equal(got, rows[:, 1:2]) and not logits.any()
    with pytest.raises(UserError, match="searches with query vectors"):
        dense.retrieve(None, 1, 20.0)


def test_reopen_knowledge_hands_the_model_the_new_retrieval_through_use_retrieval(tiny_world):
    task = _task(tiny_world)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0), task)
    before = model.context
    assert model.retriever is task.retriever and model.n_docs == 3
    task.cfg.n_docs = 2
    task.reopen_knowledge(models=[model])
    assert model.context is not before and model.retriever is task.retriever and model.n_docs == 2
    assert model.knowledge_identity == model.context.identity
    ni = _batch(task)["net_input"]
    with torch.no_grad():
        scores, rows = model.retrieve(ni["query_tokens"], ni["query_mask"], model.n_docs)
    assert rows.shape == (4, 2) and scores.shape == (4, 2)


def _writes_of(root: Path, attributes):
    """(file, line, attribute) of every assignment to ``<anything>.<attribute>`` in the ``.py`` files under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for target in targets:
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(t, ast.Attribute) and t.attr in attributes:
                        found.append((path.relative_to(root).as_posix(), t.lineno, t.attr))
    return found


def _enclosing_function(path: Path, line: int) -> str:
    lines = path.read_text(encoding="utf-8").splitlines()[:line]
    return next(text for text in reversed(lines) if text.lstrip().startswith("def ")).split("(")[0].split()[-1]


def test_use_retrieval_is_the_only_writer_of_a_models_retrieval():
    """Nothing but RagModel.use_retrieval (from __init__) assigns a model's context and identity, and
    set_extra_state only the identity a checkpoint was trained with; nothing assigns a retriever or a score scale
    to anything (the model reads them, its K and its input format from the context)."""
    writes = _writes_of(PACKAGE, {"context", "knowledge_identity", "retriever", "doc_score_scale"})
    where = {}
    for file, line, attr in writes:
        assert file == "models/rag.py", (file, line, attr)
        where.setdefault(_enclosing_function(PACKAGE / file, line), set()).add(attr)
    assert where == {"__init__": {"context", "knowledge_identity"}, "use_retrieval": {"context", "knowledge_identity"},
                     "set_extra_state": {"knowledge_identity"}}


def test_the_writer_check_finds_a_rebinding_from_outside(tmp_path):
    (tmp_path / "hub.py").write_text("def reload(model, c):\n    model.context, model.retriever = c, c.retriever\n")
    assert _writes_of(tmp_path, {"context", "retriever"}) == [("hub.py", 2, "context"), ("hub.py", 2, "retriever")]
