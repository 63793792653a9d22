"""A converted Hugging Face RAG model computes what the reference (transformers) computes.

Small random RagTokenForGeneration / RagSequenceForGeneration models with transformers' own
retriever code over a custom index (tests/conversion/hf_world.py) are saved, converted with
rag-convert-hf's code (convert_hf_rag), their knowledge dataset imported (rag-import-knowledge's),
and the plugin model loaded the way fairseq-generate loads it (tests/conversion/conftest.py). Then,
per example: question vectors, retrieved documents and document scores, the generator's inputs,
the marginal NLL (1e-4 relative) and greedy RAG-Token answers must equal the reference's. The NLL
is that of the default target format: ``<s> answer </s>`` after the decoder start ``</s>``, i.e.
transformers' loss for ``labels = </s> <s> answer </s>`` (the sequence its ``generate`` writes);
the ``hf`` target format (finetune_rag's labels) is tested in test_target_format.py.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conversion import hf_world

T = hf_world.transformers()  # skips the module without transformers

import rag_plugin  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402

rag_plugin.register()

from rag_plugin.models.rag import RagConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
MAX_LEN = 8  # greedy answers: at most 8 tokens (+ </s>)


def _reference(world, variant):
    """transformers' per-example loss for labels ``</s> <s> answer </s>`` (also its decoder input)."""
    model = world[variant]["model"]
    q = world["q_tok"](hf_world.QUESTIONS, padding=True, return_tensors="pt")
    g_tok = world["g_tok"]
    labels = [[2, 0] + g_tok(a, add_special_tokens=False)["input_ids"] + [2] for a in hf_world.ANSWERS]
    width = max(len(x) for x in labels)
    labels = torch.tensor([x + [1] * (width - len(x)) for x in labels])
    with torch.no_grad():
        out = model(input_ids=q["input_ids"], attention_mask=q["attention_mask"], labels=labels,
                    reduce_loss=False, output_retrieved=True, n_docs=hf_world.N_DOCS)
    return q, labels, out


def _ours(model, task):
    from rag_plugin.criterions.marginal_nll import MarginalNLLCriterion

    ds = task.build_dataset(hf_world.QUESTIONS, hf_world.ANSWERS)
    sample = ds.collater([ds[i] for i in range(len(ds))])
    ni = sample["net_input"]
    with torch.no_grad():
        q = model.query_encoder(ni["query_tokens"], ni["query_mask"])
        _, extra = model(**ni)
        src, lengths = model.generator_inputs(ni["src_tokens"], extra["doc_rows"])
        loss, _, _ = MarginalNLLCriterion(task)(model, sample, reduce=False)
    return sample, q, extra, src, lengths, loss


def _check_against_reference(world, load_converted, variant):
    model, task = load_converted(variant)
    assert model.variant == variant and task.input_format.name == "hf"
    q_ref, labels, ref = _reference(world, variant)
    sample, q, extra, src, lengths, loss = _ours(model, task)
    store = task.knowledge.passages
    # the same question tokens for the query encoder, and the same question vectors
    assert sample["net_input"]["query_tokens"].tolist() == q_ref["input_ids"].tolist()
    torch.testing.assert_close(q, ref.question_encoder_last_hidden_state, rtol=1e-4, atol=1e-5)
    # the same documents, in the same order, with the same scores
    ids = [[int(store.id(int(r))) for r in row] for row in extra["doc_rows"]]
    assert ids == ref.retrieved_doc_ids.tolist()
    torch.testing.assert_close(extra["doc_scores"], ref.doc_scores, rtol=1e-4, atol=1e-5)
    # the same generator inputs, token for token (the reference pads to max_combined_length)
    for i, row in enumerate(ref.context_input_ids):
        want = row[ref.context_attention_mask[i].bool()].tolist()
        assert src[i, : lengths[i]].tolist() == want, (i, src[i, : lengths[i]].tolist(), want)
    assert int(lengths.max()) == hf_world.MAX_COMBINED  # some inputs were cut, as in the reference
    # ... and for every passage with every question, against the reference retriever's own formatting
    n = len(store)
    everything = torch.tensor([[store.row_of_id(str(j)) for j in range(n)]] * len(hf_world.QUESTIONS))
    with torch.no_grad():
        src_all, lengths_all = model.generator_inputs(sample["net_input"]["src_tokens"], everything)
    retriever = world[variant]["model"].retriever
    asked = retriever.question_encoder_tokenizer.decode(q_ref["input_ids"], skip_special_tokens=True)
    docs = [{"title": hf_world.TITLES, "text": hf_world.TEXTS}] * len(hf_world.QUESTIONS)
    ctx, ctx_mask = retriever.postprocess_docs(docs, asked, None, n, return_tensors="pt")
    for i in range(len(ctx)):
        assert src_all[i, : lengths_all[i]].tolist() == ctx[i][ctx_mask[i].bool()].tolist(), i
    # the same targets (<s> answer </s>) and the same per-example marginal NLL
    assert sample["target"].tolist() == [[t for t in row[1:] if t != 1] + [1] * (
        sample["target"].size(1) - len([t for t in row[1:] if t != 1])) for row in labels.tolist()]
    np.testing.assert_allclose(loss.double().numpy(), ref.loss.double().numpy(), rtol=1e-4)
    assert float(loss.min()) > 1.0  # a random model: the NLL is far from zero, so the comparison means something
    return model, task, sample


