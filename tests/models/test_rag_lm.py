"""The decoder-only RAG models (rag_lm_token, rag_lm_seq) against brute force: the criterion's marginals equal a
sum over passages with one fairseq forward per (passage, answer) row; the reader's packed rows and its incremental
decoding equal fairseq's own TransformerLanguageModel.forward; the context is cut from the passage's end, never the
question; fairseq transformer_lm checkpoints load as they are and bad ones are one-line errors; --freeze-generator and
--retriever-loss-only train the retriever alone."""
import math

import numpy as np
import pytest
import torch

import rag_plugin

rag_plugin.register()

from rag_plugin.core.lm_layout import lm_context, lm_contexts  # noqa: E402
from rag_plugin.criterions.marginal_nll import MarginalNLLConfig, MarginalNLLCriterion  # noqa: E402
from rag_plugin.models.lm_generator import build_lm, lm_namespace  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagTokenModel  # noqa: E402
from rag_plugin.models.rag_lm import RagLMConfig, RagLMSequenceModel, RagLMTokenModel  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402

EOS, PAD = 2, 1


def _task(world, n_docs):
    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(
        data=str(world["data"]), knowledge=str(world["ks"]), n_docs=n_docs))
    task.load_dataset("train")
    return task


def _model(cls, task, seed=1, **kw):
    torch.manual_seed(seed)
    options = dict(generator_size="tiny", dropout=0.0, max_source_positions=48, max_target_positions=32)
    options.update(kw)
    return cls.build_model(RagLMConfig(**options), task)


def _batch(task, n=4):
    ds = task.datasets["train"]
    return ds.collater([ds[i] for i in range(n)])


