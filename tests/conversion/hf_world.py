"""Small random Hugging Face RAG models of the published layouts, built offline for the
conversion tests: a DPR question encoder, a BART generator with a byte-level BPE trained here,
a custom knowledge dataset (title, text, embeddings + FAISS index) and a test-defined index
behind transformers' own RagRetriever (its input formatting, question decoding and scoring are
the reference's code; only the nearest-neighbour search is ours, an exact inner product)."""
from __future__ import annotations

import csv
import json
import string
import sys
from pathlib import Path

import numpy as np

DIM = 32
N_DOCS = 3
MAX_COMBINED = 40

TITLES = ['"Kalomi"', "Rira", "Tonesu", "", "Vide  Pogari", "Mirato (river)", '"Quoted" again', "Sune",
          "Garipo", "Delo", "Numbers 1990", "Kalomi history", "Ri", "Pota", "Lomira", "Vista"]
TEXTS = [
    "Kalomi is a country. The capital of Kalomi is Rira.",
    "Rira is a city of 120,000 people on the river Mirato.",
    "Tonesu wrote the poem \"Sune\" in 1871; it was printed twice.",
    "A passage without a title: the king of Garipo is Delo.",
    "Vide  Pogari has two spaces   in its name and text.",
    "The Mirato flows 540 km through Kalomi and Garipo to the sea.",
    "A title that starts and ends with quotes keeps its inner words.",
    "Sune is a poem about the sea, the sky and the river Mirato, "
    "told by an old sailor who lived in Rira for forty years and never left.",
    "Garipo is a country north of Kalomi. Its capital is Pota.",
    "Delo was king of Garipo from 1902 to 1950.",
    "In 1990 the population of Kalomi was 3,400,000.",
    "The history of Kalomi begins with the founding of Rira.",
    "Ri is a short name.",
    "Pota lies on a lake; it is the capital of Garipo.",
    "Lomira is a mountain (2,310 m) in the south of Kalomi.",
    "Vista is an island; nobody lives there?",
]
QUESTIONS = ["What is the capital of Kalomi?", "Who wrote Sune?", "How long is the Mirato river?",
             "who was king of garipo", "Where is Lomira?", "What is Vista, an island or a city?"]
ANSWERS = ["Rira", "Tonesu", "540 km", "Delo", "in the south of Kalomi", "an island"]

WORDS = ("what is the capital of who wrote how long river was king where an island or a city kalomi rira "
         "tonesu mirato garipo delo lomira vista sune").split()


def datasets_installed() -> bool:
    """Whether Hugging Face's `datasets` is installed. Without it, tests/datasets (a namespace folder while
    pytest has tests/ on sys.path) would import under its name."""
    import importlib.util

    spec = importlib.util.find_spec("datasets")
    return spec is not None and spec.origin is not None


def transformers():
    sys.modules.setdefault("torchaudio", None)  # the installed torchaudio does not load against this torch
    if not datasets_installed():  # else transformers takes tests/datasets for it and its RagRetriever fails to import
        sys.modules["datasets"] = None
    import pytest

    return pytest.importorskip("transformers")


def write_wordpiece_vocab(path: Path) -> Path:
    chars = string.ascii_lowercase + string.digits + string.punctuation
    tokens = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + list(chars)
              + ["##" + c for c in string.ascii_lowercase + string.digits])
    path.write_text("\n".join(dict.fromkeys(tokens)) + "\n", encoding="utf-8")
    return path