def test_rag_token_equals_reference(world, load_converted):
    model, task, sample = _check_against_reference(world, load_converted, "token")
    from fairseq.dataclass.configs import GenerationConfig

    gen = task.build_generator([model], GenerationConfig(beam=1, max_len_a=0, max_len_b=MAX_LEN, min_len=1))
    hypos = gen.generate([model], sample)
    q = world["q_tok"](hf_world.QUESTIONS, padding=True, return_tensors="pt")
    ref = world["token"]["model"].generate(input_ids=q["input_ids"], attention_mask=q["attention_mask"],
                                           num_beams=1, do_sample=False, max_length=MAX_LEN + 2, min_length=2,
                                           bad_words_ids=[[1]], n_docs=hf_world.N_DOCS)
    for i, row in enumerate(ref.tolist()):
        want = row[1:]  # the reference starts from decoder_start_token_id (</s>); fairseq does too, unprinted
        want = want[: want.index(2) + 1] if 2 in want else want
        assert hypos[i][0]["tokens"].tolist() == want, (i, hypos[i][0]["tokens"].tolist(), want)


def test_rag_sequence_equals_reference(world, converted, load_converted):
    _, task, _ = _check_against_reference(world, load_converted, "sequence")
    # the same model rebuilt for training from the converted parts (--generator-checkpoint takes the
    # checkpoint's generator, --query-encoder its question encoder): the same per-example NLL
    from rag_plugin.indexing.converted_checkpoint import read_conversion
    from rag_plugin.models.rag import RagSequenceModel

    rec = read_conversion(str(converted["sequence"]["dir"]))
    cfg = RagConfig(generator_size="large", generator_embed_dim=hf_world.DIM, generator_layers=2, generator_heads=4,
                    generator_ffn_dim=64, max_source_positions=hf_world.MAX_COMBINED, max_target_positions=128,
                    input_format="hf", doc_score_scale=1.0, dropout=0.0, query_encoder=rec["encoder_spec"],
                    generator_checkpoint=rec["checkpoint"])
    model = RagSequenceModel.build_model(cfg, task).eval()
    _, _, _, _, _, loss = _ours(model, task)
    _, _, ref = _reference(world, "sequence")
    np.testing.assert_allclose(loss.double().numpy(), ref.loss.double().numpy(), rtol=1e-4)


