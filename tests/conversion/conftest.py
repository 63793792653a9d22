"""Fixtures of the conversion tests: the random Hugging Face RAG world of hf_world.py (both variants,
their reference objects, the knowledge dataset), both variants converted with rag-convert-hf's code
and the knowledge dataset imported for each, and ``load_converted`` to load a converted checkpoint
with fairseq's own loader, as fairseq-generate does (the plugin's allow-list in scope only)."""
import pytest

from tests.conversion import hf_world


@pytest.fixture(scope="session")
def world(tmp_path_factory):
    return hf_world.build(tmp_path_factory.mktemp("hf_rag"))


def _import_kwargs(world):
    forms = world["dataset"]
    if "save_to_disk" in forms:
        return dict(dataset=str(forms["save_to_disk"]), faiss_index=str(forms["faiss_index"]))
    tsv, npy, ids = forms["tsv"]
    return dict(passages=str(tsv), vectors=[str(npy)], ids=[str(ids)])


@pytest.fixture(scope="session")
def converted(world):
    from rag_plugin.conversion.hf_rag import convert_hf_rag
    from rag_plugin.indexing import BuildOptions
    from rag_plugin.indexing.import_knowledge import ImportRequest, import_knowledge

    out = {}
    for variant in ("token", "sequence"):
        ckpt_dir = world["root"] / f"plugin-{variant}"
        convert_hf_rag(str(world[variant]["dir"]), str(ckpt_dir), log=lambda m: None)
        ks = world["root"] / f"ks-{variant}"
        import_knowledge(str(ks), ImportRequest(rag_checkpoint=str(ckpt_dir), **_import_kwargs(world)),
                         BuildOptions(progress=False, log=lambda m: None))
        out[variant] = {"dir": ckpt_dir, "ks": ks, "checkpoint": ckpt_dir / "checkpoint.pt"}
    return out


@pytest.fixture(scope="session")
def load_converted(converted):
    """``load(variant, **task_overrides) -> (model in eval mode, task)``."""
    import rag_plugin

    rag_plugin.register()

    def load(variant, **overrides):
        from fairseq import checkpoint_utils

        from rag_plugin.util.safe_load import checkpoint_types_allowed

        c = converted[variant]
        with checkpoint_types_allowed():
            models, _, task = checkpoint_utils.load_model_ensemble_and_task(
                [str(c["checkpoint"])],
                arg_overrides={"knowledge": str(c["ks"]), "n_docs": hf_world.N_DOCS, **overrides})
        return models[0].eval(), task

    return load
