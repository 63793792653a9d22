"""``--target-format hf`` is transformers' fine-tuning objective (``examples/research_projects/rag/
finetune_rag.py``), checked against transformers' own loss on the random world of hf_world.py.

For a BART generator, finetune_rag passes the BART tokenizer's ``<s> answer </s>`` (padded) as both
``decoder_input_ids`` and ``labels``, with ``reduce_loss`` (here off: per example), the config's
``label_smoothing`` (its ``--label_smoothing``, default 0) and the config's ``exclude_bos_score``
(default False). ``get_nll`` shifts the labels left, so transformers scores ``answer </s>`` after
``<s>``: the plugin's criterion on a dataset of the ``hf`` target format must give the same
per-example loss. The default (``plugin``) format scores another sequence, several nats away.
"""
import numpy as np
import pytest
import torch

from tests.conversion import hf_world

T = hf_world.transformers()  # skips the module without transformers

from rag_plugin.core.input_format import InputFormat, target_layout  # noqa: E402
from rag_plugin.criterions.marginal_nll import MarginalNLLConfig, MarginalNLLCriterion  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402

BOS, PAD, EOS = 0, 1, 2


def _finetune_rag_labels(world) -> torch.Tensor:
    """finetune_rag's ``decoder_input_ids`` (= its ``labels``): ``<s> answer </s>``, right-padded."""
    rows = [world["g_tok"](a)["input_ids"] for a in hf_world.ANSWERS]
    assert all(r[0] == BOS and r[-1] == EOS for r in rows)
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


def _reference_loss(world, variant, labels, epsilon=0.0, **kwargs) -> torch.Tensor:
    model = world[variant]["model"]
    q = world["q_tok"](hf_world.QUESTIONS, padding=True, return_tensors="pt")
    model.config.label_smoothing = epsilon  # finetune_rag sets config.label_smoothing; forward reads it
    try:
        with torch.no_grad():
            out = model(input_ids=q["input_ids"], attention_mask=q["attention_mask"], decoder_input_ids=labels,
                        labels=labels, use_cache=False, reduce_loss=False, n_docs=hf_world.N_DOCS, **kwargs)
    finally:
        model.config.label_smoothing = 0.0
    return out.loss


def _sample(task):
    ds = task.build_dataset(hf_world.QUESTIONS, hf_world.ANSWERS)
    return ds.collater([ds[i] for i in range(len(ds))])


def _plugin_loss(model, task, sample, epsilon=0.0) -> torch.Tensor:
    # the criterion's target format is the task's (II("task.target_format"), as fairseq resolves it)
    cfg = MarginalNLLConfig(label_smoothing=epsilon, target_format=str(task.cfg.target_format))
    with torch.no_grad():
        loss, _, _ = MarginalNLLCriterion(task, cfg)(model, sample, reduce=False)
    return loss


@pytest.mark.parametrize("variant", ["token", "sequence"])
def test_hf_target_format_is_finetune_rag_loss(world, load_converted, variant):
    model, task = load_converted(variant, target_format="hf")
    labels = _finetune_rag_labels(world)
    sample = _sample(task)
    # decoder input <s> answer, target answer </s>: finetune_rag's labels as get_nll shifts them
    prev, target = sample["net_input"]["prev_output_tokens"], sample["target"]
    for i, row in enumerate(labels.tolist()):
        n = row.index(EOS)  # the answer's length + 1
        assert target[i].tolist() == row[1: n + 1] + [PAD] * (target.size(1) - n)
        assert prev[i, :n].tolist() == row[:n]
    ours = _plugin_loss(model, task, sample)
    ref = _reference_loss(world, variant, labels)
    np.testing.assert_allclose(ours.double().numpy(), ref.double().numpy(), rtol=1e-4)
    assert float(ours.min()) > 1.0  # a random model: far from zero, so the comparison means something
    if variant == "sequence":  # exclude_bos_score changes nothing here: the shifted labels do not start with <s>
        np.testing.assert_allclose(_reference_loss(world, variant, labels, exclude_bos_score=True).numpy(),
                                   ref.numpy(), rtol=1e-6)

    # with finetune_rag's --label_smoothing 0.1 (its example scripts' value)
    ref_smoothed = _reference_loss(world, variant, labels, epsilon=0.1)
    # through the criterion for both variants (RAG-Sequence: transformers' smoothing term, which adds the
    # prior once per vocabulary entry, under --target-format hf)
    np.testing.assert_allclose(_plugin_loss(model, task, sample, 0.1).double().numpy(),
                               ref_smoothed.double().numpy(), rtol=1e-4)

    # the default target format is another objective: <s> answer </s> after </s>
    task.cfg.target_format = "plugin"
    plugin_sample = _sample(task)
    assert plugin_sample["net_input"]["prev_output_tokens"][:, :2].tolist() == [[EOS, BOS]] * len(labels)
    gap = (_plugin_loss(model, task, plugin_sample) - ours).abs()
    assert float(gap.min()) > 1.0, gap


def test_target_layout():
    hf, plugin = InputFormat.hf(), InputFormat.plugin()
    assert target_layout("plugin", plugin, BOS, EOS) == ([], EOS)
    assert target_layout("plugin", hf, BOS, EOS) == ([BOS], EOS)
    assert target_layout("hf", hf, BOS, EOS) == ([], BOS)
    assert target_layout("hf", plugin, BOS, EOS) == ([], BOS)
    with pytest.raises(UserError, match="unknown target format 'x'"):
        target_layout("x", plugin, BOS, EOS)


def test_generation_ignores_the_target_format(world, load_converted):
    """Decoding starts from </s> whatever the target format, as transformers' generate does
    (decoder_start_token_id): greedy RAG-Token answers of a task with --target-format hf are the
    reference's greedy answers."""
    from fairseq.dataclass.configs import GenerationConfig

    model, task = load_converted("token", target_format="hf")
    sample = _sample(task)
    generator = task.build_generator([model], GenerationConfig(beam=1, max_len_a=0, max_len_b=8, min_len=1))
    hypos = generator.generate([model], sample)
    q = world["q_tok"](hf_world.QUESTIONS, padding=True, return_tensors="pt")
    ref = world["token"]["model"].generate(input_ids=q["input_ids"], attention_mask=q["attention_mask"], num_beams=1,
                                           do_sample=False, max_length=10, min_length=2, bad_words_ids=[[PAD]],
                                           n_docs=hf_world.N_DOCS)
    for i, row in enumerate(ref.tolist()):
        want = row[1:]  # after the decoder start </s>
        want = want[: want.index(EOS) + 1] if EOS in want else want
        assert hypos[i][0]["tokens"].tolist() == want, i
