"""The cached lower layers of a passage tower (rag_plugin/retrieval/encoders/lower_states.py): the tower continued
from the cache gives the vectors of the whole tower; the cache is built once, atomically, named by its weights and
passages; rows outside it are a one-line error."""
import json
import os

import numpy as np
import pytest
import torch

from rag_plugin.retrieval.encoders import lower_states as cache
from rag_plugin.retrieval.encoders.random import build_random_encoder
from rag_plugin.retrieval.encoders.text_encoder import TextEncoder
from rag_plugin.util.errors import UserError


class Store:
    """The passage-store interface the cache reads: rows' titles and texts, a content hash."""

    def __init__(self, n, seed=0, sha256="abc"):
        rng = np.random.default_rng(seed)
        words = ["river", "mountain", "capital", "1887", "population", "island", "coast", "founded", "empire"]
        self.rows = [(f"Title {i}", " ".join(rng.choice(words, size=int(rng.integers(3, 40)))))
                     for i in range(n)]
        self.sha256 = sha256

    def __len__(self):
        return len(self.rows)

    def iter_titles_texts(self):
        return iter(self.rows)


@pytest.fixture(scope="module", params=["mean", "cls"])
def encoder(request) -> TextEncoder:
    enc = build_random_encoder(dim=32, layers=3, heads=2, intermediate=64, seed=4)
    for tower in (enc.query_tower, enc.passage_tower):
        tower.pooling = request.param
    return enc


def _build(encoder, store, layers, root):
    tower = encoder.passage_tower
    key = cache.cache_key(cache.frozen_part(tower.state_dict(), layers), layers, store.sha256)
    return cache.lower_states(tower, layers, key, store, encoder.tokenize_passages, encoder.collate, root,
                              progress=False), key


@pytest.mark.parametrize("layers", [0, 1, 2, 3])
def test_tower_continued_from_the_cache_equals_the_whole_tower(encoder, tmp_path, layers):
    store = Store(70)  # more than one building batch of 64, lengths mixed
    states, _ = _build(encoder, store, layers, tmp_path)
    assert len(states) == 70 and states.layers == layers
    titles, texts = zip(*store.rows)
    whole = encoder.encode_passages(titles, texts, progress=False)  # the knowledge source's own path
    rows = [69, 3, 3, 40, 0]
    hidden, mask = states.gather(rows)
    assert mask.sum(1).tolist() == [len(ids) for ids in encoder.tokenize_passages(
        [titles[r] for r in rows], [texts[r] for r in rows])]
    tower = encoder.passage_tower.eval()
    with torch.no_grad():
        continued = tower.forward_from(hidden, mask, layers).numpy()
    np.testing.assert_allclose(continued, whole[rows], rtol=1e-5, atol=1e-6)


def test_lower_states_are_the_first_layers_output(encoder, tmp_path):
    """What is stored for a passage is exactly BERT's hidden state after the embeddings and the first M layers."""
    store = Store(5)
    states, _ = _build(encoder, store, 2, tmp_path)
    tower = encoder.passage_tower.eval()
    ids = encoder.tokenize_passages([store.rows[4][0]], [store.rows[4][1]])
    with torch.no_grad():
        x = tower.bert_model.embeddings(torch.tensor(ids), torch.zeros(1, len(ids[0]), dtype=torch.long))
        for layer in tower.bert_model.encoder.layer[:2]:
            x = layer(x, None)
    hidden, mask = states.gather([4])
    np.testing.assert_allclose(hidden[0].numpy(), x[0].numpy(), rtol=1e-5, atol=1e-6)


def test_built_once_named_by_weights_and_passages(encoder, tmp_path):
    store = Store(10)
    first, key = _build(encoder, store, 1, tmp_path)
    stamp = os.stat(first.directory / "states.npy").st_mtime_ns
    again, key2 = _build(encoder, store, 1, tmp_path)
    assert key2 == key and again.directory == first.directory
    assert os.stat(again.directory / "states.npy").st_mtime_ns == stamp  # read, not built again
    meta = json.loads((first.directory / "meta.json").read_text())
    assert meta["count"] == 10 and meta["key"] == key and meta["passages_sha256"] == "abc"
    other_passages = cache.cache_key(cache.frozen_part(encoder.passage_tower.state_dict(), 1), 1, "def")
    other_layers = cache.cache_key(cache.frozen_part(encoder.passage_tower.state_dict(), 2), 2, "abc")
    state = {k: v.clone() for k, v in encoder.passage_tower.state_dict().items()}
    state["bert_model.encoder.layer.0.output.dense.bias"] += 1e-3
    other_weights = cache.cache_key(cache.frozen_part(state, 1), 1, "abc")
    state = {k: v.clone() for k, v in encoder.passage_tower.state_dict().items()}
    state["bert_model.encoder.layer.1.output.dense.bias"] += 1e-3  # above the frozen part: the same cache
    assert cache.cache_key(cache.frozen_part(state, 1), 1, "abc") == key
    assert len({key, other_passages, other_layers, other_weights}) == 4


