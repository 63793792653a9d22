"""``--train-doc-encoder``: a trainable document encoder, its re-scoring of the retrieved rows, and its weights.

Per batch of B questions, K documents (L >= K candidates with ``--rerank-top L``)::

    q = BERT_q(question)                                 [B, D]     trainable (unless frozen)
    rows = MIPS top-L of q over the (stale) index         [B, L]     no gradient (FAISS, the stored vectors)
    d = BERT_d(tokenize(title, text) of each row)         [B, L, D]  the model's CURRENT document encoder
    scores = scale * q . d                                [B, L]     gradient reaches BERT_q and BERT_d
    keep the top K by these scores (--rerank-top; else L = K and the index's order is kept)

The index only chooses which rows are candidates; their scores (hence p(z|x)) come from the current towers, so
the marginal NLL trains the document encoder too. With L > K the L candidates are scored without a graph and only
the K kept are encoded again with one (the gradient reaches only them); the rows go through the tower
``--doc-encoder-chunk`` at a time, under activation checkpointing when a step has more (:func:`document_vectors`), so
the memory of a step's document side is bounded whatever ``--rerank-top`` and the batch. Passages are tokenized
exactly as the knowledge source embedded them (its encoder's tokenizer and passage format, handed over by the task
as ``context.passage_tokenizer``).

The document tower's learning rate is scaled as the query encoder's (``--query-encoder-lr-scale``), by the same
reparametrisation: its checkpoint keys are ``doc_encoder.*...parametrizations.weight.original`` = weight / scale.
:func:`~rag_plugin.optim.lr_scale.plain_module_state` resolves them to the effective weights (keys as
``BiEncoderTower.state_dict()``), whose
:func:`~rag_plugin.retrieval.encoders.weights.state_dict_sha256` names the tower: a knowledge-source version
re-embedded with it records that hash as ``document_tower_sha256`` (a version without it: its encoder's
``passage_weights_sha256``). A model served from a checkpoint (generation, validation, the hub) is refused when the
two differ (:func:`check_document_agreement`); in training the index is expected to be stale.
"""
from __future__ import annotations

import copy
import functools
import logging
from pathlib import Path
from typing import Optional, Tuple

import torch
from torch.utils.checkpoint import checkpoint

from rag_plugin.core.scores import inner_products
from rag_plugin.optim.lr_scale import plain_module_state
from rag_plugin.reranking.base import RerankBatch, Reranker
from rag_plugin.reranking.stage import rerank
from rag_plugin.retrieval.encoders import lower_states as lower_cache
from rag_plugin.retrieval.encoders.weights import state_dict_sha256
from rag_plugin.util.errors import UserError

logger = logging.getLogger(__name__)

#: ``KS/.lower_states``: the caches of frozen lower layers (``--doc-encoder-train-layers``)
LOWER_STATES_DIR = lower_cache.DIR_NAME
#: distinct retrieved rows per forward of the document tower (``--doc-encoder-chunk``'s default; see
#: :func:`document_vectors`)
DEFAULT_CHUNK = 64


