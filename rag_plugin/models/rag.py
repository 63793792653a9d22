"""``rag_token`` and ``rag_seq``: query encoder + frozen knowledge source + BART generator.

Per batch of B questions and K documents::

    q = BERT_q(question)                       [B, D]   trainable (unless frozen)
    rows = MIPS top-K of q over the index       [B, K]   no gradient (FAISS)
    scores = q . d(z)  from the stored vectors  [B, K]   gradient reaches BERT_q, never d(z)
    src = <s> question </s> title </s> passage </s>   for each of the B*K pairs
    logits = BART(src, prev_output_tokens)      [B*K, T, V]

With ``--train-doc-encoder`` d(z) comes from the model's own document encoder instead, recomputed on the
retrieved passages' texts (gradient reaches it too; see :mod:`rag_plugin.models.doc_encoder`).
The criterion and the generators marginalise over documents with
:mod:`rag_plugin.core.marginalization`. The two registered models differ only in ``variant``.
With ``n_docs == 0`` the model is the closed-book BART baseline (no retrieval).
"""

import copy
import json
import logging
from typing import Optional

import torch
from fairseq.models import BaseFairseqModel, register_model, register_model_architecture

from rag_plugin.models import doc_encoder as doc_side
from rag_plugin.models.context import RetrievalContext
from rag_plugin.models.generator import GeneratorShape, build_bart, count_parameters, load_generator_weights
from rag_plugin.models.rag_config import RagConfig, as_config, generator_init, lr_scale
from rag_plugin.optim.lr_scale import (
    has_scaled_keys,
    plain_module_state,
    plain_where,
    scale_learning_rate,
    scaled_state,
)
from rag_plugin.reranking.base import RerankBatch, Reranker
from rag_plugin.reranking.options import reranker_name
from rag_plugin.reranking.registry import build_reranker
from rag_plugin.reranking.stage import rerank
from rag_plugin.retrieval.encoders import load_encoder
from rag_plugin.util.errors import UserError

logger = logging.getLogger(__name__)


