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
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
from fairseq.models import register_model, register_model_architecture
from omegaconf import II

from rag_plugin.core.net_output import ATTENTION_KEY
from rag_plugin.generation.fid_attention import CrossAttentionRecorder, passage_shares
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

    @classmethod
    def build_model(cls, cfg, task):
        cfg = as_config(cfg, FidConfig)
        if task.cfg.n_docs == 0:
            raise UserError("--n-docs 0 gives Fusion-in-Decoder (--arch fid_*) no passages to read",
                            fix="use --n-docs 1 or more, or --arch rag_token_* with --n-docs 0 for closed-book BART")
        # the query encoder learns only from a retriever loss (adist: the decoder's cross-attention over the
        # passages); otherwise no gradient reaches it: frozen, no graph, no optimizer state
        adist = str(interpolated(cfg, "retriever_loss", "none")) == "adist"
        cfg.freeze_query_encoder = not adist
        model = super().build_model(cfg, task)
        model.returns_attention = adist
        return model

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        """A query encoder trained with --retriever-loss adist is saved with its learning-rate reparametrisation
        (``...parametrizations.weight.original`` = weight / scale); generating, it is fixed and plain."""
        state_dict = self._from_scaled_parameters(state_dict)
        return super().load_state_dict(state_dict, strict=strict, model_cfg=model_cfg, args=args)

    def _from_scaled_parameters(self, state_dict):
        if has_scaled_keys(self.state_dict()) or not has_scaled_keys(state_dict):
            return state_dict
        return plain_state(state_dict, lr_scale(self.cfg))

    def fused_encode(self, src_tokens, query_tokens=None, query_mask=None, fixed_doc_rows=None,
                     fixed_doc_scores=None, n_docs: Optional[int] = None):
        """Retrieve, encode each (question, passage) pair once, concatenate per question.

        Returns (encoder_out over B rows of K*L positions, doc_scores [B, K], rows [B, K])."""
        encoder_out, doc_scores, rows = self.encode(src_tokens, query_tokens, query_mask, fixed_doc_rows,
                                                    fixed_doc_scores, n_docs)
        return fuse_encodings(encoder_out, doc_scores.size(1)), doc_scores, rows

    def forward(self, src_tokens, prev_output_tokens, query_tokens=None, query_mask=None,
                fixed_doc_rows=None, fixed_doc_scores=None, n_docs: Optional[int] = None, src_lengths=None):
        """Teacher-forced logits ``[B, T, V]`` and fairseq's decoder extras, with ``extra["doc_scores"]`` [B, K]
        (the retriever's, for the record: no gradient) and ``extra["doc_rows"]`` [B, K]."""
        encoder_out, doc_scores, rows = self.fused_encode(src_tokens, query_tokens, query_mask, fixed_doc_rows,
                                                          fixed_doc_scores, n_docs)
        if not self.returns_attention:
            logits, extra = self.generator.decoder(prev_output_tokens, encoder_out=encoder_out)
        else:
            with CrossAttentionRecorder(self.generator.decoder) as recorded:
                logits, extra = self.generator.decoder(prev_output_tokens, encoder_out=encoder_out)
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
