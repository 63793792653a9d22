"""``--reranker maxsim``: late interaction (ColBERT's MaxSim) over the knowledge source's encoder's token states.

For a question x and a candidate passage z::

    score(x, z) = sum over the question's tokens i of  max over the passage's tokens j of  q_i . d_j

with ``q_i`` the L2-normalised last hidden states of the reranker's own query tower (a copy of the knowledge source's
query tower's BERT, trainable, at the query encoder's learning-rate scale) over the question's knowledge-encoder tokens
(``[CLS] q [SEP]``, both specials included as ColBERT has them, padding excluded), and ``d_j`` those of the knowledge
source's passage tower (frozen) over the passage as the knowledge source tokenized it (padding excluded). The raw sum
is the logit of p(z|x): ColBERT trains it in a softmax over candidates without a temperature, and the softmax over
sums of up to Q cosines already spans a range that grows with the question's length.

The passage tower is not a submodule (it never enters the model's state dict or its optimizer) and runs in eval mode
under no_grad. Each distinct row of a batch is computed once, :data:`CHUNK` at a time: from its text, or, where the
knowledge source holds a lower-layer cache of exactly this tower's frozen bottom (``KS/.lower_states``, see
:mod:`rag_plugin.retrieval.encoders.lower_states`), from the cached states continued through the remaining layers.
A bounded LRU keeps the states of the last ``cache_size`` rows (the stage scores L candidates, then the K it keeps
again with a graph: those K are read back): tokens x hidden x 4 bytes a passage (all-MiniLM-L6-v2, hidden 384, on
the demo's passages: 86 tokens and 132 KB on average, 215 KB at the 95th percentile; ~135 MB for the default 1024).
"""
from __future__ import annotations

import copy
import hashlib
from collections import OrderedDict
from pathlib import Path
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from rag_plugin.optim.lr_scale import plain_module_state, resolved_scale, scale_learning_rate
from rag_plugin.reranking.base import RerankBatch, Reranker, register_reranker
from rag_plugin.retrieval.encoders import lower_states as lower_cache
from rag_plugin.retrieval.encoders.bert import BertModel
from rag_plugin.retrieval.shared import SharedOnCopy
from rag_plugin.util.errors import UserError

#: distinct passages per forward of the passage tower
CHUNK = 64
#: passages whose token states are kept in memory (0: none)
DEFAULT_CACHE = 1024


def maxsim(query: torch.Tensor, query_mask: torch.Tensor, passages: torch.Tensor, passage_mask: torch.Tensor
           ) -> torch.Tensor:
    """MaxSim of token states: ``query`` [B, Q, H], ``query_mask`` [B, Q] (True/1 = token), ``passages``
    [B, L, T, H], ``passage_mask`` [B, L, T] -> [B, L]: for each passage, the sum over the question's tokens of the
    best dot product with the passage's tokens, both sides L2-normalised. Autocast off, at least float32."""
    dtype = torch.promote_types(torch.promote_types(query.dtype, passages.dtype), torch.float32)
    with torch.autocast(device_type=query.device.type, enabled=False):
        q = F.normalize(query.to(dtype), dim=-1)
        d = F.normalize(passages.to(dtype), dim=-1)
        sim = torch.einsum("bqh,blth->blqt", q, d)
        sim = sim.masked_fill(~passage_mask.bool()[:, :, None, :], float("-inf"))
        best = sim.max(dim=-1).values                                   # [B, L, Q]
        return torch.where(query_mask.bool()[:, None, :], best, best.new_zeros(())).sum(-1)


