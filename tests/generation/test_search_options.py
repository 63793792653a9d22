"""fairseq's search options with the RAG generators, against decoding rebuilt from plain parts.

* RAG-Sequence under searches whose scores are not the model's (diverse siblings, diverse beam
  groups, language-model fusion) and under a prefix-constrained search (which only masks):
  Thorough and Fast rank the candidates by the model's own marginal, as brute force does.
* RAG-Token with diverse beam groups in a batch whose dataset ids are not its rows.
* ``prefix_allowed_tokens_fn`` reaches the search and sees the samples' ids.
* Options the generators do not support are refused in one line.
"""
import copy
import io
import json
import math
from argparse import Namespace

import pytest
import torch
from fairseq.dataclass.configs import GenerationConfig
from fairseq.tasks import FairseqTask

from rag_plugin.generation import provenance
from rag_plugin.generation.adapters import retrieval_of
from rag_plugin.models.rag import RagSequenceModel, RagTokenModel
from rag_plugin.util.errors import UserError
from tests.generation.test_decoding import _forced_log_probs, _gen, _setup, _teacher_forced

K, BEAM = 3, 3


def _sharp_lm(dictionary):
    """A tiny transformer LM over the generator's dictionary, its weights scaled up so that shallow
    fusion changes the search's scores a lot."""
    from fairseq.models.transformer_lm import TransformerLanguageModel, base_lm_architecture

    args = Namespace(decoder_layers=1, decoder_embed_dim=32, decoder_ffn_embed_dim=64, decoder_attention_heads=2,
                     tokens_per_sample=64, max_target_positions=64, add_bos_token=False, dropout=0.0)
    base_lm_architecture(args)
    torch.manual_seed(0)
    lm = TransformerLanguageModel.build_model(args, Namespace(source_dictionary=dictionary,
                                                              target_dictionary=dictionary)).eval()
    with torch.no_grad():
        for p in lm.parameters():
            p.mul_(20)
    return lm


