"""DPR encoders and fairseq BART checkpoints as initialisations, against their references.

* A DPR pair (transformers' random DPRQuestionEncoder + DPRContextEncoder) written in the
  original DPR checkpoint layout: ``dpr:CKPT`` gives transformers' question and passage
  vectors; a knowledge source built with it holds the reference passage vectors; a RAG model
  built with ``--query-encoder dpr:CKPT`` has the reference question vectors and document
  scores q.d.
* A random fairseq BART saved as fairseq's releases are (``model.pt``: argparse args, weights
  with the ``<mask>`` row): ``--generator-checkpoint model.pt`` gives the reference encoder
  outputs and decoder log-probabilities.
"""
import argparse
import types

import numpy as np
import pytest
import torch

from tests.conversion import hf_world

T = hf_world.transformers()

import rag_plugin  # noqa: E402

rag_plugin.register()

from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source  # noqa: E402
from rag_plugin.models.rag import RagConfig, RagTokenModel  # noqa: E402
from rag_plugin.retrieval.encoders import load_encoder  # noqa: E402
from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles  # noqa: E402
from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask  # noqa: E402

DIM = 32  # the tiny world's knowledge source dimension: the DPR query encoder must match it
TITLES = ["Kalomi", "Rira", "Tonesu", "Garipo", "Delo", "Lomira"]
TEXTS = ["Kalomi is a country; its capital is Rira.", "Rira is a city on the river.", "Tonesu wrote a poem.",
         "Garipo is north of Kalomi.", "Delo was king of Garipo.", "Lomira is a mountain (2,310 m)."]


@pytest.fixture(scope="module")
def dpr(tmp_path_factory):
    """The reference pair and its original-layout checkpoint ``CKPT`` with vocab.txt beside it."""
    root = tmp_path_factory.mktemp("dpr")
    vocab = hf_world.write_wordpiece_vocab(root / "vocab.txt")
    q_tok = T.DPRQuestionEncoderTokenizer(vocab=str(vocab))
    c_tok = T.DPRContextEncoderTokenizer(vocab=str(vocab))
    cfg = T.DPRConfig(vocab_size=len(q_tok), hidden_size=DIM, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=128)
    torch.manual_seed(11)
    q_model, c_model = T.DPRQuestionEncoder(cfg).eval(), T.DPRContextEncoder(cfg).eval()
    model_dict = {}
    for model, hf_prefix, dpr_prefix in ((q_model, "question_encoder.bert_model.", "question_model."),
                                         (c_model, "ctx_encoder.bert_model.", "ctx_model.")):
        for key, value in model.state_dict().items():
            model_dict[dpr_prefix + key[len(hf_prefix):]] = value.clone()
    params = argparse.Namespace(pretrained_model_cfg="bert-base-uncased", sequence_length=128, projection_dim=0,
                                do_lower_case=True, encoder_model_type="hf_bert")
    ckpt = root / "dpr_biencoder.cp"
    torch.save({"model_dict": model_dict, "optimizer_dict": None, "scheduler_dict": None, "offset": 0,
                "epoch": 1, "encoder_params": params}, ckpt)
    return {"q_model": q_model, "c_model": c_model, "q_tok": q_tok, "c_tok": c_tok,
            "spec": f"dpr:{ckpt},heads=4", "root": root}


def _reference_questions(dpr, questions):
    enc = dpr["q_tok"](questions, padding=True, return_tensors="pt")
    with torch.no_grad():
        return dpr["q_model"](**enc).pooler_output


