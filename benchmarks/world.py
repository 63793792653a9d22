"""The fixed tiny benchmark configuration (see ../../shared/bench/README.md), built offline.

One directory (``<cache>/tiny-<version>``) holds everything both implementations read:

* ``corpus.json``       10,000 synthetic passages and 64 QA pairs (seed 0): a 2,000-word random
                        vocabulary (a-z, 3-9 letters), titles of 2 uniform words, texts of 55-65
                        Zipf(1.0) words; question = 12 contiguous words of a gold passage, answers =
                        a span of that passage cut to at most 8 (or 32) generator tokens incl. <s>, </s>.
* ``generator/``        byte-level BPE (vocab 8000) trained on the corpus: ``vocab.json`` +
                        ``merges.txt`` (transformers' BartTokenizer files, and the GPT-2 BPE
                        files the plugin reads) and ``dict.txt`` (the plugin's fairseq dictionary,
                        listing BPE ids 4..7999 so that fairseq ids equal the BPE ids).
* ``question_encoder/`` WordPiece ``vocab.txt`` (8000 asked; fewer exist) for both question encoders.
* ``ks/``               the plugin's knowledge source: passage store with pre-tokenized passages,
                        document vectors from a seeded random DPR-shaped context encoder (BERT,
                        4 layers, hidden 256, 4 heads, FFN 1024, CLS pooling, unnormalised,
                        ``[CLS] title [SEP] text [SEP]``), exact inner-product index.
                        transformers' side indexes the same vectors (same documents, same cost).
* ``qa_t8/``, ``qa_t32/`` the 64 QA pairs as the plugin's KILT-style ``train.jsonl``.

``DONE`` is written last: a directory without it is an interrupted build and is rebuilt.
"""
import hashlib
import json
import shutil
import time
from pathlib import Path

import numpy as np

SPEC = dict(
    seed=0,
    word_vocab_size=2000,
    word_len_range=(3, 9),
    zipf_exponent=1.0,
    n_passages=10_000,
    passage_words_range=(55, 65),
    title_words=2,
    question_words=12,
    n_qa=64,
    target_tokens=(8, 32),
    bpe_vocab=8000,
    wordpiece_vocab=8000,
    retrieval_dim=256,
    n_docs=5,
    batch_size=8,
    threads=2,
    question_encoder=dict(hidden=256, layers=4, heads=4, ffn=1024),
    generator=dict(d_model=256, layers=3, heads=4, ffn=1024, positions=1024, dropout=0.1),
    new_tokens=16,
)
VERSION = "v1"
GENERATOR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0..4, fairseq's order


