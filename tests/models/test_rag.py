"""The model + criterion against brute force that enumerates the K documents explicitly."""
import math

import numpy as np
import pytest
import torch

import rag_plugin
from rag_plugin.core import input_format

rag_plugin.register()

from rag_plugin.criterions.marginal_nll import MarginalNLLConfig, MarginalNLLCriterion, gold_doc_prob  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagSequenceModel, RagTokenModel  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402


def _task(world, n_docs):
    cfg = RetrievalAugmentedConfig(data=str(world["data"]), knowledge=str(world["ks"]), n_docs=n_docs)
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("train")
    return task


def _model(cls, task, seed=1):
    torch.manual_seed(seed)
    model = cls.build_model(RagConfig(generator_size="tiny", dropout=0.0), task)
    return model


def _batch(task, n=4):
    ds = task.datasets["train"]
    return ds.collater([ds[i] for i in range(n)])


def _per_doc_token_lp(model, sample, rows):
    """log p(y_t | x, z_k, y<t) for each document k separately: [B, K, T] in float64."""
    out = []
    target = sample["target"]
    for k in range(rows.size(1)):
        ni = dict(sample["net_input"])
        logits, _ = model(src_tokens=ni["src_tokens"], prev_output_tokens=ni["prev_output_tokens"],
                          fixed_doc_rows=rows[:, k:k + 1], fixed_doc_scores=torch.zeros(rows.size(0), 1), n_docs=1)
        lp = torch.log_softmax(logits.double(), -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        out.append(lp)
    return torch.stack(out, 1)


@pytest.mark.parametrize("cls", [RagTokenModel, RagSequenceModel])
def test_criterion_equals_explicit_enumeration_of_documents(tiny_world, cls):
    task = _task(tiny_world, n_docs=3)
    model = _model(cls, task).eval()
    crit = MarginalNLLCriterion(task)
    sample = _batch(task)
    with torch.no_grad():
        loss, _, _ = crit(model, sample, reduce=False)
        _, extra = model(**sample["net_input"])
        rows, scores = extra["doc_rows"], extra["doc_scores"].double()
        token_lp = _per_doc_token_lp(model, sample, rows)
    mask = sample["target"].ne(task.dictionary.pad())
    for b in range(rows.size(0)):
        prior = [float(scores[b, k]) for k in range(3)]
        z = math.log(sum(math.exp(p) for p in prior))
        log_prior = [p - z for p in prior]
        positions = [t for t in range(mask.size(1)) if mask[b, t]]
        if cls.variant == "sequence":
            expected = -math.log(sum(math.exp(log_prior[k] + sum(float(token_lp[b, k, t]) for t in positions))
                                     for k in range(3)))
        else:
            expected = -sum(math.log(sum(math.exp(log_prior[k] + float(token_lp[b, k, t])) for k in range(3)))
                            for t in positions)
        assert float(loss[b]) == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_k1_reduces_to_plain_seq2seq_nll(tiny_world):
    task = _task(tiny_world, n_docs=1)
    for cls in (RagTokenModel, RagSequenceModel):
        model = _model(cls, task).eval()
        sample = _batch(task)
        with torch.no_grad():
            loss, _, _ = MarginalNLLCriterion(task)(model, sample, reduce=False)
            _, extra = model(**sample["net_input"])
            rows = extra["doc_rows"]
            store = task.knowledge.passages
            questions = [q[q.ne(1)].numpy() for q in sample["net_input"]["src_tokens"]]
            docs = [[(store.title_tokens(int(r)), store.text_tokens(int(r)))] for r in rows[:, 0]]
            src, lengths = input_format.batch_inputs(questions, docs, 0, 2, 1, model.cfg.max_source_positions)
            logits, _ = model.generator(src, lengths, sample["net_input"]["prev_output_tokens"])
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2).float(), sample["target"],
                                                    ignore_index=1, reduction="none").sum(1)
        torch.testing.assert_close(loss, nll, rtol=1e-5, atol=1e-5)


