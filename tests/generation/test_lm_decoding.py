"""Decoding a decoder-only RAG model (rag_lm_token, rag_lm_seq): the beam's scores equal teacher-forced scores,
incremental decoding equals the full forward, RAG-Sequence's per-passage beams equal the LM's own beam search over
each passage's row, Thorough >= Fast, and Thorough with beam scores reused equals Thorough teacher-forcing every
pair."""
import pytest
import torch
from fairseq.dataclass.configs import GenerationConfig

import rag_plugin

rag_plugin.register()

from rag_plugin.core import marginalization as M  # noqa: E402
from rag_plugin.generation.lm_adapters import score_lm_candidates  # noqa: E402
from rag_plugin.models.rag_lm import RagLMConfig, RagLMSequenceModel, RagLMTokenModel  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402


def _setup(world, cls, n_docs=3, decoding="thorough", seed=3, context=48):
    cfg = RetrievalAugmentedConfig(data=str(world["data"]), knowledge=str(world["ks"]), n_docs=n_docs,
                                   rag_decoding=decoding)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("test")
    torch.manual_seed(seed)
    model = cls.build_model(RagLMConfig(generator_size="tiny", dropout=0.0, max_source_positions=context,
                                        max_target_positions=32), task).eval()
    ds = task.datasets["test"]
    sample = ds.collater([ds[i] for i in range(len(ds))])
    return task, model, sample


def _gen(task, model, sample, **kw):
    args = GenerationConfig(max_len_a=0, max_len_b=6, **kw)
    return task.build_generator([model], args).generate([model], sample)


def _forced_sample(sample, targets):
    width = max(len(t) for t in targets)
    target = torch.full((len(targets), width), 1, dtype=torch.long)
    prev = torch.full_like(target, 1)
    for i, t in enumerate(targets):
        target[i, : len(t)] = t
        prev[i, 0] = 2
        prev[i, 1: len(t)] = t[:-1]
    forced = dict(sample)
    forced["target"] = target
    forced["net_input"] = dict(sample["net_input"], prev_output_tokens=prev)
    return forced


@pytest.mark.parametrize("cls", [RagLMTokenModel, RagLMSequenceModel])
@pytest.mark.parametrize("beam", [1, 4])
def test_beam_score_equals_teacher_forced_score(tiny_world, cls, beam):
    task, model, sample = _setup(tiny_world, cls)
    hypos = _gen(task, model, sample, beam=beam)
    forced = task.build_generator([model], GenerationConfig(score_reference=True)).generate(
        [model], _forced_sample(sample, [h[0]["tokens"] for h in hypos]))
    for h, f in zip(hypos, forced):
        assert torch.equal(h[0]["tokens"], f[0]["tokens"])
        assert float(h[0]["score"]) == pytest.approx(float(f[0]["score"]), abs=1e-4)
        torch.testing.assert_close(h[0]["positional_scores"], f[0]["positional_scores"], atol=1e-4, rtol=1e-4)


def test_rag_token_greedy_step_is_the_prior_weighted_mixture(tiny_world):
    """Greedy RAG-Token picks, at each step, the argmax of sum_z p(z|x) p_LM(v | context_z, y<t): checked against
    a brute force with one full forward per (passage, prefix)."""
    task, model, sample = _setup(tiny_world, RagLMTokenModel)
    hypos = _gen(task, model, sample, beam=1)
    ni = sample["net_input"]
    with torch.no_grad():
        contexts, scores, rows = model.encode(ni["src_tokens"], ni.get("query_tokens"), ni.get("query_mask"))
        doc_lp = M.doc_log_prior(scores.float()).double()
        k = doc_lp.size(1)
        for i, h in enumerate(hypos[:6]):
            y = h[0]["tokens"]
            prefix = torch.cat([torch.tensor([2]), y[:-1]])
            for t in range(len(y)):
                mix = None
                for d in range(k):
                    row = contexts.tokens[i * k + d, : contexts.lengths[i * k + d]]
                    logits, _ = model.generator(torch.cat([row, prefix[: t + 1]]).unsqueeze(0))
                    p = torch.softmax(logits[0, -1].double(), -1) * doc_lp[i, d].exp()
                    mix = p if mix is None else mix + p
                if t < len(y) - 1:  # the last: </s>, chosen or forced at --max-len-b
                    assert int(mix.argmax()) == int(y[t])
                assert float(h[0]["positional_scores"][t]) == pytest.approx(float(mix[y[t]].log()), abs=1e-4)