# ---------------------------------------------------------------------------------- options
def check_options(cfg, task_cfg, variant: str, knowledge=None) -> None:
    """``--train-doc-encoder``, ``--share-encoder-towers`` and ``--rerank-top`` against the rest: one-line errors."""
    train, share, top = bool(cfg.train_doc_encoder), bool(cfg.share_encoder_towers), int(cfg.rerank_top)
    if share and not train:
        raise UserError("--share-encoder-towers makes the query encoder the document encoder, which only "
                        "--train-doc-encoder has", fix="add --train-doc-encoder, or leave --share-encoder-towers out")
    if top and not train:
        raise UserError(f"--rerank-top {top} re-scores the candidates with the model's own document encoder, which "
                        "only --train-doc-encoder has (the index's order is already by the stored vectors)",
                        fix="add --train-doc-encoder, or leave --rerank-top out")
    if top < 0:
        raise UserError(f"--rerank-top {top} is negative", fix="give the candidates L >= --n-docs, or 0 (no rerank)")
    layers = int(getattr(cfg, "doc_encoder_train_layers", 0))
    if layers and not train:
        raise UserError(f"--doc-encoder-train-layers {layers} chooses which layers of the document encoder train, "
                        "which only --train-doc-encoder has", fix="add --train-doc-encoder, or leave the option out")
    if layers < 0:
        raise UserError(f"--doc-encoder-train-layers {layers} is negative",
                        fix="give the number of top layers to train, or 0 (the whole tower)")
    chunk = chunk_size(cfg)
    if chunk < 0:
        raise UserError(f"--doc-encoder-chunk {chunk} is negative", fix=f"give the passages per forward of the "
                        f"document encoder (default {DEFAULT_CHUNK}), or 0 (all of a step's in one batch)")
    if layers and share:
        raise UserError("--doc-encoder-train-layers with --share-encoder-towers: the one tower's lower layers learn "
                        "as the query encoder, so they cannot be frozen and cached", fix="leave one of the two out")
    if not train:
        return
    retriever, k = str(getattr(task_cfg, "retriever", "dense")), int(task_cfg.n_docs)
    if variant == "fid":
        raise UserError("--train-doc-encoder trains the document encoder through p(z|x); Fusion-in-Decoder (--arch "
                        "fid_*) has no retrieval scores in its likelihood", fix="use --arch rag_token_* or rag_seq_*")
    if k == 0:
        raise UserError("--train-doc-encoder with --n-docs 0: closed book retrieves no documents to score",
                        fix="use --n-docs 1 or more, or leave --train-doc-encoder out")
    if retriever != "dense":
        raise UserError(f"--train-doc-encoder re-scores dense retrieval's rows; --retriever {retriever} scores "
                        f"{'lexically (BM25)' if retriever == 'bm25' else 'by fusing BM25 and dense ranks'}",
                        fix="use --retriever dense, or leave --train-doc-encoder out")
    reranker = str(getattr(task_cfg, "reranker", None) or "none")
    if reranker != "none":
        raise UserError(f"--train-doc-encoder re-ranks with the model's own document encoder (--rerank-top L); "
                        f"--reranker {reranker} would be a second reranker", fix="leave one of the two out")
    if share and cfg.freeze_query_encoder:
        raise UserError("--share-encoder-towers with --freeze-query-encoder: the one tower would be frozen, and no "
                        "document encoder trained", fix="leave one of the two out")
    if top and top < k:
        raise UserError(f"--rerank-top {top} is fewer than --n-docs {k}", fix=f"re-rank at least {k} candidates")
    if knowledge is not None and top > len(knowledge):
        raise UserError(f"--rerank-top {top} is larger than the knowledge source ({len(knowledge)} passages)",
                        fix=f"use --rerank-top {len(knowledge)} or fewer")
    if knowledge is not None and getattr(knowledge, "imported", False):
        raise UserError("--train-doc-encoder starts from the knowledge source's document encoder, and its vectors "
                        "were imported from an unknown one", path=str(getattr(knowledge, "directory", "")) or None,
                        fix="build the knowledge source with rag-build-knowledge (a known encoder) to train it")


def chunk_size(cfg) -> int:
    """``--doc-encoder-chunk`` (a checkpoint's config from before the option: the default)."""
    return int(getattr(cfg, "doc_encoder_chunk", DEFAULT_CHUNK))


def build_doc_encoder(cfg, task, query_encoder) -> Optional[torch.nn.Module]:
    """The trainable document tower: a copy of the knowledge source's passage tower (the query encoder itself with
    ``--share-encoder-towers``), or None without ``--train-doc-encoder``."""
    if not cfg.train_doc_encoder:
        return None
    if cfg.share_encoder_towers:
        return query_encoder
    tower = copy.deepcopy(task.text_encoder.passage_tower)  # never shares weights with the query encoder
    for p in tower.parameters():
        p.requires_grad_(True)
    trained = int(getattr(cfg, "doc_encoder_train_layers", 0))
    total = len(tower.bert_model.encoder.layer)
    if trained > total:
        raise UserError(f"--doc-encoder-train-layers {trained}: the document encoder has {total} layers",
                        fix=f"use {total} or fewer (0: the whole tower, embeddings included)")
    if trained:  # the embeddings and the lower layers stay the knowledge source's (before the lr reparametrisation)
        for module in [tower.bert_model.embeddings, *tower.bert_model.encoder.layer[:total - trained]]:
            module.requires_grad_(False)
    return tower.train()


def frozen_layers(model) -> int:
    """How many bottom layers of the trained document tower are frozen (and cached): 0 = the whole tower trains."""
    trained = int(getattr(model.cfg, "doc_encoder_train_layers", 0))
    return len(model.doc_encoder.bert_model.encoder.layer) - trained if trained else 0