class PassageStates(SharedOnCopy):
    """The frozen passage tower's last hidden states of passage-store rows (from the lower-layer cache where one
    of this tower exists), with an LRU of the last ``cache_size`` rows. Shared, not copied, by a deep copy of the
    model (``--store-ema``): the tower never changes."""

    def __init__(self, text_encoder, lower_root: Optional[Path], cache_size: int = DEFAULT_CACHE):
        self.text_encoder = text_encoder
        self.tower = text_encoder.passage_tower
        self.lower_root = lower_root
        self.cache_size = int(cache_size)
        self._cache: OrderedDict = OrderedDict()  # (store sha256, row) -> [T_r, H]
        self._on_device = {}                      # device -> the tower there (itself where it is)
        self._lower, self._lower_for = None, None

    def lower(self, store) -> Optional[lower_cache.LowerStates]:
        """The complete lower-layer cache of this tower over ``store``, or None (looked for again when the
        caches of the knowledge source change: one built during the run is used from then on)."""
        if self.lower_root is None:
            return None
        listing = tuple(sorted(self.lower_root.glob("*/" + lower_cache.META)))
        if (store.sha256, listing) != self._lower_for:
            self._lower = (lower_cache.find(self.lower_root, plain_module_state(self.tower), store.sha256)
                           if listing else None)
            self._lower_for = (store.sha256, listing)
        return self._lower

    def of(self, rows: List[int], store, device) -> List[torch.Tensor]:
        """The states [T_r, H] (padding excluded) of each of the distinct ``rows``, on ``device``."""
        key = getattr(store, "sha256", None)
        found = {r: self._cache[(key, r)] for r in rows if (key, r) in self._cache}
        missing = [r for r in rows if r not in found]
        tower = self._tower_on(torch.device(device))
        was_training = tower.training
        tower.eval()
        try:
            with torch.no_grad():
                for start in range(0, len(missing), CHUNK):
                    ids = missing[start:start + CHUNK]
                    found.update(zip(ids, self._compute(tower, ids, store, device), strict=True))
        finally:
            tower.train(was_training)
        for r in rows:
            self._remember((key, r), found[r])
        return [found[r].to(device) for r in rows]

    def _compute(self, tower, ids: List[int], store, device) -> List[torch.Tensor]:
        lower = self.lower(store)
        if lower is not None:
            hidden, mask = lower.gather(ids)
            dtype = next(tower.parameters()).dtype  # the cache is float32 whatever the tower's
            mask = mask.to(device)
            out = tower.bert_model.continue_from(hidden.to(device=device, dtype=dtype), mask, lower.layers)
        else:
            encoder = self.text_encoder
            tokens = encoder.tokenize_passages([store.title(r) for r in ids], [store.text(r) for r in ids])
            input_ids, mask, types = (t.to(device) for t in encoder.collate(tokens))
            out = tower.bert_model(input_ids, mask, types)
        return [out[i, :n].clone() for i, n in enumerate(mask.sum(1).tolist())]  # a clone: no chunk kept alive

    def clear(self) -> None:
        """Forget the kept states (a tower changed in place: another dtype, other weights)."""
        self._cache.clear()

    def _remember(self, key, states: torch.Tensor) -> None:
        if self.cache_size <= 0:
            return
        self._cache[key] = states
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _tower_on(self, device: torch.device):
        """The passage tower on ``device``: itself where it is, else a frozen copy moved there once (the task's
        encoder stays where it is)."""
        here = next(self.tower.parameters()).device
        if here == device or (device.type == here.type and device.index is None):
            return self.tower
        if device not in self._on_device:
            self._on_device[device] = copy.deepcopy(self.tower).to(device).requires_grad_(False).eval()
        return self._on_device[device]


class MaxSimReranker(Reranker):
    """Late interaction: the module docstring. Its one submodule, ``query_encoder``, is the trainable copy of the
    knowledge source's query BERT (no pooling, no projection: every parameter takes part)."""

    name = "maxsim"
    trainable = True

    def __init__(self, query_encoder: BertModel, passages: PassageStates):
        super().__init__()
        self.query_encoder = query_encoder
        self.passages = passages  # not a module: the frozen passage tower stays out of the state dict

    def forward(self, model, batch: RerankBatch) -> torch.Tensor:
        """[B, L] MaxSim scores of ``batch.rows``, float32 (float64 from float64 states). Rows of -1 are the
        stage's to hold out (:mod:`rag_plugin.reranking.stage`): a ValueError here."""
        if batch.query_tokens is None or batch.query_mask is None:
            raise UserError("--reranker maxsim reads the questions in the knowledge source's encoder tokens, and the "
                            "batch has none", fix="use a task that loads the knowledge source's encoder")
        tokens, mask = batch.query_tokens, batch.query_mask
        query = self.query_encoder(tokens, mask.long())                        # [B, Q, H], with its graph
        rows = batch.rows.to(tokens.device)
        if bool(rows.lt(0).any()):
            raise ValueError("--reranker maxsim was handed rows of -1 (no passage): the stage holds them out")
        unique, inverse = torch.unique(rows, return_inverse=True)
        states = self.passages.of(unique.tolist(), model.retriever.store, tokens.device)
        scores = []
        for b in range(rows.shape[0]):  # one question's L passages padded at a time: memory L x T x H
            picked = [states[i] for i in inverse[b].tolist()]
            padded = pad_sequence(picked, batch_first=True)                     # [L, T, H]
            lengths = torch.tensor([len(p) for p in picked], device=padded.device)
            passage_mask = torch.arange(padded.shape[1], device=padded.device)[None] < lengths[:, None]
            scores.append(maxsim(query[b:b + 1], mask[b:b + 1], padded[None], passage_mask[None])[0])
        return torch.stack(scores)


