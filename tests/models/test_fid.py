"""Fusion-in-Decoder: the decoder reads exactly the K (question, passage) encodings; fairseq's cross-entropy
criteria train it; no gradient reaches the query encoder; one-line errors for what FiD cannot do."""
import math

import pytest
import torch

import rag_plugin

rag_plugin.register()

from fairseq.criterions.cross_entropy import CrossEntropyCriterion  # noqa: E402
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion  # noqa: E402

from rag_plugin.criterions.marginal_nll import MarginalNLLCriterion  # noqa: E402
from rag_plugin.models.fid import FidConfig, FidModel, fuse_encodings  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagSequenceModel, RagTokenModel  # noqa: E402
from rag_plugin.tasks.pairing import BuiltModel, check_family  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402


def _task(world, n_docs=3, split="test", retriever="dense"):
    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(data=str(world["data"]), retriever=retriever,
                                                                      knowledge=str(world["ks"]), n_docs=n_docs))
    task.load_dataset(split)
    return task


def _fid(task, seed=0, **kw):
    torch.manual_seed(seed)
    return FidModel.build_model(FidConfig(generator_size="tiny", dropout=0.0, **kw), task)


def _batch(task, split="test"):
    ds = task.datasets[split]
    return ds.collater([ds[i] for i in range(len(ds))])


def _pair_encoding(model, question, row):
    """The generator's encoder on one (question, passage) input alone: [L, 1, H] with no padding."""
    store = model.retriever.store
    src, lengths = model.input_format.batch([question], [[(store.title_tokens(row), store.text_tokens(row))]],
                                            model.bos, model.eos, model.pad, model.cfg.max_source_positions)
    assert not src.eq(model.pad).any()
    return model.generator.encoder(src, src_lengths=lengths)["encoder_out"][0]


@pytest.mark.parametrize("k, retriever", [(1, "dense"), (3, "dense"), (3, "bm25")])
def test_decoder_reads_exactly_the_k_pair_encodings(tiny_world, k, retriever):
    """Brute force: each pair encoded on its own (no padding), the K encodings concatenated, the decoder run on
    them; the model (padded pairs, fused with their padding mask) gives the same logits to 1e-6."""
    task = _task(tiny_world, n_docs=k, retriever=retriever)
    model = _fid(task).eval().double()  # float64: the comparison holds to 1e-6 without float32 rounding
    sample = _batch(task)
    ni = sample["net_input"]
    with torch.no_grad():
        logits, extra = model(**ni)
        rows = extra["doc_rows"]
        assert rows.shape == (len(sample["id"]), k)
        for i, q in enumerate(ni["src_tokens"]):
            question = q[q.ne(model.pad)].numpy()
            encodings = [_pair_encoding(model, question, int(r)) for r in rows[i]]
            memory = torch.cat(encodings, dim=0)                                   # [sum L_k, 1, H]
            enc = {"encoder_out": [memory], "encoder_padding_mask": [torch.zeros(1, memory.size(0), dtype=torch.bool)]}
            by_hand, _ = model.generator.decoder(ni["prev_output_tokens"][i: i + 1], encoder_out=enc)
            torch.testing.assert_close(logits[i: i + 1], by_hand, atol=1e-6, rtol=0)
            if k > 1:  # one passage fewer: another output (the decoder does read every passage)
                fewer = {"encoder_out": [torch.cat(encodings[:-1], 0)],
                         "encoder_padding_mask": [torch.zeros(1, memory.size(0) - encodings[-1].size(0),
                                                              dtype=torch.bool)]}
                assert (model.generator.decoder(ni["prev_output_tokens"][i: i + 1], encoder_out=fewer)[0]
                        - by_hand).abs().max() > 1e-3


def test_fuse_encodings_layout():
    """Pair (b, k) position t lands at row b, position k*L + t; the padding mask follows it."""
    b, k, length, dim = 2, 3, 4, 5
    enc = torch.randn(length, b * k, dim)
    mask = torch.rand(b * k, length) > 0.5
    fused = fuse_encodings({"encoder_out": [enc], "encoder_padding_mask": [mask],
                            "encoder_embedding": [enc.transpose(0, 1)]}, k)
    for i in range(b):
        for j in range(k):
            for t in range(length):
                assert torch.equal(fused["encoder_out"][0][j * length + t, i], enc[t, i * k + j])
                assert fused["encoder_padding_mask"][0][i, j * length + t] == mask[i * k + j, t]
                assert torch.equal(fused["encoder_embedding"][0][i, j * length + t], enc[t, i * k + j])


def _nll_by_hand(model, sample):
    logits, _ = model(**sample["net_input"])
    lp = torch.log_softmax(logits.double(), -1)
    target = sample["target"]
    mask = target.ne(model.pad)
    token = lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    smooth = lp.sum(-1)  # fairseq's label smoothing: eps / (V - 1) on every other token
    return -(token * mask).sum(), -(smooth * mask).sum()


