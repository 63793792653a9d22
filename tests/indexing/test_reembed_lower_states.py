"""Re-embedding from cached lower-layer states (``python -m rag_plugin.indexing.reembed --lower-states DIR``, what the
trainer's re-index runs under --doc-encoder-train-layers): the vectors of the whole tower, with only its top layers
run; a cache of other frozen weights is a one-line error."""
import os
import subprocess
import sys

import numpy as np
import torch

from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source
from rag_plugin.models.context import PassageTokenizer
from rag_plugin.retrieval.encoders import lower_states as cache
from rag_plugin.retrieval.knowledge import KnowledgeSource
from tests.conftest import ROOT, assert_one_line_error, synthetic_passages, write_jsonl

SPEC = "random:dim=32,layers=2,heads=2,intermediate=64,seed=0,max_length=32"
N = 90


def _module(*args):
    return subprocess.run([sys.executable, "-m", "rag_plugin.indexing.reembed", *map(str, args)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})


def _world(tmp_path):
    src = write_jsonl(tmp_path / "p.jsonl", synthetic_passages(N, seed=5))
    ks = build_knowledge_source(str(tmp_path / "ks"), BuildSettings(passages=str(src), encoder=SPEC),
                                BuildOptions(progress=False, log=lambda m: None))
    encoder = ks.load_encoder()
    tower = encoder.passage_tower
    key = cache.cache_key(cache.frozen_part(tower.state_dict(), 1), 1, ks.passages.sha256)
    tokenizer = PassageTokenizer(encoder)
    lower = cache.lower_states(tower, 1, key, ks.passages, tokenizer.ids, tokenizer.collate,
                               tmp_path / "ks" / ".lower_states", progress=False)
    return ks, encoder, lower


def _moved(state, prefix, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) if k.startswith(prefix) else v.clone()
            for k, v in state.items()}


def test_reembedding_from_the_cache_gives_the_whole_towers_vectors(tmp_path):
    ks, encoder, lower = _world(tmp_path)
    state = _moved(encoder.passage_tower.state_dict(), "bert_model.encoder.layer.1.")  # the trained top layer
    torch.save({"document_tower": state}, tmp_path / "tower.pt")
    proc = _module("--knowledge", tmp_path / "ks", "--tower", tmp_path / "tower.pt", "--lower-states",
                   lower.directory, "--chunk-size", 32)
    assert proc.returncode == 0, proc.stderr
    new = KnowledgeSource(str(tmp_path / "ks"))
    assert new.version == 2
    encoder.passage_tower.load_state_dict(state)
    store = ks.passages
    whole = encoder.encode_passages([store.title(r) for r in range(N)], [store.text(r) for r in range(N)],
                                    progress=False)
    np.testing.assert_allclose(np.asarray(new.vectors), whole, rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(new.vectors), np.asarray(ks.vectors), atol=1e-3)  # they did move


def test_a_cache_of_other_frozen_weights_is_a_one_line_error(tmp_path):
    _, encoder, lower = _world(tmp_path)
    state = _moved(encoder.passage_tower.state_dict(), "bert_model.encoder.layer.0.")  # a frozen layer moved
    torch.save({"document_tower": state}, tmp_path / "tower.pt")
    proc = _module("--knowledge", tmp_path / "ks", "--tower", tmp_path / "tower.pt", "--lower-states",
                   lower.directory)
    assert_one_line_error(proc, "the lower-layer cache is not of this tower's frozen 1 layers", "--lower-states")
    assert KnowledgeSource(str(tmp_path / "ks")).version == 1
    assert_one_line_error(_module("--knowledge", tmp_path / "ks", "--tower", tmp_path / "tower.pt",
                                  "--lower-states", tmp_path), "not a complete lower-layer cache")


def test_rag_update_knowledge_reembed_finds_the_cache_itself(tmp_path):
    """rag-update-knowledge --reembed (no option): a cache of exactly the tower's frozen layers over these passages
    is used, with the whole tower's vectors; another tower's frozen layers are embedded by every layer."""
    ks, encoder, lower = _world(tmp_path)
    state = _moved(encoder.passage_tower.state_dict(), "bert_model.encoder.layer.1.")
    torch.save({"document_tower": state}, tmp_path / "tower.pt")
    cli = [sys.executable, "-m", "rag_plugin.cli.update_knowledge", "--knowledge", str(tmp_path / "ks"), "--reembed",
           str(tmp_path / "tower.pt"), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"the tower's lower 1 layers: from the cache {lower.directory}" in proc.stderr
    encoder.passage_tower.load_state_dict(state)
    store = ks.passages
    whole = encoder.encode_passages([store.title(r) for r in range(N)], [store.text(r) for r in range(N)],
                                    progress=False)
    np.testing.assert_allclose(np.asarray(KnowledgeSource(str(tmp_path / "ks")).vectors), whole, rtol=1e-5, atol=1e-6)
    other = _moved(encoder.passage_tower.state_dict(), "bert_model.encoder.layer.0.", seed=2)  # a frozen layer moved
    torch.save({"document_tower": other}, tmp_path / "tower.pt")
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "from the cache" not in proc.stderr, proc.stderr
    assert KnowledgeSource(str(tmp_path / "ks")).version == 3