def test_rag_sequence_beams_are_the_lm_beams_of_each_passage_row(tiny_world):
    """The per-passage beams of RAG-Sequence are fairseq's own beam search of the plain LM continuing the row."""
    from fairseq.sequence_generator import SequenceGenerator

    from rag_plugin.generation.lm_adapters import LMPairSearchModel

    task, model, sample = _setup(tiny_world, RagLMSequenceModel)
    ni = sample["net_input"]
    with torch.no_grad():
        contexts, _, _ = model.encode(ni["src_tokens"], ni.get("query_tokens"), ni.get("query_mask"))
    search_model = LMPairSearchModel(model)
    search_model.encoder.cached = contexts
    gen = SequenceGenerator([search_model], task.target_dictionary, beam_size=3, max_len_a=0, max_len_b=5)
    pair_sample = {"net_input": {"src_tokens": ni["src_tokens"].repeat_interleave(3, 0)}}
    with torch.no_grad():
        beams = gen.generate([search_model], pair_sample)
        for r in range(0, contexts.tokens.size(0), 5):  # every 5th pair: brute force, one full forward per prefix
            best = beams[r][0]
            row = contexts.tokens[r, : contexts.lengths[r]]
            prefix = torch.cat([torch.tensor([2]), best["tokens"][:-1]])
            logits, _ = model.generator(torch.cat([row, prefix]).unsqueeze(0))
            lp = torch.log_softmax(logits[0, len(row):].float(), -1).gather(-1, best["tokens"].unsqueeze(-1))
            torch.testing.assert_close(best["positional_scores"], lp.squeeze(-1), atol=1e-4, rtol=1e-4)


def test_thorough_never_below_fast_and_reuse_is_exact(tiny_world):
    task, model, sample = _setup(tiny_world, RagLMSequenceModel)
    thorough = _gen(task, model, sample, beam=3)
    task.cfg.rag_decoding = "fast"
    fast = _gen(task, model, sample, beam=3)
    for t, f in zip(thorough, fast):
        assert float(t[0]["score"]) >= float(f[0]["score"]) - 1e-5
    task.cfg.rag_decoding = "thorough"
    gen = task.build_generator([model], GenerationConfig(max_len_a=0, max_len_b=6, beam=3))
    gen.reuse_beam_scores = False
    again = gen.generate([model], sample)
    for a, b in zip(thorough, again):
        assert torch.equal(a[0]["tokens"], b[0]["tokens"])
        assert float(a[0]["score"]) == pytest.approx(float(b[0]["score"]), abs=1e-4)


def test_candidate_scores_equal_one_forward_per_pair(tiny_world):
    task, model, sample = _setup(tiny_world, RagLMSequenceModel)
    ni = sample["net_input"]
    torch.manual_seed(0)
    with torch.no_grad():
        contexts, _, _ = model.encode(ni["src_tokens"][:3], ni["query_tokens"][:3], ni["query_mask"][:3])
        cands = [torch.cat([torch.randint(4, len(task.dictionary), (n,)), torch.tensor([2])]) for n in (1, 4, 2, 6)]
        owner = torch.tensor([0, 0, 1, 2])
        got = score_lm_candidates(model, contexts, 3, owner, cands, max_cells=20 * 7 * len(task.dictionary))
        for c, y in enumerate(cands):
            for d in range(3):
                r = int(owner[c]) * 3 + d
                row = contexts.tokens[r, : contexts.lengths[r]]
                logits, _ = model.generator(torch.cat([row, torch.tensor([2]), y[:-1]]).unsqueeze(0))
                lp = torch.log_softmax(logits[0, len(row):].float(), -1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
                torch.testing.assert_close(got[c, d, : len(y)], lp, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("cls", [RagLMTokenModel, RagLMSequenceModel])
def test_each_context_runs_once_and_every_step_runs_one_token(tiny_world, cls):
    """The contexts run through the LM once per batch (B*K rows: not per beam, not per step); every later call of the
    search runs one new token per row."""
    task, model, sample = _setup(tiny_world, cls)
    calls = {"start": [], "extend": []}
    start, extend = model.reader.start, model.reader.extend

    def counted_start(state, contexts, lengths):
        calls["start"].append(tuple(contexts.shape))
        return start(state, contexts, lengths)

    def counted_extend(state, tokens, lengths, offset):
        calls["extend"].append(tuple(tokens.shape))
        return extend(state, tokens, lengths, offset)

    model.reader.start, model.reader.extend = counted_start, counted_extend
    task.cfg.rag_decoding = "fast"  # RAG-Sequence: no Thorough pass, only the beams
    _gen(task, model, sample, beam=4)
    b = sample["net_input"]["src_tokens"].size(0)
    assert len(calls["start"]) == 1 and calls["start"][0][0] == b * 3
    assert len(calls["extend"]) >= 6 and all(width == 1 for _, width in calls["extend"])
    assert calls["extend"][0][0] == b * 3 * 4  # the first step: every (question, passage, beam) row