class RagModel(BaseFairseqModel):
    """Shared implementation of RAG-Token and RAG-Sequence (see the module docstring). Fusion-in-Decoder
    (:mod:`rag_plugin.models.fid`) shares everything but :meth:`forward`: construction, retrieval, generator
    inputs, encoding and the checkpoint's identity."""

    variant = "token"
    #: the model's dataclass (fairseq hands its options as a Namespace or DictConfig)
    config_class = RagConfig

    def __init__(self, cfg: RagConfig, generator, query_encoder: Optional[torch.nn.Module], dictionary,
                 context: RetrievalContext, doc_encoder: Optional[torch.nn.Module] = None,
                 reranker: Optional[Reranker] = None):
        super().__init__()
        self.cfg = cfg
        self.generator = generator
        self.query_encoder = query_encoder
        #: the reranking stage's scorer (--reranker: its weights are the model's), or None
        self.reranker = reranker
        self.dictionary = dictionary
        self.bos, self.eos, self.pad = dictionary.bos(), dictionary.eos(), dictionary.pad()
        self.context: RetrievalContext = context
        self.knowledge_identity: Optional[dict] = None  # what this model is trained with
        self.use_retrieval(context)
        if query_encoder is not None and cfg.freeze_query_encoder:
            for p in query_encoder.parameters():
                p.requires_grad_(False)
        if getattr(cfg, "freeze_generator", False):
            for p in generator.parameters():
                p.requires_grad_(False)
        if query_encoder is not None and cfg.freeze_query_embeddings:
            query_encoder.bert_model.embeddings.word_embeddings.weight.requires_grad_(False)
        scale = lr_scale(cfg)
        if query_encoder is not None and not cfg.freeze_query_encoder and scale != 1.0:
            scale_learning_rate(query_encoder, scale)
        if query_encoder is not None and not cfg.freeze_query_encoder and not cfg.query_encoder_lr_scale:
            logger.info("the query encoder learns at %.3g x --lr (--query-encoder-lr-scale 0: min(1, 3e-5 / --lr))",
                        scale)
        if doc_encoder is not None and doc_encoder is not query_encoder:  # --train-doc-encoder, towers apart
            self._modules["doc_encoder"] = doc_encoder  # a submodule behind the property below
            if scale != 1.0:
                scale_learning_rate(doc_encoder, scale)

    @property
    def doc_encoder(self) -> Optional[torch.nn.Module]:
        """The trainable document tower (--train-doc-encoder; the query encoder with --share-encoder-towers)."""
        if self.cfg.train_doc_encoder and self.cfg.share_encoder_towers:
            return self.query_encoder
        return self._modules.get("doc_encoder")

    def use_retrieval(self, context: RetrievalContext) -> None:
        """Retrieve as ``context`` says from now on: the only writer of the model's retrieval. The task hands one at
        construction; a re-index switch (--reindex-every) and the hub's ``reload`` hand the newer version's. What the
        model records as trained with (saved in its checkpoints) follows it."""
        self.context = context
        self.knowledge_identity = dict(context.identity) or None

    @property
    def n_docs(self) -> int:
        """K, documents per question (0: closed book)."""
        return self.context.n_docs

    @property
    def retriever(self):
        """Dense, BM25 (rows fixed by the dataset), hybrid, or None (closed book): a ``Retriever``."""
        return self.context.retriever

    @property
    def input_format(self):
        return self.context.input_format

    @property
    def doc_score_scale(self) -> float:
        return self.context.doc_score_scale

    def doc_encoder_state(self) -> dict:
        """The document tower's plain weights (keys as ``BiEncoderTower.state_dict()``), see doc_encoder.py."""
        return plain_module_state(self.doc_encoder)

    # ------------------------------------------------------------------ construction
    @classmethod
    def build_model(cls, cfg, task):
        cfg = as_config(cfg, cls.config_class)
        doc_side.check_options(cfg, task.cfg, cls.variant, getattr(task, "knowledge", None))
        dictionary = task.dictionary
        generator = build_bart(GeneratorShape.of(cfg, init=generator_init(cfg)), dictionary)
        if cfg.generator_checkpoint:
            load_generator_weights(generator, cfg.generator_checkpoint, dictionary)
        reranker, query_encoder = cls.retrieval_parts(cfg, task)
        model = cls(cfg, generator, query_encoder, dictionary, task.retrieval_context(cfg),
                    doc_side.build_doc_encoder(cfg, task, query_encoder), reranker)
        logger.info("%s: trainable parameters: generator %s, query encoder %s, total %s", cls.__name__,
                    f"{count_parameters(generator):,}",
                    f"{count_parameters(query_encoder):,}" if query_encoder is not None else "none",
                    f"{count_parameters(model):,}")
        return model

    @classmethod
    def retrieval_parts(cls, cfg, task):
        """(reranker or None, query encoder or None) of a model built with ``cfg`` for ``task``: the reranking stage
        (its first stage's query encoder then fixed) and the dense or hybrid retriever's query tower; shared by the
        encoder-decoder and decoder-only readers."""
        reranker = build_reranker(reranker_name(task.cfg), cfg, task) if task.cfg.n_docs > 0 else None
        if reranker is not None and not cfg.freeze_query_encoder:  # no gradient reaches it: fixed, no graph
            logger.info("--reranker %s: the first stage only proposes candidates, its query encoder stays fixed",
                        reranker.name)
            cfg.freeze_query_encoder = True
        query_encoder = None
        if task.cfg.n_docs > 0 and task.cfg.retriever != "bm25":  # dense or hybrid
            query_encoder = cls.build_query_encoder(cfg, task)
        return reranker, query_encoder

    @staticmethod
    def build_query_encoder(cfg: RagConfig, task) -> torch.nn.Module:
        source = task.text_encoder
        if cfg.query_encoder not in ("knowledge", "random"):
            source = load_encoder(cfg.query_encoder)
            if source.dim != task.knowledge.dim:
                raise UserError(f"query encoder {cfg.query_encoder!r} has dimension {source.dim}, the knowledge "
                                f"source {task.knowledge.dim}", fix="use the question encoder paired with the index")
        tower = copy.deepcopy(source.query_tower)  # never shares weights with the document encoder
        if cfg.query_encoder == "random":
            gen = torch.Generator().manual_seed(0)
            tower.bert_model.init_weights(gen)
            if tower.encode_proj is not None:
                torch.nn.init.normal_(tower.encode_proj.weight, std=0.02, generator=gen)
                torch.nn.init.zeros_(tower.encode_proj.bias)
        tower.train()
        return tower

    def train(self, mode: bool = True):
        """A fixed query encoder (``--freeze-query-encoder``) stays in eval mode: no dropout in the retrieval of
        training batches (a trained one keeps its dropout, as DPR's training has it)."""
        super().train(mode)
        if self.query_encoder is not None and self.cfg.freeze_query_encoder:
            self.query_encoder.eval()
        if getattr(self.cfg, "freeze_generator", False):  # a fixed reader: no dropout either (REPLUG's frozen LM)
            self.generator.eval()
        return self

    # ------------------------------------------------------------------ retrieval
    def retrieve(self, query_tokens: Optional[torch.Tensor], query_mask: Optional[torch.Tensor], n_docs: int,
                 fixed_doc_rows: Optional[torch.Tensor] = None, fixed_doc_scores: Optional[torch.Tensor] = None,
                 src_tokens: Optional[torch.Tensor] = None):
        """Top-``n_docs`` documents: (doc_scores [B, K] (differentiable in q), rows Long[B, K]). The retriever
        searches with the query vectors (none for BM25); ``fixed_doc_*``: the candidates the dataset holds (BM25 and
        hybrid), or rows a caller forces on a dense model. With --train-doc-encoder the model's own document encoder
        scores the rows the index finds; with --reranker the reranker scores the first stage's L candidates and keeps
        the best ``n_docs`` (its scores are the logits; ``src_tokens``: the questions in generator tokens, which the
        reader as reranker reads)."""
        q = None
        if self.query_encoder is not None and query_tokens is not None:
            grad = self.training and not self.cfg.freeze_query_encoder and torch.is_grad_enabled()
            with torch.set_grad_enabled(grad):
                q = self.query_encoder(query_tokens, query_mask)                  # [B, D]
        candidates = None if fixed_doc_rows is None else (fixed_doc_rows, fixed_doc_scores)
        if self.doc_encoder is not None and candidates is None:
            return doc_side.rescored_retrieval(self, q, n_docs)
        if self.reranker is None:
            return self.retriever.retrieve(q, n_docs, self.doc_score_scale, candidates)  # float32 under --fp16/--amp
        wanted = max(n_docs, self.context.rerank_candidates)
        with torch.no_grad():  # the first stage only proposes candidates
            first, rows = self.retriever.retrieve(q, min(wanted, self._first_stage_width(candidates)),
                                                  self.doc_score_scale, candidates)
        if src_tokens is None:
            raise UserError("the reranking stage reads the questions' generator tokens, and none were given",
                            fix="call encode()/forward() with src_tokens, or retrieve(..., src_tokens=...)")
        batch = RerankBatch(rows=rows, first_stage=first.detach().float(), src_tokens=src_tokens,
                            query_tokens=query_tokens, query_mask=query_mask, query_vectors=q)
        grad = self.training and torch.is_grad_enabled()
        return rerank(self.reranker, self, batch, n_docs, grad)

    def _first_stage_width(self, candidates) -> int:
        """The most candidates the first stage can give: the dataset's (BM25, hybrid) or the whole collection."""
        if candidates is not None:
            return int(candidates[0].size(1))
        return len(self.retriever.store)

    def generator_inputs(self, src_tokens: torch.Tensor, rows: Optional[torch.Tensor]):
        """Inputs for the B*K (question, document) pairs, from pre-tokenized passage ids."""
        questions = [q[q.ne(self.pad)].numpy() for q in src_tokens.cpu()]
        docs = None
        if rows is not None:
            store = self.retriever.store
            docs = [[(store.title_tokens(int(r)), store.text_tokens(int(r))) for r in row] for row in rows.tolist()]
        src, lengths = self.input_format.batch(questions, docs, self.bos, self.eos, self.pad,
                                               self.cfg.max_source_positions)
        device = src_tokens.device
        return src.to(device), lengths.to(device)

    def encode(self, src_tokens, query_tokens=None, query_mask=None, fixed_doc_rows=None,
               fixed_doc_scores=None, n_docs: Optional[int] = None):
        """Retrieve and run the generator's encoder once per (question, document) pair.

        Returns (encoder_out over B*K rows, doc_scores [B, K], rows [B, K] or None).
        """
        k = self.n_docs if n_docs is None else n_docs
        if k > 0:
            doc_scores, rows = self.retrieve(query_tokens, query_mask, k, fixed_doc_rows, fixed_doc_scores, src_tokens)
        else:
            b = src_tokens.size(0)
            doc_scores, rows = src_tokens.new_zeros((b, 1), dtype=torch.float), None
        src, lengths = self.generator_inputs(src_tokens, rows)
        encoder_out = self.generator.encoder(src, src_lengths=lengths)
        return encoder_out, doc_scores, rows

    # ------------------------------------------------------------------ forward
    def forward(self, src_tokens, prev_output_tokens, query_tokens=None, query_mask=None,
                fixed_doc_rows=None, fixed_doc_scores=None, n_docs: Optional[int] = None, src_lengths=None):
        """Teacher-forced logits for every (question, document) pair.

        Returns ``(logits [B*K, T, V], extra)`` with ``extra["doc_scores"]`` [B, K] and
        ``extra["doc_rows"]`` [B, K] (None for closed book).
        """
        encoder_out, doc_scores, rows = self.encode(src_tokens, query_tokens, query_mask, fixed_doc_rows,
                                                    fixed_doc_scores, n_docs)
        k = doc_scores.size(1)
        prev = prev_output_tokens.repeat_interleave(k, dim=0) if k > 1 else prev_output_tokens
        logits, extra = self.generator.decoder(prev, encoder_out=encoder_out)
        extra["doc_scores"] = doc_scores
        extra["doc_rows"] = rows
        return logits, extra

    def max_positions(self):
        return (self.cfg.max_source_positions, self.cfg.max_target_positions)

    def max_decoder_positions(self):
        return self.cfg.max_target_positions

    # ------------------------------------------------------------------ checkpoint identity
    def get_extra_state(self):
        """Saved in the checkpoint: the knowledge source (encoder) this model was trained with."""
        state = {"knowledge": json.dumps(self.knowledge_identity or {}, sort_keys=True), "variant": self.variant}
        if self.doc_encoder is not None:  # what a re-embedded version records (~0.2 s for MiniLM-L6's 22.6M weights)
            state["document_tower_sha256"] = doc_side.document_tower_sha256(self.doc_encoder)
        return state

    def set_extra_state(self, state):
        trained = json.loads(state.get("knowledge") or "{}")
        self.context.check_trained_encoder(trained.get("encoder"), document_tower_trained=self.doc_encoder is not None)
        self._check_generator_tokenizer(trained.get("tokenizer"))
        self._note_newer_version(trained)
        self.context.note_trained_retriever(trained)
        saved = state.get("variant")
        check_model_family(saved, self.variant)
        if saved and saved != self.variant:  # a resume with another --arch, or a deliberate fine-tune
            logger.warning("the checkpoint was trained as RAG-%s; this model is RAG-%s (its --arch): the weights are "
                           "the same, the marginalisation is not", saved.capitalize(), self.variant.capitalize())
        if trained:
            self.knowledge_identity = trained

    def _note_newer_version(self, trained: dict) -> None:
        """A warning (not an error: same document encoder) when the knowledge source the model was trained on
        has been updated since (rag-update-knowledge) and this model now reads a newer version."""
        now = self.knowledge_identity or {}
        if trained.get("knowledge") and trained.get("knowledge") == now.get("knowledge") and \
                int(now.get("version") or 1) > int(trained.get("version") or 1):
            logger.warning("%s: the checkpoint was trained on version %s of this knowledge source; it now reads "
                           "version %s (same document encoder, updated passages)", now["knowledge"],
                           trained.get("version") or 1, now["version"])

    def _check_generator_tokenizer(self, trained: Optional[dict]) -> None:
        """A swapped knowledge source must pre-tokenize with the generator's own dictionary and subword
        model: one of the same size but other symbols loads without a shape error and reads every
        question, passage and answer in ids the generator never learned. (Checkpoints written before
        the tokenizer was recorded are not checked.)"""
        now = (self.knowledge_identity or {}).get("tokenizer")
        if not trained or not now:
            return
        differ = sorted(k for k in set(trained) & set(now) if k.endswith("sha256") and trained[k] != now[k])
        if differ:
            source = (self.knowledge_identity or {}).get("knowledge", "this knowledge source")
            raise UserError(f"the knowledge source {source} pre-tokenizes with another generator vocabulary than "
                            f"the checkpoint was trained with ({', '.join(differ)} differ)",
                            fix="build (or rebuild) the swapped knowledge source with the training run's --dict and "
                                "--bpe-model")

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """A checkpoint trained with dense retrieval also serves closed book (``--n-docs 0``) and BM25
        (``--retriever bm25``): its query encoder is left out. The other way round is an error."""
        if hasattr(self.generator, "encoder") and not any(k.startswith("generator.encoder.") for k in state_dict) \
                and any(k.startswith("generator.decoder.") for k in state_dict):
            raise UserError("the checkpoint is a decoder-only RAG model (rag_lm_*), --arch builds an encoder-decoder "
                            "one", fix="load it with --arch rag_lm_token_* / rag_lm_seq_* (as it was trained)")
        ours = any(k.startswith("query_encoder.") for k in self.state_dict())
        theirs = any(k.startswith("query_encoder.") for k in state_dict)
        if theirs and not ours:
            state_dict = {k: v for k, v in state_dict.items() if not k.startswith("query_encoder.")}
        elif ours and not theirs and strict:
            raise UserError("the checkpoint has no query encoder (it was trained closed book or with BM25), "
                            "this run retrieves with a dense one",
                            fix="run with --n-docs 0 or --retriever bm25, as it was trained")
        state_dict = doc_side.complete_state(self, state_dict)
        result = torch.nn.Module.load_state_dict(self, self._into_scaled_parameters(state_dict), strict=strict)
        doc_side.check_document_agreement(self)  # served from a checkpoint: its document encoder made the vectors?
        return result

    def _into_scaled_parameters(self, state_dict):
        """A checkpoint saved without the towers' learning-rate reparametrisation (a converted model, one trained at
        scale 1) loaded into a model that has it (``--finetune-from-model`` at another --lr), or the reverse (a
        trained query encoder, fixed under a ``--reranker`` added at generation); a checkpoint without the
        reranker's weights (one added at generation) keeps the model's own (zero-shot: the knowledge source's)."""
        ours = self.state_dict()
        state_dict = self._with_own_reranker(state_dict)
        state_dict = plain_where(state_dict, ours, lr_scale(self.cfg))
        if not has_scaled_keys(ours):
            return state_dict
        return scaled_state(state_dict, ours, lr_scale(self.cfg))

    def _with_own_reranker(self, state_dict):
        if self.reranker is None:  # --reranker none over a checkpoint trained with one: its weights unused
            return {k: v for k, v in state_dict.items() if not k.startswith("reranker.")}
        if any(k.startswith("reranker.") for k in state_dict):
            return state_dict
        own = {f"reranker.{k}": v for k, v in self.reranker.state_dict().items()}
        if own:
            logger.info("the checkpoint has no weights of --reranker %s: it reranks with its own start (zero-shot)",
                        self.reranker.name)
        return {**state_dict, **own}


