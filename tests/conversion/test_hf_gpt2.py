"""rag-convert-hf --gpt2 (rag_plugin/conversion/hf_gpt2.py): a tiny random GPT-2 converted into a fairseq
``transformer_lm``, checked against transformers' own model, offline.

The GPT-2 is built with transformers (``GPT2LMHeadModel(GPT2Config(...))``, seeded) and saved with
``save_pretrained`` (safetensors), beside a consistent byte-level BPE trained here with ``tokenizers``
(GPT-2's algorithm and file formats: 299 tokens, then ``<|endoftext|>`` last, as in GPT-2). The converted
checkpoint is loaded with fairseq's own ``load_model_ensemble_and_task`` under the plugin's allow-list
(``weights_only=True``), then:

* logits at every GPT-2 token equal transformers' (mapped ids, 1e-5, float32, eval mode), for each
  activation the converter maps, and the special rows equal ``<|endoftext|>``'s;
* greedy continuations are equal token for token: fairseq's SequenceGenerator (beam 1, incremental
  decoding, the prompt as its prefix) against transformers' ``generate(do_sample=False)``;
* text -> fairseq's ``--bpe gpt2`` over the written encoder.json/vocab.bpe -> dict.txt gives the ids of
  transformers' tokenizer, mapped;
* bad input is one line (the command line: exit 2, one ``error:`` line).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import assert_one_line_error
from tests.conversion import hf_world

T = hf_world.transformers()  # skips the module without transformers

REPO = Path(__file__).resolve().parents[2]
VOCAB = 300  # 299 BPE tokens, then <|endoftext|>
EOS = VOCAB - 1
TEXT = ["the river flows to the sea", "Kalomi is a country; its capital is Rira.", "who wrote the poem Sune?"]


def write_bpe(folder: Path) -> None:
    """vocab.json + merges.txt: a byte-level BPE trained on the test texts, <|endoftext|> the last id."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(TEXT * 5 + hf_world.TEXTS, vocab_size=EOS, min_frequency=2, show_progress=False)
    tok.save_model(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert len(vocab) == EOS, len(vocab)
    vocab["<|endoftext|>"] = EOS
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")


def make_gpt2(folder: Path, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    options = dict(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=EOS,
                   eos_token_id=EOS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    options.update(overrides)
    model = T.GPT2LMHeadModel(T.GPT2Config(**options)).eval()
    with torch.no_grad():  # random LayerNorm parameters, so that every weight is checked
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith("transformer.ln_f"):
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
    model.save_pretrained(str(folder), safe_serialization=True)
    write_bpe(folder)
    return model


def convert(src, out, **kw):
    from rag_plugin.conversion.hf_gpt2 import convert_hf_gpt2

    return convert_hf_gpt2(str(src), str(out), log=lambda m: None, **kw)


def load(out: Path):
    from fairseq import checkpoint_utils

    from rag_plugin.util.safe_load import checkpoint_types_allowed

    with checkpoint_types_allowed():
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(out / "checkpoint.pt")])
    return models[0].eval(), task


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf_gpt2")
    model = make_gpt2(root / "gpt2")
    convert(root / "gpt2", root / "out")
    return model, root


def to_fairseq(ids):
    from rag_plugin.conversion.hf_gpt2 import gpt2_to_fairseq

    return torch.tensor([[gpt2_to_fairseq(int(g), EOS) for g in row] for row in ids])


def assert_logits_equal(hf_model, fs_model, ids):
    with torch.no_grad():
        want = hf_model(ids).logits
        got = fs_model(to_fairseq(ids))[0]
    assert got.shape == (*ids.shape, VOCAB + 3)
    columns = to_fairseq([list(range(VOCAB))])[0]
    torch.testing.assert_close(got[..., columns], want, rtol=0, atol=1e-5)
    for special in (0, 1, 3):  # the rows that are no GPT-2 token hold <|endoftext|>'s
        torch.testing.assert_close(got[..., special], got[..., 2], rtol=0, atol=0)


def test_logits_equal_transformers(gpt2):
    hf_model, root = gpt2
    fs_model, task = load(root / "out")
    assert type(fs_model).__name__ == "TransformerLanguageModel" and len(task.dictionary) == VOCAB + 3
    assert task.dictionary.eos() == 2 and task.dictionary.index("5") == 9
    ids = torch.randint(0, VOCAB, (3, 64), generator=torch.Generator().manual_seed(1))
    ids[:, 0] = EOS
    assert_logits_equal(hf_model, fs_model, ids)


@pytest.mark.parametrize("activation", ["gelu", "relu", "gelu_pytorch_tanh"])
def test_logits_equal_for_each_activation(tmp_path, activation):
    hf_model = make_gpt2(tmp_path / "gpt2", seed=2, activation_function=activation, n_inner=48)
    convert(tmp_path / "gpt2", tmp_path / "out")
    fs_model, _ = load(tmp_path / "out")
    ids = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(3))
    assert_logits_equal(hf_model, fs_model, ids)