def test_sequence_equals_token_for_one_token_targets(tiny_world):
    task = _task(tiny_world, n_docs=3)
    model = _model(RagTokenModel, task).eval()
    sample = _batch(task)
    sample["target"] = sample["target"][:, :1].clone()
    sample["net_input"]["prev_output_tokens"] = sample["net_input"]["prev_output_tokens"][:, :1].clone()
    sample["ntokens"] = sample["target"].numel()
    crit = MarginalNLLCriterion(task)
    with torch.no_grad():
        token_loss, _, _ = crit(model, sample, reduce=False)
        model.variant = "sequence"
        seq_loss, _, _ = crit(model, sample, reduce=False)
    torch.testing.assert_close(token_loss, seq_loss)


def test_gradient_reaches_query_encoder_never_documents(tiny_world):
    task = _task(tiny_world, n_docs=3)
    model = _model(RagTokenModel, task).train()
    vectors_before = np.array(task.knowledge.vectors)
    loss, _, _ = MarginalNLLCriterion(task)(model, _batch(task))
    loss.backward()
    q_grads = [p.grad for p in model.query_encoder.parameters()]
    assert all(g is not None for g in q_grads) and sum(float(g.abs().sum()) for g in q_grads) > 0
    assert all(p.grad is None for p in task.text_encoder.passage_tower.parameters())
    assert all(p.grad is not None for p in model.generator.parameters() if p.requires_grad)
    # the query encoder is a copy: training it cannot move the document encoder
    passage_side = list(task.text_encoder.passage_tower.parameters())
    assert not any(a is b for a in model.query_encoder.parameters() for b in passage_side)
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    np.testing.assert_array_equal(vectors_before, np.asarray(task.knowledge.vectors))


def test_frozen_query_encoder_gets_no_gradient(tiny_world):
    task = _task(tiny_world, n_docs=3)
    torch.manual_seed(0)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0, freeze_query_encoder=True), task)
    loss, _, _ = MarginalNLLCriterion(task)(model.train(), _batch(task))
    loss.backward()
    assert all(p.grad is None for p in model.query_encoder.parameters())


def test_closed_book_has_no_retrieval(tiny_world):
    task = _task(tiny_world, n_docs=0)
    model = _model(RagSequenceModel, task).eval()
    assert model.query_encoder is None
    sample = _batch(task)
    with torch.no_grad():
        loss, _, log = MarginalNLLCriterion(task)(model, sample, reduce=False)
        logits, _ = model.generator(*input_format.batch_inputs(
            [q[q.ne(1)].numpy() for q in sample["net_input"]["src_tokens"]], None, 0, 2, 1, 256),
            sample["net_input"]["prev_output_tokens"])
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), sample["target"], ignore_index=1,
                                                reduction="none").sum(1)
    torch.testing.assert_close(loss, nll, rtol=1e-5, atol=1e-5)


def test_generator_input_never_cuts_the_question():
    q = np.arange(10, 20)
    title, text = np.arange(100, 105), np.arange(200, 300)
    x = input_format.pair_input(q, title, text, bos=0, eos=2, max_len=30)
    assert len(x) == 30 and x[0] == 0 and list(x[1:11]) == list(q) and x[11] == 2 and x[-1] == 2
    assert list(x[12:17]) == list(title) and x[17] == 2 and list(x[18:29]) == list(text[:11])
    short = input_format.pair_input(q, title, text, bos=0, eos=2, max_len=14)
    assert list(short[1:11]) == list(q)


def test_query_encoder_lr_scale_scales_the_adam_step(tiny_world):
    task = _task(tiny_world, n_docs=3)
    sample = _batch(task)
    moves = {}
    for scale in (1.0, 0.1):
        torch.manual_seed(0)
        model = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0, query_encoder_lr_scale=scale),
                                          task).train()
        before = model.query_encoder.bert_model.encoder.layer[0].output.dense.weight.detach().clone()
        opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        loss, _, _ = MarginalNLLCriterion(task)(model, sample)
        loss.backward()
        opt.step()
        after = model.query_encoder.bert_model.encoder.layer[0].output.dense.weight.detach()
        moves[scale] = (after - before).abs().max().item()
    assert moves[1.0] == pytest.approx(1e-3, rel=0.05)
    assert moves[0.1] == pytest.approx(1e-4, rel=0.05)