# ---------------------------------------------------------------------------------- the builder
def vocab_sha256(tokenizer) -> str:
    """The hash of a tokenizer's vocabulary as :meth:`TextEncoder.identity` records it (``vocab_sha256``)."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    text = "\n".join(tok for tok, _ in sorted(vocab.items(), key=lambda kv: kv[1]))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def check_token_states(text_encoder, knowledge) -> None:
    """A one-line error unless ``text_encoder`` has BERT towers whose token states can be compared, reading the
    knowledge source's tokens."""
    towers = [getattr(text_encoder, side, None) for side in ("query_tower", "passage_tower")]
    name = getattr(text_encoder, "name", type(text_encoder).__name__)
    if not all(isinstance(getattr(t, "bert_model", None), BertModel) for t in towers):
        raise UserError(f"--reranker maxsim compares per-token states of the knowledge source's encoder, and its "
                        f"encoder {name!r} has no BERT towers", fix="use --reranker upr or cross, or a knowledge "
                        "source embedded with a BERT-family encoder")
    sizes = [t.bert_model.config.hidden_size for t in towers]
    if sizes[0] != sizes[1]:
        raise UserError(f"--reranker maxsim compares the query tower's token states ({sizes[0]}) with the passage "
                        f"tower's ({sizes[1]}): they differ in size", fix="use --reranker upr or cross")
    theirs = ((getattr(knowledge, "encoder_identity", None) or {}).get("vocab_sha256")
              if knowledge is not None else None)
    if theirs and vocab_sha256(text_encoder.tokenizer) != theirs:
        raise UserError(f"--reranker maxsim reads passages in the knowledge source's tokens, and the encoder "
                        f"{name!r} has another vocabulary", path=str(getattr(knowledge, "directory", "")) or None,
                        fix="use the encoder the knowledge source was built with")


def _lr_scale(model_cfg) -> float:
    """The query encoder's learning-rate scale (``--query-encoder-lr-scale``, 0 resolved against ``--lr``)."""
    try:
        lr = getattr(model_cfg, "lr", None)
    except Exception:  # an interpolation (``lr: ${optimization.lr}``) the config cannot resolve
        lr = None
    return resolved_scale(getattr(model_cfg, "query_encoder_lr_scale", 0.0), lr)


def build_token_state_cache(text_encoder, store, root: Path) -> lower_cache.LowerStates:
    """``--maxsim-cache``: every passage's last hidden states under the frozen passage tower, computed once (with a
    progress bar; ranks of a job take turns on its lock) into a lower-layer cache of all the tower's layers, which
    :class:`PassageStates` then reads (no layer left to run)."""
    tower = text_encoder.passage_tower
    layers = len(tower.bert_model.encoder.layer)
    key = lower_cache.tower_key(plain_module_state(tower), layers, store.sha256)
    return lower_cache.lower_states(tower, layers, key, store, text_encoder.tokenize_passages, text_encoder.collate,
                                    root)


@register_reranker("maxsim")
def build(model_cfg, task, cache_size: int = DEFAULT_CACHE) -> MaxSimReranker:
    """The MaxSim reranker of ``task``'s knowledge source: its own query tower learning at the query encoder's
    scale, the knowledge source's passage tower frozen and shared."""
    encoder = getattr(task, "text_encoder", None)
    if encoder is None:
        raise UserError("--reranker maxsim reads the knowledge source's encoder (its token states), and this task "
                        "loaded none", fix="retrieve with --n-docs 1 or more, or use --reranker upr")
    knowledge = getattr(task, "knowledge", None)
    check_token_states(encoder, knowledge)
    root = Path(knowledge.root) / lower_cache.DIR_NAME if getattr(knowledge, "root", None) else None
    if root is not None and bool(getattr(task.cfg, "maxsim_cache", False)):
        build_token_state_cache(encoder, knowledge.passages, root)
    query = copy.deepcopy(encoder.query_tower.bert_model).requires_grad_(True).train()
    reranker = MaxSimReranker(query, PassageStates(encoder, root, cache_size))
    scale = _lr_scale(model_cfg)
    if scale != 1.0:
        scale_learning_rate(reranker.query_encoder, scale)
    return reranker
