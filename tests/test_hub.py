import copy
from pathlib import Path

import pytest

from rag_plugin.hub import RAG
from rag_plugin.util.errors import UserError
from tests.generation.test_decoding import _exact_retrieval


@pytest.mark.slow
def test_hub_generate_returns_answers_with_provenance(tiny_world, trained):
    rag = RAG.from_pretrained(str(trained["rag_seq_tiny"]), n_docs=2, rag_decoding="fast")
    out = rag.generate(["What is the capital of Kakaka?", ""], beam=2, nbest=2, max_len_b=4)
    assert len(out) == 2
    for r in out:
        assert isinstance(r["answer"], str) and len(r["provenance"]) == 2 and len(r["alternatives"]) <= 1
        assert abs(sum(p["p"] for p in r["provenance"]) - 1) < 1e-4
        assert r["provenance"][0]["p"] >= r["provenance"][1]["p"]
    # the provenance of the real question: retrieval by brute force (question encoder, every stored vector)
    (expect,) = _exact_retrieval(rag, ["What is the capital of Kakaka?"], k=2)
    assert [(p["id"], p["p"]) for p in out[0]["provenance"]] == [(i, pytest.approx(pz, abs=1e-6)) for i, pz in expect]


def test_hub_without_knowledge_source(tmp_path):
    with pytest.raises(UserError, match="checkpoint not found"):
        RAG.from_pretrained(str(tmp_path / "none.pt"))


@pytest.mark.slow
def test_hub_hot_swap_drops_the_checkpoints_search_settings(tiny_world, trained, tmp_path):
    """A checkpoint trained on an IVF index with --nprobe, hot-swapped to a Flat one: its nprobe is for
    its own index and is dropped (before: '--nprobe applies to IVF indexes only', with no way around it);
    without a swap it still applies, and an explicit one is passed on."""
    import torch

    state = torch.load(trained["rag_token_tiny"], weights_only=False)  # the test's own checkpoint
    state["cfg"]["task"]["nprobe"] = 4  # as if trained on an IVF knowledge source with --nprobe 4
    ckpt = tmp_path / "ivf_trained.pt"
    torch.save(state, ckpt)
    with pytest.raises(UserError, match="--nprobe applies to IVF indexes only"):
        RAG.from_pretrained(str(ckpt), n_docs=2)  # the checkpoint's own (Flat here) knowledge source
    rag = RAG.from_pretrained(str(ckpt), knowledge=str(tiny_world["ks"]), n_docs=2)
    assert rag.task.cfg.nprobe is None
    assert len(rag.generate(["What is the capital of Kakaka?"], beam=1, max_len_b=3)[0]["provenance"]) == 2
    # RAG-Token: fairseq's search returns the whole beam; nbest keeps the best ones
    assert [len(rag.generate(["What is the capital of Kakaka?"], beam=4, nbest=n, max_len_b=3)[0]["alternatives"])
            for n in (1, 3)] == [0, 2]
    with pytest.raises(UserError, match="--nprobe applies to IVF indexes only"):
        RAG.from_pretrained(str(ckpt), knowledge=str(tiny_world["ks"]), n_docs=2, nprobe=8)
    # --knowledge typed relative to where fairseq-train ran: the model's own record (resolved) finds it
    state["cfg"]["task"]["nprobe"] = None
    state["cfg"]["task"]["knowledge"] = "w/ks"
    torch.save(state, ckpt)
    assert RAG.from_pretrained(str(ckpt), n_docs=2).task.cfg.knowledge == str(Path(tiny_world["ks"]).resolve())


@pytest.mark.slow
def test_hub_keeps_its_version_until_reload(tiny_world, trained, tmp_path):
    """A hub keeps the knowledge-source version it opened across an update; reload() reads the new one,
    whose deleted passage is never retrieved again."""
    import shutil

    from rag_plugin.indexing.update import update_knowledge_source

    ks = tmp_path / "ks"
    shutil.copytree(tiny_world["ks"], ks)
    rag = RAG.from_pretrained(str(trained["rag_token_tiny"]), knowledge=str(ks), n_docs=2)
    question = ["What is the capital of Kakaka?"]
    before = rag.generate(question, beam=1, max_len_b=3)[0]["provenance"]
    top = before[0]["id"]
    (tmp_path / "gone.txt").write_text(top + "\n")
    update_knowledge_source(str(ks), delete=str(tmp_path / "gone.txt"), progress=False, log=lambda m: None)
    assert rag.version == 1 and rag.generate(question, beam=1, max_len_b=3)[0]["provenance"] == before
    assert rag.reload() == 2 and rag.version == 2
    after = rag.generate(question, beam=1, max_len_b=3)[0]["provenance"]
    assert top not in [p["id"] for p in after] and after[0]["id"] == before[1]["id"]


def test_hub_device_option_and_to(tiny_world, tmp_path, monkeypatch):
    """device= / RAG.to: a GPU without CUDA is a one-line error before anything loads; a model moved elsewhere
    (meta here) is where RAG.device says."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for device in ("cuda", "cuda:1"):
        with pytest.raises(UserError, match="device cuda.*CUDA is not available") as err:
            RAG.from_pretrained(str(tmp_path / "none.pt"), device=device)
        assert "\n" not in str(err.value)
    from tests.models.test_doc_encoder import _model, _task

    task = _task(tiny_world)
    rag = RAG(task, _model(task, from_checkpoint=True, query_encoder_lr_scale=1.0))
    assert rag.device == torch.device("cpu") and rag.to("meta") is rag and rag.device == torch.device("meta")


@pytest.mark.parametrize("dtype", ["half", "bfloat16"])
def test_hub_reload_of_a_model_cast_to_half_precision_with_a_trained_document_encoder(tiny_world, tmp_path, dtype):
    """A served model with --train-doc-encoder cast to half precision after loading reloads its knowledge source
    (before: refused, its halved tower hashing unlike the float32 one that embedded the version), and a version
    re-embedded with its tower; a version re-embedded with another tower is still refused."""
    import shutil

    import torch

    from rag_plugin.indexing import BuildOptions
    from rag_plugin.indexing.reembed import Reembedding, reembed
    from tests.models.test_doc_encoder import _model, _perturb, _task

    shutil.copytree(tiny_world["data"], tmp_path / "qa")
    shutil.copytree(tiny_world["ks"], tmp_path / "ks")
    world = {"data": tmp_path / "qa", "ks": tmp_path / "ks"}
    task = _task(world)
    served = _model(task, from_checkpoint=True, query_encoder_lr_scale=1.0)
    served.load_state_dict(served.state_dict())  # as a checkpoint loads it (the source's own tower: agrees)
    rag = RAG(task, served)
    own = served.doc_encoder_state()
    getattr(rag.model, dtype)()
    assert next(rag.model.doc_encoder.parameters()).dtype != torch.float32
    assert rag.reload() == 1
    other = copy.deepcopy(served.doc_encoder).float()
    _perturb(other)
    quiet = {"progress": False, "log": lambda m: None}
    reembed(str(world["ks"]), {k: v.float() for k, v in other.state_dict().items()}, Reembedding("another tower"),
            BuildOptions(**quiet))
    with pytest.raises(UserError, match="document encoder differs from the vectors of .* version 2"):
        rag.reload()
    reembed(str(world["ks"]), own, Reembedding("the served tower"), BuildOptions(**quiet))
    assert rag.reload() == 3 and rag.version == 3