def test_query_encoder_lr_scale_scales_torch_adamw_weight_decay(tiny_world):
    """AdamW's decoupled decay under --query-encoder-lr-scale 0.03 and --weight-decay 0.1: with zero
    gradients an update only decays, the query encoder's weights by (1 - 0.03 lr wd) per step as an
    lr of 0.03 x lr implies, the generator's by (1 - lr wd)."""
    from rag_plugin.optim.torch_adamw import TorchAdamW, TorchAdamWConfig

    task = _task(tiny_world, n_docs=3)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0, query_encoder_lr_scale=0.03),
                                      task)
    lr, wd, steps = 0.05, 0.1, 20
    opt = TorchAdamW(TorchAdamWConfig(lr=[lr], weight_decay=wd), [p for p in model.parameters() if p.requires_grad])
    assert sorted(g["weight_decay"] for g in opt.param_groups) == pytest.approx([0.03 * wd, wd])
    q_weight = lambda: model.query_encoder.bert_model.encoder.layer[0].output.dense.weight.detach().clone()
    g_weight = lambda: model.generator.encoder.layers[0].fc1.weight.detach().clone()
    q0, g0 = q_weight(), g_weight()
    for _ in range(steps):
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        opt.step()
    torch.testing.assert_close(q_weight(), q0 * (1 - 0.03 * lr * wd) ** steps, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(g_weight(), g0 * (1 - lr * wd) ** steps, rtol=1e-5, atol=1e-7)


def test_document_scores_stay_float32_under_a_16_bit_query_encoder(tiny_world):
    """--fp16/--bf16 make the query encoder 16-bit; the prior's logits are still float32 inner products of
    its query vector with the stored float32 document vectors (16-bit scores would round them: bf16 steps
    of 0.25-0.5 at DPR's scores of 60-90)."""
    task = _task(tiny_world, n_docs=3)
    model = _model(RagTokenModel, task).eval()
    model.query_encoder.to(torch.bfloat16)
    ni = _batch(task)["net_input"]
    with torch.no_grad():
        scores, rows = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)
        q = model.query_encoder(ni["query_tokens"], ni["query_mask"])
    assert q.dtype == torch.bfloat16 and scores.dtype == torch.float32
    d = torch.from_numpy(np.asarray(task.knowledge.vectors, dtype=np.float64))[rows]  # [B, K, D]
    expect = (d @ q.double().unsqueeze(-1)).squeeze(-1) * model.doc_score_scale
    torch.testing.assert_close(scores.double(), expect, rtol=1e-6, atol=1e-6)


def test_bm25_scores_survive_fairseqs_16_bit_batches(tiny_world):
    """Under --fp16/--bf16 fairseq's trainer casts every float32 tensor of a batch to 16 bits
    (Trainer._prepare_sample); BM25's document scores must reach the model unrounded."""
    from fairseq import utils

    cfg = RetrievalAugmentedConfig(data=str(tiny_world["data"]), knowledge=str(tiny_world["ks"]), n_docs=3,
                                   retriever="bm25")
    task = RetrievalAugmentedTask.setup_task(cfg)
    task.load_dataset("train")
    sample = _batch(task)
    scores = sample["net_input"]["fixed_doc_scores"].clone()
    for dtype in (torch.half, torch.bfloat16):
        cast = utils.apply_to_sample(lambda t, dtype=dtype: t.to(dtype) if t.dtype is torch.float32 else t, sample)
        assert torch.equal(cast["net_input"]["fixed_doc_scores"], scores)
    model = _model(RagTokenModel, task).eval()
    with torch.no_grad():
        _, extra = model(**sample["net_input"])
    assert extra["doc_scores"].dtype == torch.float32
    torch.testing.assert_close(extra["doc_scores"], scores[:, :3].float(), rtol=0, atol=0)
    assert torch.equal(extra["doc_rows"], sample["net_input"]["fixed_doc_rows"][:, :3])