def test_greedy_continuations_equal(gpt2):
    from fairseq.sequence_generator import SequenceGenerator

    from rag_plugin.conversion.hf_gpt2 import fairseq_to_gpt2

    hf_model, root = gpt2
    fs_model, task = load(root / "out")
    steps = 12
    for seed in range(3):
        prompt = torch.randint(0, EOS, (1, 5), generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            hf_ids = hf_model.generate(torch.cat([torch.tensor([[EOS]]), prompt], 1), do_sample=False,
                                       max_new_tokens=steps, min_new_tokens=steps, pad_token_id=EOS)
        want = hf_ids[0, 1 + 5:].tolist()
        assert EOS not in want  # so fairseq may not end earlier
        generator = SequenceGenerator([fs_model], task.target_dictionary, beam_size=1, max_len_a=0,
                                      max_len_b=5 + steps, min_len=5 + steps)
        prefix = to_fairseq(prompt)
        sample = {"net_input": {"src_tokens": prefix, "src_lengths": torch.tensor([5])}}
        with torch.no_grad():
            hypo = generator.generate([fs_model], sample, prefix_tokens=prefix)[0][0]["tokens"]
        assert hypo[:5].tolist() == prefix[0].tolist()
        got = [fairseq_to_gpt2(int(f), EOS) for f in hypo[5:5 + steps]]
        assert got == want, seed


def test_vocabulary_files_and_bpe(gpt2):
    from fairseq.data.encoders.gpt2_bpe import GPT2BPE, GPT2BPEConfig

    _, root = gpt2
    src, out = root / "gpt2", root / "out"
    assert (out / "encoder.json").read_bytes() == (src / "vocab.json").read_bytes()
    assert (out / "vocab.bpe").read_bytes() == (src / "merges.txt").read_bytes()
    record = json.loads((out / "conversion.json").read_text())
    assert record["ids"]["gpt2_eos"] == EOS and record["source"] == str(src.resolve())
    _, task = load(out)
    bpe = GPT2BPE(GPT2BPEConfig(gpt2_encoder_json=str(out / "encoder.json"), gpt2_vocab_bpe=str(out / "vocab.bpe")))
    hf_tok = T.GPT2Tokenizer.from_pretrained(str(src))  # reads vocab.json and merges.txt
    for text in TEXT:
        fs_ids = task.dictionary.encode_line(bpe.encode(text), add_if_not_exist=False, append_eos=False)
        assert fs_ids.tolist() == to_fairseq([hf_tok.encode(text)])[0].tolist()
        assert 3 not in fs_ids.tolist()  # no <unk>


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "rag_plugin.cli.convert_hf", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=str(REPO))


def test_command_line(gpt2, tmp_path):
    _, root = gpt2
    proc = _cli("--gpt2", root / "gpt2", "--out", tmp_path / "cli")
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    assert proc.stderr.splitlines() == [f"wrote {tmp_path / 'cli'}: transformer_lm, 2 layers d=32, GPT-2 "
                                        f"vocabulary {VOCAB} (fairseq {VOCAB + 3}), 64 positions"]
    assert (tmp_path / "cli" / "dict.txt").read_bytes() == (root / "out" / "dict.txt").read_bytes()
    assert_one_line_error(_cli("--gpt2", root / "gpt2", "--out", tmp_path / "cli"), "not empty", "--overwrite")
    assert _cli("--gpt2", root / "gpt2", "--out", tmp_path / "cli", "--overwrite").returncode == 0
    assert_one_line_error(_cli("--gpt2", root / "gpt2", "--hf-dir", root / "gpt2", "--out", tmp_path / "x"),
                          "not allowed with")
    assert_one_line_error(_cli("--gpt2", root / "gpt2", "--variant", "token", "--out", tmp_path / "x"), "--variant")
    assert not (tmp_path / "x").exists()