def _reference_passages(dpr, titles, texts):
    enc = dpr["c_tok"](titles, texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():  # segment ids all 0, as DPR's own embedding code (and wiki_dpr's vectors) had them
        return dpr["c_model"](input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).pooler_output


def test_dpr_checkpoint_equals_reference_pair(dpr):
    enc = load_encoder(dpr["spec"])
    assert (enc.kind, enc.pooling, enc.normalize, enc.passage_format) == ("dpr", "cls", False, "pair")
    np.testing.assert_allclose(enc.encode_queries(hf_world.QUESTIONS),
                               _reference_questions(dpr, hf_world.QUESTIONS).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(enc.encode_passages(TITLES, TEXTS, progress=False),
                               _reference_passages(dpr, TITLES, TEXTS).numpy(), rtol=1e-4, atol=1e-5)


def _fairseq_bart(dictionary, seed=5):
    """A random fairseq BART (the 'tiny' preset's sizes) over ``dictionary`` + ``<mask>``, as the
    denoising task builds bart.base/bart.large, with every weight perturbed."""
    from fairseq.data import Dictionary
    from fairseq.models.bart.model import BARTModel, bart_base_architecture

    d = Dictionary()
    for sym in dictionary.symbols[4:]:
        d.add_symbol(sym)
    d.add_symbol("<mask>")
    args = argparse.Namespace(arch="bart_base", task="denoising", encoder_embed_dim=192, encoder_ffn_embed_dim=768,
                              encoder_layers=2, encoder_attention_heads=4, decoder_layers=2,
                              decoder_attention_heads=4, max_source_positions=256, max_target_positions=128,
                              dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    bart_base_architecture(args)
    torch.manual_seed(seed)
    bart = BARTModel.build_model(args, types.SimpleNamespace(source_dictionary=d, target_dictionary=d))
    with torch.no_grad():
        for p in bart.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return bart.eval(), args, len(d)


def test_dpr_and_fairseq_bart_initialise_a_rag_model(dpr, tiny_world, tmp_path):
    # a knowledge source whose passages were embedded by the DPR context encoder (from the checkpoint)
    passages = tmp_path / "passages.jsonl"
    passages.write_text("".join(f'{{"id": "p{i}", "title": "{t}", "text": "{x}"}}\n'
                                for i, (t, x) in enumerate(zip(TITLES, TEXTS, strict=True))))
    settings = BuildSettings(passages=str(passages), encoder=dpr["spec"], tokenizer=GeneratorTokenizerFiles(
        dict=str(tiny_world["root"] / "dict.txt"), bpe_model=str(tiny_world["root"] / "spm.model")))
    ks = build_knowledge_source(str(tmp_path / "ks"), settings, BuildOptions(progress=False, log=lambda m: None))
    ref_p = _reference_passages(dpr, TITLES, TEXTS)
    np.testing.assert_allclose(np.asarray(ks.vectors), ref_p.numpy(), rtol=1e-4, atol=1e-5)

    # a fairseq BART release checkpoint over the generator dictionary (+ <mask>)
    task = RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(
        data=str(tiny_world["data"]), knowledge=str(tmp_path / "ks"), n_docs=3))
    bart, args, rows = _fairseq_bart(task.dictionary)
    assert rows == len(task.dictionary) + 1
    model_pt = tmp_path / "bart" / "model.pt"
    model_pt.parent.mkdir()
    torch.save({"args": args, "model": bart.state_dict(), "optimizer_history": [], "extra_state": {},
                "last_optimizer_state": None}, model_pt)

    torch.manual_seed(0)
    model = RagTokenModel.build_model(RagConfig(generator_size="tiny", dropout=0.0, query_encoder=dpr["spec"],
                                                generator_checkpoint=str(model_pt)), task).eval()
    questions = [f"What is the capital of {t}?" for t in TITLES]
    ds = task.build_dataset(questions, ["x"] * len(questions))
    sample = ds.collater([ds[i] for i in range(len(ds))])
    ni = sample["net_input"]
    with torch.no_grad():
        # the query encoder is DPR's question encoder; document scores are its q . d(z)
        q = model.query_encoder(ni["query_tokens"], ni["query_mask"])
        ref_q = _reference_questions(dpr, questions)
        torch.testing.assert_close(q, ref_q, rtol=1e-4, atol=1e-5)
        _, extra = model(**ni)
        ref_scores = torch.gather(ref_q @ ref_p.T, 1, extra["doc_rows"])
        torch.testing.assert_close(extra["doc_scores"], ref_scores, rtol=1e-4, atol=1e-5)
        # the generator is the fairseq BART: same encoder outputs, same decoder log-probabilities
        src, lengths = model.generator_inputs(ni["src_tokens"], extra["doc_rows"])
        ours = model.generator.encoder(src, src_lengths=lengths)["encoder_out"][0]
        ref = bart.encoder(src, src_lengths=lengths)["encoder_out"][0]
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
        assert float(ref.std()) > 0.1
        prev = ni["prev_output_tokens"].repeat_interleave(3, dim=0)
        ours_lp = torch.log_softmax(model.generator(src, lengths, prev)[0], -1)
        ref_lp = torch.log_softmax(bart(src, lengths, prev)[0][..., : len(task.dictionary)], -1)
        torch.testing.assert_close(ours_lp, ref_lp, rtol=1e-4, atol=1e-4)