def _lse(terms):
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def _brute_force_rag_sequence(task, model, sample, gen_kw, extra, prefix_fn=None):
    """RAG-Sequence decoding from plain parts, for any search option: fairseq's own builder and
    SequenceGenerator, with the same options, run on the BART generator for each (question, document)
    input and propose the candidates; every p(y|x,z) is teacher-forced through BART by hand; the prior is
    the softmax of the retrieval scores. Thorough: log sum over every document; Fast: over the documents
    whose beam found y. Returns the best (score / |y|, y) per question for each, and how many (candidate,
    document) beam scores differ from the model's."""
    ni = sample["net_input"]
    eos = task.dictionary.eos()
    with torch.no_grad():
        _, out = model(**ni)
        prior = torch.log_softmax(out["doc_scores"].double(), -1)
        src, lengths = model.generator_inputs(ni["src_tokens"], out["doc_rows"])  # row b * K + d
        # on a copy: fairseq's search makes BART's cross-attention beam-grouped and its encoder's
        # reorder_encoder_out a no-op for good (BARTModel.set_beam_size)
        bart_model = copy.deepcopy(model.generator)
        bart = FairseqTask.build_generator(task, [bart_model], GenerationConfig(
            beam=BEAM, max_len_a=0, max_len_b=6, **gen_kw), extra_gen_cls_kwargs=dict(extra),
            prefix_allowed_tokens_fn=prefix_fn)
        beams = bart.generate([bart_model], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
        cache = {}

        def forced(row, y):
            if (row, y) not in cache:
                cache[row, y] = float(_forced_log_probs(model.generator, src[row:row + 1], lengths[row:row + 1],
                                                        list(y), eos).sum())
            return cache[row, y]

        best = {"thorough": [], "fast": []}
        altered = 0
        for b in range(ni["src_tokens"].size(0)):
            found = {}  # candidate -> documents whose beam found it
            for d in range(K):
                for h in beams[b * K + d]:
                    y = tuple(h["tokens"].tolist())
                    found.setdefault(y, set()).add(d)
                    altered += abs(float(h["positional_scores"].double().sum()) - forced(b * K + d, y)) > 1e-3
            scored = {"thorough": [], "fast": []}
            for y, docs in found.items():
                joint = [float(prior[b, d]) + forced(b * K + d, y) for d in range(K)]
                scored["thorough"].append((_lse(joint) / len(y), y))
                scored["fast"].append((_lse([joint[d] for d in docs]) / len(y), y))
            for decoding in best:
                best[decoding].append(max(scored[decoding]))
    return best, altered


def _no_tokens_of(banned, eos):
    return lambda batch_id, tokens: [t for t in range(101) if t not in banned or t == eos]


@pytest.mark.parametrize("option", ["diversity_rate", "diverse_beam_groups", "lm_fusion", "prefix_allowed_tokens_fn"])
def test_rag_sequence_scores_are_the_models_under_search_options(tiny_world, option):
    """The beam scores are reused as log p(y|x,z) only when they are the model's: the answer and its
    score equal the brute-force ones (fully teacher-forced) for Thorough and Fast alike."""
    task, model, sample = _setup(tiny_world, RagSequenceModel, n_docs=K, seed=3)
    gen_kw, extra, fn = {}, {}, None
    if option == "diversity_rate":
        gen_kw = dict(diversity_rate=5.0)
    elif option == "diverse_beam_groups":
        gen_kw = dict(diverse_beam_groups=3, diverse_beam_strength=5.0)
    elif option == "lm_fusion":
        extra = {"lm_model": _sharp_lm(task.dictionary), "lm_weight": 1.0}
    else:  # forbid the tokens of the unconstrained answers: the constraint must change them
        plain = _gen(task, model, sample, beam=BEAM)
        banned = {t for hyps in plain for t in hyps[0]["tokens"].tolist()} - {task.dictionary.eos()}
        fn = _no_tokens_of(banned, task.dictionary.eos())
    expect, altered = _brute_force_rag_sequence(task, model, sample, gen_kw, extra, fn)
    if option == "prefix_allowed_tokens_fn":
        assert altered == 0  # masking only: the beams' scores are the model's and are reused
        assert not any(set(y) & banned for _, y in expect["thorough"])
    else:
        assert altered > 0   # the option changed the search's scores: reusing them would be wrong
    for decoding in ("thorough", "fast"):
        task.cfg.rag_decoding = decoding
        args = GenerationConfig(beam=BEAM, max_len_a=0, max_len_b=6, **gen_kw)
        got = task.build_generator([model], args, extra_gen_cls_kwargs=dict(extra),
                                   prefix_allowed_tokens_fn=fn).generate([model], sample)
        for (score, y), hyps in zip(expect[decoding], got):
            assert hyps[0]["tokens"].tolist() == list(y), decoding
            assert float(hyps[0]["score"]) == pytest.approx(score, abs=1e-4), decoding


def test_rag_token_diverse_beam_groups_with_dataset_ids(tiny_world):
    """fairseq's diverse beam search keeps per-row buffers: a batch whose ids (3, 4) are not its rows
    gives the answers those questions get in a batch whose ids are its rows (0..4)."""
    task, model, sample = _setup(tiny_world, RagTokenModel, seed=3)
    ds = task.datasets["test"]
    part = ds.collater([ds[3], ds[4]])
    assert part["id"].tolist() == [3, 4]
    kw = dict(beam=4, nbest=4, diverse_beam_groups=2, diverse_beam_strength=2.0)
    got = _gen(task, model, part, **kw)
    full = _gen(task, model, sample, **kw)
    assert sample["id"].tolist() == list(range(5))
    for hyps, ref in zip(got, full[3:]):
        assert len(hyps) == 4
        assert [h["tokens"].tolist() for h in hyps] == [h["tokens"].tolist() for h in ref]
        assert [float(h["score"]) for h in hyps] == pytest.approx([float(h["score"]) for h in ref], abs=1e-4)


@pytest.mark.parametrize("cls", [RagTokenModel, RagSequenceModel])
def test_prefix_allowed_tokens_fn_constrains_answers_by_sample_id(tiny_world, cls):
    """build_generator's prefix_allowed_tokens_fn reaches fairseq's search; it sees each question's
    sample id (as fairseq passes dataset ids), and the answers' scores stay the model's."""
    task, model, _ = _setup(tiny_world, cls, seed=3)
    ds = task.datasets["test"]
    sample = ds.collater([ds[2], ds[4]])
    eos = task.dictionary.eos()
    allowed = {2: {eos, 10, 11, 12}, 4: {eos, 20, 21, 22}}
    seen = set()

    def fn(batch_id, tokens):
        seen.add(batch_id)
        return sorted(allowed[batch_id])

    args = GenerationConfig(beam=2, max_len_a=0, max_len_b=4)
    hypos = task.build_generator([model], args, prefix_allowed_tokens_fn=fn).generate([model], sample)
    assert seen == {2, 4}
    for sid, hyps in zip(sample["id"].tolist(), hypos):
        assert set(hyps[0]["tokens"].tolist()) <= allowed[sid]
    forced = _teacher_forced(task, model, sample, hypos)
    for h, f in zip(hypos, forced):
        assert float(h[0]["score"]) == pytest.approx(float(f[0]["score"]), abs=1e-4)


# ----------------------------------------------------------------------------- refused options
@pytest.mark.parametrize("cls", [RagTokenModel, RagSequenceModel])
@pytest.mark.parametrize("option, value", [("print_alignment", "hard"), ("print_alignment", "soft"),
                                           ("constraints", "ordered"), ("replace_unk", "@@ "),
                                           ("print_step", True)])
@pytest.mark.parametrize("score_reference", [False, True])
def test_unsupported_options_are_one_line_errors(tiny_world, cls, option, value, score_reference):
    task, model, _ = _setup(tiny_world, cls, seed=3)
    args = GenerationConfig(beam=2, score_reference=score_reference, **{option: value})
    with pytest.raises(UserError) as err:
        task.build_generator([model], args)
    line = err.value.render()
    assert "--" + option.replace("_", "-") in line and line.endswith(")") and "\n" not in line


def test_constraints_refused_for_interactive_input(tiny_world):
    task, _, sample = _setup(tiny_world, RagTokenModel, seed=3)
    src = sample["net_input"]["src_tokens"]
    with pytest.raises(UserError, match="--constraints"):
        task.build_dataset_for_inference(src, sample["net_input"]["src_lengths"],
                                         constraints=torch.zeros(src.size(0), 2, dtype=torch.long))


@pytest.mark.parametrize("cls, score_reference", [(RagSequenceModel, False), (RagSequenceModel, True),
                                                  (RagTokenModel, True)])
def test_doc_posterior_out_refused_where_nothing_is_written(tiny_world, tmp_path, cls, score_reference):
    task, model, _ = _setup(tiny_world, cls, seed=3)
    task.cfg.doc_posterior_out = str(tmp_path / "post.jsonl")
    with pytest.raises(UserError, match="--doc-posterior-out") as err:
        task.build_generator([model], GenerationConfig(beam=2, score_reference=score_reference))
    assert err.value.render().endswith(")")
    token_task, token_model, _ = _setup(tiny_world, RagTokenModel, seed=3)
    token_task.cfg.doc_posterior_out = str(tmp_path / "post.jsonl")
    token_task.build_generator([token_model], GenerationConfig(beam=2))  # RAG-Token generation: accepted


def test_prefix_allowed_tokens_fn_refused_when_scoring_references(tiny_world):
    task, model, _ = _setup(tiny_world, RagTokenModel, seed=3)
    with pytest.raises(UserError, match="prefix_allowed_tokens_fn"):
        task.build_generator([model], GenerationConfig(score_reference=True),
                             prefix_allowed_tokens_fn=lambda batch_id, tokens: [2])


# ----------------------------------------------------------------------------- fairseq-generate's options
def _fairseq_generate_main(task, generator, model, sample, quiet, output_file):
    """inference_step as fairseq-generate runs it: --quiet reaches the task through its config
    (``common_eval.quiet`` by interpolation), the output stream through the command-line hook."""
    task.cfg.quiet, task.output_stream = quiet, output_file
    try:
        return task.inference_step(generator, [model], sample)
    finally:
        task.cfg.quiet, task.output_stream = "${common_eval.quiet}", None


def test_quiet_prints_no_provenance_lines(tiny_world, tmp_path):
    task, model, sample = _setup(tiny_world, RagTokenModel, seed=3)
    task.cfg.provenance_out = str(tmp_path / "prov.jsonl")
    gen = task.build_generator([model], GenerationConfig(beam=2, max_len_a=0, max_len_b=4))
    loud, quiet = io.StringIO(), io.StringIO()
    hypos = _fairseq_generate_main(task, gen, model, sample, False, loud)
    rows, doc_lp = retrieval_of(hypos)
    expect = provenance.z_lines(sample["id"].tolist(), rows, doc_lp, task.knowledge.passages)
    assert loud.getvalue().splitlines() == expect and len(expect) == 3 * len(sample["id"])
    _fairseq_generate_main(task, gen, model, sample, True, quiet)
    assert quiet.getvalue() == ""
    records = (tmp_path / "prov.jsonl").read_text().splitlines()
    assert len(records) == 2 * len(sample["id"])  # --provenance-out is still written


def test_post_process_sentencepiece_keeps_text(tiny_world):
    """fairseq's --post-process sentencepiece makes every line text before the task's BPE decodes it:
    decoding leaves it as it is; without it, pieces are decoded; other post-processing is refused."""
    from fairseq.data.data_utils import post_process

    task, _, _ = _setup(tiny_world, RagTokenModel, seed=3)
    text = json.loads((tiny_world["data"] / "test.jsonl").read_text().splitlines()[0])["input"]

    def build_bpe(post_process):  # fairseq's --post-process reaches the task by interpolation
        task.cfg.post_process = post_process
        return task.build_bpe(None)

    plain = build_bpe(None)
    pieces = plain.encode(text)
    assert plain.decode(pieces) == task.tokenizer.decode(task.tokenizer.encode(text)) == text
    processed = post_process(pieces, "sentencepiece")
    assert processed == text
    bpe = build_bpe("sentencepiece")
    assert bpe.decode(processed) == text
    for mode in ("letter", "wordpiece"):
        with pytest.raises(UserError, match=f"--post-process {mode}"):
            build_bpe(mode)
