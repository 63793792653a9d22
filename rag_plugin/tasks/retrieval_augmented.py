"""Task ``retrieval_augmented``: question/target data + a knowledge source, for RAG models.

Loads KILT-style JSONL splits from ``DATA/{split}.jsonl`` and the knowledge source (passage
store, vectors, FAISS index, its document encoder and the generator tokenizer it was
pre-tokenized with), builds the retriever once per process, and hands each model it builds a
:class:`~rag_plugin.models.context.RetrievalContext`. At generation it prints the retrieved
documents (Z lines) beside fairseq's, from what the generators return with the hypotheses.

What fairseq does not hand a task reaches it through its config by interpolation
(``common_eval.quiet``, ``common_eval.post_process``, ``dataset.gen_subset``), and, on the
fairseq-generate command line, the output stream through :mod:`rag_plugin.fairseq_hooks`.
"""

import logging
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import torch
from fairseq import models as fairseq_models
from fairseq.data import Dictionary
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import FairseqTask, register_task
from omegaconf import II

from rag_plugin.core.input_format import target_layout
from rag_plugin.criterions.retrieval_health import CollapseMonitor
from rag_plugin.criterions.retriever_loss import AddsRetrieverLoss
from rag_plugin.data.gold_rows import gold_rows, rows_by_passage_id
from rag_plugin.data.kilt import read_kilt, regex_target_refusal
from rag_plugin.data.qa_dataset import RetrievalQADataset
from rag_plugin.generation.adapters import retrieval_of
from rag_plugin.generation.dispatch import build_generator
from rag_plugin.generation.options import UNSUPPORTED
from rag_plugin.generation.outputs import GenerationOutputs
from rag_plugin.generation.piece_codec import PieceCodec
from rag_plugin.models.context import PassageTokenizer, RetrievalContext
from rag_plugin.reindexing.reindexer import Reindexer
from rag_plugin.reranking import options as rerank_options
from rag_plugin.retrieval.collective import job_searcher
from rag_plugin.retrieval.knowledge import KnowledgeSource
from rag_plugin.retrieval.retriever import BM25Retriever, DenseRetriever
from rag_plugin.tasks import hybrid_options, pairing, reindex_options
from rag_plugin.util.errors import UserError
from rag_plugin.util.interpolation import interpolated
from rag_plugin.util.safe_load import checkpoint_task_options

logger = logging.getLogger(__name__)


@dataclass
class RetrievalAugmentedConfig(hybrid_options.HybridConfig,  # --fusion, ...
                               reindex_options.ReindexConfig,  # --reindex-every, ...
                               rerank_options.RerankConfig):  # --reranker, --rerank-candidates, ...
    data: str = field(default="", metadata={
        "help": "directory with train.jsonl, valid.jsonl (and test.jsonl), KILT style"})
    knowledge: str = field(default="", metadata={
        "help": "knowledge source directory (rag-build-knowledge); one with the same encoder may be swapped in later"})
    n_docs: Optional[int] = field(default=None, metadata={
        "help": "documents retrieved per question (K; 0 = closed book); default 5, or the checkpoint's with --path"})
    retriever: ChoiceEnum(["dense", "bm25", "hybrid"]) = field(default="dense", metadata={
        "help": "dense (trainable query encoder, MIPS), bm25 (fixed) or hybrid (the two fused, see --fusion)"})
    nprobe: Optional[int] = field(default=None, metadata={"help": "IVF lists visited per search"})
    ef_search: Optional[int] = field(default=None, metadata={"help": "HNSW search breadth"})
    private_index: bool = field(default=False, metadata={
        "help": "read a private copy of the FAISS index instead of mapping it shared by the node's processes"})
    shard_placement: ChoiceEnum(["rank", "node", "local"]) = field(default="rank", metadata={
        "help": "a sharded knowledge source in a job: each rank holds its shards (rank), each node (node), or all"})
    max_query_tokens: int = field(default=64, metadata={"help": "question length for the query encoder"})
    rag_decoding: ChoiceEnum(["thorough", "fast"]) = field(default="thorough", metadata={
        "help": "RAG-Sequence decoding: thorough (every hypothesis under every document) or fast"})
    provenance_out: Optional[str] = field(default=None, metadata={
        "help": "generation: also write the retrieved documents of every sample as JSON lines"})
    doc_posterior_out: Optional[str] = field(default=None, metadata={
        "help": "generation, rag_token: write each answer's per-token document posterior as JSON lines"})
    progress_interval: float = field(default=30.0, metadata={
        "help": "generation: log progress every this many seconds (0: every batch; -1: never)"})
    train_all_answers: bool = field(default=False, metadata={
        "help": "one training example per gold answer alias (default: the first answer only)"})
    target_format: ChoiceEnum(["plugin", "hf"]) = field(default="plugin", metadata={
        "help": "plugin: the decoder starts with </s>; hf: with <s> (transformers' finetune_rag objective)"})
    seed: int = II("common.seed")
    quiet: bool = II("common_eval.quiet")
    post_process: Optional[str] = II("common_eval.post_process")
    gen_subset: str = II("dataset.gen_subset")
    checkpoint_path: Optional[str] = II("common_eval.path")