def test_building_a_new_cache_names_the_older_ones_and_their_size(encoder, tmp_path, caplog):
    """Caches are never removed; a new build logs the older complete ones with their total size, and nothing when
    it is the only one or when a cache is only read."""
    with caplog.at_level("WARNING", logger=cache.__name__):
        first, _ = _build(encoder, Store(10), 1, tmp_path)
        assert not caplog.records
        second, _ = _build(encoder, Store(10, sha256="def"), 1, tmp_path)
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    size = sum(f.stat().st_size for f in first.directory.iterdir())
    assert f"1 older lower-layer cache(s) in {tmp_path} take {size / 1e9:.2f} GB ({first.directory.name})" in message
    assert second.directory.name not in message
    assert cache.other_caches(tmp_path, second.directory) == [(first.directory, size)]
    caplog.clear()
    with caplog.at_level("WARNING", logger=cache.__name__):
        _build(encoder, Store(10, sha256="def"), 1, tmp_path)  # complete: read, not built
    assert not caplog.records


def test_an_interrupted_build_is_never_read(encoder, tmp_path, monkeypatch):
    store = Store(10)
    calls = {"n": 0}
    real = encoder.collate

    def failing(ids):
        calls["n"] += 1
        raise KeyboardInterrupt  # killed mid-build

    tower = encoder.passage_tower
    key = cache.cache_key(cache.frozen_part(tower.state_dict(), 1), 1, store.sha256)
    with pytest.raises(KeyboardInterrupt):
        cache.lower_states(tower, 1, key, store, encoder.tokenize_passages, failing, tmp_path, progress=False)
    assert calls["n"] == 1 and not (tmp_path / key[:24]).exists() and (tmp_path / f"{key[:24]}.partial").exists()
    states = cache.lower_states(tower, 1, key, store, encoder.tokenize_passages, real, tmp_path, progress=False)
    assert len(states) == 10 and not (tmp_path / f"{key[:24]}.partial").exists()


def test_find_returns_only_a_complete_cache_of_the_towers_frozen_layers(encoder, tmp_path):
    """cache.find (what reembed continues from by itself): the cache of exactly this tower's frozen layers over these
    passages, whatever its layer count; never another tower's or passages', a build not yet renamed, or a cache
    that cannot be read."""
    store = Store(10)
    state = encoder.passage_tower.state_dict()
    assert cache.find(tmp_path, state, store.sha256) is None  # nothing built
    built, key = _build(encoder, store, 2, tmp_path)
    found = cache.find(tmp_path, state, store.sha256)
    assert found is not None and found.directory == built.directory and found.layers == 2
    assert cache.find(tmp_path, state, "other passages") is None
    moved = {k: v.clone() for k, v in state.items()}
    moved["bert_model.encoder.layer.1.output.dense.bias"] += 1e-3  # a frozen layer moved
    assert cache.find(tmp_path, moved, store.sha256) is None
    os.replace(built.directory, built.directory.with_suffix(".partial"))  # as if killed just before the rename
    assert cache.find(tmp_path, state, store.sha256) is None
    os.replace(built.directory.with_suffix(".partial"), built.directory)
    (built.directory / "states.npy").unlink()  # unreadable: passed over, not a traceback
    assert cache.find(tmp_path, state, store.sha256) is None


def test_rows_outside_the_cache_are_a_one_line_error(encoder, tmp_path):
    states, _ = _build(encoder, Store(4), 1, tmp_path)
    with pytest.raises(UserError, match="passage row 4 is not in the cached") as err:
        states.gather([1, 4])
    assert "\n" not in str(err.value)


def test_an_unwritable_folder_is_a_one_line_error(encoder, tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="cannot write the lower-layer cache") as err:
        _build(encoder, Store(3), 1, tmp_path / "file" / "below")
    assert "--doc-encoder-train-layers 0" in str(err.value) and "\n" not in str(err.value)