def test_fairseq_cross_entropy_criteria_train_fid(tiny_world):
    task = _task(tiny_world, split="train")
    model = _fid(task).eval()
    sample = _batch(task, "train")
    with torch.no_grad():
        loss, sample_size, log = CrossEntropyCriterion(task, sentence_avg=False)(model, sample)
        nll, smooth = _nll_by_hand(model, sample)
    assert sample_size == sample["ntokens"]
    assert float(loss) == pytest.approx(float(nll), rel=1e-5)
    eps = 0.1
    ls = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=eps)
    with torch.no_grad():
        loss, _, log = ls(model, sample)
    v = len(task.dictionary)
    expected = (1 - eps - eps / (v - 1)) * nll + eps / (v - 1) * smooth
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert float(log["nll_loss"]) == pytest.approx(float(nll), rel=1e-5)


def test_no_gradient_reaches_the_query_encoder(tiny_world):
    task = _task(tiny_world, split="train")
    model = _fid(task).train()
    assert model.query_encoder is not None and model.generator.training
    assert not model.query_encoder.training  # fixed: retrieval without dropout in training too
    assert not any(p.requires_grad for p in model.query_encoder.parameters())
    loss, _, _ = CrossEntropyCriterion(task, sentence_avg=False)(model, _batch(task, "train"))
    loss.backward()
    assert all(p.grad is None for p in model.query_encoder.parameters())
    grads = [p.grad for p in model.generator.parameters() if p.requires_grad]
    assert all(g is not None for g in grads) and sum(float(g.abs().sum()) for g in grads) > 0


def test_fid_without_passages_is_an_error(tiny_world):
    task = _task(tiny_world, n_docs=0)
    with pytest.raises(UserError, match="--n-docs 0"):
        _fid(task)


def test_query_encoder_stays_fixed_whatever_its_lr_scale_without_adist(tiny_world):
    """The recipe's --query-encoder-lr-scale applies only when --retriever-loss adist trains the encoder."""
    model = _fid(_task(tiny_world), query_encoder_lr_scale=0.1)
    assert model.cfg.freeze_query_encoder and not model.returns_attention
    assert not any(p.requires_grad for p in model.query_encoder.parameters())


def test_checkpoints_of_the_other_family_are_refused(tiny_world):
    """RAG and FiD weights have the same names and shapes: the saved model family tells them apart."""
    task = _task(tiny_world)
    fid = _fid(task)
    torch.manual_seed(0)
    rag = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0), task)
    assert set(fid.state_dict()) == set(rag.state_dict())
    with pytest.raises(UserError, match=r"RAG model, --arch builds a FiD model .*--arch rag_token_\*"):
        fid.load_state_dict(rag.state_dict())
    with pytest.raises(UserError, match=r"FiD model, --arch builds a RAG model .*--arch fid_\*"):
        rag.load_state_dict(fid.state_dict())
    other = _fid(task, seed=1)
    other.load_state_dict(fid.state_dict())  # the same family loads
    assert all(torch.equal(a, b) for a, b in zip(other.state_dict().values(), fid.state_dict().values())
               if torch.is_tensor(a))


def test_criteria_of_the_other_family_are_refused(tiny_world):
    from omegaconf import OmegaConf

    from rag_plugin.criterions.marginal_nll import MarginalNLLConfig

    task = _task(tiny_world)
    fid, token = BuiltModel.of(_fid(task)), BuiltModel.of(RagTokenModel.build_model(RagConfig(generator_size="tiny"),
                                                                                   task))
    sequence = BuiltModel.of(RagSequenceModel.build_model(RagConfig(generator_size="tiny"), task))
    with pytest.raises(UserError, match="--criterion marginal_nll"):
        check_family(fid, MarginalNLLCriterion(task))
    with pytest.raises(UserError, match="--criterion cross_entropy"):
        check_family(token, CrossEntropyCriterion(task, sentence_avg=False))
    check_family(fid, CrossEntropyCriterion(task, sentence_avg=False))
    check_family(sequence, MarginalNLLCriterion(task))
    # the task checks the model it built against the criterion it builds
    task.build_model(OmegaConf.structured(FidConfig(generator_size="tiny", _name="fid", lr=[1e-3])))
    with pytest.raises(UserError, match="--criterion marginal_nll"):
        task.build_criterion(OmegaConf.structured(MarginalNLLConfig(_name="marginal_nll")))


def test_generator_checkpoint_of_a_rag_model_initialises_fid(tiny_world, tmp_path):
    """--generator-checkpoint: the same generator checkpoints as RAG (here a RAG model's own weights)."""
    task = _task(tiny_world)
    torch.manual_seed(5)
    rag = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0), task)
    path = tmp_path / "rag.pt"
    torch.save({"model": rag.state_dict()}, path)
    fid = _fid(task, generator_checkpoint=str(path))
    for name, value in rag.generator.state_dict().items():
        assert torch.equal(fid.generator.state_dict()[name], value), name
    assert not math.isnan(float(next(fid.parameters()).detach().sum()))


@pytest.mark.parametrize("frozen", [True, False])
def test_a_frozen_rag_query_encoder_retrieves_without_dropout_in_training(tiny_world, frozen):
    """RAG with --freeze-query-encoder: in train mode its query encoder stays in eval mode, so two training
    forwards retrieve with the same scores (a trained one keeps its dropout)."""
    task = _task(tiny_world, split="train")
    torch.manual_seed(0)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", freeze_query_encoder=frozen), task).train()
    assert model.query_encoder.training is not frozen
    ni = _batch(task, "train")["net_input"]
    with torch.no_grad():
        first = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)[0]
        second = model.retrieve(ni["query_tokens"], ni["query_mask"], 3)[0]
    assert torch.equal(first, second) is frozen
