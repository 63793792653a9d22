"""The decoder-only reader's shared cache (rag_plugin/models/lm_prefix_cache.py): each context's keys and values are
held once whatever the rows reading it; following the beams copies only the generated tokens' keys, dropping
finished questions copies the kept contexts once, and a reorder that does not keep a context's rows adjacent gives
each row its own copy. In every case the logits are the full forward's."""
import torch

import rag_plugin

rag_plugin.register()

from rag_plugin.models.lm_reader import _CACHE  # noqa: E402
from rag_plugin.models.rag_lm import RagLMConfig, RagLMTokenModel  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402

PAD = 1


def _setup(world):
    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(
        data=str(world["data"]), knowledge=str(world["ks"]), n_docs=3))
    task.load_dataset("train")
    torch.manual_seed(2)
    model = RagLMTokenModel.build_model(RagLMConfig(generator_size="tiny", dropout=0.0, max_source_positions=48,
                                                    max_target_positions=32), task).eval()
    ds = task.datasets["train"]
    sample = ds.collater([ds[i] for i in range(2)])
    ni = sample["net_input"]
    contexts, _, _ = model.encode(ni["src_tokens"], ni["query_tokens"], ni["query_mask"])
    return model, contexts  # 6 contexts of different lengths


def _full(model, contexts, row_context, tokens):
    """Logits of each row's last token by one full forward of its unpadded context + tokens."""
    out = []
    for r, c in enumerate(row_context.tolist()):
        row = torch.cat([contexts.tokens[c, : contexts.lengths[c]], tokens[r]])
        logits, _ = model.generator(row.unsqueeze(0))
        out.append(logits[0, -1])
    return torch.stack(out)


def test_contexts_are_held_once_and_follow_the_rows(tiny_world):
    model, contexts = _setup(tiny_world)
    reader, beam = model.reader, 4
    torch.manual_seed(0)
    steps = torch.randint(4, len(model.dictionary), (6 * beam, 3))
    with torch.no_grad():
        state = {}
        reader.start(state, contexts.tokens, contexts.lengths)
        cache = state[_CACHE]
        held = cache.layers[0].key.data_ptr()
        expand = torch.arange(6).repeat_interleave(beam)
        reader.reorder(state, expand)
        assert cache.rows_per_group == beam and cache.layers[0].key.data_ptr() == held  # not copied per beam
        row_context, lengths, history = expand.clone(), contexts.lengths[expand], steps[:, :0]
        for t in range(3):
            logits = reader.extend(state, steps[:, t: t + 1], lengths, t)[:, -1]
            history = torch.cat([history, steps[:, t: t + 1]], 1)
            torch.testing.assert_close(logits, _full(model, contexts, row_context, history), atol=1e-5, rtol=1e-5)
            if t == 0:  # the beams of each context reordered among themselves: the contexts stay where they are
                order = (torch.arange(6).repeat_interleave(beam) * beam
                         + torch.randint(0, beam, (6 * beam,), generator=torch.Generator().manual_seed(1)))
            elif t == 1:  # contexts 1 and 4 finished: theirs leave, the kept ones are copied once
                kept = torch.tensor([0, 2, 3, 5])
                order = (kept.repeat_interleave(beam) * beam + torch.arange(beam).repeat(4))
            else:  # nothing finished, the beams kept: the identity
                order = torch.arange(steps.size(0))
            reader.reorder(state, order)
            if t == 0:
                assert cache.layers[0].key.data_ptr() == held and cache.rows_per_group == beam
            steps, history, row_context, lengths = steps[order], history[order], row_context[order], lengths[order]
        assert cache.groups == 4 and cache.rows_per_group == beam
        # a reorder that interleaves the contexts' rows: each row its own copy, the same logits
        order = torch.arange(steps.size(0)).flip(0)
        reader.reorder(state, order)
        history, row_context, lengths = history[order], row_context[order], lengths[order]
        assert cache.rows_per_group == 1 and cache.groups == steps.size(0)
        nxt = torch.randint(4, len(model.dictionary), (steps.size(0), 1))
        logits = reader.extend(state, nxt, lengths, 3)[:, -1]
        torch.testing.assert_close(logits, _full(model, contexts, row_context, torch.cat([history, nxt], 1)),
                                   atol=1e-5, rtol=1e-5)
