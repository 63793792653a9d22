"""Fusion-in-Decoder decoding: fairseq's SequenceGenerator over the fused encodings gives the scores of
teacher forcing and the hypotheses of a naive search (encoder output copied per beam) without copying
anything per beam; each passage's cross-attention share against fairseq's own per-layer attention."""
import pytest
import torch
from fairseq.dataclass.configs import GenerationConfig
from fairseq.models import FairseqEncoder, FairseqEncoderDecoderModel

import rag_plugin

rag_plugin.register()

from fairseq.sequence_generator import SequenceGenerator  # noqa: E402

from rag_plugin.models.fid import FidConfig, FidModel  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402

K = 3


def _batch(task, split):
    ds = task.datasets[split]
    return ds.collater([ds[i] for i in range(len(ds))])


@pytest.fixture(scope="module")
def fid(tiny_world):
    """A tiny FiD model, every weight matrix doubled (seed 1): its hypotheses have 2 to 9 tokens, so that
    questions and beams finish the search at different steps."""
    cfg = RetrievalAugmentedConfig(data=str(tiny_world["data"]), knowledge=str(tiny_world["ks"]), n_docs=K)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("test")
    torch.manual_seed(1)
    model = FidModel.build_model(FidConfig(generator_size="tiny", dropout=0.0), task).eval()
    with torch.no_grad():
        for p in model.generator.parameters():
            if p.dim() == 2:
                p.mul_(2.0)
    return task, model, _batch(task, "test")


def _generate(task, model, sample, **kw):
    args = GenerationConfig(max_len_a=0, max_len_b=8, **kw)
    return task.build_generator([model], args).generate([model], sample)


def _select(sample, rows, drop=("prev_output_tokens",)):
    return {key: value.index_select(0, rows) if torch.is_tensor(value) else value
            for key, value in sample["net_input"].items() if key not in drop}


def _fused(model, sample):
    return model.fused_encode(**_select(sample, torch.arange(sample["id"].numel()),
                                        drop=("prev_output_tokens", "src_lengths")))[0]


def _forced(model, sample, owner, tokens):
    """Per-token log-probabilities of the given answers by the model's own forward (teacher forcing)."""
    width = max(len(t) for t in tokens)
    target = torch.full((len(tokens), width), model.pad, dtype=torch.long)
    prev = torch.full_like(target, model.pad)
    for i, t in enumerate(tokens):
        target[i, : len(t)], prev[i, 0], prev[i, 1: len(t)] = t, model.eos, t[:-1]
    with torch.no_grad():
        lp = model.get_normalized_probs(model(prev_output_tokens=prev, **_select(sample, owner)), log_probs=True)
    return lp.gather(-1, target.unsqueeze(-1)).squeeze(-1), prev, target


@pytest.mark.parametrize("beam", [1, 4])
def test_beam_scores_equal_teacher_forced_scores(fid, beam):
    task, model, sample = fid
    hypos = _generate(task, model, sample, beam=beam)
    owner = torch.tensor([i for i, hyps in enumerate(hypos) for _ in hyps])
    tokens = [h["tokens"] for hyps in hypos for h in hyps]
    forced, _, _ = _forced(model, sample, owner, tokens)
    assert len({len(t) for t in tokens}) > 1  # questions and beams finish at different steps
    flat = [h for hyps in hypos for h in hyps]
    for r, h in enumerate(flat):
        n = len(h["tokens"])
        torch.testing.assert_close(h["positional_scores"], forced[r, :n], atol=1e-5, rtol=1e-5)
        assert float(h["score"]) == pytest.approx(float(forced[r, :n].sum()) / n, abs=1e-5)  # lenpen 1
    # --score-reference: the same teacher-forced scores
    scored = task.build_generator([model], GenerationConfig(score_reference=True))
    ref = dict(sample)
    best = [hyps[0]["tokens"] for hyps in hypos]
    _, ref_prev, ref["target"] = _forced(model, sample, torch.arange(len(best)), best)
    ref["net_input"] = dict(sample["net_input"], prev_output_tokens=ref_prev)
    for hyps, s in zip(hypos, scored.generate([model], ref)):
        assert torch.equal(s[0]["tokens"], hyps[0]["tokens"])
        assert float(s[0]["score"]) == pytest.approx(float(hyps[0]["score"]), abs=1e-5)
        torch.testing.assert_close(s[0]["doc_attention"], hyps[0]["doc_attention"], atol=1e-6, rtol=0)