def _row_log_probs(model, context, prev, target):
    """log p(target_t | context, prev<=t) of one unpadded row by fairseq's own forward, float64: [T]."""
    keep = target.ne(PAD)
    row = torch.cat([context, prev[keep]]).unsqueeze(0)
    logits, _ = model.generator(row)
    lp = torch.log_softmax(logits[0, len(context):].double(), -1)
    return lp.gather(-1, target[keep].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("cls", [RagLMTokenModel, RagLMSequenceModel])
def test_criterion_equals_a_sum_over_passages_with_one_forward_per_row(tiny_world, cls):
    task = _task(tiny_world, n_docs=3)
    model = _model(cls, task).eval()
    sample = _batch(task)
    with torch.no_grad():
        loss, _, _ = MarginalNLLCriterion(task)(model, sample, reduce=False)
        contexts, scores, rows = model.encode(sample["net_input"]["src_tokens"], sample["net_input"]["query_tokens"],
                                              sample["net_input"]["query_mask"])
        prev, target = sample["net_input"]["prev_output_tokens"], sample["target"]
        for b in range(rows.size(0)):
            log_prior = torch.log_softmax(scores[b].double(), -1)
            per_doc = [_row_log_probs(model, contexts.tokens[b * 3 + k, : contexts.lengths[b * 3 + k]], prev[b],
                                      target[b]) for k in range(3)]
            if cls.variant == "sequence":
                expected = -math.log(sum(math.exp(float(log_prior[k] + per_doc[k].sum())) for k in range(3)))
            else:
                expected = -sum(math.log(sum(math.exp(float(log_prior[k] + per_doc[k][t])) for k in range(3)))
                                for t in range(len(per_doc[0])))
            assert float(loss[b]) == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_rows_lay_out_passage_then_question(tiny_world):
    task = _task(tiny_world, n_docs=2)
    model = _model(RagLMTokenModel, task)
    sample = _batch(task, 2)
    ni = sample["net_input"]
    contexts, _, rows = model.encode(ni["src_tokens"], ni["query_tokens"], ni["query_mask"])
    store = task.knowledge.passages
    for b in range(2):
        q = ni["src_tokens"][b][ni["src_tokens"][b].ne(PAD)].tolist()
        for k in range(2):
            r = int(rows[b, k])
            row = contexts.tokens[b * 2 + k, : contexts.lengths[b * 2 + k]].tolist()
            passage = store.title_tokens(r).tolist() + [EOS] + store.text_tokens(r).tolist()
            assert row[0] == EOS and row[-len(q) - 1:] == [EOS] + q
            assert row[1:-len(q) - 1] == passage[: len(row) - len(q) - 2]  # the passage, cut at its end


def test_context_cut_from_the_passage_end_and_question_never_cut():
    q = np.arange(10, 20)
    title, text = np.arange(100, 105), np.arange(200, 260)
    row = lm_context(q, title, text, EOS, budget=30)
    assert len(row) == 30 and row[-10:].tolist() == q.tolist() and row[0] == EOS and row[-11] == EOS
    assert row[1:6].tolist() == title.tolist() and row[7:19].tolist() == text[:12].tolist()
    assert lm_context(q, title, text, EOS, budget=13).tolist() == [EOS, 100, EOS] + q.tolist()
    assert lm_context(q, title, text, EOS, budget=11).tolist() == [EOS] + q.tolist()  # no room for a passage
    with pytest.raises(UserError, match="question of 10 tokens does not fit"):
        lm_context(q, title, text, EOS, budget=10)
    tokens, lengths = lm_contexts([q, q[:3]], None, EOS, PAD, 40)  # closed book: </s> question
    assert lengths.tolist() == [11, 4] and tokens[1, 4:].eq(PAD).all()


def test_a_question_longer_than_the_context_is_a_one_line_error(tiny_world):
    task = _task(tiny_world, n_docs=2)
    model = _model(RagLMTokenModel, task, max_source_positions=4)
    sample = _batch(task, 2)
    with pytest.raises(UserError, match="does not fit the decoder-only reader's context of 4 tokens"):
        model(**sample["net_input"])


def test_teacher_forced_rows_and_incremental_decoding_equal_fairseqs_forward(tiny_world):
    task = _task(tiny_world, n_docs=3)
    model = _model(RagLMSequenceModel, task).eval()
    sample = _batch(task)
    ni = sample["net_input"]
    with torch.no_grad():
        logits, _ = model(**ni)
        contexts, _, _ = model.encode(ni["src_tokens"], ni["query_tokens"], ni["query_mask"])
        prev = ni["prev_output_tokens"].repeat_interleave(3, 0)
        for i in range(prev.size(0)):  # packed rows == fairseq's forward of each unpadded row
            row = contexts.tokens[i, : contexts.lengths[i]]
            p = prev[i][prev[i].ne(PAD)]
            ref, _ = model.generator(torch.cat([row, p]).unsqueeze(0))
            torch.testing.assert_close(logits[i, : len(p)], ref[0, len(row):], atol=1e-5, rtol=1e-5)
        state = {}
        model.reader.start(state, contexts.tokens, contexts.lengths)
        steps = torch.cat([model.reader.extend(state, prev[:, t: t + 1], contexts.lengths, t)
                           for t in range(prev.size(1))], 1)
        keep = prev.ne(PAD).unsqueeze(-1)
        torch.testing.assert_close(steps * keep, logits * keep, atol=1e-5, rtol=1e-5)
        # the cache copied to 2 rows per context (beams) and reordered: still the same rows
        state = {}
        model.reader.start(state, contexts.tokens, contexts.lengths)
        order = torch.arange(prev.size(0)).repeat_interleave(2).flip(0)
        model.reader.reorder(state, order)
        both = model.reader.extend(state, prev[order], contexts.lengths[order], 0)
        torch.testing.assert_close(both * keep[order], logits[order] * keep[order], atol=1e-5, rtol=1e-5)


def _fairseq_lm_checkpoint(path, task, layers=2, positions=96):
    """A fairseq transformer_lm checkpoint as fairseq-train --task language_modeling saves one (cfg + model)."""
    torch.manual_seed(7)
    args = lm_namespace("tiny", positions, 0.0, 0.0, 0.0, {"decoder_embed_dim": 64, "decoder_layers": layers,
                                                            "decoder_attention_heads": 4, "decoder_ffn_embed_dim": 128,
                                                            "activation_fn": "relu", "decoder_learned_pos": True})
    lm = build_lm(args, task.dictionary)
    cfg = {"model": dict(vars(args), _name="transformer_lm"), "task": {"_name": "language_modeling"}}
    torch.save({"cfg": cfg, "model": lm.state_dict()}, path)
    return lm


def test_a_fairseq_transformer_lm_checkpoint_loads_as_it_is(tiny_world, tmp_path):
    task = _task(tiny_world, n_docs=0)
    lm = _fairseq_lm_checkpoint(tmp_path / "lm.pt", task).eval()
    model = _model(RagLMTokenModel, task, generator_checkpoint=str(tmp_path / "lm.pt")).eval()
    assert model.reader.max_positions() == 96 and len(model.generator.decoder.layers) == 2
    sample = _batch(task)
    with torch.no_grad():
        logits, _ = model(**sample["net_input"])
        contexts, _, _ = model.encode(sample["net_input"]["src_tokens"])
        p = sample["net_input"]["prev_output_tokens"][0]
        p = p[p.ne(PAD)]
        row = contexts.tokens[0, : contexts.lengths[0]]
        ref, _ = lm(torch.cat([row, p]).unsqueeze(0))  # the checkpoint's own network, untouched
    torch.testing.assert_close(logits[0, : len(p)], ref[0, len(row):], atol=1e-5, rtol=1e-5)


def test_bad_lm_checkpoints_are_one_line_errors(tiny_world, tmp_path):
    task = _task(tiny_world, n_docs=0)
    _fairseq_lm_checkpoint(tmp_path / "lm.pt", task)
    state = torch.load(tmp_path / "lm.pt", weights_only=False)
    emb = state["model"]["decoder.embed_tokens.weight"]
    state["model"]["decoder.embed_tokens.weight"] = torch.cat([emb, emb[:5]])  # another vocabulary's size
    torch.save(state, tmp_path / "other_vocab.pt")
    with pytest.raises(UserError, match="another vocabulary"):
        _model(RagLMTokenModel, task, generator_checkpoint=str(tmp_path / "other_vocab.pt"))
    own = tmp_path / "renamed"  # the same size, other symbols (the LM's dict.txt beside its checkpoint)
    own.mkdir()
    (own / "lm.pt").write_bytes((tmp_path / "lm.pt").read_bytes())
    symbols = task.dictionary.symbols[task.dictionary.nspecial:]
    (own / "dict.txt").write_text("".join(f"{s}x 1\n" for s in symbols))
    with pytest.raises(UserError, match="vocabulary .* differs from the knowledge source's generator dictionary"):
        _model(RagLMTokenModel, task, generator_checkpoint=str(own / "lm.pt"))
    torch.manual_seed(0)  # an encoder-decoder RAG checkpoint is no LM
    bart = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0), task)
    torch.save({"cfg": {"model": {}}, "model": bart.state_dict()}, tmp_path / "bart.pt")
    with pytest.raises(UserError, match="not a fairseq transformer_lm checkpoint"):
        _model(RagLMTokenModel, task, generator_checkpoint=str(tmp_path / "bart.pt"))
    with pytest.raises(UserError, match="--input-format hf"):
        _model(RagLMTokenModel, task, input_format="hf")


