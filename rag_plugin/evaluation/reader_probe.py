"""Does a reader tell the passage that answers a question from the others it reads?

RAG weighs the passages it reads by the retriever's p(z|x); Fusion-in-Decoder (FiD) cannot see those scores:
its decoder must find the answering passage among the K encodings by their content. A reader that cannot
(a small one trained from scratch, say) reads K passages as a blur of them, and reads worse the more it is
given. This probe measures that, per question whose data names a gold passage that is in the knowledge source,
with the answer teacher-forced, under four conditions (K passages each, but the first):

* ``gold``: the gold passage alone (K = 1): how well the reader reads the answer off its passage;
* ``gold+random``: the gold passage among K-1 passages drawn at random from the knowledge source;
* ``gold+retrieved``: the gold passage among the K-1 best passages of the model's own retriever that are not gold;
* ``random``: K random passages and no gold passage: the answer from nothing that states it.

The gold passage takes a random slot in each row (seeded), the same for every model probed with the same seed.
Per condition, two numbers:

* ``answer_nll``: the answer's negative log-likelihood in nats (summed over its tokens, mean over questions).
  FiD: its likelihood. RAG: the reader alone, the RAG-Sequence marginal under a uniform prior,
  ``-log (1/K) sum_k p(y|x,z_k)``, so a RAG reader that tells the passages apart perfectly pays ``log K`` over
  ``gold``; a FiD reader that does pays nothing;
* ``gold_share`` (the two mixed conditions): the reader's weight on the gold passage. FiD: its share of the
  decoder's cross-attention (layers, heads and answer tokens averaged; FiD-KD's passage score). RAG: its
  posterior under a uniform prior, ``p(y|x,z_gold) / sum_k p(y|x,z_k)``. ``1/K`` is a reader that cannot tell
  the passages apart.

No fairseq command line: :func:`probe` takes a loaded :class:`rag_plugin.hub.RAG` (``rag-probe-reader`` loads it),
on whatever device its model is: the questions' tensors go there, the weights on the gold passage are summed there.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import torch
from fairseq import utils

from rag_plugin.core import marginalization as M
from rag_plugin.generation.fid_attention import teacher_forced
from rag_plugin.models.fid import fuse_encodings
from rag_plugin.util.devices import model_device
from rag_plugin.util.errors import UserError

CONDITIONS = ("gold", "gold+random", "gold+retrieved", "random")
#: the conditions where the gold passage is one of K (its share is measured there)
MIXED = ("gold+random", "gold+retrieved")


@dataclass
class ProbeQuestions:
    """The probed questions: text, first answer, gold store rows (every passage of the gold documents)."""
    questions: List[str]
    answers: List[str]
    gold: List[List[int]]
    skipped: int = 0  # records whose gold passages are none of the knowledge source's

    def __len__(self):
        return len(self.questions)


@dataclass
class ProbeResult:
    k: int
    n: int
    skipped: int
    answer_nll: Dict[str, float] = field(default_factory=dict)
    gold_share: Dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"k": self.k, "questions": self.n, "skipped_without_gold_passage": self.skipped,
                "chance_share": 1.0 / self.k, "answer_nll": self.answer_nll, "gold_share": self.gold_share}


def probe_questions(records, by_id: Dict[str, List[int]], limit: Optional[int] = None) -> ProbeQuestions:
    """Records (:class:`rag_plugin.data.kilt.QARecord`) with a gold passage in the store (``by_id``:
    :func:`rag_plugin.data.gold_rows.rows_by_passage_id`), the first ``limit`` of them."""
    out = ProbeQuestions([], [], [])
    for r in records:
        rows = sorted({row for pid in r.provenance for row in by_id.get(pid, [])})
        if not rows:
            out.skipped += 1
            continue
        if limit is not None and len(out) >= limit:
            break
        out.questions.append(r.input)
        out.answers.append(r.answers[0])
        out.gold.append(rows)
    return out


def passage_rows(gold: Sequence[int], others: Sequence[int], k: int, rng: random.Random,
                 with_gold: bool = True) -> List[int]:
    """K rows: the first gold row in a random slot among the first K-1 ``others`` (or K ``others``)."""
    if not with_gold:
        return list(others[:k])
    rows = list(others[: k - 1])
    rows.insert(rng.randrange(k), gold[0])
    return rows


def random_others(gold: Sequence[int], n_passages: int, count: int, rng: random.Random) -> List[int]:
    """``count`` distinct random store rows, none of them gold."""
    if n_passages - len(set(gold)) < count:
        raise UserError(f"the knowledge source has {n_passages} passages: too few for {count} random non-gold ones",
                        fix="use a smaller --n-docs")
    banned, out = set(gold), []
    while len(out) < count:
        row = rng.randrange(n_passages)
        if row not in banned:
            banned.add(row)
            out.append(row)
    return out


def read_scores(model, src_tokens, prev, target, rows: torch.Tensor, pad: int):
    """(answer NLL [B] in nats, gold-independent reader weights [B, K]) of the answers read with ``rows`` [B, K]."""
    k = rows.size(1)
    src, lengths = model.generator_inputs(src_tokens, rows)
    encoder_out = model.generator.encoder(src, src_lengths=lengths)
    if getattr(model, "variant", None) == "fid":
        fused = fuse_encodings(encoder_out, k)
        token_lp, shares = teacher_forced(model, fused, torch.arange(rows.size(0)), prev, target, k)
        return -token_lp.sum(1), shares
    logits, _ = model.generator.decoder(prev.repeat_interleave(k, dim=0), encoder_out=encoder_out)
    b, t = target.shape
    lprobs = torch.log_softmax(logits.float(), dim=-1).view(b, k, t, -1)
    token_lp = M.target_token_log_probs(lprobs, target)                          # [B, K, T]
    uniform = torch.full((b, k), -math.log(k), device=token_lp.device)           # the reader alone: no retrieval
    mask = target.ne(pad)
    return (M.rag_sequence_nll(token_lp, uniform, mask),
            M.rag_sequence_doc_log_posterior(token_lp, uniform, mask).exp())


def retrieved_rows(model, net_input: dict, gold: List[List[int]], k: int) -> List[List[int]]:
    """Per question, the model's retrieval's best K-1 non-gold rows (it is asked for K-1 + the most gold rows)."""
    want = k - 1 + max(len(g) for g in gold)
    _, rows = model.retrieve(net_input.get("query_tokens"), net_input.get("query_mask"), want,
                             net_input.get("fixed_doc_rows"), net_input.get("fixed_doc_scores"),
                             net_input.get("src_tokens"))
    out = []
    for found, g in zip(rows.tolist(), gold):
        banned = set(g)
        others = [r for r in found if r not in banned and r >= 0]
        if len(others) < k - 1:
            raise UserError(f"the retriever returned {len(others)} non-gold passages for a question, {k - 1} needed",
                            fix="use a smaller --n-docs")
        out.append(others)
    return out


def gold_weight(weights: torch.Tensor, rows: List[List[int]], gold: List[List[int]]) -> torch.Tensor:
    """The summed weight ``weights`` [B, K] puts on each row's gold passage (``rows[b][k] == gold[b][0]``; 0 where no
    row is gold), a 0-dim tensor on ``weights``' device."""
    is_gold = torch.tensor([[row == g[0] for row in rr] for rr, g in zip(rows, gold)], device=weights.device)
    return (weights * is_gold).sum()


