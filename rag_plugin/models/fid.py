"""``fid``: Fusion-in-Decoder (Izacard & Grave, 2021) over the same retrieval as RAG.

Per batch of B questions and K documents::

    rows = top-K of the task's retriever          [B, K]   no gradient (FAISS or BM25)
    src = <s> question </s> title </s> passage </s>   for each of the B*K pairs (RAG's input format)
    h = BART_encoder(src)                          [L, B*K, H]   each pair encoded on its own
    memory = concat_k h(question, passage_k)       [K*L, B, H]   padding mask [B, K*L] concatenated too
    logits = BART_decoder(prev_output_tokens, memory)   [B, T, V]

Trained with plain cross-entropy on the answer (fairseq's ``--criterion cross_entropy`` or
``label_smoothed_cross_entropy``: the model's output is a fairseq decoder's). Retrieval, generator
inputs, encoding, construction and checkpoint identity are :class:`~rag_plugin.models.rag.RagModel`'s;
only :meth:`FidModel.forward` differs. The query encoder only chooses the passages read: no gradient
from the answer's cross-entropy reaches it. It stays fixed, unless the criterion's ``--retriever-loss adist``
trains it towards each passage's share of the decoder's cross-attention (FiD-KD, Atlas's ADist): then the
forward pass also returns those shares as ``extra["doc_attention_scores"]`` [B, K] (a constant), and the
retriever's scores keep their gradient (criterion ``reader_cross_entropy`` adds the loss).

``--fid-score-bias`` (Akimoto et al., EMNLP Findings 2023) lets the decoder see retrieval: every cross-attention
logit over passage k's positions gets ``w * log p(z_k|x)`` added (:mod:`rag_plugin.generation.fid_score_bias`), w = 1 /
``--fid-attention-temperature`` or learned (``score_bias_log_weight``, w = exp of it, only with the bias).
``--fid-random-passages P`` trains with mixed-quality contexts (:mod:`rag_plugin.models.fid_random_passages`).
"""
import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from fairseq.models import register_model, register_model_architecture
from omegaconf import II

from rag_plugin.core import marginalization as M
from rag_plugin.core.net_output import ATTENTION_KEY
from rag_plugin.generation.fid_attention import CrossAttentionRecorder, passage_shares
from rag_plugin.generation.fid_score_bias import score_bias, with_prior
from rag_plugin.models.fid_random_passages import QueryVectors, mix_random_passages
from rag_plugin.models.rag import RagModel, _preset
from rag_plugin.models.rag_config import RagConfig, as_config, lr_scale
from rag_plugin.optim.lr_scale import has_scaled_keys, plain_state
from rag_plugin.util.errors import UserError
from rag_plugin.util.interpolation import interpolated


@dataclass
class FidConfig(RagConfig):
    freeze_query_encoder: bool = field(
        default=False, metadata={"help": "no effect on FiD: its query encoder is fixed unless --retriever-loss adist "
                                         "trains it"})
    #: the criterion's --retriever-loss (adist trains the query encoder; anything else leaves it fixed)
    retriever_loss: str = II("oc.select:criterion.retriever_loss,none")
    fid_score_bias: bool = field(default=False, metadata={
        "help": "add w * log p(z|x) to the decoder's cross-attention logits over each passage (Akimoto et al. 2023)"})
    fid_attention_temperature: float = field(default=0.0, metadata={
        "help": "with --fid-score-bias: w = 1 / this temperature; 0 = w is learned (starts at 1)"})
    fid_random_passages: float = field(default=0.0, metadata={
        "help": "training: probability per question that its last passage is replaced by a random one"})


def check_fid_options(cfg) -> None:
    """One-line errors for the FiD options that cannot work (``cfg``: a FidConfig)."""
    temperature, random_p = float(cfg.fid_attention_temperature), float(cfg.fid_random_passages)
    if not temperature >= 0:  # NaN too
        raise UserError(f"--fid-attention-temperature {temperature} is "
                        f"{'not a number' if math.isnan(temperature) else 'negative'}",
                        fix="give a temperature > 0 (w = 1/T), or 0 for a learned weight")
    if temperature and not cfg.fid_score_bias:
        raise UserError(f"--fid-attention-temperature {temperature} sets the weight of --fid-score-bias's bias, "
                        "and the bias is off", fix="add --fid-score-bias, or leave --fid-attention-temperature out")
    if not 0.0 <= random_p <= 1.0:
        raise UserError(f"--fid-random-passages {random_p} is not a probability",
                        fix="give the share of training questions that read one random passage, in [0, 1]")


