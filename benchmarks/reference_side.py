"""transformers' RAG (RagTokenForGeneration / RagSequenceForGeneration) on the same tiny world.

Same passages and the same document vectors as the plugin's knowledge source (so both sides
retrieve from the same index, at the same cost), the same byte-level BPE (transformers'
BartTokenizer reads the world's vocab.json/merges.txt: token ids are identical) and the same
WordPiece vocabulary for the DPR question encoder. Passages live where transformers' own recipe
puts them (``datasets`` saved to disk, faiss index file, ``CustomHFIndex``).
"""
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# torchaudio may be installed in a build that does not load against this torch; transformers
# imports it whenever present, and nothing here needs audio.
sys.modules.setdefault("torchaudio", None)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from world import SPEC, load_corpus  # noqa: E402


def unavailable_reason():
    """None when transformers' RAG can run here, else why not (the benchmark then skips it)."""
    for module in ("transformers", "datasets", "faiss"):
        try:
            __import__(module)
        except Exception as err:  # noqa: BLE001 (any import failure means: skip the reference)
            return f"{module} is not importable ({type(err).__name__}: {err})"
    try:
        from transformers import RagSequenceForGeneration, RagTokenForGeneration  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return f"transformers has no RAG ({err})"
    return None


def _build_index_files(world: Path) -> Path:
    """datasets + faiss files for transformers' CustomHFIndex, from the plugin's passages and vectors."""
    import faiss
    from datasets import Dataset

    out = world / "hf_index"
    if (out / "DONE").is_file():
        return out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir()
    corpus = load_corpus(world)
    vectors = np.load(world / "ks" / "vectors.npy")
    ds = Dataset.from_dict({"title": corpus["titles"], "text": corpus["texts"], "embeddings": list(vectors)})
    ds.save_to_disk(str(out / "passages"))
    ds.add_faiss_index("embeddings", custom_index=faiss.IndexFlatIP(vectors.shape[1]))
    ds.get_index("embeddings").save(str(out / "index.faiss"))
    (out / "DONE").write_text("ok\n")
    return out