def test_gold_doc_prob_sums_the_prior_of_gold_documents_only():
    """Gold rows pad with -1: a -1 is never a gold hit, whatever the retrieved rows hold."""
    prior = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    rows = torch.tensor([[7, -1, 4], [9, 2, -1]])
    gold = torch.tensor([[4, -1], [-1, -1]])
    got = gold_doc_prob(prior.log(), rows, gold)
    torch.testing.assert_close(got, torch.tensor([0.2, 0.0]))


def test_dense_checkpoint_serves_closed_book_but_not_the_reverse(tiny_world):
    """fairseq-generate --n-docs 0 (or --retriever bm25) on a checkpoint trained with dense retrieval:
    the same generator, the query encoder left out; a closed-book checkpoint under dense retrieval
    would leave the query encoder random: a one-line error."""
    from rag_plugin.util.errors import UserError

    dense = _model(RagTokenModel, _task(tiny_world, n_docs=3))
    closed = _model(RagTokenModel, _task(tiny_world, n_docs=0), seed=5)
    assert closed.query_encoder is None
    closed.load_state_dict(dense.state_dict())
    for (name, a), (_, b) in zip(closed.generator.state_dict().items(), dense.generator.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(UserError, match="no query encoder.*--n-docs 0 or --retriever bm25"):
        _model(RagTokenModel, _task(tiny_world, n_docs=3)).load_state_dict(closed.state_dict())


def test_sentence_avg_divides_by_examples_and_gold_metric_needs_provenance(tiny_world):
    """--sentence-avg: fairseq divides the summed loss by sample_size = number of examples (else
    target tokens); the logged loss is per sample_size, nll per token. --best-checkpoint-metric
    gold_doc_prob on a valid set without provenance: a one-line error, not fairseq's KeyError."""
    from fairseq import metrics

    from rag_plugin.util.errors import UserError

    task = _task(tiny_world, n_docs=3)
    model = _model(RagTokenModel, task).eval()
    sample = _batch(task)
    with torch.no_grad():
        loss_t, size_t, log_t = MarginalNLLCriterion(task)(model, sample)
        loss_s, size_s, log_s = MarginalNLLCriterion(task, MarginalNLLConfig(sentence_avg=True))(model, sample)
    assert size_t == sample["ntokens"] and size_s == sample["target"].size(0) == 4
    torch.testing.assert_close(loss_s, loss_t)
    with metrics.aggregate() as agg:
        MarginalNLLCriterion.reduce_metrics([log_s])
    assert agg.get_smoothed_value("loss") == pytest.approx(float(loss_s) / 4 / math.log(2), abs=1e-3)
    assert agg.get_smoothed_value("nll_loss") == pytest.approx(
        float(log_s["nll_loss"]) / sample["ntokens"] / math.log(2), abs=1e-3)
    no_gold = {k: v for k, v in sample.items() if k != "gold_rows"}
    crit = MarginalNLLCriterion(task, MarginalNLLConfig(best_checkpoint_metric="gold_doc_prob"))
    with torch.no_grad(), pytest.raises(UserError, match="gold_doc_prob needs retrieved documents and gold passages"):
        crit(model, no_gold)
    crit(model.train(), no_gold)  # training batches need none


def test_checkpoint_records_the_generator_vocabulary_and_refuses_another(tiny_world):
    """A hot swap to a knowledge source pre-tokenized with another generator vocabulary (same size,
    other symbols: the weights would load) is a one-line error; the same vocabulary loads."""
    import json as _json

    from rag_plugin.util.errors import UserError

    task = _task(tiny_world, n_docs=3)
    model = _model(RagTokenModel, task)
    state = model.get_extra_state()
    recorded = _json.loads(state["knowledge"])["tokenizer"]
    assert recorded["dictionary_sha256"] == task.tokenizer.dictionary_sha256()
    _model(RagTokenModel, task).set_extra_state(state)  # the same vocabulary: accepted
    other = _json.loads(state["knowledge"])
    other["tokenizer"]["dictionary_sha256"] = "0" * 64
    with pytest.raises(UserError, match="another generator vocabulary .*dictionary_sha256"):
        _model(RagTokenModel, task).set_extra_state({**state, "knowledge": _json.dumps(other)})
    legacy = _json.loads(state["knowledge"])
    del legacy["tokenizer"]  # written before the vocabulary was recorded: not checked
    _model(RagTokenModel, task).set_extra_state({**state, "knowledge": _json.dumps(legacy)})


def test_targets_are_cut_at_the_decoders_length_only_with_a_warning(tiny_world, caplog):
    """No fixed cap below the decoder's positions (there was a silent one at 256); a target longer
    than the decoder is cut to it (</s> kept) with a warning, and its size for batching counts the cut."""
    import logging

    task = _task(tiny_world, n_docs=3)
    answer = " ".join(["Kakaka Rimilo Tokaka"] * 120)
    full = len(task.tokenizer.encode_batch([answer])[0]) + 2  # <s>-less prefix aside: tokens + </s> at least
    assert full > 300
    task.max_target = 1024  # as a bart.base-sized decoder sets it
    ds = task.build_dataset(["What is the capital of Kakaka?"], [answer])
    target = ds[0]["target"]
    assert len(target) == len(ds.targets[0]) >= full - 1 and target[-1] == task.dictionary.eos()
    task.max_target = 64
    with caplog.at_level(logging.WARNING):
        ds = task.build_dataset(["What is the capital of Kakaka?"], [answer])
    assert "1 of 1 targets are longer than the decoder's 64 positions" in caplog.text
    assert len(ds[0]["target"]) == 64 and ds[0]["target"][-1] == task.dictionary.eos()
    assert ds.sizes[0] == len(ds[0]["question"]) + 64


def test_gold_ids_missing_from_the_knowledge_source_are_reported(tiny_world, caplog):
    import logging

    task = _task(tiny_world, n_docs=3)
    store = task.knowledge.passages
    with caplog.at_level(logging.WARNING):
        assert task.gold_rows([["wiki0"], ["wiki1"]]) is None  # none resolves: as if the data named none
    assert "2 of 2 records name gold passages none of which is in the knowledge source" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        rows = task.gold_rows([[store.id(3)], ["wiki1"], []])
    assert rows[:, 0].tolist() == [3, -1, -1] and "1 of 2 records" in caplog.text


def test_unscaled_checkpoint_loads_into_a_scaled_query_encoder(tiny_world):
    """A checkpoint without the learning-rate reparametrisation (a converted model, or one trained at scale 1)
    fine-tuned at another scale: every query-encoder weight arrives as itself (stored = weight / scale)."""
    task = _task(tiny_world, n_docs=3)
    torch.manual_seed(0)
    plain = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0, query_encoder_lr_scale=1.0), task)
    torch.manual_seed(1)
    scaled = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0, query_encoder_lr_scale=0.03),
                                       task)
    scaled.load_state_dict(plain.state_dict())
    ours = {n: p for n, p in plain.query_encoder.named_parameters()}
    for name, module in scaled.query_encoder.named_modules():
        for pname in getattr(module, "parametrizations", {}):
            key = f"{name}.{pname}" if name else pname
            assert torch.allclose(getattr(module, pname), ours[key], atol=1e-7), key
    sample = _batch(task)
    plain.eval(), scaled.eval()
    with torch.no_grad():
        assert torch.allclose(plain(**sample["net_input"])[0], scaled(**sample["net_input"])[0], atol=1e-5)