def learns_score_bias_weight(cfg) -> bool:
    """Whether the model has the learned weight of the score bias (--fid-score-bias with temperature 0)."""
    return bool(getattr(cfg, "fid_score_bias", False)) and not float(getattr(cfg, "fid_attention_temperature", 0.0))


def fuse_encodings(encoder_out: Dict[str, List[torch.Tensor]], k: int) -> Dict[str, List[torch.Tensor]]:
    """BART encoder output over B*K question-major pair rows -> one row per question over the K encodings
    concatenated: ``encoder_out`` [L, B*K, H] -> [K*L, B, H] (pair k at positions k*L ... k*L+L-1), the
    padding mask [B*K, L] -> [B, K*L], the embeddings [B*K, L, H] -> [B, K*L, H]."""
    enc = encoder_out["encoder_out"][0]
    length, rows, dim = enc.shape
    b = rows // k
    fused = enc.view(length, b, k, dim).permute(2, 0, 1, 3).reshape(k * length, b, dim)
    mask = encoder_out["encoder_padding_mask"][0].reshape(b, k * length)
    out = {"encoder_out": [fused], "encoder_padding_mask": [mask], "encoder_states": [], "src_tokens": [],
           "src_lengths": []}
    embedding = encoder_out.get("encoder_embedding") or []
    out["encoder_embedding"] = [embedding[0].reshape(b, k * length, -1)] if embedding else []
    return out