def train_bpe(out: Path):
    """A byte-level BPE (GPT-2's algorithm) trained on the test texts: vocab (with BART's
    specials <s>=0, <pad>=1, </s>=2, <unk>=3 and <mask> last) and merges."""
    from tokenizers import ByteLevelBPETokenizer

    corpus = TITLES + TEXTS + QUESTIONS + ANSWERS + [q.lower() for q in QUESTIONS]
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(corpus * 5, vocab_size=420, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>"], show_progress=False)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_model(str(out))
    vocab = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    vocab["<mask>"] = len(vocab)
    merges = [tuple(line.split(" ")) for line in (out / "merges.txt").read_text(encoding="utf-8").splitlines()
              if line and not line.startswith("#version")]
    return vocab, merges


def embeddings(n: int, dim: int = DIM, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def make_retriever(T, config, q_tok, g_tok, vectors: np.ndarray, titles, texts):
    """transformers' RagRetriever (its own __call__/postprocess_docs) over a test-defined exact
    inner-product index (RagRetriever.__init__ would insist on the `datasets` package)."""
    from transformers.models.rag.retrieval_rag import Index, RagRetriever

    class ExactIndex(Index):
        def get_doc_dicts(self, doc_ids):
            return [{"title": [titles[i] for i in row], "text": [texts[i] for i in row]} for row in doc_ids]

        def get_top_docs(self, q, n_docs=5):
            ids = np.argsort(-(np.asarray(q, dtype=np.float32) @ vectors.T), axis=1, kind="stable")[:, :n_docs]
            return ids, vectors[ids]

        def is_initialized(self):
            return True

        def init_index(self):
            pass

    r = object.__new__(RagRetriever)
    r._init_retrieval = False
    r.index = ExactIndex()
    r.generator_tokenizer = g_tok
    r.question_encoder_tokenizer = q_tok
    r.n_docs = config.n_docs
    r.batch_size = config.retrieval_batch_size
    r.config = config
    r.ctx_encoder_tokenizer = None
    r.return_tokenized_docs = False
    return r


def build(root: Path, seed: int = 0) -> dict:
    """Both RAG variants saved as save_pretrained folders, the knowledge dataset in the forms the
    importer reads, and the live reference objects."""
    import torch

    T = transformers()
    root.mkdir(parents=True, exist_ok=True)
    vocab, merges = train_bpe(root / "bpe")
    g_tok = T.BartTokenizer(vocab=vocab, merges=merges)
    q_tok = T.DPRQuestionEncoderTokenizer(vocab=str(write_wordpiece_vocab(root / "vocab.txt")))
    qcfg = T.DPRConfig(vocab_size=len(q_tok), hidden_size=DIM, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=128)
    gcfg = T.BartConfig(vocab_size=len(g_tok), d_model=DIM, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                        decoder_ffn_dim=64, max_position_embeddings=128, dropout=0.0, attention_dropout=0.0)
    vectors = embeddings(len(TITLES))
    out = {"T": T, "root": root, "g_tok": g_tok, "q_tok": q_tok, "vectors": vectors}
    for i, (name, cls) in enumerate((("token", T.RagTokenForGeneration), ("sequence", T.RagSequenceForGeneration))):
        config = T.RagConfig.from_question_encoder_generator_configs(
            qcfg, gcfg, n_docs=N_DOCS, max_combined_length=MAX_COMBINED, retrieval_vector_size=DIM)
        torch.manual_seed(seed + i)
        model = cls(config).eval()
        folder = root / f"rag-{name}"
        model.save_pretrained(folder)
        T.RagTokenizer(question_encoder=q_tok, generator=g_tok).save_pretrained(str(folder))
        model.set_retriever(make_retriever(T, config, q_tok, g_tok, vectors, TITLES, TEXTS))
        out[name] = {"model": model, "dir": folder}
    out["dataset"] = write_knowledge_dataset(root / "knowledge", vectors)
    return out


def write_knowledge_dataset(folder: Path, vectors: np.ndarray) -> dict:
    """The custom knowledge dataset as `datasets` saves it (save_to_disk + the FAISS index), with
    `datasets` when installed, else the same on-disk layout written with pyarrow; plus the
    parquet and TSV + .npy + ids forms."""
    import faiss

    folder.mkdir(parents=True, exist_ok=True)
    forms = {}
    columns = {"title": TITLES, "text": TEXTS, "embeddings": [v.tolist() for v in vectors]}
    try:
        if not datasets_installed():
            raise ImportError("datasets")
        import datasets

        ds = datasets.Dataset.from_dict(columns)
        ds.save_to_disk(str(folder / "hf_dataset"))
        ds.add_faiss_index(column="embeddings", metric_type=faiss.METRIC_INNER_PRODUCT)
        ds.get_index("embeddings").save(str(folder / "hf_dataset_index.faiss"))
        forms["save_to_disk"] = folder / "hf_dataset"
        forms["written_by"] = "datasets"
    except ImportError:
        try:
            import pyarrow as pa
        except ImportError:
            pa = None
        if pa is not None:
            table = pa.table({"title": TITLES, "text": TEXTS,
                              "embeddings": pa.array(columns["embeddings"], type=pa.list_(pa.float32()))})
            (folder / "hf_dataset").mkdir()
            with pa.OSFile(str(folder / "hf_dataset" / "data-00000-of-00001.arrow"), "wb") as sink:
                with pa.ipc.new_stream(sink, table.schema) as writer:
                    writer.write_table(table, max_chunksize=5)
            (folder / "hf_dataset" / "state.json").write_text(json.dumps(
                {"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
            forms["save_to_disk"] = folder / "hf_dataset"
            forms["written_by"] = "pyarrow"
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        faiss.write_index(index, str(folder / "hf_dataset_index.faiss"))
    forms["faiss_index"] = folder / "hf_dataset_index.faiss"
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        ids = [str(i) for i in range(len(TITLES))]
        table = pa.table({"id": ids, "text": TEXTS, "title": TITLES,
                          "embeddings": pa.array(columns["embeddings"], type=pa.list_(pa.float32(), DIM))})
        (folder / "parquet").mkdir()
        pq.write_table(table.slice(0, 7), str(folder / "parquet" / "train-00000-of-00002.parquet"))
        pq.write_table(table.slice(7), str(folder / "parquet" / "train-00001-of-00002.parquet"))
        forms["parquet"] = folder / "parquet"
    except ImportError:
        pass
    # DPR's psgs_w100.tsv layout (id, text, title; CSV "" quoting, as DPR reads it with csv.reader) + a .npy
    # of vectors + their ids; every text quoted, as in DPR's file
    with open(folder / "psgs.tsv", "w", encoding="utf-8", newline="") as fh:
        out = csv.writer(fh, delimiter="\t", lineterminator="\n")
        out.writerow(["id", "text", "title"])
        for i, (t, x) in enumerate(zip(TITLES, TEXTS, strict=True)):
            fh.write(f'{i}\t"{x.replace(chr(34), chr(34) * 2)}"\t')
            out.writerow([t])
    np.save(folder / "psgs.npy", vectors)
    (folder / "psgs.ids").write_text("".join(f"{i}\n" for i in range(len(TITLES))), encoding="utf-8")
    forms["tsv"] = (folder / "psgs.tsv", folder / "psgs.npy", folder / "psgs.ids")
    return forms