class ReferenceSide:
    name = "transformers"

    def __init__(self, world: Path, max_combined_lengths=(96, 300), adam: str = "fused"):
        """``adam``: "fused" (torch's fused AdamW: transformers' Trainer default, ``adamw_torch_fused``,
        with torch >= 2.8) or "single" (``torch.optim.Adam``'s per-tensor loop)."""
        from transformers import (
            BartConfig,
            BartTokenizerFast,
            DPRConfig,
            DPRQuestionEncoderTokenizerFast,
            RagConfig,
            RagRetriever,
        )
        from transformers.models.rag.retrieval_rag import CustomHFIndex

        self.world = world
        self.adam = adam
        files = _build_index_files(world)
        self.gen_tok = BartTokenizerFast.from_pretrained(str(world / "generator"))
        self.q_tok = DPRQuestionEncoderTokenizerFast.from_pretrained(str(world / "question_encoder"))
        assert len(self.gen_tok) == SPEC["bpe_vocab"], len(self.gen_tok)
        q, g = SPEC["question_encoder"], SPEC["generator"]
        qcfg = DPRConfig(vocab_size=len(self.q_tok), pad_token_id=self.q_tok.pad_token_id, hidden_size=q["hidden"],
                         num_hidden_layers=q["layers"], num_attention_heads=q["heads"], intermediate_size=q["ffn"],
                         max_position_embeddings=512, projection_dim=0)
        tok = self.gen_tok
        gcfg = BartConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                          eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.eos_token_id,
                          forced_eos_token_id=tok.eos_token_id, d_model=g["d_model"], encoder_layers=g["layers"],
                          decoder_layers=g["layers"], encoder_attention_heads=g["heads"],
                          decoder_attention_heads=g["heads"], encoder_ffn_dim=g["ffn"], decoder_ffn_dim=g["ffn"],
                          max_position_embeddings=g["positions"], dropout=g["dropout"])
        self.configs = {}
        self.retrievers = {}
        index = None
        for mcl in max_combined_lengths:
            cfg = RagConfig.from_question_encoder_generator_configs(
                qcfg, gcfg, n_docs=SPEC["n_docs"], max_combined_length=mcl,
                retrieval_vector_size=SPEC["retrieval_dim"], retrieval_batch_size=SPEC["batch_size"],
                index_name="custom", passages_path=str(files / "passages"), index_path=str(files / "index.faiss"),
                vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id, decoder_start_token_id=tok.eos_token_id, label_smoothing=0.0,
                reduce_loss=False, exclude_bos_score=False)  # training calls pass reduce_loss=True
            if index is None:  # one index, shared by the retrievers of both padding settings
                index = CustomHFIndex.load_from_disk(cfg.retrieval_vector_size, cfg.passages_path, cfg.index_path)
            self.configs[mcl] = cfg
            self.retrievers[mcl] = RagRetriever(cfg, question_encoder_tokenizer=self.q_tok,
                                                generator_tokenizer=self.gen_tok, index=index)
        corpus = load_corpus(world)
        qa = corpus["qa"]
        bs = SPEC["batch_size"]
        self.batches = {}
        for t in SPEC["target_tokens"]:
            out = []
            for s in range(0, len(qa), bs):
                chunk = qa[s:s + bs]
                qenc = self.q_tok([e["question"] for e in chunk], padding="longest", return_tensors="pt")
                labels = self.gen_tok([e[f"answer_t{t}"] for e in chunk], padding="longest", return_tensors="pt")
                out.append({"input_ids": qenc["input_ids"], "attention_mask": qenc["attention_mask"],
                            "labels": labels["input_ids"]})
            self.batches[t] = out

    def model(self, kind: str, mcl: int, seed: int = 0):
        from transformers import RagSequenceForGeneration, RagTokenForGeneration

        torch.manual_seed(seed)
        cls = RagTokenForGeneration if kind == "token" else RagSequenceForGeneration
        return cls(config=self.configs[mcl], retriever=self.retrievers[mcl])

    def optimizer(self, params) -> torch.optim.Optimizer:
        """Adam at lr 1e-5 (no weight decay: AdamW and Adam are the same update)."""
        params = [p for p in params if p.requires_grad]
        if self.adam == "fused":
            return torch.optim.AdamW(params, lr=1e-5, weight_decay=0.0, fused=True)
        return torch.optim.Adam(params, lr=1e-5)

    @staticmethod
    def n_params(model) -> dict:
        return {"total": sum(p.numel() for p in model.parameters()),
                "question_encoder": sum(p.numel() for p in model.question_encoder.parameters()),
                "generator": sum(p.numel() for p in model.generator.parameters())}

    def trainer(self, kind: str, t: int, mcl: int, seed: int = 0):
        model = self.model(kind, mcl, seed).train()
        opt = self.optimizer(model.parameters())
        batches = self.batches[t]

        def step(i: int) -> float:
            b = batches[i % len(batches)]
            out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], labels=b["labels"],
                        n_docs=SPEC["n_docs"], reduce_loss=True, use_cache=False)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(out.loss.detach())

        step.model = model
        return step

    def generator_fn(self, model, mode: str, device: str = "cpu"):
        """mode: token_greedy | token_beam4 | seq_thorough (transformers' only RAG-Sequence decoding); the model and
        the batches are moved to ``device``."""
        model.eval().to(device)
        beams = 1 if mode == "token_greedy" else 4
        n = SPEC["new_tokens"]
        batches = [{k: v.to(device) for k, v in b.items()} for b in self.batches[8]]

        def run(i: int):
            b = batches[i % len(batches)]
            with torch.no_grad():
                # n decoder steps after decoder_start (max_length counts it); </s> forced at the last
                return model.generate(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                                      n_docs=SPEC["n_docs"], max_length=n + 1, min_length=n, num_beams=beams)

        return run