#: K when neither --n-docs nor a checkpoint says
DEFAULT_N_DOCS = 5


def trained_task_options(cfg) -> Optional[dict]:
    """The task options the checkpoint of ``--path`` (fairseq-generate/-interactive/-validate) was trained with, or
    None (no --path, or unreadable: fairseq's loader reports that in one line when it loads the model)."""
    path = interpolated(cfg, "checkpoint_path")
    if not path:
        return None
    try:
        return checkpoint_task_options(str(path).split(":")[0])
    except UserError:
        return None


def trained_n_docs(cfg, saved: Optional[dict] = None) -> int:
    """K for a run that did not give --n-docs: the checkpoint's (``saved``, its task options: a closed-book checkpoint
    generates closed book), else :data:`DEFAULT_N_DOCS`."""
    try:
        k = int((saved or {})["n_docs"])
    except (KeyError, TypeError, ValueError):
        return DEFAULT_N_DOCS
    logger.info("--n-docs %d: as the checkpoint was trained (pass --n-docs to change it)", k)
    return k


@register_task("retrieval_augmented", dataclass=RetrievalAugmentedConfig)
class RetrievalAugmentedTask(FairseqTask):
    cfg: RetrievalAugmentedConfig
    #: fairseq's trainer hands train_step and valid_step its EMA copy of the model (--store-ema): a re-index switch
    #: hands it the new version's retrieval too (validation reads the trained model, as without the EMA)
    uses_ema = True

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
        #: where Z lines go: fairseq-generate's own stream (handed over by the command-line hook), else stdout
        self.output_stream = None
        # fairseq-interactive: the ids it prints for the batches to come (see build_dataset_for_inference)
        self._interactive = {"next_id": 0, "dataset": None, "batches": deque()}
        self.collapse = CollapseMonitor()  # warns when retrieval collapses in training
        self._generation_outputs = None
        #: the models are loaded from a checkpoint to generate or evaluate, not trained (build_model says)
        self.serving = False
        #: what build_criterion checks of the model build_model built (its family, query encoder, attention)
        self.built_model: Optional[pairing.BuiltModel] = None
        #: --reindex-every: the background re-indexer, made at the first training step
        self.reindexer: Optional[Reindexer] = None

    # ------------------------------------------------------------------ setup
    @classmethod
    def setup_task(cls, cfg: RetrievalAugmentedConfig, **kwargs):
        if not cfg.knowledge:
            raise UserError("no knowledge source given", fix="pass --knowledge KS_DIR (it also holds the generator's "
                                                            "tokenizer, even for --n-docs 0)")
        saved = trained_task_options(cfg)  # None without --path
        if cfg.n_docs is None:
            cfg.n_docs = trained_n_docs(cfg, saved)
        rerank_options.resolve_from_checkpoint(cfg, saved)
        if cfg.n_docs < 0:
            raise UserError(f"--n-docs must be >= 0, got {cfg.n_docs}",
                            fix="use --n-docs 0 (closed book) up to the number of passages")
        knowledge = KnowledgeSource(cfg.knowledge, index_mode="private" if cfg.private_index else "shared")
        if cfg.n_docs > len(knowledge):
            raise UserError(f"--n-docs {cfg.n_docs} is larger than the knowledge source ({len(knowledge)} passages)",
                            path=cfg.knowledge, fix=f"use --n-docs {len(knowledge)} or fewer")
        hybrid_options.check_options(cfg, len(knowledge))
        rerank_options.check_options(cfg, len(knowledge))
        tokenizer = knowledge.load_generator_tokenizer()
        dictionary = Dictionary.load(str(tokenizer.files.dict))
        if len(dictionary) != len(tokenizer):
            raise UserError("generator dictionary and tokenizer disagree", path=tokenizer.files.dict)
        if cfg.nprobe is not None or cfg.ef_search is not None:
            knowledge.set_search_params(nprobe=cfg.nprobe, ef_search=cfg.ef_search)
        reads_encoder = (cfg.retriever != "bm25"
                         or rerank_options.reranker_name(cfg) in rerank_options.READ_KNOWLEDGE_ENCODER)
        text_encoder = knowledge.load_encoder() if cfg.n_docs > 0 and reads_encoder else None
        logger.info("knowledge source %s: %d passages, encoder %s, dictionary %d symbols", cfg.knowledge,
                    len(knowledge), knowledge.encoder_identity.get("name"), len(dictionary))
        return cls(cfg, knowledge, dictionary, tokenizer, text_encoder)

    def fairseq_option(self, name: str, default=None):
        """An option this task's config takes from fairseq's (``quiet``, ``post_process``, ``gen_subset``)."""
        return interpolated(self.cfg, name, default)

    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    @property
    def retriever(self):
        """This process's retriever (the same object for every model it builds), or None closed book."""
        if self.cfg.n_docs == 0:
            return None
        if self.cfg.retriever == "bm25":
            return self.bm25
        if self._retriever is None:
            searcher = job_searcher(self.knowledge, str(self.cfg.shard_placement), log=logger.info)
            self._retriever = DenseRetriever(self.knowledge, encoder=self.text_encoder, searcher=searcher)
            if self.cfg.retriever == "hybrid":
                self._retriever = hybrid_options.hybrid_retriever(self.cfg, self._retriever, self.bm25)
        return self._retriever

    def reopen_knowledge(self, version: Optional[int] = None, models=()) -> int:
        """Open the knowledge source's current version (or ``version``) again (``rag-update-knowledge`` or a re-index
        made a newer one): the retriever, and each of ``models`` (``use_retrieval``), read it from now on. Returns the
        version now open."""
        self.knowledge, self._retriever, self._bm25 = self.knowledge.reopened(version), None, None
        for model in models:
            model.use_retrieval(self.retrieval_context(model.cfg))
        return self.knowledge.version

    @property
    def bm25(self):
        if self._bm25 is None:
            self._bm25 = BM25Retriever(self.knowledge.passages)
        return self._bm25

    def retrieval_context(self, model_cfg) -> RetrievalContext:
        """What a model built by this task receives at construction (its knowledge, K, format, retriever)."""
        wanted = str(getattr(model_cfg, "input_format", "plugin"))
        if wanted != self.input_format.name:
            raise UserError(f"the model reads the {wanted} input format, the knowledge source's passages are "
                            f"pre-tokenized for the {self.input_format.name} format", path=self.cfg.knowledge,
                            fix=f"use a knowledge source built (or imported) with --input-format {wanted}, or a model "
                                f"with --input-format {self.input_format.name}")
        scale = getattr(model_cfg, "doc_score_scale", 0.0) or (
            20.0 if self.knowledge.encoder_identity.get("normalize") else 1.0)
        identity = {"encoder": self.knowledge.encoder_identity,
                    "knowledge": str(Path(self.cfg.knowledge).resolve()),
                    "version": self.knowledge.version,
                    "passage_store_sha256": self.knowledge.passages.sha256,
                    "count": len(self.knowledge),
                    "input_format": self.input_format.name,
                    "tokenizer": self.knowledge.passages.tokenizer_identity or None,
                    "retriever": hybrid_options.retriever_name(self.cfg)}
        return RetrievalContext(n_docs=self.cfg.n_docs, input_format=self.input_format, retriever=self.retriever,
                                doc_score_scale=float(scale), identity=identity, knowledge=self.knowledge,
                                passage_tokenizer=PassageTokenizer(self.text_encoder) if self.text_encoder else None,
                                serving=self.serving,
                                checkpoint=interpolated(self.cfg, "checkpoint_path"),
                                rerank_candidates=rerank_options.rerank_candidates(self.cfg))

    # ------------------------------------------------------------------ data
    def load_dataset(self, split: str, epoch: int = 1, combine: bool = False, **kwargs):
        path = Path(self.cfg.data) / f"{split}.jsonl"
        if not self.cfg.data or not path.is_file():
            raise UserError(f"missing data split {split!r}", path=str(path),
                            fix=f"DATA must hold {split}.jsonl (KILT style)")
        records = read_kilt(str(path), require_answers=True, allow_empty_input=(split != "train"))
        refusal = regex_target_refusal(records, path)
        if split == "train" and refusal is not None:
            raise refusal
        questions, targets = [], []  # one entry per training example (records repeat with train_all_answers)
        for r in records:
            answers = r.answers if (self.cfg.train_all_answers and split == "train") else r.answers[:1]
            for a in answers:
                questions.append(r)
                targets.append(a)
        self.records[split] = records
        dataset = self.build_dataset([r.input for r in questions], targets, record_ids=[r.id for r in questions],
                                     gold_rows=self.gold_rows([r.provenance for r in questions]))
        dataset.loss_refusal = refusal  # generation reads only the questions; a loss on these targets is refused
        self.datasets[split] = dataset
        logger.info("%s: %d examples from %s", split, len(dataset), path)

    def gold_rows(self, provenance: List[List[str]]):
        """Store rows of the gold passages ([N, G], -1 padded), or None (see :mod:`rag_plugin.data.gold_rows`)."""
        if not any(provenance):
            return None
        if self._rows_by_id is None:
            self._rows_by_id = rows_by_passage_id(self.knowledge.passages)
        return gold_rows(provenance, self._rows_by_id)

    def build_dataset(self, questions, targets=None, record_ids=None, gold_rows=None,
                      candidates: Optional[int] = None) -> RetrievalQADataset:
        """Pre-tokenize questions (query encoder + generator) and targets once, in the input format
        of the knowledge source (:mod:`rag_plugin.core.input_format`). ``candidates``: the BM25 rows each question
        holds (--retriever bm25; default --n-docs; hybrid: the fused lists' own length)."""
        fmt = self.input_format
        q_enc = None
        if self.text_encoder is not None:
            q_enc = self.text_encoder.tokenize_queries(questions, max_length=self.cfg.max_query_tokens)
        decoded = [None] * len(questions)
        if fmt.name == "hf" and q_enc is not None:  # the question as the query encoder read it
            decoded = [self.text_encoder.tokenizer.decode(ids, skip_special_tokens=True) for ids in q_enc]
        q_gen = self.tokenizer.encode_batch([fmt.question_string(q, d) for q, d in zip(questions, decoded)])
        tgt = None
        layout = target_layout(str(self.cfg.target_format), fmt, self.dictionary.bos(),
                               self.dictionary.eos())
        if targets is not None:
            tgt = [layout.prefix + t for t in self.tokenizer.encode_batch(targets)]
        fixed_rows = fixed_scores = None
        if self.cfg.n_docs > 0 and self.cfg.retriever == "bm25":
            found = self.bm25.search(questions, candidates or max(self.cfg.n_docs,
                                                                  rerank_options.rerank_candidates(self.cfg)))
            fixed_rows, fixed_scores = found.rows, found.scores
        elif self.cfg.n_docs > 0 and self.cfg.retriever == "hybrid":  # the BM25 candidates, fused in the model
            fixed_rows, fixed_scores = self.retriever.bm25_candidates(questions)
        dataset = RetrievalQADataset(q_enc, q_gen, tgt, pad=self.dictionary.pad(), eos=self.dictionary.eos(),
                                     fixed_rows=fixed_rows, fixed_scores=fixed_scores, record_ids=record_ids,
                                     gold_rows=gold_rows, decoder_start=layout.decoder_start)
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

    def get_batch_iterator(self, dataset, *args, **kwargs):
        # fairseq drops the last partial batch when required_batch_size_multiple > 1: never
        # (every valid/test example must be scored, and no training example silently skipped).
        if "required_batch_size_multiple" in kwargs:
            kwargs["required_batch_size_multiple"] = 1
        iterator = super().get_batch_iterator(dataset, *args, **kwargs)
        state = self._interactive
        if dataset is state["dataset"]:  # fairseq-interactive walks these batches in order (shuffle=False)
            state["batches"] = deque((state["start"], [int(i) for i in ids]) for ids in iterator.frozen_batches)
        return iterator

    def max_positions(self):
        return None

    # ------------------------------------------------------------------ training
    def begin_epoch(self, epoch, model):
        """fairseq-train starts an epoch: every split it loaded is a loss target."""
        for dataset in self.datasets.values():
            if getattr(dataset, "loss_refusal", None) is not None:
                raise dataset.loss_refusal
        return super().begin_epoch(epoch, model)

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False, ema_model=None):
        if sample and sample.get("loss_refusal") is not None:
            raise sample["loss_refusal"]
        if self.cfg.reindex_every:  # re-embed in the background, switch when done (rag_plugin/reindexing/)
            if self.reindexer is None:
                self.reindexer = Reindexer.for_task(self, model)
            self.reindexer.step(self, model, update_num, followers=[ema_model] if ema_model is not None else [])
        if isinstance(criterion, AddsRetrieverLoss):  # --retriever-loss-start
            criterion.set_update(update_num)
        loss, sample_size, stats = super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        if not ignore_grad:
            self.collapse.observe_train(stats)
        return loss, sample_size, stats

    def valid_step(self, sample, model, criterion, ema_model=None):
        if sample and sample.get("loss_refusal") is not None:
            raise sample["loss_refusal"]
        return super().valid_step(sample, model, criterion)

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        # summed over the ranks: the valid-set collapse check sees the whole valid set, on every rank
        self.collapse.observe_reduced(logging_outputs, [len(d) for split, d in self.datasets.items()
                                                        if split != "train"])

    # ------------------------------------------------------------------ model
    def build_model(self, cfg, from_checkpoint=False):
        self.serving = bool(from_checkpoint)  # the model's retrieval context says so (see retrieval_context)
        model = fairseq_models.build_model(cfg, self, from_checkpoint)
        self.built_model = pairing.BuiltModel.of(model)
        self.max_target = model.max_decoder_positions()
        for split, dataset in self.datasets.items():
            self._set_max_target(dataset, split)
        return model

    def build_criterion(self, cfg, from_checkpoint=False):
        criterion = super().build_criterion(cfg, from_checkpoint)
        pairing.check_family(self.built_model, criterion)  # FiD trains with cross-entropy, RAG with marginal_nll
        pairing.check_retriever_loss(self.cfg, self.built_model, criterion)
        return criterion

    # ------------------------------------------------------------------ generation
    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None,
                        prefix_allowed_tokens_fn=None):
        """RAG-Token's beam search, RAG-Sequence's per-document beams or FiD's, as the model is
        (:mod:`rag_plugin.generation.dispatch`); each searches with :meth:`build_search`."""
        return build_generator(self, models, args, extra_gen_cls_kwargs, prefix_allowed_tokens_fn)

    def build_search(self, models, args, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None):
        """fairseq's own sequence generator over ``models`` (beam search, sampling, prefixes, its options): what the
        plugin's generators search with, over the adapters that present a RAG or FiD model to it."""
        return super().build_generator(models, args, extra_gen_cls_kwargs=extra_gen_cls_kwargs,
                                       prefix_allowed_tokens_fn=prefix_allowed_tokens_fn)

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        if "id" not in sample:  # fairseq-interactive keeps only src_tokens: rebuild the retrieval inputs
            sample = self._interactive_sample(sample)
        with torch.no_grad():
            hypos = generator.generate(models, sample, prefix_tokens=prefix_tokens, constraints=constraints)
        rows, doc_lp = retrieval_of(hypos)
        if doc_lp is not None:
            self.generation_outputs.write_provenance(models[0], generator, sample, hypos, rows, doc_lp)
        self.generation_outputs.progress().update(len(hypos))
        return hypos

    @property
    def generation_outputs(self):
        """Where generation writes: Z lines, --provenance-out / --doc-posterior-out files, the progress line."""
        if self._generation_outputs is None:
            self._generation_outputs = GenerationOutputs(self)
        return self._generation_outputs

    def build_dataset_for_inference(self, src_tokens, src_lengths, constraints=None, **kwargs):
        """fairseq-interactive: questions arrive as generator tokens; recover the text once. fairseq-interactive
        numbers its lines across buffers (``start_id`` + dataset index): the task counts them the same way,
        so that Z lines carry the ids of the question's own S-/H- lines."""
        if constraints is not None:
            raise UserError(UNSUPPORTED["constraints"][0], fix=UNSUPPORTED["constraints"][1])
        dataset = self._questions_dataset(src_tokens)
        state = self._interactive
        state["start"], state["dataset"] = state["next_id"], dataset
        state["next_id"] += len(dataset)
        return dataset

    def _questions_dataset(self, src_tokens):
        questions = []
        for tokens in src_tokens:
            ids = [int(t) for t in tokens if int(t) not in (self.dictionary.eos(), self.dictionary.pad())]
            text = self.tokenizer.decode(ids)
            if not text.strip():
                logger.warning("empty question: answering it without retrieval cues")
            questions.append(text)
        return self.build_dataset(questions)

    def _interactive_sample(self, sample):
        """The full sample (query tokens, ids) behind fairseq-interactive's ``{"net_input": {src_tokens}}``:
        the next batch of the dataset it asked for, whose ids it prints; else rebuilt from the tokens."""
        src = sample["net_input"]["src_tokens"]
        state = self._interactive
        dataset, start, indices = state["dataset"], None, None
        if state["batches"]:
            start, indices = state["batches"].popleft()
        if dataset is None or indices is None or len(indices) != src.size(0):
            dataset, start, indices = self._questions_dataset(src.cpu()), 0, list(range(src.size(0)))
        rebuilt = dataset.collater([dataset[i] for i in indices])
        rebuilt["id"] = torch.tensor([start + i for i in indices], dtype=torch.long)
        rebuilt["net_input"]["src_tokens"] = src  # keep the tokens fairseq prints
        rebuilt["net_input"] = {k: (v.to(src.device) if torch.is_tensor(v) else v)
                                for k, v in rebuilt["net_input"].items()}
        return rebuilt

    def build_bpe(self, args):
        """Pieces <-> text with the knowledge source's tokenizer (see :mod:`rag_plugin.generation.piece_codec`)."""
        return PieceCodec.for_post_process(self.tokenizer, self.fairseq_option("post_process"))

    def build_tokenizer(self, args):
        return None
