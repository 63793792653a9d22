"""Task ``retrieval_augmented``: question/target data + a knowledge source, for RAG models.

Loads KILT-style JSONL splits from ``DATA/{split}.jsonl``, the knowledge source (passage
store, vectors, FAISS index, its document encoder and the generator tokenizer it was
pre-tokenized with), builds the retriever once per process, and hands it to the model.
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch
from fairseq.data import Dictionary
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from rag_plugin.data.kilt import read_kilt
from rag_plugin.data.qa_dataset import RetrievalQADataset
from rag_plugin.util.errors import REPLACE_UNK, UserError

logger = logging.getLogger(__name__)


@dataclass
class RetrievalAugmentedConfig(FairseqDataclass):
    data: str = field(default="", metadata={"help": "directory with train.jsonl, valid.jsonl (and test.jsonl), "
                                                    "KILT style: {id, input, output: [{answer, provenance}]}"})
    knowledge: str = field(default="", metadata={"help": "knowledge source directory (scripts/build_knowledge_source.py); "
                                                         "at generation time another one with the same document "
                                                         "encoder may be swapped in"})
    n_docs: int = field(default=5, metadata={"help": "documents retrieved per question (K); 0 = closed-book BART"})
    retriever: ChoiceEnum(["dense", "bm25"]) = field(
        default="dense", metadata={"help": "dense (trainable query encoder, MIPS) or bm25 (fixed; BM25 scores as "
                                           "logits of p(z|x), the paper's ablation)"})
    nprobe: Optional[int] = field(default=None, metadata={"help": "IVF lists visited per search"})
    ef_search: Optional[int] = field(default=None, metadata={"help": "HNSW search breadth"})
    max_query_tokens: int = field(default=64, metadata={"help": "question length for the query encoder"})
    rag_decoding: ChoiceEnum(["thorough", "fast"]) = field(
        default="thorough", metadata={"help": "RAG-Sequence decoding: thorough (every hypothesis scored under every "
                                              "document) or fast (p(y|x,z)=0 where y was not in z's beam)"})
    provenance_out: Optional[str] = field(
        default=None, metadata={"help": "generation: also write the retrieved documents of every sample as JSON lines"})
    doc_posterior_out: Optional[str] = field(
        default=None, metadata={"help": "generation, rag_token: write each answer's per-token document posterior "
                                        "as JSON lines (plot with scripts/plot_doc_posterior.py)"})
    train_all_answers: bool = field(default=False, metadata={"help": "one training example per gold answer alias "
                                                                      "(default: the first answer only)"})
    seed: int = II("common.seed")


@register_task("retrieval_augmented", dataclass=RetrievalAugmentedConfig)
class RetrievalAugmentedTask(FairseqTask):
    cfg: RetrievalAugmentedConfig

    def __init__(self, cfg: RetrievalAugmentedConfig, knowledge, dictionary, tokenizer, text_encoder):
        super().__init__(cfg)
        self.knowledge = knowledge
        self.dictionary = dictionary
        self.tokenizer = tokenizer          # generator tokenizer (the one passages were pre-tokenized with)
        self.text_encoder = text_encoder    # the knowledge source's bi-encoder (query tokenizer, initial q)
        self.input_format = knowledge.input_format  # the generator input format the passages were tokenized for
        self._retriever = None
        self._bm25 = None
        self._rows_by_id: Optional[Dict[str, List[int]]] = None
        self.max_target: Optional[int] = None  # set when a model is built (its decoder positions)
        self.records = {}

    # ------------------------------------------------------------------ setup
    @classmethod
    def setup_task(cls, cfg: RetrievalAugmentedConfig, **kwargs):
        from rag_plugin.retrieval.knowledge import KnowledgeSource

        if not cfg.knowledge:
            raise UserError("no knowledge source given", fix="pass --knowledge KS_DIR (it also holds the generator's "
                                                            "tokenizer, even for --n-docs 0)")
        if cfg.n_docs < 0:
            raise UserError(f"--n-docs must be >= 0, got {cfg.n_docs}",
                            fix="use --n-docs 0 (closed book) up to the number of passages")
        knowledge = KnowledgeSource(cfg.knowledge)
        if cfg.n_docs > len(knowledge):
            raise UserError(f"--n-docs {cfg.n_docs} is larger than the knowledge source ({len(knowledge)} passages)",
                            path=cfg.knowledge, fix=f"use --n-docs {len(knowledge)} or fewer")
        tokenizer = knowledge.load_generator_tokenizer()
        dictionary = Dictionary.load(str(Path(tokenizer.dict_path)))
        if len(dictionary) != len(tokenizer):
            raise UserError("generator dictionary and tokenizer disagree", path=tokenizer.dict_path)
        if cfg.nprobe is not None or cfg.ef_search is not None:
            knowledge.set_search_params(nprobe=cfg.nprobe, ef_search=cfg.ef_search)
        text_encoder = knowledge.load_encoder() if cfg.n_docs > 0 and cfg.retriever == "dense" else None
        logger.info("knowledge source %s: %d passages, encoder %s, dictionary %d symbols", cfg.knowledge,
                    len(knowledge), knowledge.encoder_identity.get("name"), len(dictionary))
        return cls(cfg, knowledge, dictionary, tokenizer, text_encoder)

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    @property
    def retriever(self):
        if self._retriever is None and self.cfg.n_docs > 0 and self.cfg.retriever == "dense":
            from rag_plugin.retrieval.retriever import DenseRetriever

            self._retriever = DenseRetriever(self.knowledge, encoder=self.text_encoder)
        return self._retriever

    def attach_retrieval(self, model) -> None:
        """Give a freshly built model this process's retriever, K and input format."""
        wanted = str(getattr(model.cfg, "input_format", "plugin"))
        if wanted != self.input_format.name:
            raise UserError(f"the model reads the {wanted} input format, the knowledge source's passages are "
                            f"pre-tokenized for the {self.input_format.name} format", path=self.cfg.knowledge,
                            fix=f"use a knowledge source built (or imported) with --input-format {wanted}, or a model "
                                f"with --input-format {self.input_format.name}")
        model.input_format = self.input_format
        model.n_docs = self.cfg.n_docs
        self.max_target = model.cfg.max_target_positions
        for split, dataset in self.datasets.items():
            self._set_max_target(dataset, split)
        if not model.cfg.doc_score_scale:
            model.doc_score_scale = 20.0 if self.knowledge.encoder_identity.get("normalize") else 1.0
        if self.cfg.n_docs > 0:
            model.retriever = self.retriever or _StoreOnly(self.knowledge)
        model.knowledge_identity = {"encoder": self.knowledge.encoder_identity,
                                    "knowledge": str(Path(self.cfg.knowledge).resolve()),
                                    "passage_store_sha256": self.knowledge.passages.sha256,
                                    "count": len(self.knowledge),
                                    "input_format": self.input_format.name,
                                    "tokenizer": self.knowledge.passages.tokenizer_identity or None}

    # ------------------------------------------------------------------ data
    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs):
        path = Path(self.cfg.data) / f"{split}.jsonl"
        if not self.cfg.data or not path.is_file():
            raise UserError(f"missing data split {split!r}", path=str(path),
                            fix=f"DATA must hold {split}.jsonl (KILT style)")
        records = read_kilt(str(path), require_answers=True, allow_empty_input=(split != "train"))
        if split == "train" or _computing_loss():
            _refuse_regex_targets(records, path)
        questions, targets = [], []  # one entry per training example (records repeat with train_all_answers)
        for r in records:
            answers = r.answers if (self.cfg.train_all_answers and split == "train") else r.answers[:1]
            for a in answers:
                questions.append(r)
                targets.append(a)
        self.records[split] = records
        self.datasets[split] = self.build_dataset([r.input for r in questions], targets,
                                                  record_ids=[r.id for r in questions],
                                                  gold_rows=self.gold_rows([r.provenance for r in questions]))
        logger.info("%s: %d examples from %s", split, len(self.datasets[split]), path)

    def gold_rows(self, provenance: List[List[str]]) -> Optional[np.ndarray]:
        """Store rows of the gold passages ([N, G], -1 padded), or None if the data names none.

        A provenance id matches a passage id, or every ``<id>_<n>`` passage split from it.
        """
        if not any(provenance):
            return None
        if self._rows_by_id is None:
            store = self.knowledge.passages
            by_id: Dict[str, List[int]] = {}
            for row in range(len(store)):
                pid = store.id(row)
                by_id.setdefault(pid, []).append(row)
                base = pid.rsplit("_", 1)
                if len(base) == 2 and base[1].isdigit():
                    by_id.setdefault(base[0], []).append(row)
            self._rows_by_id = by_id
        rows = [sorted({r for pid in prov for r in self._rows_by_id.get(pid, [])}) for prov in provenance]
        named = sum(1 for prov in provenance if prov)
        lost = sum(1 for prov, r in zip(provenance, rows) if prov and not r)
        if lost:
            example = next(prov[0] for prov, r in zip(provenance, rows) if prov and not r)
            logger.warning("%d of %d records name gold passages none of which is in the knowledge source (e.g. "
                           "%r): gold_doc_prob leaves them out", lost, named, example)
        if lost == named:
            return None  # no gold passage here at all: as if the data named none
        width = max(1, max(len(r) for r in rows))
        out = np.full((len(rows), width), -1, dtype=np.int64)
        for i, r in enumerate(rows):
            out[i, : len(r)] = r
        return out

    def build_dataset(self, questions, targets=None, record_ids=None, gold_rows=None) -> RetrievalQADataset:
        """Pre-tokenize questions (query encoder + generator) and targets once, in the input format
        of the knowledge source (:mod:`rag_plugin.core.input_format`)."""
        fmt = self.input_format
        q_enc = None
        if self.text_encoder is not None:
            q_enc = self.text_encoder.tokenize_queries(questions, max_length=self.cfg.max_query_tokens)
        decoded = [None] * len(questions)
        if fmt.name == "hf" and q_enc is not None:  # the question as the query encoder read it
            decoded = [self.text_encoder.tokenizer.decode(ids, skip_special_tokens=True) for ids in q_enc]
        q_gen = self.tokenizer.encode_batch([fmt.question_string(q, d) for q, d in zip(questions, decoded)])
        tgt = None
        if targets is not None:
            prefix = fmt.target_prefix(self.dictionary.bos())
            tgt = [prefix + t for t in self.tokenizer.encode_batch(targets)]
        fixed_rows = fixed_scores = None
        if self.cfg.n_docs > 0 and self.cfg.retriever == "bm25":
            found = self.bm25.search(questions, self.cfg.n_docs)
            fixed_rows, fixed_scores = found.rows, found.scores
        dataset = RetrievalQADataset(q_enc, q_gen, tgt, pad=self.dictionary.pad(), eos=self.dictionary.eos(),
                                     fixed_rows=fixed_rows, fixed_scores=fixed_scores, record_ids=record_ids,
                                     gold_rows=gold_rows)
        self._set_max_target(dataset, "")
        return dataset

    def _set_max_target(self, dataset, split: str) -> None:
        """The decoder's length, once a model is built: longer targets are cut to it (</s> kept), with a
        warning that counts them (fairseq-train loads the valid set before it builds the model)."""
        dataset.max_target = self.max_target
        if self.max_target is None or getattr(dataset, "targets", None) is None:
            return
        cut = sum(len(t) > self.max_target for t in dataset.targets)  # targets end in </s>
        if cut:
            logger.warning("%s%d of %d targets are longer than the decoder's %d positions (--max-target-positions): "
                           "cut to it", f"{split}: " if split else "", cut, len(dataset.targets), self.max_target)

    @property
    def bm25(self):
        if self._bm25 is None:
            from rag_plugin.retrieval.retriever import BM25Retriever

            self._bm25 = BM25Retriever(self.knowledge.passages)
        return self._bm25

    def get_batch_iterator(self, dataset, *args, **kwargs):
        # fairseq drops the last partial batch when required_batch_size_multiple > 1: never
        # (every valid/test example must be scored, and no training example silently skipped).
        if "required_batch_size_multiple" in kwargs:
            kwargs["required_batch_size_multiple"] = 1
        return super().get_batch_iterator(dataset, *args, **kwargs)

    def max_positions(self):
        return None

    # ------------------------------------------------------------------ generation
    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None,
                        prefix_allowed_tokens_fn=None):
        from rag_plugin.generation.rag_sequence import RagSequenceGenerator
        from rag_plugin.generation.rag_token import RagTokenGenerator
        from rag_plugin.generation.scorer import RagScorer

        if len(models) != 1:
            raise UserError("RAG decoding takes one checkpoint, not an ensemble", fix="pass a single --path")
        model = models[0]
        _refuse_unsupported_generation_options(args)
        score_reference = getattr(args, "score_reference", False)
        if self.cfg.doc_posterior_out and (score_reference or model.variant != "token"):
            if score_reference:
                what, fix = "--score-reference", "leave --doc-posterior-out out when scoring references"
            else:
                what, fix = "a RAG-Sequence checkpoint (rag_seq)", "leave --doc-posterior-out out, or use a rag_token checkpoint"
            raise UserError(f"--doc-posterior-out writes RAG-Token's per-token document posterior of generated "
                            f"answers; with {what} there is none to write", fix=fix)
        if score_reference:
            if prefix_allowed_tokens_fn is not None:
                raise UserError("prefix_allowed_tokens_fn constrains a search; --score-reference does not search",
                                fix="leave prefix_allowed_tokens_fn out when scoring references")
            return RagScorer(model)
        if model.variant == "token":
            if self.cfg.rag_decoding == "fast":
                logger.warning("--rag-decoding fast applies to RAG-Sequence; this rag_token checkpoint decodes with "
                               "RAG-Token's beam search")
            return RagTokenGenerator(self, model, args, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)
        return RagSequenceGenerator(self, model, args, self.cfg.rag_decoding, extra_gen_cls_kwargs,
                                    prefix_allowed_tokens_fn)

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        from rag_plugin.generation import provenance

        if "id" not in sample:  # fairseq-interactive keeps only src_tokens: rebuild the retrieval inputs
            sample = self._interactive_sample(sample)
        with torch.no_grad():
            hypos = generator.generate(models, sample, prefix_tokens=prefix_tokens, constraints=constraints)
        rows, doc_lp = generator.last_retrieval.get("rows"), generator.last_retrieval.get("doc_lp")
        ids = sample["id"].tolist()
        store = self.knowledge.passages
        quiet = provenance.cli_option("quiet", generate_only=True)  # fairseq-generate --quiet: no S/T/H/D/P lines
        lines = [] if quiet else provenance.z_lines(ids, rows, doc_lp, store)
        if lines:
            stream = provenance.output_stream()
            stream.write("\n".join(lines) + "\n")
        expected = len(next(iter(self.datasets.values()))) if len(self.datasets) == 1 else None  # fairseq-generate
        if self.cfg.provenance_out:
            provenance.append_jsonl(self.cfg.provenance_out, provenance.provenance_records(ids, rows, doc_lp, store),
                                    expected=expected)
        if self.cfg.doc_posterior_out and rows is not None and getattr(generator, "variant", None) == "token":
            provenance.append_jsonl(self.cfg.doc_posterior_out, provenance.token_doc_posteriors(
                models[0], sample, hypos, rows, doc_lp, self.tokenizer, store), expected=expected)
        return hypos

    def _interactive_sample(self, sample):
        from rag_plugin.generation.provenance import interactive_ids

        src = sample["net_input"]["src_tokens"]
        dataset = self.build_dataset_for_inference(src.cpu(), None)
        rebuilt = dataset.collater([dataset[i] for i in range(len(dataset))])
        ids = interactive_ids(len(dataset), depth=3)  # the ids fairseq-interactive prints (Z- lines match S-/H-)
        if ids is not None:
            rebuilt["id"] = torch.tensor(ids, dtype=torch.long)
        rebuilt["net_input"]["src_tokens"] = src  # keep the tokens fairseq prints
        rebuilt["net_input"] = {k: (v.to(src.device) if torch.is_tensor(v) else v) for k, v in rebuilt["net_input"].items()}
        return rebuilt

    def build_bpe(self, args):
        """Pieces <-> text with the knowledge source's tokenizer (D lines come out as text).

        fairseq-generate/-interactive print H lines as pieces and pass them (and S/T lines, and the
        BLEU input) through this codec's ``decode``. ``--post-process sentencepiece`` (alias
        ``--remove-bpe sentencepiece``) makes fairseq turn SentencePiece pieces into words itself
        first: then, as with fairseq's own ``--post-process``, every line is already text, and the
        codec hands it back unchanged (decoding words as pieces would make them all unknown).
        ``--post-process`` modes that join pieces by other marks (``letter``, ``wordpiece``,
        ``_EOW``), or ``sentencepiece`` over GPT-2 ids, would garble the answers: refused.
        """
        from rag_plugin.generation.provenance import cli_option

        post = cli_option("post_process")
        kind = getattr(self.tokenizer, "kind", None)
        if post == "sentencepiece" and kind == "sentencepiece":
            return _PieceCodec(self.tokenizer, already_text=True)
        if post in ("letter", "wordpiece", "_EOW", "sentencepiece"):  # sentencepiece here: over GPT-2 ids
            raise UserError(f"--post-process {post} does not apply to this knowledge source's {kind} tokens",
                            fix="leave --post-process out: D lines are text already"
                                + (", or use --post-process sentencepiece" if kind == "sentencepiece" else ""))
        return _PieceCodec(self.tokenizer)

    def build_tokenizer(self, args):
        return None

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None, **kwargs):
        """fairseq-interactive: questions arrive as generator tokens; recover the text once."""
        if constraints is not None:
            raise UserError(_UNSUPPORTED["constraints"][0], fix=_UNSUPPORTED["constraints"][1])
        questions = []
        for tokens in src_tokens:
            ids = [int(t) for t in tokens if int(t) not in (self.dictionary.eos(), self.dictionary.pad())]
            text = self.tokenizer.decode(ids)
            if not text.strip():
                logger.warning("empty question: answering it without retrieval cues")
            questions.append(text)
        return self.build_dataset(questions)

    # ------------------------------------------------------------------ model
    def build_model(self, cfg, from_checkpoint=False):
        from fairseq import models

        return models.build_model(cfg, self, from_checkpoint)