def test_fairseq_generate_reproduces_reference_answers(world, converted, tmp_path):
    """The converted checkpoint through the fairseq-generate command line: greedy RAG-Token answers
    are the reference's greedy answers (as text)."""
    from rag_plugin.indexing.converted_checkpoint import read_conversion
    from rag_plugin.retrieval.tokenization import GeneratorTokenizer

    data = tmp_path / "data"
    data.mkdir()
    pairs = enumerate(zip(hf_world.QUESTIONS, hf_world.ANSWERS, strict=True))
    (data / "test.jsonl").write_text("".join(json.dumps({"id": str(i), "input": q, "output": [{"answer": a}]}) + "\n"
                                             for i, (q, a) in pairs))
    c = converted["token"]
    cmd = [str(Path(sys.executable).parent / "fairseq-generate"), str(data), "--user-dir", str(REPO / "rag_plugin"),
           "--task", "retrieval_augmented", "--knowledge", str(c["ks"]), "--path", str(c["checkpoint"]),
           "--gen-subset", "test", "--beam", "1", "--max-len-b", str(MAX_LEN), "--n-docs", str(hf_world.N_DOCS),
           "--batch-size", "6", "--cpu", "--num-workers", "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(REPO), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {}
    for line in proc.stdout.splitlines():
        if line.startswith("D-"):  # the detokenized hypothesis
            head, _, text = line.split("\t", 2)
            got[int(head[2:])] = text
    tok = GeneratorTokenizer(read_conversion(str(c["dir"]))["tokenizer"])
    q = world["q_tok"](hf_world.QUESTIONS, padding=True, return_tensors="pt")
    ref = world["token"]["model"].generate(input_ids=q["input_ids"], attention_mask=q["attention_mask"],
                                           num_beams=1, do_sample=False, max_length=MAX_LEN + 2, min_length=2,
                                           bad_words_ids=[[1]], n_docs=hf_world.N_DOCS)
    assert len(got) == len(hf_world.QUESTIONS)
    for i, row in enumerate(ref.tolist()):
        assert got[i] == tok.decode([t for t in row[1:] if t > 3]), i
    # and through the Python entry point
    from rag_plugin.hub import RAG

    rag = RAG.from_pretrained(str(c["checkpoint"]), knowledge=str(c["ks"]), n_docs=hf_world.N_DOCS)
    answers = rag.generate(hf_world.QUESTIONS, beam=1, max_len_b=MAX_LEN)
    assert [a["answer"] for a in answers] == [got[i] for i in range(len(got))]


def test_generator_tokenizer_and_hf_input_format_are_exact(world, converted):
    """The converted BPE files tokenize like the reference's tokenizer, and the hf format's
    per-passage pieces concatenate to exactly the BPE of the reference's whole input string."""
    from rag_plugin.core.input_format import InputFormat
    from rag_plugin.indexing.converted_checkpoint import read_conversion
    from rag_plugin.retrieval.tokenization import GeneratorTokenizer

    d = converted["token"]["dir"]
    tok = GeneratorTokenizer(read_conversion(str(d))["tokenizer"])
    g_tok = world["g_tok"]
    assert len(tok) == len(g_tok)
    fmt = InputFormat.hf()
    titles = hf_world.TITLES + ['"', '""', "  ", "a ", " lead", "x\ty"]
    texts = hf_world.TEXTS + ["", " ", "  two", "end  ", "tab\there", "ü ñ 中文 ☃"]
    split = 0
    for title, text in zip(titles, texts, strict=True):
        for question in ("what is the capital of kalomi?", "", "x"):
            whole = ((title.removeprefix('"').removesuffix('"')) + " / " + text + " // " + question).replace("  ", " ")
            want = g_tok(whole, add_special_tokens=False)["input_ids"]
            a, b = fmt.passage_strings(title, text)
            got = tok.encode(a) + tok.encode(b) + tok.encode(fmt.question_string("", question))
            assert got == want, (title, text, question)
            split += bool(b)
    assert split >= len(hf_world.TITLES) * 3 - 6  # most passages split into a title and a text part


def test_converted_directory_and_errors(world, converted, tiny_world, tmp_path):
    from rag_plugin.conversion.hf_rag import convert_hf_rag
    from rag_plugin.indexing.converted_checkpoint import read_conversion

    rec = read_conversion(str(converted["token"]["dir"]))
    assert rec["architecture"] == "rag_token" and rec["n_docs"] == hf_world.N_DOCS
    assert rec["input_format"]["name"] == "hf" and rec["encoder_spec"].startswith("hf-dpr:")
    # questions as long as the DPR encoder's positions (transformers cuts none), not the plugin's 256
    assert rec["encoder_spec"].endswith(",max_length=128")
    src = world["token"]["dir"]
    with pytest.raises(UserError, match="holds ',' or '='"):  # the spec grammar could not record that path
        convert_hf_rag(str(src), str(tmp_path / "o-lr=3e-5"), log=lambda m: None)
    assert not (tmp_path / "o-lr=3e-5").exists()

    def broken(name, edit):
        folder = tmp_path / name
        subprocess.run(["cp", "-r", str(src), str(folder)], check=True)
        edit(folder)
        return folder

    def set_config(**changes):
        def edit(folder):
            cfg = json.loads((folder / "config.json").read_text())
            for key, value in changes.items():
                target = cfg
                *path, last = key.split(".")
                for p in path:
                    target = target[p]
                target[last] = value
            (folder / "config.json").write_text(json.dumps(cfg))
        return edit

    cases = [
        (tmp_path / "nowhere", "not found"),
        (broken("t5", set_config(**{"generator.model_type": "t5"})), "generator model_type 't5'"),
        (broken("bert", set_config(model_type="bert")), "model_type 'bert' is not 'rag'"),
        (broken("dims", set_config(**{"question_encoder.hidden_size": 48, "question_encoder.num_attention_heads": 4})),
         "shape"),
        (broken("noarch", set_config(architectures=["RagModel"])), "--variant"),
        (broken("act", set_config(**{"generator.activation_function": "relu"})), "activation_function"),
        (broken("notok", lambda f: subprocess.run(["rm", "-r", str(f / "generator_tokenizer")], check=True)),
         "generator tokenizer not found"),
        (broken("noweights", lambda f: (f / "model.safetensors").unlink()), "no model.safetensors"),
        (broken("noqtok", lambda f: subprocess.run(["rm", "-r", str(f / "question_encoder_tokenizer")], check=True)),
         "question encoder tokenizer not found"),
    ]
    for folder, fragment in cases:
        out = tmp_path / f"out-{folder.name}"
        with pytest.raises(UserError) as err:
            convert_hf_rag(str(folder), str(out), log=lambda m: None)
        assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)
        assert not out.exists() and not list(tmp_path.glob(f".out-{folder.name}.*"))  # nothing half-written
    # a model of the hf format against a knowledge source pre-tokenized for the plugin format
    from fairseq import checkpoint_utils

    from rag_plugin.util.safe_load import checkpoint_types_allowed

    with pytest.raises(UserError, match="reads the hf input format") as err, checkpoint_types_allowed():
        checkpoint_utils.load_model_ensemble_and_task([str(converted["token"]["checkpoint"])],
                                                      arg_overrides={"knowledge": str(tiny_world["ks"])})
    assert "--input-format hf" in str(err.value)
    # the command line: one line, exit status 2; an existing output is not overwritten
    proc = subprocess.run([str(Path(sys.executable).parent / "rag-convert-hf"), "--hf-dir", str(src),
                           "--out", str(converted["token"]["dir"])], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--overwrite" in proc.stderr, proc.stderr
