"""RetrievalQADataset batching: --max-tokens below an example is a one-line error, never a skip."""
import numpy as np
import pytest

from rag_plugin.data.qa_dataset import RetrievalQADataset
from rag_plugin.util.errors import UserError


def _dataset():
    # sizes (question + target + </s>): 3 + 2 = 5, 5 + 4 = 9, 4 + 3 = 7
    return RetrievalQADataset(None, [[5, 6, 7], [5, 6, 7, 8, 9], [5, 6, 7, 8]], [[10], [10, 11, 12], [10, 11]],
                              pad=1, eos=2, record_ids=["a", "b", "c"])


def _greedy_batches(sizes, order, max_tokens):
    """fairseq's rule by hand: a batch grows while (its longest example) x (its examples) fits."""
    batches, current = [], []
    for i in order:
        if current and max(sizes[j] for j in current + [i]) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


def test_max_tokens_below_the_longest_example_is_one_line_error():
    ds = _dataset()
    assert ds.sizes.tolist() == [5, 9, 7]
    with pytest.raises(UserError) as err:
        ds.batch_by_size(ds.ordered_indices(), max_tokens=8)
    line = err.value.render()
    assert "--max-tokens 8" in line and "example 1 (id 'b')" in line and "9 tokens" in line
    assert "1 example(s)" in line and line.endswith("(raise --max-tokens to at least 9, or use --batch-size)")
    assert "\n" not in line


@pytest.mark.parametrize("max_tokens", [9, 14, 15, 18, 21, None])
def test_batches_are_fairseqs_when_every_example_fits(max_tokens):
    ds = _dataset()
    order = ds.ordered_indices()
    assert order.tolist() == [0, 2, 1]
    batches = [np.asarray(b).tolist() for b in ds.batch_by_size(order, max_tokens=max_tokens, max_sentences=8)]
    expect = _greedy_batches(ds.sizes.tolist(), order.tolist(), max_tokens or 10**9)
    assert batches == expect
    assert sorted(i for b in batches for i in b) == [0, 1, 2]  # nothing skipped