class _CopyingEncoder(FairseqEncoder):
    """The naive search's encoder: the fused output, expanded and reordered per beam like any fairseq encoder's."""

    def __init__(self, model, out):
        super().__init__(model.dictionary)
        self.model, self.out = model, out

    def forward(self, src_tokens, **unused):
        return self.out

    def reorder_encoder_out(self, encoder_out, new_order):
        return self.model.generator.encoder.reorder_encoder_out(encoder_out, new_order)


def test_search_equals_naive_search_and_copies_nothing_per_beam(fid):
    """Against fairseq's SequenceGenerator on a plain encoder-decoder whose encoder output holds B*beam rows:
    the same hypotheses and scores. The generator's encoder runs once, over the B*K pairs; the cross-attention
    keys never have more rows than there are questions."""
    task, model, sample = fid
    beam, b = 4, sample["id"].numel()
    encoded, key_rows = [], []
    hooks = [model.generator.encoder.register_forward_pre_hook(lambda m, a: encoded.append(a[0].size(0))),
             model.generator.decoder.layers[0].encoder_attn.register_forward_pre_hook(
                 lambda m, a, kw: key_rows.append((kw["key"].size(1), kw["query"].size(1))), with_kwargs=True)]
    try:
        hypos = _generate(task, model, sample, beam=beam)
    finally:
        for h in hooks:
            h.remove()
    search_calls = [kq for kq in key_rows if kq[1] > kq[0]]
    assert encoded == [b * K]  # the pairs, once
    assert search_calls and all(k <= b and q == k * beam for k, q in search_calls)
    assert any(k < b for k, _ in search_calls)  # finished questions left the encoder output
    with torch.no_grad():
        out = _fused(model, sample)
        naive = FairseqEncoderDecoderModel(_CopyingEncoder(model, out), model.generator.decoder)
        plain = SequenceGenerator([naive], task.dictionary, beam_size=beam, max_len_a=0, max_len_b=8)
        expected = plain.generate([naive], {"net_input": {"src_tokens": sample["net_input"]["src_tokens"]}})
    for mine, theirs in zip(hypos, expected):
        assert [h["tokens"].tolist() for h in mine] == [h["tokens"].tolist() for h in theirs]
        for h, e in zip(mine, theirs):
            assert float(h["score"]) == pytest.approx(float(e["score"]), abs=1e-5)


def test_attention_shares_against_fairseq_per_layer_attention(fid):
    """FiD-KD's score by hand: fairseq's decoder returns one layer's cross-attention averaged over heads
    (``alignment_layer``); averaged over the layers and the answer's tokens, summed per passage, the shares
    are the generator's. Before normalising they already sum to 1 (padding gets no attention)."""
    task, model, sample = fid
    hypos = _generate(task, model, sample, beam=2)
    with torch.no_grad():
        out = _fused(model, sample)
        length = out["encoder_out"][0].size(0) // K
        decoder = model.generator.decoder
        for i, hyps in enumerate(hypos):
            enc = model.generator.encoder.reorder_encoder_out(out, torch.tensor([i]))
            for h in hyps:
                y = h["tokens"]
                prev = torch.cat([torch.tensor([model.eos]), y[:-1]]).unsqueeze(0)
                layers = [decoder.extract_features(prev, encoder_out=enc, alignment_layer=j)[1]["attn"][0]
                          for j in range(len(decoder.layers))]                       # each [1, T, K*L]
                per_position = torch.stack(layers).mean(0)[0].mean(0)                # [K*L]
                assert float(per_position.sum()) == pytest.approx(1.0, abs=1e-5)
                assert float(per_position[enc["encoder_padding_mask"][0][0]].abs().sum()) == 0.0
                shares = per_position.view(K, length).sum(-1)
                torch.testing.assert_close(h["doc_attention"], shares, atol=1e-5, rtol=0)
                assert float(h["doc_attention"].sum()) == pytest.approx(1.0, abs=1e-6)


def test_rag_only_decoding_options_are_refused(fid):
    task, model, sample = fid
    task.cfg.rag_decoding = "fast"
    try:
        with pytest.raises(UserError, match="--rag-decoding fast"):
            task.build_generator([model], GenerationConfig())
    finally:
        task.cfg.rag_decoding = "thorough"
    task.cfg.doc_posterior_out = "/nonexistent/posterior.jsonl"
    try:
        with pytest.raises(UserError, match="--doc-posterior-out"):
            task.build_generator([model], GenerationConfig())
    finally:
        task.cfg.doc_posterior_out = None
