"""Embedding on a device and in half precision (rag-build-knowledge / rag-update-knowledge --device --fp16,
TextEncoder.for_embedding): the fp16 vectors are within float16 rounding of the float32 ones (and not equal: the
half-precision forward ran), stored float32, the encoder's identity unchanged and ``embedding_fp16`` recorded; every
tensor the towers get is on their device; a GPU asked for without CUDA is a one-line error."""
import numpy as np
import pytest
import torch

from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source
from rag_plugin.indexing.reembed import Reembedding, reembed
from rag_plugin.retrieval.encoders import load_encoder
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.util.errors import UserError
from tests.conftest import assert_one_line_error, synthetic_passages, write_jsonl
from tests.indexing.test_build_cli import _run
from tests.indexing.test_reembed import _cli, _own_state, _perturbed, _vectors

SPEC = "random:dim=64,layers=2,heads=4,intermediate=128,seed=0,max_length=48"
N = 60


def _close_not_equal(half: np.ndarray, full: np.ndarray) -> None:
    assert half.dtype == np.float32 and half.shape == full.shape
    scale = float(np.abs(full).max())
    assert np.abs(half - full).max() <= 1e-2 * scale  # float16 rounding (10-bit mantissa) through 2 layers
    assert not np.array_equal(half, full)  # the forward did run in half precision


def _library_build(tmp_path, src):
    return build_knowledge_source(str(tmp_path / "fp32"), BuildSettings(passages=str(src), encoder=SPEC),
                                  BuildOptions(progress=False, log=lambda m: None))


def test_fp16_build_is_float16_rounding_of_float32_stored_float32(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(N, seed=3))
    proc = _run("-m", "rag_plugin.cli.build_knowledge", "--passages", src, "--out", tmp_path / "fp16",
                "--encoder", SPEC, "--device", "cpu", "--fp16", "--quiet")
    assert proc.returncode == 0, proc.stderr
    half, full = KnowledgeSource(str(tmp_path / "fp16")), _library_build(tmp_path, src)
    assert np.load(tmp_path / "fp16" / "vectors.npy", mmap_mode="r").dtype == np.float32
    _close_not_equal(_vectors(half), _vectors(full))
    assert half.manifest["embedding_fp16"] is True and "embedding_fp16" not in full.manifest
    assert half.encoder_identity == full.encoder_identity  # the weights, not the precision, name the encoder


def test_fp16_reembed_and_update_through_rag_update_knowledge(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(N, seed=4))
    ks = _library_build(tmp_path, src)
    state = _perturbed(_own_state(ks))
    torch.save({"document_tower": state}, tmp_path / "tower.pt")
    ok = _cli("--knowledge", str(tmp_path / "fp32"), "--reembed", str(tmp_path / "tower.pt"), "--fp16",
              "--device", "cpu")
    assert ok.returncode == 0, ok.stderr
    half = KnowledgeSource(str(tmp_path / "fp32"))
    assert half.version == 2 and half.manifest["embedding_fp16"] is True
    build_knowledge_source(str(tmp_path / "ref"), BuildSettings(passages=str(src), encoder=SPEC),
                           BuildOptions(progress=False, log=lambda m: None))
    reembed(str(tmp_path / "ref"), state, Reembedding("test"), BuildOptions(progress=False, log=lambda m: None))
    _close_not_equal(_vectors(half), _vectors(KnowledgeSource(str(tmp_path / "ref"))))
    # new passages of a plain update go through the encoder in half precision too
    plain = build_knowledge_source(str(tmp_path / "plain"), BuildSettings(passages=str(src), encoder=SPEC),
                                   BuildOptions(progress=False, log=lambda m: None))
    added = [{"id": f"new{i}", "title": "Added", "text": f"a passage added later, number {i}"} for i in range(3)]
    write_jsonl(tmp_path / "add.jsonl", added)
    ok = _cli("--knowledge", str(tmp_path / "plain"), "--add", str(tmp_path / "add.jsonl"), "--fp16")
    assert ok.returncode == 0, ok.stderr
    updated = KnowledgeSource(str(tmp_path / "plain"))
    assert updated.version == 2 and updated.manifest["embedding_fp16"] is True
    np.testing.assert_array_equal(_vectors(updated)[:N], _vectors(plain))  # unchanged passages: reused as they were
    expected = load_encoder(SPEC).encode_passages([a["title"] for a in added], [a["text"] for a in added],
                                                  progress=False)
    _close_not_equal(_vectors(updated)[N:], expected)


@pytest.mark.parametrize("module", ["rag_plugin.cli.build_knowledge", "rag_plugin.cli.update_knowledge"])
def test_a_gpu_without_cuda_is_a_one_line_error(tmp_path, module):
    args = ["--passages", tmp_path / "none.jsonl", "--out", tmp_path / "out"] if "build" in module else [
        "--knowledge", tmp_path / "none", "--add", tmp_path / "none.jsonl"]
    assert_one_line_error(_run("-m", module, *args, "--device", "cuda"), "--device cuda: CUDA is not available",
                          "--device cpu")
    assert_one_line_error(_run("-m", module, *args, "--device", "tpu0"), "'tpu0' is not a device")
    assert not (tmp_path / "out").exists()


def test_every_tensor_the_towers_get_is_on_their_device():
    """The encoder moved to the meta device (a stand-in for a GPU: a CPU tensor beside a meta one is an error): the
    towers' forward, spied, is handed meta tensors only."""
    encoder = load_encoder(SPEC).for_embedding("meta")
    seen = []

    def spy(module, args):
        seen.append({a.device for a in args})
        return None

    def stand_in(module, args, output):
        return torch.zeros(output.shape)  # the CPU vectors _encode then reads

    encoder.passage_tower.register_forward_pre_hook(spy)
    encoder.passage_tower.register_forward_hook(stand_in)
    vectors = encoder.encode_passages(["a", "b", None], ["one text", "two texts here", "three"], batch_size=2)
    assert vectors.shape == (3, 64) and vectors.dtype == np.float32
    assert seen == [{torch.device("meta")}] * 2


def test_an_encoder_with_the_interface_only_runs_where_it_runs(hashing_encoder):
    """The tests' HashingEncoder (encode_passages, encode_queries, identity; no towers to move): used as it is by
    default, and a one-line error when --fp16 or a GPU is asked for explicitly (the distributed build's tests
    embed with it)."""
    from rag_plugin.indexing.embedding import embedding_encoder

    assert embedding_encoder(hashing_encoder) is hashing_encoder
    assert embedding_encoder(hashing_encoder, "cpu") is hashing_encoder
    with pytest.raises(UserError, match="chooses its own device and precision"):
        embedding_encoder(hashing_encoder, "cpu", fp16=True)