@register_model("fid", dataclass=FidConfig)
class FidModel(RagModel):
    """Fusion-in-Decoder: the decoder cross-attends over the K (question, passage) encodings at once."""

    variant = "fid"
    config_class = FidConfig
    #: returns the decoder's cross-attention share of each passage when asked (--retriever-loss adist)
    cross_attention_doc_scores = True
    #: whether forward() returns the shares (set by build_model from the criterion's --retriever-loss)
    returns_attention = False

    def __init__(self, cfg, *args, **kwargs):
        super().__init__(cfg, *args, **kwargs)
        if learns_score_bias_weight(cfg):  # w = exp(log weight), 1 at the start; plain FiD has no such parameter
            self.score_bias_log_weight = torch.nn.Parameter(torch.zeros(()))

    @classmethod
    def build_model(cls, cfg, task):
        cfg = as_config(cfg, FidConfig)
        if task.cfg.n_docs == 0:
            raise UserError("--n-docs 0 gives Fusion-in-Decoder (--arch fid_*) no passages to read",
                            fix="use --n-docs 1 or more, or --arch rag_token_* with --n-docs 0 for closed-book BART")
        # the query encoder learns only from a retriever loss (adist: the decoder's cross-attention over the
        # passages); otherwise no gradient reaches it: frozen, no graph, no optimizer state
        check_fid_options(cfg)
        adist = str(interpolated(cfg, "retriever_loss", "none")) == "adist"
        cfg.freeze_query_encoder = not adist
        model = super().build_model(cfg, task)
        model.returns_attention = adist
        if model.reranker is not None and not (adist or cfg.fid_score_bias):
            # the answer's cross-entropy reaches the reranker's logits only through the score bias or adist:
            # otherwise its weights are fixed (no graph, no optimizer state, no unused DDP parameter)
            model.reranker.requires_grad_(False)
        return model

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """A query encoder trained with --retriever-loss adist is saved with its learning-rate reparametrisation
        (``...parametrizations.weight.original`` = weight / scale); generating, it is fixed and plain."""
        state_dict = self._from_scaled_parameters(state_dict)
        if learns_score_bias_weight(self.cfg) and "score_bias_log_weight" not in state_dict:
            # a plain FiD checkpoint fine-tuned with --fid-score-bias: the weight starts at 1
            state_dict = dict(state_dict, score_bias_log_weight=self.score_bias_log_weight.detach().clone())
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def _from_scaled_parameters(self, state_dict):
        if has_scaled_keys(self.state_dict()) or not has_scaled_keys(state_dict):
            return state_dict
        return plain_state(state_dict, lr_scale(self.cfg))

    def fused_encode(self, src_tokens, query_tokens=None, query_mask=None, fixed_doc_rows=None,
                     fixed_doc_scores=None, n_docs: Optional[int] = None):
        """Retrieve, encode each (question, passage) pair once, concatenate per question.

        Returns (encoder_out over B rows of K*L positions, doc_scores [B, K], rows [B, K]). With --fid-score-bias the
        encoder output also holds log p(z|x) [B, K] (``fid_score_bias.PRIOR_KEY``, with the scores' graph)."""
        encoder_out, doc_scores, rows = self.encode(src_tokens, query_tokens, query_mask, fixed_doc_rows,
                                                    fixed_doc_scores, n_docs)
        fused = fuse_encodings(encoder_out, doc_scores.size(1))
        if self.cfg.fid_score_bias:
            fused = with_prior(fused, M.doc_log_prior(doc_scores.to(torch.promote_types(doc_scores.dtype,
                                                                                        torch.float32))))
        return fused, doc_scores, rows

    def score_bias_weight(self):
        """w of the score bias (a float, or the learned tensor), or None without --fid-score-bias."""
        if not self.cfg.fid_score_bias:
            return None
        temperature = float(self.cfg.fid_attention_temperature)
        if temperature:
            return 1.0 / temperature
        return self.score_bias_log_weight.exp()

    def fused_decode(self, prev_output_tokens, encoder_out, **kwargs):
        """The generator's decoder over a fused encoder output, with the score bias where it has a prior."""
        with score_bias(self.generator.decoder, encoder_out, self.score_bias_weight()):
            return self.generator.decoder(prev_output_tokens, encoder_out=encoder_out, **kwargs)

    def retrieve(self, query_tokens, query_mask, n_docs: int, fixed_doc_rows=None, fixed_doc_scores=None,
                 src_tokens=None):
        """RAG's retrieval (and reranking); in training with --fid-random-passages P, each question's last passage
        replaced by a random one with probability P (see :mod:`rag_plugin.models.fid_random_passages`)."""
        args = (query_tokens, query_mask, n_docs, fixed_doc_rows, fixed_doc_scores, src_tokens)
        p = float(self.cfg.fid_random_passages)
        if not (self.training and p > 0):
            return super().retrieve(*args)
        with QueryVectors(self.query_encoder) as q:
            doc_scores, rows = super().retrieve(*args)
        # the random passage is scored scale * q.d where the K logits are that too: dense retrieval of its own rows,
        # no reranker (whose scores are another scale); otherwise the margin rule
        exact = fixed_doc_rows is None and getattr(self, "reranker", None) is None
        return mix_random_passages(doc_scores, rows, p, len(self.retriever.store), self.retriever if exact else None,
                                   q.value, self.doc_score_scale)

    def forward(self, src_tokens, prev_output_tokens, query_tokens=None, query_mask=None,
                fixed_doc_rows=None, fixed_doc_scores=None, n_docs: Optional[int] = None, src_lengths=None):
        """Teacher-forced logits ``[B, T, V]`` and fairseq's decoder extras, with ``extra["doc_scores"]`` [B, K]
        (the retriever's: no gradient unless --retriever-loss adist trains the query encoder) and
        ``extra["doc_rows"]`` [B, K]."""
        encoder_out, doc_scores, rows = self.fused_encode(src_tokens, query_tokens, query_mask, fixed_doc_rows,
                                                          fixed_doc_scores, n_docs)
        if not self.returns_attention:
            logits, extra = self.fused_decode(prev_output_tokens, encoder_out)
        else:
            with CrossAttentionRecorder(self.generator.decoder) as recorded:
                logits, extra = self.fused_decode(prev_output_tokens, encoder_out)
            attention = torch.stack(recorded.layers).mean(0)                         # [B, T, K*L]
            extra[ATTENTION_KEY] = passage_shares(attention, prev_output_tokens.ne(self.pad),
                                                  doc_scores.size(1)).detach()
        extra["doc_scores"] = doc_scores
        extra["doc_rows"] = rows
        return logits, extra

    def get_normalized_probs(self, net_output, log_probs: bool, sample=None):
        """fairseq's criteria (cross_entropy, label_smoothed_cross_entropy) read the decoder's output."""
        return self.generator.get_normalized_probs(net_output, log_probs, sample)


for _size, _positions in (("tiny", 128), ("base", 1024), ("large", 1024)):
    register_model_architecture("fid", f"fid_{_size}")(_preset(_size, _positions))