def spec_key() -> str:
    text = json.dumps({"spec": SPEC, "version": VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def world_dir(cache: str) -> Path:
    return Path(cache) / f"tiny-{VERSION}-{spec_key()}"


def encoder_spec(vocab_txt: Path) -> str:
    """The plugin's encoder spec for the DPR-shaped random bi-encoder (separate towers: the
    passage tower, seed 2, embeds the documents; the query tower, seed 1, starts the query encoder)."""
    q = SPEC["question_encoder"]
    return (f"random:dim={q['hidden']},layers={q['layers']},heads={q['heads']},intermediate={q['ffn']},"
            f"seed=1,shared=0,pooling=cls,normalize=0,passages=pair,vocab={vocab_txt}")


# ----------------------------------------------------------------------------- corpus
def _random_words(rng) -> list:
    lo, hi = SPEC["word_len_range"]
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words, seen = [], set()
    while len(words) < SPEC["word_vocab_size"]:
        w = "".join(rng.choice(alphabet, size=int(rng.integers(lo, hi + 1))))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def make_corpus() -> dict:
    rng = np.random.default_rng(SPEC["seed"])
    words = _random_words(rng)
    n = len(words)
    zipf = 1.0 / np.arange(1, n + 1) ** SPEC["zipf_exponent"]
    zipf /= zipf.sum()
    lo, hi = SPEC["passage_words_range"]
    titles, texts = [], []
    for _ in range(SPEC["n_passages"]):
        titles.append(" ".join(words[i] for i in rng.integers(0, n, SPEC["title_words"])))
        length = int(rng.integers(lo, hi + 1))
        texts.append(" ".join(words[i] for i in rng.choice(n, size=length, p=zipf)))
    qa = []
    for i in range(SPEC["n_qa"]):
        gold = int(rng.integers(0, SPEC["n_passages"]))
        tw = texts[gold].split()
        start = int(rng.integers(0, len(tw) - SPEC["question_words"] + 1))
        span = int(rng.integers(0, len(tw) - 40))
        qa.append({"id": f"q{i}", "gold": gold, "question": " ".join(tw[start:start + SPEC["question_words"]]),
                   "answer_words": tw[span:span + 40]})
    return {"words": words, "titles": titles, "texts": texts, "qa": qa}


def _cut_answers(qa: list, n_tokens) -> None:
    """answer_t{T}: the longest prefix (>= 1 word) of the span with <s> + tokens + </s> <= T."""
    for ex in qa:
        words = ex.pop("answer_words")
        for t in SPEC["target_tokens"]:
            k = 1
            while k < len(words) and n_tokens(" ".join(words[:k + 1])) + 2 <= t:
                k += 1
            ex[f"answer_t{t}"] = " ".join(words[:k])


# ----------------------------------------------------------------------------- tokenizers
def _train_tokenizers(corpus: dict, out: Path) -> None:
    from tokenizers import BertWordPieceTokenizer, ByteLevelBPETokenizer

    text = [f"{t} {x}" for t, x in zip(corpus["titles"], corpus["texts"])]
    gdir, qdir = out / "generator", out / "question_encoder"
    gdir.mkdir(parents=True)
    qdir.mkdir(parents=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(text, vocab_size=SPEC["bpe_vocab"], min_frequency=2, show_progress=False,
                            special_tokens=GENERATOR_SPECIALS)
    bpe.save_model(str(gdir))
    vocab = json.loads((gdir / "vocab.json").read_text())
    size = len(vocab)
    assert [vocab[s] for s in GENERATOR_SPECIALS] == list(range(len(GENERATOR_SPECIALS))), "special ids"
    assert sorted(vocab.values()) == list(range(size)), "BPE ids are not contiguous"
    # fairseq's Dictionary puts <s> <pad> </s> <unk> at 0..3; listing ids 4.. in order keeps ids equal
    (gdir / "dict.txt").write_text("".join(f"{i} 1\n" for i in range(4, size)))
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(text, vocab_size=SPEC["wordpiece_vocab"], min_frequency=2, show_progress=False,
                           special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    wp.save_model(str(qdir))


def generator_token_counter(gdir: Path):
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer(str(gdir / "vocab.json"), str(gdir / "merges.txt"))
    return lambda s: len(tok.encode(s).ids)


# ----------------------------------------------------------------------------- build
def build(cache: str, log=print) -> Path:
    """Build the world (or return it when it is already complete: ``DONE`` is written last)."""
    from rag_plugin.indexing import BuildOptions, BuildSettings, build_knowledge_source
    from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles

    out = world_dir(cache)
    if (out / "DONE").is_file():
        return out
    if out.exists():  # an interrupted build: start again
        shutil.rmtree(out)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    corpus = make_corpus()
    _train_tokenizers(corpus, out)
    _cut_answers(corpus["qa"], generator_token_counter(out / "generator"))
    (out / "corpus.json").write_text(json.dumps(corpus))
    log(f"corpus and tokenizers: {time.perf_counter() - t0:.0f}s")
    with open(out / "passages.jsonl", "w") as fh:
        for i, (t, x) in enumerate(zip(corpus["titles"], corpus["texts"])):
            fh.write(json.dumps({"id": str(i), "title": t, "text": x}) + "\n")
    for t in SPEC["target_tokens"]:
        d = out / f"qa_t{t}"
        d.mkdir()
        rows = [{"id": ex["id"], "input": ex["question"], "output": [{"answer": ex[f"answer_t{t}"]}]}
                for ex in corpus["qa"]]
        (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    gdir = out / "generator"
    settings = BuildSettings(passages=str(out / "passages.jsonl"),
                             encoder=encoder_spec((out / "question_encoder" / "vocab.txt").resolve()),
                             index_factory="Flat", tokenizer=GeneratorTokenizerFiles(
                                 dict=str(gdir / "dict.txt"), gpt2_encoder_json=str(gdir / "vocab.json"),
                                 gpt2_vocab_bpe=str(gdir / "merges.txt")))
    build_knowledge_source(str(out / "ks"), settings, BuildOptions(progress=True, log=log, batch_size=128))
    (out / "DONE").write_text(json.dumps({"spec": SPEC, "version": VERSION}) + "\n")
    log(f"world built in {time.perf_counter() - t0:.0f}s -> {out}")
    return out


def load_corpus(world: Path) -> dict:
    return json.loads((world / "corpus.json").read_text())