def lower_states_of(model):
    """The cached lower-layer states the model's document encoder continues from (built on first use under the
    knowledge source's ``.lower_states/``), or None: no layer frozen, or the model is served from a checkpoint
    (generation re-scores the few rows it retrieves with the whole tower)."""
    layers, knowledge = frozen_layers(model), model.context.knowledge
    if not int(getattr(model.cfg, "doc_encoder_train_layers", 0)) or model.context.serving or knowledge is None:
        return None
    store = model.retriever.store
    cached = getattr(model, "_lower_states", None)
    if cached is not None and cached.passages_sha256 == store.sha256:  # a re-index's version: the same passages
        return cached
    key = lower_cache.tower_key(plain_module_state(model.doc_encoder), layers, store.sha256)
    tokenizer, root = model.context.passage_tokenizer, Path(knowledge.root) / LOWER_STATES_DIR
    logger.info("--doc-encoder-train-layers %d: the document encoder's lower %d layers run once per passage (%s "
                "passages, cached under %s)", int(model.cfg.doc_encoder_train_layers), layers, f"{len(store):,}", root)
    cached = lower_cache.lower_states(model.doc_encoder, layers, key, store, tokenizer.ids, tokenizer.collate, root)
    object.__setattr__(model, "_lower_states", cached)  # not a module, not in the state dict
    return cached


# ---------------------------------------------------------------------------------- scores
def document_vectors(doc_encoder: torch.nn.Module, rows: torch.Tensor, store, tokenize, device,
                     lower=None, chunk: int = 0) -> torch.Tensor:
    """The current document encoder's vectors of ``rows`` (Long[B, L]): [B, L, D], each distinct row encoded once
    from the passage store's title and text, or, given ``lower`` (:class:`LowerStates`), from its cached states of
    the frozen lower layers.

    ``chunk`` > 0 (``--doc-encoder-chunk``): the distinct rows go through the tower ``chunk`` at a time. When that
    makes more than one chunk and gradients are recorded, each chunk runs under activation checkpointing
    (:func:`torch.utils.checkpoint.checkpoint`, non-reentrant): only its inputs and its [chunk, D] vectors are kept,
    and its activations are computed again (same dropout masks: the RNG state is replayed) when the backward
    reaches it, so the tower's activations alive at once are one chunk's whatever ``--rerank-top``, for one more
    forward of the tower. Without gradients (evaluation, generation) the chunks only bound the batch. ``chunk`` 0:
    one batch, no checkpointing."""
    unique, inverse = torch.unique(rows, return_inverse=True)
    ids = unique.tolist()
    size = chunk if chunk > 0 else max(len(ids), 1)
    checkpointed = (len(ids) > size and torch.is_grad_enabled()
                    and any(p.requires_grad for p in doc_encoder.parameters()))
    parts = [_encode_chunk(doc_encoder, ids[start:start + size], store, tokenize, device, lower, checkpointed)
             for start in range(0, len(ids), size)]
    vectors = parts[0] if len(parts) == 1 else torch.cat(parts)  # [U, D]
    return vectors[inverse.to(device)]                            # [B, L, D]


def _encode_chunk(doc_encoder, ids, store, tokenize, device, lower, checkpointed: bool) -> torch.Tensor:
    """[len(ids), D]: the tower on these distinct rows (from the lower-layer cache given one)."""
    if lower is not None:
        hidden, mask = lower.gather(ids)
        dtype = next(doc_encoder.parameters()).dtype  # the cache is float32 whatever the model's
        inputs = (hidden.to(device=device, dtype=dtype), mask.to(device))
        run = functools.partial(_from_lower, doc_encoder, lower.layers)
    else:
        inputs = tuple(t.to(device) for t in tokenize([store.title(r) for r in ids], [store.text(r) for r in ids]))
        run = doc_encoder
    if checkpointed:  # the inputs are on ``device``: the checkpoint saves and replays that device's RNG too
        return checkpoint(run, *inputs, use_reentrant=False)
    return run(*inputs)