#: fairseq-generate options the RAG generators do not support: option -> (what, what to do)
_UNSUPPORTED = {
    "print_alignment": ("--print-alignment needs the attention of a single source sentence; RAG attends over "
                        "several (question, passage) inputs and reports no alignment",
                        "leave --print-alignment out; the Z- lines name the passages an answer drew on"),
    "constraints": ("--constraints (lexically constrained decoding) is not supported by the RAG generators",
                    "leave --constraints out; from Python, build_generator's prefix_allowed_tokens_fn "
                    "constrains the answers"),
    "replace_unk": REPLACE_UNK,
    "print_step": ("--print-step prints the steps of iterative refinement decoders; RAG decodes left to right",
                   "leave --print-step out"),
}


def _computing_loss() -> bool:
    """Whether fairseq-train (its validation subsets) or fairseq-validate is loading data: there
    the targets of every split are loss targets. fairseq-generate, or a caller from Python,
    only needs the questions of an evaluation split (answers are scored from the gold file)."""
    from rag_plugin.generation.provenance import caller_frames

    return any(frame.f_globals.get("__name__") in ("fairseq_cli.train", "fairseq_cli.validate")
               for frame in caller_frames(1))


def _refuse_regex_targets(records, path: Path) -> None:
    """Regular-expression answers (CuratedTrec: ``meta.answer_is_regex``) whose concrete targets
    were not derived (no ``meta.answer_pattern``) would teach the generator to write the pattern.
    The paper takes the most frequent match in the retrieved passages instead."""
    bad = [i for i, r in enumerate(records)
           if r.meta.get("answer_is_regex") and r.meta.get("answer_pattern") is None]
    if not bad:
        return
    data = path.parent
    what = "training target" if path.stem == "train" else "target of the validation loss"
    raise UserError(f"{len(bad)} of {len(records)} records have regular-expression answers "
                    f"(meta.answer_is_regex, CuratedTrec) and no concrete target, e.g. {records[bad[0]].id!r}: "
                    f"the pattern itself would be the {what}", path=str(path), line=records[bad[0]].line,
                    fix=f"run scripts/curatedtrec_targets.py --data {data} --knowledge KS_DIR, which takes each "
                        f"pattern's most frequent match in the retrieved passages as the target as the paper "
                        f"does, and train on its output")


def _refuse_unsupported_generation_options(args) -> None:
    for option, (message, fix) in _UNSUPPORTED.items():
        if getattr(args, option, None):
            raise UserError(message, fix=fix)


class _PieceCodec:
    """fairseq's BPE interface over the generator tokenizer. ``already_text``: fairseq's
    ``--post-process sentencepiece`` made the lines text before ``decode`` sees them (see
    ``RetrievalAugmentedTask.build_bpe``): ``decode`` returns them unchanged."""

    def __init__(self, tokenizer, already_text: bool = False):
        self.tokenizer = tokenizer
        self.already_text = already_text

    def encode(self, x: str) -> str:
        return " ".join(self.tokenizer.pieces(x))

    def decode(self, x: str) -> str:
        """Space-separated pieces -> text (text as it is when ``already_text``)."""
        if self.already_text:
            return x
        index = self.tokenizer.index
        ids = [index.get(p, 3) for p in x.split()]
        return self.tokenizer.decode(ids)

    def is_beginning_of_word(self, x: str) -> bool:
        return x.startswith("\u2581")


class _StoreOnly:
    """For fixed (BM25) retrieval: the model only needs the passage store."""

    def __init__(self, knowledge):
        self.knowledge = knowledge
        self.store = knowledge.passages