def check_model_family(saved: Optional[str], loading: str) -> None:
    """A one-line error when a checkpoint of one model family (RAG: ``token``/``sequence``; FiD: ``fid``) is loaded
    into the other: the weights have the same names and shapes, so nothing else would notice."""
    def family(variant):
        return "FiD" if variant == "fid" else "RAG"

    if saved and family(saved) != family(loading):
        arch = "fid_*" if saved == "fid" else "rag_token_* or rag_seq_*"
        raise UserError(f"the checkpoint is a {family(saved)} model, --arch builds a {family(loading)} model",
                        fix=f"load it with --arch {arch} (as it was trained); to start a {family(loading)} model from "
                            f"its generator, pass it as --generator-checkpoint instead")


@register_model("rag_token", dataclass=RagConfig)
class RagTokenModel(RagModel):
    """RAG-Token: a different document may generate each target token."""

    variant = "token"


@register_model("rag_seq", dataclass=RagConfig)
class RagSequenceModel(RagModel):
    """RAG-Sequence: one document generates the whole target."""

    variant = "sequence"


def _preset(size: str, positions: int):
    def arch(cfg):
        cfg.generator_size = size
        if getattr(cfg, "max_source_positions", None) is None:
            cfg.max_source_positions = positions
        if getattr(cfg, "max_target_positions", None) is None:
            cfg.max_target_positions = positions  # bart.base/large checkpoints hold 1024 positions
    return arch


for _model in ("rag_token", "rag_seq"):
    for _size, _positions in (("tiny", 128), ("base", 1024), ("large", 1024)):
        register_model_architecture(_model, f"{_model}_{_size}")(_preset(_size, _positions))