def check(rag, data: ProbeQuestions, k: int) -> None:
    """One-line errors for what cannot be probed: K < 2, no question with a gold passage, a closed-book model."""
    if k < 2:
        raise UserError(f"--n-docs {k}: the probe mixes the gold passage with others, so it needs K >= 2",
                        fix="use --n-docs 2 or more")
    if not len(data):
        raise UserError("no question of the data names a gold passage that is in the knowledge source",
                        fix="give records 'provenance' ids of the knowledge source's passages (or their documents)")
    if getattr(rag.model, "variant", None) not in ("token", "sequence", "fid") or rag.task.cfg.n_docs == 0:
        raise UserError("the checkpoint is not a model that reads passages (RAG or FiD)",
                        fix="probe a model trained with --arch rag_* or fid_* and --n-docs 1 or more")


def probe(rag, data: ProbeQuestions, k: int, batch_size: int = 16, seed: int = 0,
          progress: Optional[Callable[[int], None]] = None) -> ProbeResult:
    """Run the four conditions over ``data`` with the loaded model ``rag`` (:class:`rag_plugin.hub.RAG`).
"""
    check(rag, data, k)
    task, model = rag.task, rag.model
    device = model_device(model)
    pad, n_store = task.dictionary.pad(), len(task.knowledge.passages)
    rng = random.Random(seed)
    sums = {c: [0.0, 0.0] for c in CONDITIONS}
    model.eval()
    for start in range(0, len(data), batch_size):
        idx = range(start, min(start + batch_size, len(data)))
        questions = [data.questions[i] for i in idx]
        gold = [data.gold[i] for i in idx]
        # the candidates a BM25 (or hybrid) dataset holds: enough for K-1 non-gold ones once the gold are set aside
        dataset = task.build_dataset(questions, targets=[data.answers[i] for i in idx],
                                     candidates=k - 1 + max(len(g) for g in gold))
        sample = dataset.collater([dataset[i] for i in range(len(dataset))])
        sample = utils.apply_to_sample(lambda t: t.to(device), sample)  # a model on a GPU (as the hub's generate)
        ni = sample["net_input"]
        with torch.no_grad():
            retrieved = retrieved_rows(model, ni, gold, k)
            rows = {"gold": [[g[0]] for g in gold],
                    "gold+random": [passage_rows(g, random_others(g, n_store, k - 1, rng), k, rng) for g in gold],
                    "gold+retrieved": [passage_rows(g, o, k, rng) for g, o in zip(gold, retrieved)],
                    "random": [random_others(g, n_store, k, rng) for g in gold]}
            for cond in CONDITIONS:
                r = torch.tensor(rows[cond], dtype=torch.long)
                nll, weights = read_scores(model, ni["src_tokens"], ni["prev_output_tokens"], sample["target"], r, pad)
                sums[cond][0] += float(nll.sum())
                sums[cond][1] += float(gold_weight(weights, rows[cond], gold))
        if progress is not None:
            progress(len(questions))
    n = len(data)
    result = ProbeResult(k=k, n=n, skipped=data.skipped)
    for cond in CONDITIONS:
        result.answer_nll[cond] = sums[cond][0] / n
        if cond in MIXED:
            result.gold_share[cond] = sums[cond][1] / n
    return result