def _from_lower(doc_encoder, layers: int, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return doc_encoder.forward_from(hidden, mask, layers)


class DocumentEncoderReranker(Reranker):
    """The trainable document encoder as the reranking stage's scorer: scale x q . d(z), d(z) from the model's
    CURRENT document tower on the candidates' texts (differentiable in both towers while training). It has no weights
    of its own (the towers are the model's)."""

    name = "doc_encoder"

    def forward(self, model, batch: RerankBatch) -> torch.Tensor:
        q = batch.query_vectors
        d = document_vectors(model.doc_encoder, batch.rows, model.retriever.store, model.context.passage_tokenizer,
                             q.device, lower_states_of(model), chunk=chunk_size(model.cfg))
        return inner_products(d, q, model.doc_score_scale)  # float32 whatever the precision


def rescored_retrieval(model, q: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(scores [B, K], rows Long[B, K]): the index's top L = max(K, --rerank-top) rows for ``q`` [B, D], scored
    with the model's current document encoder (differentiable in both towers while training), the top K kept: the
    reranking stage (:func:`rag_plugin.reranking.stage.rerank`) with :class:`DocumentEncoderReranker` as its scorer.

    While training with L > K the L candidates are scored without a graph, and only the K kept rows are encoded
    again with one: the top-K values are all the gradient reaches, so it is the same gradient as through the
    whole [B, L] graph, with the activations and the backward of K rows per question instead of L. With L = K the
    index's order is kept."""
    top = max(k, int(model.cfg.rerank_top))
    with torch.no_grad():  # the index only picks the candidates: its stored vectors' scores are not used
        first, rows = model.retriever.retrieve(q, top, model.doc_score_scale)
    batch = RerankBatch(rows=rows, first_stage=first.detach(), src_tokens=rows.new_zeros((rows.size(0), 0)),
                        query_vectors=q)
    grad = model.training and torch.is_grad_enabled()
    return rerank(DocumentEncoderReranker(), model, batch, k, grad, keep_order_at_k=True)


# ---------------------------------------------------------------------------------- the tower's name
def document_tower_sha256(module: torch.nn.Module) -> str:
    """The hash naming a document tower (:func:`state_dict_sha256` of its plain weights)."""
    return state_dict_sha256(plain_module_state(module))


# ---------------------------------------------------------------------------------- agreement with the index
def version_document_hash(knowledge) -> Optional[str]:
    """The document tower hash of a knowledge-source version: its manifest's ``document_tower_sha256`` (a version
    re-embedded with a trained tower), else its encoder's ``passage_weights_sha256``."""
    return knowledge.manifest.get("document_tower_sha256") or knowledge.encoder_identity.get("passage_weights_sha256")


def served_tower_sha256(model, just_loaded: bool) -> str:
    """The hash of a served model's document tower as loaded, computed when its weights were (``just_loaded``) and
    kept: a served tower does not train, and a cast after loading (``.half()``/``.bfloat16()``: the hub, or
    fairseq-generate's --fp16) rounds float32 weights that then no longer upcast to the bytes that were hashed."""
    if just_loaded or getattr(model, "_served_tower_sha256", None) is None:
        model._served_tower_sha256 = document_tower_sha256(model.doc_encoder)
    return model._served_tower_sha256


def check_document_agreement(model, just_loaded: bool = True) -> None:
    """Served from a checkpoint (not trained), a dense model must read a version whose vectors its document encoder
    made: its own (--train-doc-encoder), else the one it was trained with (a version re-embedded with another tower
    would be read through a query encoder trained against other vectors). A one-line error. ``just_loaded``: the
    model's weights are as its checkpoint's (at load); else (another version opened later) the tower's hash is the
    one computed then (:func:`served_tower_sha256`)."""
    context = model.context
    if not context.serving or context.knowledge is None or context.retriever is None or model.query_encoder is None:
        return
    trained = model.doc_encoder is not None
    if trained:
        mine = served_tower_sha256(model, just_loaded)
    else:
        encoder = (model.knowledge_identity or {}).get("encoder") or {}
        mine = encoder.get("passage_weights_sha256")
        if not mine or encoder.get("kind") == "imported":  # unknown document encoder: nothing to compare
            return
    knowledge = context.knowledge
    theirs = version_document_hash(knowledge)
    if theirs is None or getattr(knowledge, "imported", False) or mine == theirs:  # unknown: nothing to compare
        return
    where = str(context.identity.get("knowledge") or knowledge.root)
    fix = (f"re-embed: rag-update-knowledge --knowledge {where} --reembed {context.checkpoint or 'CHECKPOINT'} (a new "
           f"version), then generate again" if trained else
           "generate with a version embedded with the document encoder the checkpoint was trained with")
    raise UserError(f"the checkpoint's document encoder differs from the vectors of {where} version "
                    f"{knowledge.version}", path=context.checkpoint, fix=fix)


def complete_state(model, state_dict: dict) -> dict:
    """Load-time: a checkpoint without a document encoder (``--finetune-from-model`` of a plain RAG checkpoint
    with --train-doc-encoder) keeps the model's own, the knowledge source's; a checkpoint with one loaded into a
    model without --train-doc-encoder drops it (its stored vectors score)."""
    tower = model._modules.get("doc_encoder")  # None with --share-encoder-towers (the query encoder's keys)
    theirs = any(k.startswith("doc_encoder.") for k in state_dict)
    if tower is not None and not theirs:
        logger.info("the checkpoint has no document encoder: --train-doc-encoder starts from the model's own (the "
                    "knowledge source's)")
        return {**state_dict, **{f"doc_encoder.{k}": v for k, v in tower.state_dict().items()}}
    if theirs and tower is None:
        return {k: v for k, v in state_dict.items() if not k.startswith("doc_encoder.")}
    return state_dict