def test_checkpoints_of_the_other_family_are_refused(tiny_world):
    task = _task(tiny_world, n_docs=2)
    lm_model = _model(RagLMTokenModel, task)
    torch.manual_seed(0)
    bart = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0), task)
    with pytest.raises(UserError, match="is a decoder-only RAG model"):
        bart.load_state_dict(lm_model.state_dict())
    with pytest.raises(UserError, match="is an encoder-decoder RAG model"):
        lm_model.load_state_dict(bart.state_dict())


def test_frozen_lm_and_retriever_loss_only_train_the_retriever_alone(tiny_world):
    """REPLUG LSR: --freeze-generator --retriever-loss pdist --retriever-loss-only: the LM gets no gradient (and no
    dropout), the query encoder does, and the loss is the PDist term alone (the marginal NLL logged)."""
    task = _task(tiny_world, n_docs=3)
    model = _model(RagLMTokenModel, task, freeze_generator=True, dropout=0.3).train()
    assert not any(p.requires_grad for p in model.generator.parameters()) and not model.generator.training
    only = MarginalNLLCriterion(task, MarginalNLLConfig(retriever_loss="pdist", retriever_loss_only=True))
    both = MarginalNLLCriterion(task, MarginalNLLConfig(retriever_loss="pdist"))
    sample = _batch(task)
    torch.manual_seed(0)
    loss, sample_size, stats = only(model, sample)
    loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if n.startswith("query_encoder.") and p.requires_grad]
    assert grads and any(g is not None and g.abs().sum() > 0 for g in grads)
    weighted = stats["retriever_loss"] * sample_size / stats["nsentences"]
    assert float(loss.detach()) == pytest.approx(float(weighted), rel=1e-5)
    torch.manual_seed(0)
    _, _, stats_both = both(model, sample)
    assert float(stats["nll_loss"]) == pytest.approx(float(stats_both["nll_loss"]), rel=1e-5)
    with pytest.raises(UserError, match="needs a --retriever-loss"):
        MarginalNLLCriterion(task, MarginalNLLConfig(retriever_loss_only=True))
