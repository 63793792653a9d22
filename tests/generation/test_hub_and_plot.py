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
