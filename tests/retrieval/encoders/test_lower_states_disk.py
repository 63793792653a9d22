"""The lower-layer cache (--doc-encoder-train-layers) at scale: its size (tokens x hidden x 4 bytes) checked against
the free disk before it is built, exactly for a small store and from a sample before tokenizing a large one (a cache
that does not fit is a one-line error with the figures and the fix, and leaves nothing behind); the passages are
tokenized a window at a time, into the same cache."""
import collections
import shutil

import numpy as np
import pytest

from rag_plugin.retrieval.encoders import lower_states as cache
from rag_plugin.retrieval.encoders.random import build_random_encoder
from rag_plugin.util.errors import UserError
from tests.retrieval.encoders.test_lower_states import Store

Usage = collections.namedtuple("Usage", "total used free")


class RowStore(Store):
    """A store with row access (as the passage store has): the sample is spread over it."""

    def title(self, row):
        return self.rows[row][0]

    def text(self, row):
        return self.rows[row][1]


@pytest.fixture(scope="module")
def encoder():
    return build_random_encoder(dim=32, layers=2, heads=2, intermediate=64, seed=4)


def _free(monkeypatch, free):
    seen = []

    def usage(path):
        seen.append(str(path))
        return Usage(10 * free + 1, 0, free)

    monkeypatch.setattr(shutil, "disk_usage", usage)
    return seen


def _build(encoder, store, root, tokenize=None):
    tower = encoder.passage_tower
    key = cache.cache_key(cache.frozen_part(tower.state_dict(), 1), 1, store.sha256)
    return cache.lower_states(tower, 1, key, store, tokenize or encoder.tokenize_passages, encoder.collate, root,
                              progress=False)


def test_a_cache_larger_than_the_free_disk_is_a_one_line_error_with_the_figures(encoder, tmp_path, monkeypatch):
    store = Store(70)
    tokens = sum(len(x) for x in encoder.tokenize_passages(*map(list, zip(*store.rows))))
    need = tokens * 32 * 4 + 71 * 8
    assert cache.cache_bytes(70, tokens, 32) == need
    enough = need * (1 + cache.HEADROOM_FRACTION) + cache.HEADROOM_BYTES
    seen = _free(monkeypatch, int(enough) - 1)
    with pytest.raises(UserError) as err:
        _build(encoder, store, tmp_path / "lower")
    message = str(err.value)
    assert "\n" not in message
    assert (f"needs {need / 1e9:.2f} GB (70 passages x {tokens / 70:.0f} tokens x hidden size 32 x 4 bytes, plus 10% "
            f"headroom) but its disk has {(int(enough) - 1) / 1e9:.2f} GB free") in message
    assert "--doc-encoder-train-layers 0" in message and "larger disk" in message
    assert seen == [str(tmp_path / "lower")]  # the filesystem the cache goes on
    assert [p.name for p in (tmp_path / "lower").iterdir()] == [p.name for p in (tmp_path / "lower").glob("*.lock")]
    _free(monkeypatch, int(enough) + 1)
    built = _build(encoder, store, tmp_path / "lower")
    assert built.meta["tokens"] == tokens
    assert sum(f.stat().st_size for f in built.directory.glob("*.npy")) >= need  # the estimate is the size


def test_a_large_store_is_refused_from_a_sample_before_it_is_tokenized(encoder, tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "SAMPLE", 40)
    store = RowStore(400, seed=2)
    tokenized = []

    def tokenize(titles, texts):
        tokenized.append(len(titles))
        return encoder.tokenize_passages(titles, texts)

    exact = sum(len(x) for x in encoder.tokenize_passages(*map(list, zip(*store.rows))))
    _free(monkeypatch, 1000)
    with pytest.raises(UserError, match=r"400 passages x ~\d+ tokens x hidden size 32") as err:
        _build(encoder, store, tmp_path, tokenize)
    assert tokenized == [40]  # the sample only, spread over the store
    per = float(str(err.value).split("passages x ~")[1].split(" ")[0])
    assert per == pytest.approx(exact / 400, rel=0.15)


def test_the_figures_at_wikipedia_scale():
    """21M passages of ~150 tokens, BERT-base: ~9.7 TB, against 2 TB free."""
    with pytest.raises(UserError) as err:
        import unittest.mock

        with unittest.mock.patch.object(shutil, "disk_usage", lambda path: Usage(4e12, 2e12, 2e12)):
            cache.check_disk("/data/ks/.lower_states", 21_000_000, 21_000_000 * 150, 768, estimated=True)
    assert ("needs 9,677 GB (21,000,000 passages x ~150 tokens x hidden size 768 x 4 bytes, plus 10% headroom) but its "
            "disk has 2,000 GB free") in str(err.value)


def test_the_build_tokenizes_a_window_at_a_time_into_the_same_cache(encoder, tmp_path, monkeypatch):
    store = Store(70, seed=3)
    whole = _build(encoder, store, tmp_path / "whole")
    monkeypatch.setattr(cache, "TOKENIZE_WINDOW", 16)
    sizes = []

    def tokenize(titles, texts):
        sizes.append(len(titles))
        return encoder.tokenize_passages(titles, texts)

    windowed = _build(encoder, store, tmp_path / "windowed", tokenize)
    assert sizes == [16, 16, 16, 16, 6]
    np.testing.assert_array_equal(windowed.offsets, whole.offsets)
    np.testing.assert_array_equal(np.asarray(windowed.states), np.asarray(whole.states))
    assert sorted(p.name for p in windowed.directory.iterdir()) == ["meta.json", "offsets.npy", "states.npy"]