def _copy_folder(src: Path, dst: Path, config=None, drop=()) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in drop:
            (dst / f.name).write_bytes(f.read_bytes())
    if config:
        cfg = json.loads((src / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("change,needles", [
    (dict(config={"model_type": "gpt_neo"}), ["model_type 'gpt_neo'"]),
    (dict(config={"scale_attn_by_inverse_layer_idx": True}), ["scale_attn_by_inverse_layer_idx=True"]),
    (dict(config={"activation_function": "silu"}), ["activation_function='silu'"]),
    (dict(config={"layer_norm_epsilon": 1e-6}), ["layer_norm_epsilon"]),
    (dict(config={"bos_token_id": 0}), ["bos_token_id=0"]),
    (dict(config={"n_layer": 3}), ["n_layer=3"]),
    (dict(config={"n_embd": 64}), ["wpe.weight", "shape", "(64, 64)"]),
    (dict(config={"tie_word_embeddings": False}), ["tie_word_embeddings=False"]),
    (dict(drop=("merges.txt",)), ["merges.txt", "not found"]),
    (dict(drop=("config.json",)), ["config.json", "not found"]),
    (dict(drop=("model.safetensors",)), ["no model.safetensors"]),
])
def test_bad_input_is_one_line(gpt2, tmp_path, change, needles):
    _, root = gpt2
    src = _copy_folder(root / "gpt2", tmp_path / "bad", **change)
    proc = _cli("--gpt2", src, "--out", tmp_path / "out")
    assert_one_line_error(proc, *needles)
    assert not (tmp_path / "out").exists()


def test_pickle_only_folder_is_refused_unread(gpt2, tmp_path):
    from rag_plugin.util.errors import UserError

    hf_model, root = gpt2
    src = _copy_folder(root / "gpt2", tmp_path / "bin", drop=("model.safetensors",))
    (src / "pytorch_model.bin").write_bytes(b"not a pickle: it must not be read")
    with pytest.raises(UserError, match="pytorch_model.bin.*safetensors"):
        convert(src, tmp_path / "out")


def test_rag_reader_over_the_converted_gpt2_has_gpt2s_distribution(gpt2):
    """--generator-checkpoint of a conversion: the decoder-only RAG reader builds the LM from the checkpoint's own
    cfg, masks <s>, <pad>, <unk> (no GPT-2 token), and its log-probabilities over the whole fairseq vocabulary are
    GPT-2's (1e-5), for a context followed by an answer (the reader's packed rows and its incremental decoding)."""
    from fairseq.data import Dictionary

    from rag_plugin.conversion.hf_gpt2 import NOT_GPT2_IDS
    from rag_plugin.models.gpt2_ids import is_converted_gpt2
    from rag_plugin.models.lm_reader import LMReader
    from rag_plugin.models.rag_lm import RagLMConfig, RagLMModel

    hf_model, root = gpt2
    checkpoint = str(root / "out" / "checkpoint.pt")
    assert is_converted_gpt2(checkpoint) and not is_converted_gpt2(str(root / "gpt2" / "model.safetensors"))
    dictionary = Dictionary.load(str(root / "out" / "dict.txt"))
    lm, _ = RagLMModel.build_generator(RagLMConfig(generator_checkpoint=checkpoint, dropout=0.0,
                                                   max_source_positions=40, max_target_positions=20), dictionary)
    lm.eval()
    reader = LMReader(lm, dictionary.pad(), NOT_GPT2_IDS)
    g = torch.randint(0, VOCAB, (2, 14), generator=torch.Generator().manual_seed(3))
    ids = to_fairseq(g)
    contexts, prev = ids[:, :9], ids[:, 9:]
    lengths = torch.tensor([9, 6])
    contexts[1, 6:] = dictionary.pad()  # a shorter context, right-padded
    with torch.no_grad():
        got = torch.log_softmax(reader.teacher_forced(contexts, lengths, prev).float(), -1)
        state = {}
        reader.start(state, contexts, lengths)
        stepped = torch.log_softmax(reader.extend(state, prev, lengths, 0).float(), -1)
        columns = to_fairseq([list(range(VOCAB))])[0]
        for i, n in enumerate(lengths.tolist()):
            row = torch.cat([g[i, :n], g[i, 9:]]).unsqueeze(0)
            want = torch.log_softmax(hf_model(row).logits[0, n:].float(), -1)
            torch.testing.assert_close(got[i][:, columns], want, rtol=0, atol=1e-5)
            torch.testing.assert_close(stepped[i][:, columns], want, rtol=0, atol=1e-5)
    assert torch.isneginf(got[..., list(NOT_GPT2_IDS)]).all()
